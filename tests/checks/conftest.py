"""Fixtures for the engine's tests."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Callable, Iterator

import pytest


@pytest.fixture
def file_size_limit() -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """A context in which this process may not write a file past `bytes` (RLIMIT_FSIZE): a
    write beyond it fails with EFBIG, as on a full disk, instead of raising SIGXFSZ."""

    @contextlib.contextmanager
    def limit(size: int) -> Iterator[None]:
        before = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, before[1]))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, before)
            signal.signal(signal.SIGXFSZ, handler)

    return limit
