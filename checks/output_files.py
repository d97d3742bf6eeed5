"""The files Keystone writes for its user (run reports, JUnit, Markdown, comparisons, replay
files): each one there whole or not at all.

A report written in place and interrupted (Ctrl-C, a full disk, a file-size limit, a CI job
killed at its timeout) left a truncated file where the previous complete one had been, which
a CI system then failed to parse. Here the text goes to a new file beside the target, which
replaces the target only once all of it is written (a rename within one directory, atomic on
POSIX); on any error the new file is removed and the target is as it was. The text arrives in
chunks, so a large report is never held in memory as one string. No Django here: the engine's
reporters use it too.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def write_whole(path: str | Path, chunks: Iterable[str]) -> Path:
    """Write the concatenated `chunks` as UTF-8 to `path`, creating its parent
    directories; returns `path`. Readers of a file there see the old one or the new one,
    never a part of either. Something there that is no regular file (`/dev/stdout`, a FIFO)
    is written to as a stream: it cannot be replaced. A link to a file keeps pointing at it:
    the file it names is replaced. No fsync: this guards against an interrupted writer, not
    a power cut."""
    target = Path(path)
    if target.exists() and not target.is_file():
        with target.open("w", encoding="utf-8") as stream:
            stream.writelines(chunks)
        return target
    real = Path(os.path.realpath(target))
    real.parent.mkdir(parents=True, exist_ok=True)
    partial, handle = _create_beside(real)
    try:
        with contextlib.suppress(FileNotFoundError):  # a file replaced keeps its mode
            os.fchmod(handle, stat.S_IMODE(real.stat().st_mode))
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.writelines(chunks)
        os.replace(partial, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return target


def _create_beside(target: Path) -> tuple[Path, int]:
    """A new file in the target's directory, created with the mode a plain write would give
    (0666 less the umask; mkstemp's would be 0600), and its descriptor."""
    while True:
        partial = target.with_name(f".{target.name}.{os.urandom(4).hex()}.partial")
        try:
            return partial, os.open(partial, _CREATE, 0o666)
        except FileExistsError:
            continue
