"""Files under a directory the agent could touch (its workspace), read and written by
Keystone without following anything the agent planted there.

The agent runs with write access to its workspace, and may keep running in the background.
Any file Keystone opens there may have been replaced by a link to a host file
(`/proc/self/environ`, another project's artifacts), a FIFO (an open that never returns) or
a huge file. So every access goes through this module:

- the path is walked one component at a time from a descriptor of the root, each directory
  opened with O_NOFOLLOW (a link anywhere on the way is refused, not followed);
- the file itself is opened with O_NOFOLLOW and O_NONBLOCK, and must be a regular file;
- reads are capped; writes replace whatever is at the path (unlink does not follow links)
  and create the file with O_EXCL, so a link put there in between is refused too.

A refused path raises UnsafePath (an OSError), which callers treat like a missing file and
report. No Django here: the engine's checks use it too.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

DEFAULT_READ_CAP = 16 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """The path leads through a link, or to something that is not a regular file."""


def read_bytes(root: Path, relative: str, *, cap: int = DEFAULT_READ_CAP) -> tuple[bytes, int]:
    """At most `cap` bytes of the regular file `relative` under `root`, and its full size.
    FileNotFoundError when there is nothing there; UnsafePath when it is not a plain file."""
    directory, name = _open_parent(root, relative, create=False)
    try:
        handle = _open_file(directory, name, os.O_RDONLY | os.O_NONBLOCK)
    finally:
        os.close(directory)
    with os.fdopen(handle, "rb") as file:
        size = _regular_size(handle, relative)
        return file.read(cap), size


def open_regular(root: Path, relative: str) -> BinaryIO:
    """The regular file `relative` under `root`, open for reading (for streaming)."""
    directory, name = _open_parent(root, relative, create=False)
    try:
        handle = _open_file(directory, name, os.O_RDONLY | os.O_NONBLOCK)
    finally:
        os.close(directory)
    try:
        _regular_size(handle, relative)
    except UnsafePath:
        os.close(handle)
        raise
    return os.fdopen(handle, "rb")


def read_text(root: Path, relative: str, *, cap: int = DEFAULT_READ_CAP) -> str | None:
    """The file as text (undecodable bytes replaced), or None when it is missing or unsafe."""
    try:
        data, _size = read_bytes(root, relative, cap=cap)
    except OSError:
        return None
    return data.decode("utf-8", errors="replace")


def write_bytes(root: Path, relative: str, data: bytes, *, mode: int = 0o644) -> Path:
    """Write `data` to `relative` under `root` (parents created), replacing what is there
    without following it. Returns the path written."""
    directory, name = _open_parent(root, relative, create=True)
    try:
        _remove(directory, name, relative)
        handle = _open_file(directory, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    finally:
        os.close(directory)
    os.fchmod(handle, mode)  # exactly `mode`, whatever the umask (scripts need their x bit)
    with os.fdopen(handle, "wb") as file:
        file.write(data)
    return root / relative


def write_text(root: Path, relative: str, text: str, *, mode: int = 0o644) -> Path:
    return write_bytes(root, relative, text.encode("utf-8"), mode=mode)


def remove(root: Path, relative: str) -> None:
    """Remove whatever file or link is at `relative` (nothing when there is none)."""
    try:
        directory, name = _open_parent(root, relative, create=False)
    except FileNotFoundError:
        return
    try:
        _remove(directory, name, relative)
    finally:
        os.close(directory)


def make_fifo(root: Path, relative: str) -> Path:
    """A fresh named pipe at `relative` (parents created); what was there is replaced."""
    directory, name = _open_parent(root, relative, create=True)
    try:
        _remove(directory, name, relative)
        os.mkfifo(name, 0o600, dir_fd=directory)
    finally:
        os.close(directory)
    return root / relative


def open_fifo(root: Path, relative: str, flags: int) -> int:
    """A descriptor of the named pipe at `relative`, refused when it is anything else."""
    directory, name = _open_parent(root, relative, create=False)
    try:
        handle = _open_file(directory, name, flags | os.O_NONBLOCK)
    finally:
        os.close(directory)
    if not stat.S_ISFIFO(os.fstat(handle).st_mode):
        os.close(handle)
        raise UnsafePath(f"{relative} is not a named pipe")
    return handle


def _open_parent(root: Path, relative: str, *, create: bool) -> tuple[int, str]:
    """A descriptor of the directory that holds `relative`, and the last component's name."""
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or ".." in parts:
        raise UnsafePath(f"{relative!r} is not a path inside the directory")
    directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=directory)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=directory)
                inner = os.open(part, _DIR_FLAGS, dir_fd=directory)
            except OSError as exc:  # ELOOP or ENOTDIR: a link, or a file where a directory was
                raise UnsafePath(f"{relative}: {part} is a link or not a directory") from exc
            os.close(directory)
            directory = inner
    except BaseException:
        os.close(directory)
        raise
    return directory, parts[-1]


def _open_file(directory: int, name: str, flags: int, mode: int = 0o644) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=directory)
    except FileNotFoundError:
        raise
    except FileExistsError as exc:  # O_EXCL: something appeared between unlink and open
        raise UnsafePath(f"{name}: replaced while Keystone wrote it") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the last component is a link
            raise UnsafePath(f"{name} is a link") from exc
        raise


def _regular_size(handle: int, relative: str) -> int:
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePath(f"{relative} is not a regular file")
    return info.st_size


def _remove(directory: int, name: str, relative: str) -> None:
    try:
        os.unlink(name, dir_fd=directory)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError) as exc:
        raise UnsafePath(f"{relative} is a directory") from exc
