"""A control group per sandboxed command: a ceiling on the number of processes (a fork bomb
stops at it instead of reaching the host) and on the memory of the whole process tree (rlimits
only bound each process), and a way to kill every process the command left behind, even one
that left its process group.

The command joins its group itself before it execs (a small `sh` prologue writes its own PID
into `cgroup.procs`), so not one of its children is ever born outside it. Where no writable
hierarchy exists (no cgroup file system, cgroup v2 without a delegated subtree, a worker
without the right), `support()` says why, and the execution carries a warning that the limits
are not enforced on this host.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")

# Writes its own PID into every cgroup.procs given, then execs the rest of its arguments.
_JOIN = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'


@dataclass(frozen=True, slots=True)
class _Controller:
    name: str  # "pids" or "memory"
    parent: Path  # where this worker's groups are made


def _own_v1_path(controller: str) -> str | None:
    """This process's group in a cgroup v1 hierarchy, from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


@functools.cache
def _controllers() -> tuple[tuple[_Controller, ...], str]:
    """The hierarchies where this worker can make groups, and why not where it cannot."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return (), (
            "cgroup v2 without a subtree delegated to the worker (run it in a systemd "
            "scope with Delegate=yes)"
        )
    found: list[_Controller] = []
    reasons: list[str] = []
    for name in ("pids", "memory"):
        own = _own_v1_path(name)
        parent = CGROUP_ROOT / name / (own or "/").lstrip("/")
        probe = parent / f"keystone-probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            reasons.append(f"no writable {name} cgroup ({exc.strerror or exc})")
            continue
        found.append(_Controller(name, parent))
    return tuple(found), "; ".join(reasons)


def support() -> tuple[bool, str]:
    """Whether process-count and memory ceilings hold here, and if not, why."""
    found, why = _controllers()
    names = {c.name for c in found}
    return names == {"pids", "memory"}, why


class CommandCgroup:
    """The group of one command: made on enter, limits written; on exit every process still
    in it is killed and the group removed."""

    def __init__(self, *, max_processes: int | None, memory_mb: int | None) -> None:
        self.limits = {"pids": max_processes, "memory": memory_mb}
        self.paths: list[Path] = []

    def __enter__(self) -> CommandCgroup:
        name = f"keystone-{uuid.uuid4().hex}"
        try:
            for controller in _controllers()[0]:
                _remove_stale(controller.parent)
                limit = self.limits[controller.name]
                if limit is None:
                    continue
                path = controller.parent / name
                path.mkdir()
                self.paths.append(path)
                if controller.name == "pids":
                    (path / "pids.max").write_text(str(limit))
                else:
                    (path / "memory.limit_in_bytes").write_text(str(limit * 1024 * 1024))
        except OSError:
            self.__exit__()
            raise
        return self

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv`, started inside the group."""
        if not self.paths:
            return argv
        procs = [str(path / "cgroup.procs") for path in self.paths]
        return ["/bin/sh", "-c", _JOIN, "keystone-cgroup", str(len(procs)), *procs, *argv]

    def pids_hit_limit(self) -> bool:
        """Whether the command was refused a process because of the ceiling."""
        for path in self.paths:
            events = path / "pids.events"
            with contextlib.suppress(OSError, ValueError):
                if events.exists() and int(events.read_text().split()[1]) > 0:
                    return True
        return False

    def __exit__(self, *exc: object) -> None:
        for path in self.paths:
            _empty(path)
        self.paths = []


# A group older than this with nothing in it was left by a worker that died (its processes
# ended since): removed by the next command. Younger ones may be a neighbour's that is
# about to receive its process.
_STALE_SECONDS = 120.0


def _remove_stale(parent: Path) -> None:
    """Remove the empty groups dead workers left behind; a group with processes in it cannot
    be removed (the kernel refuses), so a live one is never touched."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    limit = time.time() - _STALE_SECONDS
    for entry in entries:
        if entry.name.startswith("keystone-") and entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < limit:
                    os.rmdir(entry.path)


def _empty(path: Path) -> None:
    """Kill every process left in the group, then remove it."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        path.rmdir()
