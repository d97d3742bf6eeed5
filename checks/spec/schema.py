"""The spec's JSON Schema, and jsonschema errors turned into messages a person can act on."""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from checks.json_schema import jsonschema

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schema" / "spec.schema.json"


@dataclass(frozen=True, slots=True)
class Problem:
    """A validation problem before it is given a line: path into the data, message, and
    whether it points at the key (unknown/missing fields) or at the value."""

    path: tuple[Any, ...]
    message: str
    at_key: bool = False


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    with SCHEMA_PATH.open(encoding="utf-8") as handle:
        loaded: dict[str, Any] = json.load(handle)
    return loaded


def spec_schema() -> dict[str, Any]:
    """The published JSON Schema (a copy: callers may change it freely)."""
    return copy.deepcopy(_schema())


@lru_cache(maxsize=1)
def compiled_validator() -> jsonschema.Draft202012Validator:
    """The published schema as one validator (for callers that want plain jsonschema)."""
    return jsonschema.Draft202012Validator(_schema())


@dataclass(frozen=True, slots=True)
class _Validators:
    """The schema compiled in parts (see `_validators`): the document without the per-type
    check rules, and one validator per check type."""

    document: jsonschema.Draft202012Validator
    checks: dict[str, jsonschema.Draft202012Validator]


@lru_cache(maxsize=1)
def _validators() -> _Validators:
    """The same schema split for speed, compiled once per process.

    The published `check` definition dispatches on `type` through one if/then per check
    type; evaluating ~40 conditions for each of hundreds of invariants dominated the
    time. Here the document validator only checks `check.type`, and each check is then
    validated by its own type's definition: the same rules, one lookup instead of 40.
    """
    published = _schema()
    definitions = published["$defs"]
    # New dicts along the one path that changes (no validator changes its schema): a deep
    # copy of the whole schema cost every command that validates a spec ~4 ms.
    check = {key: value for key, value in definitions["check"].items() if key != "allOf"}
    schema = {**published, "$defs": {**definitions, "check": check}}
    checks = {
        name: jsonschema.Draft202012Validator(definitions[f"check_{name}"])
        for name in check["properties"]["type"]["enum"]
    }
    return _Validators(jsonschema.Draft202012Validator(schema), checks)


def suggestion(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest valid name, or ''."""
    if not isinstance(word, str):
        return ""
    matches = difflib.get_close_matches(
        word, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6
    )
    return f" (did you mean '{matches[0]}'?)" if matches else ""


def schema_problems(data: Any) -> Iterator[Problem]:
    validators = _validators()
    for error in validators.document.iter_errors(data):
        yield from _translate(error)
    invariants = data.get("invariants") if isinstance(data, dict) else None
    if not isinstance(invariants, dict):
        return
    for invariant_id, invariant in invariants.items():
        check = invariant.get("check") if isinstance(invariant, dict) else None
        kind = check.get("type") if isinstance(check, dict) else None
        if isinstance(kind, str) and kind in validators.checks:
            prefix = ("invariants", invariant_id, "check")
            for error in validators.checks[kind].iter_errors(check):
                yield from _translate(error, prefix)


_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "true or false",
    "null": "null",
}


def describe(value: Any) -> str:
    """How a YAML value reads in a message: "string 'abc'", "integer 5", "a list"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"integer {_short(str(value))}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string '{_short(value)}'"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} '{_short(str(value))}'"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return f"'{_short(value)}'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return _short(str(value))


def _translate(
    error: jsonschema.ValidationError, prefix: tuple[Any, ...] = ()
) -> Iterator[Problem]:
    path = (*prefix, *error.absolute_path)
    keyword = error.validator
    expected = error.validator_value
    value = error.instance
    schema = error.schema if isinstance(error.schema, dict) else {}

    if keyword == "additionalProperties" and isinstance(value, dict):
        allowed = list(schema.get("properties", {}))
        note = schema.get("x-unknown")
        for key in value:
            if key not in allowed:
                # The closest name helps most; otherwise say which kind of block refused it.
                hint = suggestion(key, allowed) or (f" ({note})" if isinstance(note, str) else "")
                yield Problem((*path, key), f"unknown field '{key}'{hint}", at_key=True)
    elif keyword == "required" and isinstance(value, dict):
        for name in expected:
            if name not in value:
                yield Problem(path, f"missing required field '{name}'", at_key=True)
    elif keyword == "enum":
        yield Problem(path, _enum_message(value, list(expected), schema.get("x-kind")))
    elif keyword == "const":
        yield Problem(path, f"must be {_literal(expected)}, got {_literal(value)}")
    elif keyword == "type":
        yield Problem(path, f"expected {_expected_types(expected)}, got {describe(value)}")
    elif keyword in _BOUNDS:
        yield Problem(path, f"must be {_BOUNDS[keyword]} {expected}, got {_literal(value)}")
    elif keyword == "minItems":
        yield Problem(
            path, "must not be empty" if expected == 1 else f"must have at least {expected} items"
        )
    elif keyword == "minProperties":
        yield Problem(
            path, "must not be empty" if expected == 1 else f"must have at least {expected} entries"
        )
    elif keyword == "minLength":
        yield Problem(path, "must not be empty")
    elif keyword == "pattern":
        template = schema.get("x-message")
        if isinstance(template, str):
            yield Problem(path, template.replace("{value}", _short(str(value))))
        else:
            yield Problem(path, f"{_literal(value)} does not match the pattern {expected}")
    else:
        yield Problem(path, error.message)


_BOUNDS = {
    "minimum": ">=",
    "maximum": "<=",
    "exclusiveMinimum": ">",
    "exclusiveMaximum": "<",
}


def _expected_types(expected: Any) -> str:
    names = [expected] if isinstance(expected, str) else list(expected)
    return " or ".join(_TYPE_NAMES.get(n, n) for n in names)


def _enum_message(value: Any, choices: list[Any], kind: Any) -> str:
    listed = ", ".join(str(c) for c in choices)
    if not isinstance(value, str):
        return f"expected one of {listed}, got {describe(value)}"
    hint = suggestion(value, [str(c) for c in choices])
    if isinstance(kind, str):
        # Long lists (check types, mutation types) only get the closest name.
        if not hint and len(choices) <= 10:
            hint = f" (expected one of {listed})"
        return f"unknown {kind} '{_short(value)}'{hint}"
    return f"'{_short(value)}' is not one of {listed}{hint}"
