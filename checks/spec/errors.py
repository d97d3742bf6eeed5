"""Validation errors: a YAML path, a human message and where it is written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checks.wording import counted


@dataclass(frozen=True)
class SpecError:
    """One validation problem of a spec: its YAML path, a message for people, and where it is
    written."""

    path: str  # dotted YAML path ("invariants.tests_pass.check.type"), "" for the root
    message: str
    line: int | None  # 1-based
    column: int | None  # 1-based

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        if self.line is not None:
            text += f" at line {self.line}"
            if self.column is not None:
                text += f", col {self.column}"
        return text

    def sort_key(self) -> tuple[int, int, str, str]:
        return (self.line or 0, self.column or 0, self.path, self.message)


class SpecValidationError(Exception):
    """A spec that did not validate; `errors` holds every problem found, sorted by line."""

    def __init__(self, errors: list[SpecError], source: str = "<spec>") -> None:
        self.errors = list(errors)
        self.source = source
        super().__init__(self._summary())

    def _summary(self) -> str:
        head = f"{self.source}: {counted(len(self.errors), 'error')}"
        return "\n  ".join([head, *(str(e) for e in self.errors)])

    def __str__(self) -> str:
        return self._summary()


def format_path(path: tuple[Any, ...] | list[Any]) -> str:
    """('chaos_matrix', 1, 'tool_faults', 0) -> 'chaos_matrix[1].tool_faults[0]'."""
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
