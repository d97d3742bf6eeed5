"""Fixtures of the security tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory any user can traverse to (pytest's tmp_path is under a 0700 directory): a
    local agent runs as a uid of its own, and must reach its workspace under it."""
    directory = Path(tempfile.mkdtemp(prefix="keystone-sec-", dir="/tmp"))
    os.chmod(directory, 0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
