"""The check registry: the check types of every family, keyed by the spec's `check.type`.

Registration flows one way: this module lists the families, each family lists its classes
in `CHECKS` and imports only the engine's types and `checks.families._common`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from checks.check import Check
from checks.families import (
    custom,
    drift,
    files,
    hooks,
    judge,
    keywords,
    output,
    pii,
    process,
    refusal,
    schema,
    services,
    similarity,
    tool_calls,
)

FAMILIES = (
    custom,
    drift,
    files,
    hooks,
    judge,
    keywords,
    output,
    pii,
    process,
    refusal,
    schema,
    services,
    similarity,
    tool_calls,
)

REGISTRY: dict[str, type[Check]] = {}


def register(cls: type[Check]) -> type[Check]:
    for name in (cls.type, *cls.aliases):
        if name in REGISTRY:
            raise ValueError(f"check type {name!r} registered twice")
        REGISTRY[name] = cls
    return cls


for _family in FAMILIES:
    for _check in _family.CHECKS:
        register(_check)


def check_types() -> list[str]:
    return sorted(REGISTRY)


def get_check_class(type_name: str) -> type[Check]:
    return REGISTRY[type_name]


CheckFactory = Callable[[dict[str, Any]], Check]

__all__ = ["REGISTRY", "Check", "CheckFactory", "check_types", "get_check_class", "register"]
