"""Which process made what outlives a SIGKILL of the process that made it: a command's
cgroup, a Docker container, an `agent.start` server, a throwaway PostgreSQL cluster (and a
uid's lock file, which the kernel unlocks). Its maker stops it when done; should the maker be
killed first (kill -9, the OOM killer), any other process of Keystone's on the host can tell,
from the pid the thing is marked with, and stop it instead. Nothing else would: an agent left
running keeps running as long as it likes, with no one left to enforce its timeout.
"""

from __future__ import annotations

import functools
import math
import os
import stat
import time
from pathlib import Path

# How often a process looks for what dead processes left (a listing each: of a directory, or
# a request to the Docker engine).
LOOK_SECONDS = 30.0


class Looks:
    """When this process last looked for what dead processes left, per place (a cgroup
    parent, a lock directory, ...): a look is due at the first time, then every
    LOOK_SECONDS."""

    def __init__(self) -> None:
        self._last: dict[object, float] = {}  # place -> time.monotonic() of the last look

    def due(self, place: object) -> bool:
        """Whether to look at `place` now; if so, the look is counted as made."""
        now = time.monotonic()
        if now - self._last.get(place, -math.inf) < LOOK_SECONDS:
            return False
        self._last[place] = now
        return True

    def forget(self) -> None:
        """The next look at every place is due at once."""
        self._last.clear()


def start_time(pid: int) -> int | None:
    """When the process `pid` started, in clock ticks since the boot: with its pid, what
    tells it from a later process given the same pid. None once it has ended, or when that
    cannot be told."""
    try:
        stat = _stat(pid)
    except OSError:
        return None
    if stat is None or stat[0] in ("Z", "X"):
        return None
    return int(stat[19])  # the 22nd field of /proc/PID/stat, the 3rd (state) being [0]


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name; None when there is no such
    process. OSError when it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError):  # ProcessLookupError: ended as it was read
        return None
    return text.rpartition(")")[2].split() or None


def running(pid: int) -> bool:
    """Whether the process `pid` (of this process's PID namespace) has not ended. A zombie
    has: only its exit status is left, for its parent to read. When that cannot be told, it
    runs: what a living process made is never stopped."""
    try:
        stat = _stat(pid)
    except OSError:
        return True
    return stat is not None and stat[0] not in ("Z", "X")


@functools.cache
def _namespace() -> str | None:
    """This host's boot and this process's PID namespace: where a pid names one process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def this_process() -> str:
    """This process, as it marks what it makes where the processes of other hosts and PID
    namespaces make things too (a Docker engine): BOOT_ID/pid:[INODE]/PID."""
    return f"{_namespace() or 'unknown'}/{os.getpid()}"


def ended(owner: str) -> bool:
    """Whether `owner` (a process's `this_process()`) is a process of this host and PID
    namespace that has ended. One of elsewhere may run, as far as this process can tell."""
    namespace, _, pid = owner.rpartition("/")
    here = _namespace()
    return here is not None and namespace == here and pid.isdigit() and not running(int(pid))


def read_own_file(path: Path) -> str:
    """The text of a file, in a directory anyone may write to (the temporary directory), that
    names what to stop: only if this process's user wrote it, or another user could have this
    process kill what they choose. OSError for a link, anything but a regular file, or a file
    of another user."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(f"{path} is not a file of this user's")
        return os.read(fd, 4096).decode()
    finally:
        os.close(fd)
