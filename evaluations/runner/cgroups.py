"""A control group per sandboxed command: a ceiling on the number of processes (a fork bomb
stops at it instead of reaching the host) and on the memory of the whole process tree (rlimits
only bound each process), and a way to kill every process the command left behind, even one
that left its process group, and even once the worker that started it has died (the group
is named after the worker's pid, `kill_orphans`).

The command's first shell waits on its standard input for a line, `go`, which the worker
writes once it has put that shell's PID into the group's `cgroup.procs` (`admit`): not one of
its children is ever born outside it, and nothing of the agent's runs before. The worker does
the moving, as root or as the delegated subtree's owner, so the shell may already run as the
execution's uid (the local backend starts it so, as_uid.py: one program fewer to start than
a root shell that joins, then drops, then starts the command's shell). A shell whose
worker died before admitting it reads end-of-file and exits 125. cgroup v1: a group
in the worker's own `pids` and `memory` hierarchies. cgroup v2 (the host has
/sys/fs/cgroup/cgroup.controllers): a group under the worker's own group, when that subtree
is delegated to it (writable, with both controllers). Where neither exists (no cgroup file
system, v2 without delegation, a worker without the right), `support()` says why, and the
execution carries a warning that the limits are not enforced on this host.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from evaluations.runner import owners

CGROUP_ROOT = Path("/sys/fs/cgroup")

# The line `admit` is followed by on the command's standard input.
GATE_LINE = b"go\n"
# The first shell's prologue: wait for the gate line (`read` takes one byte at a time from a
# pipe, so the command's own input, written after it, is left whole), then run what the
# caller adds (%s, shell commands ending in "&& "). The line is read into `keystone_gate`,
# unset again, so the command's environment reaches it as it was given.
_GATE = (
    'IFS= read -r keystone_gate && [ "$keystone_gate" = go ] || exit 125; '
    "unset keystone_gate; %strue || exit\n"
)


LIMITED = ("pids", "memory")
# cgroup v2: where the worker's own processes go once its group hands controllers to children
# (a group with controllers enabled for its children may hold no process itself). Not
# "keystone-" like the commands' groups, so stale-group cleaning never considers it.
_V2_WORKER_LEAF = "worker"


@dataclass(frozen=True, slots=True)
class _Hierarchy:
    """A cgroup hierarchy in which this worker can make its commands' groups."""

    parent: Path  # where this worker's groups are made
    controllers: tuple[str, ...]  # which of LIMITED it limits
    version: int  # 1 or 2


# The file that holds each limit, per cgroup version.
_LIMIT_FILES = {
    (1, "pids"): "pids.max",
    (1, "memory"): "memory.limit_in_bytes",
    (2, "pids"): "pids.max",
    (2, "memory"): "memory.max",
}


def _own_path(proc_self_cgroup: str, controller: str | None) -> str | None:
    """This process's group from /proc/self/cgroup: in the v1 hierarchy of `controller`, or
    the v2 one (`0::/path`) when `controller` is None."""
    for line in proc_self_cgroup.splitlines():
        hierarchy_id, controllers, path = line.split(":", 2)
        if controller is None and hierarchy_id == "0" and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return None


def _probe(parent: Path) -> None:
    probe = parent / f"keystone-probe-{uuid.uuid4().hex[:8]}"
    probe.mkdir()
    probe.rmdir()


def _find_v1(root: Path, proc_self_cgroup: str) -> tuple[tuple[_Hierarchy, ...], str]:
    found: list[_Hierarchy] = []
    reasons: list[str] = []
    for name in LIMITED:
        own = _own_path(proc_self_cgroup, name)
        parent = root / name / (own or "/").lstrip("/")
        try:
            _probe(parent)
        except OSError as exc:
            reasons.append(f"no writable {name} cgroup ({exc.strerror or exc})")
            continue
        found.append(_Hierarchy(parent, (name,), 1))
    return tuple(found), "; ".join(reasons)


def _find_v2(root: Path, proc_self_cgroup: str) -> tuple[tuple[_Hierarchy, ...], str]:
    """A subtree delegated to the worker: its own group, writable, with the pids and memory
    controllers. The first time, the group's processes move into a leaf child and the
    controllers are enabled for the children, where each command then gets its group."""
    own = _own_path(proc_self_cgroup, None)
    if own is None:
        return (), "cgroup v2, but this process is in no v2 group (/proc/self/cgroup)"
    base = root / own.lstrip("/")
    delegate = "run the worker in a systemd service or scope with Delegate=yes"
    try:
        available = set(_read(base / "cgroup.controllers").split())
        missing = [name for name in LIMITED if name not in available]
        if missing:
            return (), (
                f"cgroup v2: the worker's group {base} has no {' or '.join(missing)} "
                f"controller ({delegate})"
            )
        enabled = set(_read(base / "cgroup.subtree_control").split())
        if not set(LIMITED) <= enabled:
            leaf = base / _V2_WORKER_LEAF
            leaf.mkdir(exist_ok=True)
            for pid in _read(base / "cgroup.procs").split():
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    _write(leaf / "cgroup.procs", pid)
            _write(base / "cgroup.subtree_control", " ".join(f"+{n}" for n in LIMITED))
        _probe(base)
    except OSError as exc:
        return (), (
            f"cgroup v2 without a subtree delegated to the worker ({base}: "
            f"{exc.strerror or exc}; {delegate})"
        )
    return (_Hierarchy(base, LIMITED, 2),), ""


def find_hierarchies(root: Path, proc_self_cgroup: str) -> tuple[tuple[_Hierarchy, ...], str]:
    """Where this worker can make groups under `root`, and why not where it cannot: cgroup v2
    when `root` is a unified hierarchy (it has cgroup.controllers), else v1."""
    if (root / "cgroup.controllers").exists():
        return _find_v2(root, proc_self_cgroup)
    return _find_v1(root, proc_self_cgroup)


@functools.cache
def _controllers() -> tuple[tuple[_Hierarchy, ...], str]:
    """This host's hierarchies, found once per process."""
    try:
        proc_self_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError as exc:
        return (), f"cannot read /proc/self/cgroup ({exc})"
    return find_hierarchies(CGROUP_ROOT, proc_self_cgroup)


def support() -> tuple[bool, str]:
    """Whether process-count and memory ceilings hold here, and if not, why."""
    found, why = _controllers()
    names = {name for hierarchy in found for name in hierarchy.controllers}
    return names == set(LIMITED), why


def cpu_quota(root: Path, proc_self_cgroup: str) -> float | None:
    """How many CPUs the control groups of this process may use at most: the smallest quota
    over period on the way from its own group up to `root`'s (cgroup v2 `cpu.max`, v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us` in the `cpu` hierarchy); None when none is
    set. A container on a v1 host sees its own group at the hierarchy's root, while
    /proc/self/cgroup names its path on the host: then only that root is read."""
    unified = (root / "cgroup.controllers").exists()
    top = root if unified else root / "cpu"
    own = _own_path(proc_self_cgroup, None if unified else "cpu")
    group = top / (own or "/").lstrip("/")
    if not group.is_dir():
        group = top
    quotas = []
    while True:
        with contextlib.suppress(OSError, ValueError, ZeroDivisionError):
            if unified:
                quota, period = _read(group / "cpu.max").split()
            else:
                quota = _read(group / "cpu.cfs_quota_us").strip()
                period = _read(group / "cpu.cfs_period_us").strip()
            if quota not in ("max", "-1"):
                quotas.append(int(quota) / int(period))
        if group == top:
            return min(quotas, default=None)
        group = group.parent


def usable_cpus() -> int:
    """The CPUs this process can keep busy: those it may run on (its affinity mask, which a
    cpuset or `taskset` narrows), no more than its control groups' quota, rounded up (a
    container given two CPUs on a 64-core host has two, not 64). What pools size to."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    try:
        proc_self_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        return cpus
    quota = cpu_quota(CGROUP_ROOT, proc_self_cgroup)
    return cpus if quota is None else max(1, min(cpus, math.ceil(quota)))


class CommandCgroup:
    """The group of one command: made on enter, limits written; on exit every process still
    in it is killed and the group removed."""

    def __init__(
        self,
        *,
        max_processes: int | None,
        memory_mb: int | None,
        hierarchies: tuple[_Hierarchy, ...] | None = None,
    ) -> None:
        self.limits = {
            "pids": max_processes,
            "memory": None if memory_mb is None else memory_mb * 1024 * 1024,
        }
        self.hierarchies = _controllers()[0] if hierarchies is None else hierarchies
        self.paths: list[Path] = []

    def __enter__(self) -> CommandCgroup:
        name = f"keystone-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            for hierarchy in self.hierarchies:
                _remove_stale(hierarchy.parent)
                limits = {
                    _LIMIT_FILES[hierarchy.version, controller]: self.limits[controller]
                    for controller in hierarchy.controllers
                    if self.limits[controller] is not None
                }
                if not limits:
                    continue
                path = hierarchy.parent / name
                path.mkdir()
                self.paths.append(path)
                for file_name, limit in limits.items():
                    _write(path / file_name, str(limit))
        except OSError:
            self.__exit__()
            raise
        return self

    def wrap(
        self, argv: list[str], *, then: str = "", in_place: bool = False, gate: bool = False
    ) -> list[str]:
        """`argv` behind a shell prologue: once the group has paths (or `gate`: the caller
        has its own reason to hold the command back), wait for the gate line on standard
        input (`admit`); then run the shell commands `then` (`"ulimit -f 8 && "`: a failing
        one keeps the command from starting). `in_place`: every program in `argv` before its
        closing `/bin/sh -c COMMAND` execs the next in the same process, so that shell runs
        the prologue itself, then COMMAND, on its script's second line (one program fewer to
        start). Otherwise a shell of its own runs the prologue, then execs `argv` (bwrap
        forks: its children must be born inside the group)."""
        gate = gate or bool(self.paths)
        if not gate and not then:
            return argv
        prologue = (_GATE if gate else "%strue || exit\n") % then
        if in_place and len(argv) >= 3 and argv[-3:-1] == ["/bin/sh", "-c"]:
            return [*argv[:-1], prologue + argv[-1]]
        return ["/bin/sh", "-c", prologue + 'exec "$@"', "keystone-sandbox", *argv]

    def admit(self, pid: int) -> None:
        """Put the process `pid`, a shell waiting in `wrap`'s prologue, in every group; the
        caller then writes GATE_LINE to its standard input."""
        for path in self.paths:
            _write(path / "cgroup.procs", str(pid))

    @property
    def kills_leftovers(self) -> bool:
        """Whether the command runs in a group of its own, whose processes (all it starts,
        none able to leave) are killed on exit."""
        return bool(self.paths)

    def pids_hit_limit(self) -> bool:
        """Whether the command was refused a process because of the ceiling."""
        for path in self.paths:
            events = path / "pids.events"
            with contextlib.suppress(OSError, ValueError):
                if int(_read(events).split()[1]) > 0:
                    return True
        return False

    def __exit__(self, *exc: object) -> None:
        for path in self.paths:
            _empty(path)
        self.paths = []


# A command's group is named after the process that made it: keystone-PID-HEX. That process
# empties and removes it when the command ends; should it die first (a SIGKILL, the OOM
# killer), any other process of Keystone's that looks empties it instead.
_GROUP_NAME = re.compile(r"keystone-(\d+)-[0-9a-f]{32}")

# A group older than this with nothing in it, whose name says nothing of its maker (made by
# an earlier version), was left by a worker that died: removed by the next command. Younger
# ones may be a neighbour's that is about to receive its process.
_STALE_SECONDS = 120.0

# When this process last looked under each parent: a look reads every group's entry (a
# scandir, and a stat or a read of its maker's /proc/PID/stat each).
_looks = owners.Looks()


def _read(path: Path) -> str:
    """A control file's text. Through the descriptor alone: the file object Path.read_text
    and write_text open adds four or five system calls to each (an fstat, an ioctl, two
    lseek, and a second fstat to read), and a command reads three of these files and
    writes four."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


def _write(path: Path, text: str) -> None:
    """Write a control file in one write(2), which is how the kernel takes its value (opened
    as a shell's `>` and Path.write_text open it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def kill_orphans() -> None:
    """Now rather than at the next look: kill what runs in the groups of Keystone's processes
    that died, and remove the groups. For a process that has just seen another one of its
    run die, whose agents would otherwise run on until their command ends, with no one left to
    enforce its timeout."""
    _looks.forget()
    for hierarchy in _controllers()[0]:
        _remove_stale(hierarchy.parent)


def _remove_stale(parent: Path) -> None:
    """Empty and remove the groups whose maker died, and remove the empty, old groups of
    makers unknown. A group whose maker runs is never touched: the kernel refuses to remove
    one with processes in it. The groups under `parent` are made by the processes of this
    one's own group (a container has a group of its own), whose pids this process sees."""
    if not _looks.due(parent):
        return
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    limit = time.time() - _STALE_SECONDS
    for entry in entries:
        if not entry.name.startswith("keystone-") or not entry.is_dir(follow_symlinks=False):
            continue
        maker = _GROUP_NAME.fullmatch(entry.name)
        if maker is not None:
            if not owners.running(int(maker[1])):
                _empty(Path(entry.path))
            continue
        with contextlib.suppress(OSError):
            if entry.stat(follow_symlinks=False).st_mtime < limit:
                os.rmdir(entry.path)


def _empty(path: Path) -> None:
    """Kill every process left in the group, then remove it."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pids = [int(pid) for pid in _read(path / "cgroup.procs").split()]
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
