"""JSON text as every other parser reads it (RFC 8259), for what the agent and its model send.

Python's json module also reads NaN, Infinity and -Infinity, which no other JSON parser does
(an agent's `{"price": NaN}` breaks the program that reads it), and NaN compares false to
every bound, so it passed a schema's minimum and maximum. Pure: no Django.
"""

from __future__ import annotations

import json
from typing import Any


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def loads_strict(text: str | bytes) -> Any:
    """json.loads without NaN and the infinities; ValueError when `text` is not JSON."""
    return json.loads(text, parse_constant=_not_json)
