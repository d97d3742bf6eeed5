"""Whole numbers people type: ids and version numbers in form fields, query strings, labels
and cursors."""

from __future__ import annotations

from typing import Any

# Digits in the largest whole number read: every 18-digit number fits in PostgreSQL's bigint
# and SQLite's INTEGER (at most 2**63 - 1, 19 digits).
WHOLE_NUMBER_DIGITS_MAX = 18


def whole_number(text: Any) -> int | None:
    """`text` as a whole number >= 0, or None when it is not one. str.isdigit() alone let
    through what int() refuses ('²', other non-ASCII digits; more than 4300 digits) and
    numbers too large for the database's integers: each was a 500."""
    value = str(text if text is not None else "").strip()
    if not (value.isascii() and value.isdigit()) or len(value) > WHOLE_NUMBER_DIGITS_MAX:
        return None
    return int(value)
