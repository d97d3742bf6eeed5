"""Terminal output helpers shared by the `keystone` commands (no Django, no engine)."""

from __future__ import annotations

import os
from typing import TextIO


def use_color(choice: str, stream: TextIO) -> bool:
    """--color auto|always|never: auto colours a terminal unless NO_COLOR is set."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty()
