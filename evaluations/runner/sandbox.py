"""Sandboxes: where an agent's commands run. One interface, three backends.

- `local`: a plain subprocess in its own process group with rlimits and a clean environment.
- `bwrap`: bubblewrap; read-only system, writable workspace only, private /tmp, own PID namespace.
- `docker`: a container per command through the docker SDK.

Every backend gets a shell command string, runs it with `sh -c` in the workspace, caps what
it prints, kills everything it started on timeout, and reports a `ProcessResult`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import resource
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks import safe_files
from checks.context import CommandResult, CommandRunner
from evaluations.runner import as_uid, local_uids, owners, relay
from evaluations.runner.cgroups import GATE_LINE, CommandCgroup
from evaluations.runner.egress import EgressRelay, Endpoint, trap_ports
from evaluations.runner.workspace import AGENT_HOME, KEYSTONE_DIR

NETWORK_MODES = ("none", "services", "host")
DEFAULT_MAX_OUTPUT_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_FILE_BYTES = 1024 * 1024 * 1024
# Processes (threads included) the whole command tree may have at once: a fork bomb stops
# here. Enforced through a cgroup where the host has one to give (evaluations/runner/cgroups.py).
DEFAULT_MAX_PROCESSES = 512
# What the workspace may hold while a command runs (sandbox.resources.disk_mb).
DEFAULT_DISK_MB = 2048
# The agent's HOME (and, on the local backend, its TMPDIR), in the workspace.
HOME_DIR = f"{KEYSTONE_DIR}/{AGENT_HOME}"
# How long to keep reading a pipe after the process exited (its killed children close it).
_DRAIN_SECONDS = 2.0
_READ_CHUNK = 64 * 1024

LOCAL_FALLBACK_WARNING = "bubblewrap is not usable on this host; executions run as plain local processes without isolation"


@dataclass(slots=True)
class ProcessResult:
    """How a sandboxed command ended: exit code, output (cut at the cap), time and CPU used,
    and why it could not start or was killed."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_ms: float
    cpu_ms: float | None  # the child's own user+sys CPU time; None where it cannot be measured
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: str | None = None  # the sandbox could not start the command at all
    # A limit the command broke and was killed for ("disk limit 100 MB exceeded ..."): the
    # agent's own doing, so a failure, not an error of the sandbox.
    limit_exceeded: str | None = None
    # Connections the command tried to addresses its execution did not declare, where the
    # sandbox could see them (egress.py): {"host", "port", "time"}.
    refused_connections: list[dict[str, Any]] = field(default_factory=list)


class SandboxUnavailable(Exception):
    """The requested backend cannot run on this host (no engine, no bubblewrap)."""


@dataclass(frozen=True, slots=True)
class _RunRequest:
    """One `Sandbox.run` call, checked: everything a backend needs to start the command."""

    command: str
    workspace: Path
    env: dict[str, str]
    stdin: str | None
    timeout: float
    max_output_bytes: int
    cpus: float | None
    memory_mb: int | None
    network: str
    ro_binds: Sequence[Path]
    max_file_bytes: int
    egress: Sequence[Endpoint]
    max_processes: int | None
    disk_mb: int | None

    @property
    def file_size_limit(self) -> int:
        """RLIMIT_FSIZE: no single file larger than the whole workspace may be."""
        if self.disk_mb is None:
            return self.max_file_bytes
        return min(self.max_file_bytes, self.disk_mb * 1024 * 1024)


class Sandbox(ABC):
    name: str = ""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        # How to stop each thing this sandbox started that still runs (see `stoppable`).
        self._stops: list[Callable[[], object]] = []

    def run(
        self,
        command: str,
        *,
        workspace: Path,
        env: dict[str, str],
        stdin: str | None = None,
        timeout: float = 600.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        cpus: float | None = None,
        memory_mb: int | None = None,
        network: str = "services",
        ro_binds: Sequence[Path] = (),
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        egress: Sequence[Endpoint] = (),
        max_processes: int | None = DEFAULT_MAX_PROCESSES,
        disk_mb: int | None = DEFAULT_DISK_MB,
    ) -> ProcessResult:
        """Run `sh -c command` in `workspace` with exactly `env` (plus minimal defaults).
        `ro_binds` are extra host directories the command may read, at the same path.
        `egress` are the only addresses `network: services` lets the command reach (where
        the backend can enforce it: bwrap)."""
        # Checked for every backend, local included where the mode cannot be enforced, so
        # that a typo fails everywhere alike.
        _check_network(network)
        _ensure_home(workspace)
        request = _RunRequest(
            command=command,
            workspace=workspace,
            env=env,
            stdin=stdin,
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            cpus=cpus,
            memory_mb=memory_mb,
            network=network,
            ro_binds=ro_binds,
            max_file_bytes=max_file_bytes,
            egress=tuple(egress),
            max_processes=max_processes,
            disk_mb=disk_mb,
        )
        return self._run(request)

    @abstractmethod
    def _run(self, request: _RunRequest) -> ProcessResult:
        """Start the command the backend's way, wait for it within its limits, report it."""

    def stop_all(self) -> None:
        """Stop everything this sandbox started that still runs, and from now on whatever it
        starts, at once (run cancellation: an execution may be about to start its agent
        when its run is cancelled)."""
        with self._lock:
            self._stopped = True
            stops = list(self._stops)
        for stop in stops:
            stop()

    @property
    def stopped(self) -> bool:
        """stop_all was called: the execution's run was cancelled."""
        return self._stopped

    @contextlib.contextmanager
    def stoppable(self, stop: Callable[[], object]) -> Iterator[None]:
        """While the block runs, stop_all calls `stop`: for what this sandbox has just
        started (a process group, a container, an HTTP agent's connection). When stop_all
        came first, `stop` is called at once."""
        with self._lock:  # either stop_all finds `stop`, or this sees _stopped
            self._stops.append(stop)
            stopped = self._stopped
        try:
            if stopped:
                stop()
            yield
        finally:
            with self._lock:
                self._stops.remove(stop)

    def release(self, workspace: Path | None = None) -> None:
        """The execution is over (its last command ended): give back what the sandbox held
        for it (the local backend's uid). `workspace`: the workspace when it stays on disk."""
        return None  # the other backends hold nothing beyond a command

    def workspace_path(self, workspace: Path) -> str:
        """Where the workspace appears to the command."""
        return str(workspace)

    def run_warnings(self, workspace: Path) -> list[str]:
        """What the run should say about this sandbox's isolation of `workspace`'s commands."""
        return []

    def python_executable(self) -> str:
        """The interpreter a python agent runs with inside this sandbox."""
        return sys.executable

    def default_path(self) -> str:
        # Keystone's own interpreter first, so `python` in an agent's command is the one the
        # python agents run with (and its packages, such as the openai SDK).
        return f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"

    def command_runner(
        self,
        workspace: Path,
        env: dict[str, str],
        *,
        network: str = "services",
        cpus: float | None = None,
        memory_mb: int | None = None,
        max_output_bytes: int = 1024 * 1024,
        ro_binds: Sequence[Path] = (),
        egress: Sequence[Endpoint] = (),
    ) -> CommandRunner:
        """A `checks` CommandRunner, so `command_exit` checks run where the agent ran."""

        def run(command: str, *, stdin: str | None = None, timeout: float = 60.0) -> CommandResult:
            result = self.run(
                command,
                workspace=workspace,
                env=env,
                stdin=stdin,
                timeout=timeout,
                max_output_bytes=max_output_bytes,
                cpus=cpus,
                memory_mb=memory_mb,
                network=network,
                ro_binds=ro_binds,
                egress=egress,
            )
            stderr = result.stderr if result.error is None else (result.stderr + result.error)
            exit_code = result.exit_code if result.exit_code is not None else -1
            return CommandResult(
                exit_code, result.stdout, stderr, timed_out=result.timed_out, error=result.error
            )

        return run

    def _environment(self, env: dict[str, str], workspace_in_sandbox: str) -> dict[str, str]:
        """Only what the caller passes, over minimal defaults; never the server's os.environ."""
        defaults = {
            "PATH": self.default_path(),
            "HOME": f"{workspace_in_sandbox}/{HOME_DIR}",
            "LANG": "C.UTF-8",
        }
        merged = {**defaults, **{key: str(value) for key, value in env.items()}}
        merged["KEYSTONE_WORKSPACE"] = workspace_in_sandbox
        return merged


def _check_network(network: str) -> None:
    if network not in NETWORK_MODES:
        raise ValueError(
            f"unknown network mode {network!r} (expected one of {', '.join(NETWORK_MODES)})"
        )


# --------------------------------------------------------------------------- output capture


class _CappedBuffer:
    """Keeps the first `cap` bytes and counts the rest, so a flooding process costs no memory."""

    def __init__(self, cap: int) -> None:
        self.cap = max(0, cap)
        self.data = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... truncated {self.dropped} bytes by Keystone]"
        return text


# --------------------------------------------------------------------------- disk


def disk_usage(root: Path) -> int:
    """Bytes the tree under `root` takes on disk: allocated blocks (a sparse file costs what
    it stores), each inode once (hard links), links never followed."""
    total = 0
    seen: set[tuple[int, int]] = set()
    pending = [str(root)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue  # removed while we looked: it holds nothing any more
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
            if stat.S_ISDIR(info.st_mode):
                pending.append(entry.path)
    return total


class DiskWatch:
    """Measures the workspace while a command runs and calls `kill` once it holds more than
    `limit_mb`: RLIMIT_FSIZE bounds one file, this bounds all of them together.

    One thread (`_DiskWatcher`) measures every watched workspace of the process in turn,
    instead of a thread per command: most commands end before their first measurement, and
    starting and joining a thread for each cost more than the command's own bookkeeping.
    Each workspace's interval adapts to what measuring it costs (ten times it, at least
    50 ms), so a workspace of many files is not walked without pause; a fast writer can
    therefore go past the limit by what it writes in one interval before it is killed."""

    def __init__(self, workspace: Path, limit_mb: int | None, kill: Callable[[], object]) -> None:
        self.workspace = workspace
        self.limit_mb = limit_mb
        self.kill = kill
        self.exceeded = False
        self.next_check = 0.0

    def __enter__(self) -> DiskWatch:
        if self.limit_mb is not None:
            self.next_check = time.monotonic() + _DISK_INTERVAL
            _DISK_WATCHER.add(self)
        return self

    def over_limit(self) -> bool:
        """Measure now (on the watcher's thread), and say when the next measurement is due."""
        assert self.limit_mb is not None
        began = time.perf_counter()
        over = disk_usage(self.workspace) > self.limit_mb * 1024 * 1024
        self.next_check = time.monotonic() + max(_DISK_INTERVAL, 10 * (time.perf_counter() - began))
        return over

    @property
    def message(self) -> str | None:
        if not self.exceeded:
            return None
        return (
            f"disk limit {self.limit_mb} MB exceeded: the workspace grew past it and the "
            "command was killed (sandbox.resources.disk_mb)"
        )

    def __exit__(self, *exc: object) -> None:
        if self.limit_mb is not None:
            _DISK_WATCHER.remove(self)


_DISK_INTERVAL = 0.05


class _DiskWatcher:
    """The thread that measures every DiskWatch of this process when it is due. It starts
    with the first watch and sleeps while there is none."""

    def __init__(self) -> None:
        self._watches: set[DiskWatch] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, watch: DiskWatch) -> None:
        with self._changed:
            self._watches.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="keystone-disk-watch"
                )
                self._thread.start()
            self._changed.notify()

    def remove(self, watch: DiskWatch) -> None:
        # `kill` is called under the same lock: once this returns, it is never called for a
        # command that has ended (its pid or container may belong to another by then).
        with self._changed:
            self._watches.discard(watch)

    def _loop(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [w for w in self._watches if w.next_check <= now and not w.exceeded]
                if not due:
                    soonest = min((w.next_check for w in self._watches), default=None)
                    self._changed.wait(None if soonest is None else soonest - now)
                    continue
            for watch in due:  # measured without the lock: commands start and end meanwhile
                over = watch.over_limit()
                with self._changed:
                    if over and watch in self._watches:
                        watch.exceeded = True
                        watch.kill()


_DISK_WATCHER = _DiskWatcher()


# --------------------------------------------------------------------------- local processes


def _limits(cpu_seconds: int | None, memory_mb: int | None, max_file_bytes: int | None) -> str:
    """The rlimits as `ulimit` commands for the command's first shell (the one its cgroups
    admit): no preexec function in the worker, so Python can vfork instead of copying the
    whole worker for every spawn (6.6 ms against 1 ms for a 110 MB worker), and no program
    of its own to exec for them. The units are /bin/sh's (POSIX mode): seconds, KiB of
    address space, 512-byte blocks of file size. The CPU time's soft limit goes first
    (SIGXCPU), then a hard one a second later (SIGKILL). Never above the worker's own hard
    limits, which the shell inherits: it may already run as the execution's uid, which can
    lower a limit but not raise it."""
    limits = ""
    if cpu_seconds is not None:
        hard = _within_hard_limit(resource.RLIMIT_CPU, cpu_seconds + 1, 1)
        limits += f"ulimit -S -t {min(cpu_seconds, hard)} && ulimit -H -t {hard} && "
    if memory_mb is not None:
        limits += f"ulimit -v {_within_hard_limit(resource.RLIMIT_AS, memory_mb * 1024, 1024)} && "
    if max_file_bytes is not None:
        blocks = max(1, max_file_bytes // 512)
        limits += f"ulimit -f {_within_hard_limit(resource.RLIMIT_FSIZE, blocks, 512)} && "
    return limits


def _within_hard_limit(which: int, value: int, unit: int) -> int:
    """`value` (in `unit` bytes or seconds), lowered to this process's hard limit `which`."""
    hard = resource.getrlimit(which)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, max(1, hard // unit))


NOBODY = 65534


def _hand_to(workspace: Path, uid: int) -> None:
    """Make the workspace `uid`'s (group too), its top directory closed to every other user
    (0700): an agent running as `uid` can write it, no other execution's agent can enter it,
    and Keystone (root) still reads and removes all of it. Links are changed, never followed
    (lchown; os.walk does not descend into them). Each entry once: a directory as its
    parent's entry, the top one before the walk."""
    os.lchown(workspace, uid, uid)
    for directory, dirnames, filenames in os.walk(workspace):
        for name in dirnames + filenames:
            os.lchown(os.path.join(directory, name), uid, uid)
    os.chmod(workspace, 0o700)


def _closed_to_others(path: Path) -> Path | None:
    """The first directory on the way to `path` that users other than its owner cannot
    traverse (no `x` for others), or None when any user can reach it."""
    for directory in reversed(path.resolve().parents):
        try:
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                return directory
        except OSError:
            return directory
    return None


@functools.cache
def _interpreter_closed_to_others() -> Path | None:
    """_closed_to_others of Keystone's interpreter, looked up once per process: where it is
    installed does not change while the process runs, and only a warning depends on it."""
    return _closed_to_others(Path(sys.executable))


def _kill_unreaped(pid: int) -> None:
    """Kill the group of our child `pid` from another thread, unless it was reaped already:
    then its group id may belong to someone else by now."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return
    _kill_group(pid)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _ProcessSandbox(Sandbox):
    """Runs an argv on this machine in a new session; shared by `local` and `bwrap`."""

    @abstractmethod
    def argv(
        self,
        command: str,
        *,
        workspace: Path,
        network: str,
        ro_binds: Sequence[Path] = (),
        egress: EgressRelay | None = None,
    ) -> list[str]:
        """What to execute on this machine so that `sh -c command` runs as the backend means;
        `egress` is the worker's end of the relay to the execution's endpoints, when the
        backend gives the command a network of its own."""

    def _run(self, request: _RunRequest) -> ProcessResult:
        with contextlib.ExitStack() as stack:
            egress = None
            if self.isolates_network and request.network == "services" and request.egress:
                # Traps only with endpoints, as under Docker: the relay runs for them anyway,
                # and starting it just for the traps would cost every execution a Python
                # start. It runs as nobody without capability inside: no port below 1024.
                traps = trap_ports(request.egress, lowest=1024)
                egress = stack.enter_context(EgressRelay(request.egress, traps=traps))
                egress.listen_unix()
            group = stack.enter_context(
                CommandCgroup(max_processes=request.max_processes, memory_mb=request.memory_mb)
            )
            result = self._start(request, egress, group)
            if egress is not None:
                result.refused_connections = list(egress.refused)
            return result

    # Whether `network: services` gets a network namespace reaching only `egress`.
    isolates_network = False
    # Whether argv() execs `/bin/sh -c COMMAND` in the process it starts (no fork on the
    # way), so that shell can be the one the command's cgroups admit (CommandCgroup.wrap).
    execs_in_place = False

    def _start_as(self, workspace: Path) -> int | None:
        """The uid to start the command as (as_uid.run_as), or None: as the worker."""
        return None

    def _start(
        self, request: _RunRequest, egress: EgressRelay | None, group: CommandCgroup
    ) -> ProcessResult:
        workspace = request.workspace
        argv = self.argv(
            request.command,
            workspace=workspace,
            network=request.network,
            ro_binds=request.ro_binds,
            egress=egress,
        )
        # The environment goes to the process itself, never onto a command line (bwrap's
        # --setenv), where any process on the host could read secrets in /proc/PID/cmdline.
        env = self._environment(request.env, str(workspace))
        limits = _limits(
            _cpu_limit(request.timeout, request.cpus), request.memory_mb, request.file_size_limit
        )
        # The command's first shell waits on its input for the gate line (cgroups.py): until
        # it is in its cgroups, and until the thread that started it as another uid is gone
        # (as_uid.py). The input is a pipe then, given back to /dev/null when the command
        # has none.
        uid = self._start_as(workspace)
        gated = group.kills_leftovers or uid is not None
        stdin = (request.stdin or "").encode() if request.stdin is not None or gated else None
        if gated and request.stdin is None:
            limits += "exec </dev/null && "
        launched = group.wrap(argv, then=limits, in_place=self.execs_in_place, gate=gated)

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                launched,
                cwd=workspace,
                env=env,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # own process group: the whole tree dies together
                close_fds=True,
            )

        started = time.perf_counter()
        try:
            process = start() if uid is None else as_uid.run_as(uid, start)
        except OSError as exc:
            return ProcessResult(
                None, "", "", False, 0.0, None, error=f"could not start {argv[0]}: {exc}"
            )
        try:
            if gated:
                try:
                    group.admit(process.pid)
                except OSError as exc:  # nothing of the command ran: it waits at the gate
                    _kill_group(process.pid)
                    _reap(process.pid)
                    return ProcessResult(
                        None, "", "", False, 0.0, None, error=f"could not limit the command: {exc}"
                    )
                stdin = GATE_LINE + (stdin or b"")
            with (
                self.stoppable(lambda: _kill_unreaped(process.pid)),
                DiskWatch(workspace, request.disk_mb, lambda: _kill_unreaped(process.pid)) as disk,
            ):
                result = self._communicate(
                    process, stdin, started, request.timeout, request.max_output_bytes
                )
            result.limit_exceeded = disk.message
            if group.pids_hit_limit():  # said where the agent's own errors are read
                result.stderr += (
                    f"\nkeystone: the process limit ({request.max_processes}) was reached; "
                    "further processes were refused (sandbox.resources.max_processes)\n"
                )
            return result
        finally:
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    stream.close()

    def _communicate(
        self,
        process: subprocess.Popen[bytes],
        stdin: bytes | None,
        started: float,
        timeout: float,
        max_output_bytes: int,
    ) -> ProcessResult:
        assert process.stdout is not None and process.stderr is not None
        out, err = _CappedBuffer(max_output_bytes), _CappedBuffer(max_output_bytes)
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ, out)
        selector.register(process.stderr, selectors.EVENT_READ, err)
        pending_input = memoryview(stdin or b"")
        if process.stdin is not None:
            os.set_blocking(process.stdin.fileno(), False)
            selector.register(process.stdin, selectors.EVENT_WRITE, "stdin")
        exit_watch = _ExitWatch(process.pid, selector)

        deadline = started + timeout
        timed_out = False
        status: int | None = None
        rusage: resource.struct_rusage | None = None
        drain_until = math.inf
        try:
            while True:
                now = time.perf_counter()
                if status is None and now >= deadline:
                    timed_out = True
                    _kill_group(process.pid)
                    status, rusage = _reap(process.pid)
                    exit_watch.stop()
                    drain_until = time.perf_counter() + _DRAIN_SECONDS
                if status is not None and (now >= drain_until or not _has_readers(selector)):
                    break
                wait = (deadline if status is None else drain_until) - now
                for key, _events in selector.select(min(max(wait, 0.0), exit_watch.poll_interval)):
                    if key.data == "exit":
                        continue  # handled by exit_watch below
                    if key.data == "stdin":
                        pending_input = _write_some(process, selector, pending_input)
                        continue
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if chunk:
                        key.data.feed(chunk)
                    else:
                        selector.unregister(key.fileobj)
                if status is None and exit_watch.exited():
                    # Kill what the agent left running before reaping it (its pid is still
                    # reserved as a zombie, so the group id cannot have been reused).
                    _kill_group(process.pid)
                    status, rusage = _reap(process.pid)
                    exit_watch.stop()
                    drain_until = time.perf_counter() + _DRAIN_SECONDS
        finally:
            exit_watch.close()
            selector.close()
            if status is None:
                _kill_group(process.pid)
                status, rusage = _reap(process.pid)
        process.returncode = os.waitstatus_to_exitcode(status)
        cpu_ms = None if rusage is None else (rusage.ru_utime + rusage.ru_stime) * 1000
        return ProcessResult(
            exit_code=process.returncode,
            stdout=out.text(),
            stderr=err.text(),
            timed_out=timed_out,
            duration_ms=(time.perf_counter() - started) * 1000,
            cpu_ms=cpu_ms,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
        )


def _reap(pid: int) -> tuple[int, resource.struct_rusage | None]:
    """Wait for the child and take its rusage (its own CPU time plus its reaped children's)."""
    try:
        _pid, status, rusage = os.wait4(pid, 0)
    except ChildProcessError:  # reaped elsewhere: the status is lost, the process is gone
        return 0, None
    return status, rusage


def _has_readers(selector: selectors.BaseSelector) -> bool:
    return any(isinstance(key.data, _CappedBuffer) for key in selector.get_map().values())


def _write_some(
    process: subprocess.Popen[bytes], selector: selectors.BaseSelector, pending: memoryview
) -> memoryview:
    assert process.stdin is not None
    try:
        written = os.write(process.stdin.fileno(), pending[:_READ_CHUNK])
        pending = pending[written:]
    except BlockingIOError:
        return pending
    except (BrokenPipeError, ConnectionResetError):
        pending = pending[:0]  # the command does not read its input: that is its business
    if not pending:
        selector.unregister(process.stdin)
        process.stdin.close()
    return pending


class _ExitWatch:
    """Tells when the child exited without reaping it: a pidfd in the selector where the
    kernel has them (no polling latency), else a short poll with waitid(WNOWAIT)."""

    def __init__(self, pid: int, selector: selectors.BaseSelector) -> None:
        self.pid = pid
        self.selector = selector
        self.fd: int | None = None
        self.poll_interval = 0.005
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return
        selector.register(self.fd, selectors.EVENT_READ, "exit")
        self.poll_interval = math.inf

    def exited(self) -> bool:
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def stop(self) -> None:
        """After reaping: a pidfd of a reaped child stays readable and would spin the loop."""
        if self.fd is not None:
            self.selector.unregister(self.fd)
            os.close(self.fd)
            self.fd = None
        self.poll_interval = math.inf

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class LocalSandbox(_ProcessSandbox):
    """No isolation beyond a process group and session, rlimits, a clean environment and,
    when the worker is root, a user of the execution's own: a uid of KEYSTONE_LOCAL_UIDS
    (local_uids.py) held from its first command until `release`, so the agent can neither
    signal the worker nor read its files, nor enter another execution's workspace (mode
    0700, its own uid's) or read its processes' environment."""

    name = "local"
    execs_in_place = True  # the shell itself

    def __init__(self, uids: range | None = None) -> None:
        super().__init__()
        self._uids = uids  # None: the configured range, read when a uid is first needed
        self._lease: local_uids.UidLease | None = None
        self._lease_lock = threading.Lock()
        # workspace -> the first directory on the way to it that others cannot traverse:
        # looked up once per execution (a stat of every directory on the way), not at each
        # of its commands' two questions and the run's warnings.
        self._closed: dict[Path, Path | None] = {}

    def _closed_to_others(self, workspace: Path) -> Path | None:
        if workspace not in self._closed:
            self._closed[workspace] = _closed_to_others(workspace)
        return self._closed[workspace]

    def _environment(self, env: dict[str, str], workspace_in_sandbox: str) -> dict[str, str]:
        # Without a mount namespace there is no private /tmp: temporary files go in the
        # workspace, removed with it and out of other executions' reach, not in the host's
        # /tmp (a TMPDIR the spec sets still wins). In the agent's HOME, which every command
        # has (_ensure_home), not a directory of their own: one inode fewer to make and
        # remove per execution (see write_audit's call in the harness for what that costs).
        tmp = {"TMPDIR": f"{workspace_in_sandbox}/{HOME_DIR}"}
        return {**tmp, **super()._environment(env, workspace_in_sandbox)}

    def _runs_as_own_uid(self, workspace: Path) -> bool:
        # As its own uid wherever another user can reach the workspace (without a mount
        # namespace there is no other way in); elsewhere the run carries a warning
        # (run_warnings).
        return os.getuid() == 0 and self._closed_to_others(workspace) is None

    @property
    def uid(self) -> int | None:
        """The uid this execution's agent runs as, once its first command has started."""
        lease = self._lease
        return None if lease is None else lease.uid

    def _hold_uid(self) -> local_uids.UidLease:
        with self._lease_lock:
            if self._lease is None:
                self._lease = local_uids.acquire(self._uids)
            return self._lease

    def release(self, workspace: Path | None = None) -> None:
        """The execution is over: kill whatever its agent left running, give `workspace`
        back to root if it is still on disk (kept), then give the uid back."""
        with self._lease_lock:
            lease, self._lease = self._lease, None
        if lease is not None:
            lease.release(workspace)

    def run_warnings(self, workspace: Path) -> list[str]:
        if os.getuid() != 0:
            return [
                f"the local backend runs the agent as the worker's own user (uid {os.getuid()}):"
                " it can signal the worker's processes and read every file the worker can"
                " (use sandbox.backend: bwrap)"
            ]
        blocked = self._closed_to_others(workspace)
        if blocked is not None:
            return [
                "the local backend runs the agent as root, the worker's own user: the "
                f"execution's uid (one of {local_uids.SETTING}) cannot traverse "
                f"{blocked} to reach the workspace (keep KEYSTONE_HOME where other users can "
                "traverse, or use sandbox.backend: bwrap)"
            ]
        interpreter = _interpreter_closed_to_others()
        if interpreter is not None:
            return [
                "the local backend runs the agent as a uid of the execution's (one of "
                f"{local_uids.SETTING}), which cannot traverse {interpreter} to Keystone's "
                f"interpreter {sys.executable}: python agents and `python` in commands will "
                "not start (install Keystone where other users can reach it, or use "
                "sandbox.backend: bwrap)"
            ]
        return []

    def _start(
        self, request: _RunRequest, egress: EgressRelay | None, group: CommandCgroup
    ) -> ProcessResult:
        if self._runs_as_own_uid(request.workspace):
            try:
                lease = self._hold_uid()
            except (local_uids.LocalUidsUnavailable, OSError) as exc:
                return ProcessResult(None, "", "", False, 0.0, None, error=str(exc))
            lease.record_workspace(request.workspace)
            if not group.kills_leftovers:
                lease.uncontained()
            _hand_to(request.workspace, lease.uid)
        return super()._start(request, egress, group)

    def argv(
        self,
        command: str,
        *,
        workspace: Path,
        network: str,
        ro_binds: Sequence[Path] = (),
        egress: EgressRelay | None = None,
    ) -> list[str]:
        # Nothing to isolate with: the workspace is the working directory, the network and
        # the extra binds are the host's own. The user is _start_as's.
        return ["/bin/sh", "-c", command]

    def _start_as(self, workspace: Path) -> int | None:
        # The shell starts as the execution's uid (as_uid.run_as: no supplementary group, no
        # capability, no setuid escalation), waits for the worker to put it in the
        # command's cgroups, and sets its rlimits before the command (CommandCgroup.wrap).
        return self.uid if self._runs_as_own_uid(workspace) else None


def _cpu_limit(timeout: float, cpus: float | None) -> int:
    # CPU seconds over all threads of a process: a busy process on N cores uses N per second.
    return max(1, math.ceil(timeout * max(1.0, cpus or 1.0))) + 1


def _ensure_home(workspace: Path) -> None:
    (workspace / HOME_DIR).mkdir(parents=True, exist_ok=True)


# --------------------------------------------------------------------------- bubblewrap

# /etc entries a command needs to resolve names, verify TLS and find shared libraries;
# the rest of the server's /etc stays out of view.
_ETC_ENTRIES = (
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/mime.types",
)
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


# The command runs as `nobody` in a user namespace of its own, with no capability: even when
# the worker is root, it cannot remount /, open the host's files by handle, or open raw
# sockets (CAP_NET_RAW of the host's network belongs to the host's user namespace).
BWRAP_PRIVILEGES = ("--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL")


@functools.cache
def bwrap_status() -> tuple[bool, str]:
    """Whether bubblewrap really works here (installed is not enough: the kernel or the
    container may forbid its namespaces). Tried once per process."""
    try:
        done = subprocess.run(
            ["bwrap", *BWRAP_PRIVILEGES, "--ro-bind", "/", "/", "--unshare-pid", "true"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap could not be started: {exc}"
    if done.returncode != 0:
        return False, f"bwrap failed (exit {done.returncode}): {done.stderr.strip()[:300]}"
    return True, "ok"


def bwrap_available() -> bool:
    return bwrap_status()[0]


class BwrapSandbox(_ProcessSandbox):
    """Bubblewrap: the command sees a read-only system, its own workspace (writable, at the
    same path as on the host), a private /tmp and nothing else of the server."""

    name = "bwrap"
    isolates_network = True

    def __init__(self, executable: str = "bwrap") -> None:
        super().__init__()
        self.executable = executable

    def argv(
        self,
        command: str,
        *,
        workspace: Path,
        network: str,
        ro_binds: Sequence[Path] = (),
        egress: EgressRelay | None = None,
    ) -> list[str]:
        args = [
            self.executable,
            *BWRAP_PRIVILEGES,
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            # The command itself is PID 1: bwrap then reaps it, so its CPU time reaches our
            # wait4 (with bwrap's own init in between it is lost), and when it exits the
            # kernel kills everything else left in the namespace.
            "--as-pid-1",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            "keystone-sandbox",
        ]
        # `services`: a network namespace of its own too, reaching the execution's endpoints
        # through the relay and nothing else (the server's database, Redis, web port...).
        if network in ("none", "services"):
            args.append("--unshare-net")
        args += ["--ro-bind", "/usr", "/usr"]
        for path in _ROOT_LINKS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in _ETC_ENTRIES:
            if egress is not None and path == "/etc/hosts":
                continue  # the relay's own, naming every endpoint's host 127.0.0.1
            args += ["--ro-bind-try", path, path]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for path in _python_roots():
            args += ["--ro-bind", path, path]
        for extra in _safe_ro_binds(ro_binds, workspace):
            args += ["--ro-bind", extra, extra]
        if egress is not None and egress.directory is not None:
            args += ["--ro-bind", str(egress.directory), _EGRESS_DIR]
            args += ["--ro-bind", str(egress.directory / "hosts"), "/etc/hosts"]
            args += ["--ro-bind", relay.__file__, _RELAY_SCRIPT]
        # The workspace last, so no other mount can hide it; only this one, never its parent.
        args += ["--bind", str(workspace), str(workspace), "--chdir", str(workspace), "--"]
        if egress is not None:
            # The relay binds the endpoints' ports inside, then execs the command.
            args += [sys.executable, "-I", "-S", _RELAY_SCRIPT, _EGRESS_DIR]
            args += [*(str(port) for port in egress.ports), "--"]
        args += ["/bin/sh", "-c", command]
        return args


# Where the relay's sockets and its script appear inside the sandbox.
_EGRESS_DIR = "/run/keystone/egress"
_RELAY_SCRIPT = "/run/keystone/relay.py"


def _safe_ro_binds(ro_binds: Sequence[Path], workspace: Path) -> list[str]:
    """Extra read-only directories, minus any that hold the workspace: those would show the
    command its neighbours (the workspaces root) and more of the server than intended."""
    workspace = workspace.resolve()
    safe = []
    for extra in ro_binds:
        resolved = Path(extra).resolve()
        if resolved == workspace or resolved in workspace.parents:
            continue
        safe.append(str(resolved))
    return safe


@functools.cache
def _python_roots() -> tuple[str, ...]:
    """The installation (and venv) of this interpreter, so python agents run in the sandbox."""
    roots: list[str] = []
    for prefix in (sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parent.parent)):
        resolved = str(Path(prefix).resolve())
        if resolved.startswith("/usr") or resolved == "/":
            continue  # already visible through /usr
        if not any(resolved == root or resolved.startswith(root + "/") for root in roots):
            roots.append(resolved)
    return tuple(roots)


# --------------------------------------------------------------------------- docker

DEFAULT_DOCKER_IMAGE = "python:3.11-slim"
_CONTAINER_WORKSPACE = "/workspace"


@functools.cache
def docker_status() -> tuple[bool, str]:
    """Whether a Docker engine answers (the SDK is installed; the daemon may not run)."""
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception as exc:  # the SDK raises several unrelated types for "no engine"
        return False, f"{type(exc).__name__}: {exc}"
    return True, "ok"


def docker_missing(sandbox_conf: dict[str, Any]) -> str | None:
    """What a spec whose sandbox is docker lacks on this machine (the engine, or its image
    here, since images are not pulled), or None."""
    if sandbox_conf.get("backend") != "docker":
        return None
    image = str(sandbox_conf.get("image") or DEFAULT_DOCKER_IMAGE)
    ok, reason = docker_status()
    if not ok:
        return f"the spec needs Docker (sandbox.backend: docker) and no Docker engine answers ({reason})"
    import docker
    import docker.errors

    client = docker.from_env(timeout=10)
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return (
            f"the spec needs the Docker image {image}, which this engine does not have "
            f"(docker pull {image})"
        )
    except docker.errors.DockerException as exc:
        return f"the spec needs the Docker image {image} and the engine could not say if it has it ({exc})"
    finally:
        client.close()
    return None


def docker_available() -> bool:
    return docker_status()[0]


class DockerSandbox(Sandbox):
    """One container per command: image, CPU, memory and process limits, network none, host,
    or `services` (none, with the execution's endpoints relayed in), the workspace mounted at
    /workspace; the container is removed afterwards whatever happens."""

    name = "docker"

    def __init__(self, image: str = DEFAULT_DOCKER_IMAGE, *, python: str = "python3") -> None:
        import docker

        self.image = image
        self.python = python
        super().__init__()
        self.client = docker.from_env()

    def workspace_path(self, workspace: Path) -> str:
        return _CONTAINER_WORKSPACE

    def python_executable(self) -> str:
        return self.python

    def default_path(self) -> str:
        return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    def _run(self, request: _RunRequest) -> ProcessResult:
        import docker.errors
        import requests.exceptions

        workspace = request.workspace
        started = time.perf_counter()
        # The SDK gives a container no stdin stream, and `docker logs` is slow and stores all
        # output on disk; so stdin is a file, and stdout/stderr are named pipes in the
        # (bind-mounted) workspace that this process reads directly, with the usual cap.
        token = uuid.uuid4().hex
        stdin_name, out_name, err_name = (
            f".keystone/{kind}-{token}" for kind in ("stdin", "stdout", "stderr")
        )
        safe_files.write_text(workspace, stdin_name, request.stdin or "")
        out, err = _CappedBuffer(request.max_output_bytes), _CappedBuffer(request.max_output_bytes)
        pump = _FifoPump(workspace, {out_name: out, err_name: err})
        user = _container_user(workspace)
        wrapper = 'exec /bin/sh -c "$1" < "$2" > "$3" 2> "$4"'
        # `services`: a network of its own (none), where the worker then makes listeners for
        # the execution's endpoints; the command waits for them (the marker file $5).
        # Traps only with endpoints: the worker enters the container's network namespace
        # (root only) when it has endpoints to relay, never just for the traps.
        relay = (
            EgressRelay(request.egress, traps=trap_ports(request.egress) if request.egress else ())
            if request.network == "services"
            else None
        )
        ready_name = f".keystone/netready-{token}"
        if relay is not None and relay.ports:
            wrapper = 'while [ ! -e "$5" ]; do sleep 0.01; done; ' + wrapper
        # A list, not a dict keyed by host path: the same host path may appear twice.
        volumes = [f"{workspace}:{_CONTAINER_WORKSPACE}:rw"]
        volumes += [f"{extra}:{extra}:ro" for extra in _safe_ro_binds(request.ro_binds, workspace)]
        container = None
        timed_out = False
        exit_code: int | None = None
        error: str | None = None
        limit_exceeded: str | None = None
        try:
            _remove_orphaned_containers(self.client)
            container = self.client.containers.create(
                self.image,
                ["/bin/sh", "-c", wrapper, "keystone", request.command]
                + [
                    f"{_CONTAINER_WORKSPACE}/{name}"
                    for name in (stdin_name, out_name, err_name, ready_name)
                ],
                working_dir=_CONTAINER_WORKSPACE,
                environment=self._environment(request.env, _CONTAINER_WORKSPACE),
                volumes=volumes,
                network_mode="host" if request.network == "host" else "none",
                extra_hosts={name: "127.0.0.1" for name in relay.host_names} if relay else None,
                nano_cpus=int(request.cpus * 1e9) if request.cpus else None,
                mem_limit=f"{request.memory_mb}m" if request.memory_mb else None,
                pids_limit=request.max_processes,
                user=user,
                # No capability, no privilege gained through setuid files, a read-only root
                # filesystem: the agent writes only its workspace and a private /tmp.
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={"/tmp": "rw,nosuid,nodev,size=256m"},
                ulimits=[
                    docker.types.Ulimit(
                        name="fsize", soft=request.file_size_limit, hard=request.file_size_limit
                    )
                ],
                labels={"keystone.sandbox": "docker", OWNER_LABEL: owners.this_process()},
                detach=True,
            )
            container.start()
            with self.stoppable(functools.partial(_kill_container, container)):
                if relay is not None and relay.ports:
                    container.reload()
                    try:
                        relay.listen_in_namespace(int(container.attrs["State"]["Pid"]))
                    except OSError as exc:
                        container.kill()
                        raise docker.errors.DockerException(
                            "network: services needs the worker to enter the container's network "
                            f"namespace (run it as root, or use bwrap): {exc}"
                        ) from exc
                    safe_files.write_text(workspace, ready_name, "")
                remaining = max(0.1, started + request.timeout - time.perf_counter())
                # The workspace is a bind mount: `--storage-opt size=` bounds only the image's
                # writable layer (read-only here), so the workspace is watched as for bwrap.
                with DiskWatch(workspace, request.disk_mb, container.kill) as disk:
                    try:
                        exit_code = int(container.wait(timeout=remaining)["StatusCode"])
                    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                        timed_out = True
                        container.kill()
                        exit_code = int(container.wait(timeout=30)["StatusCode"])
                limit_exceeded = disk.message
        except docker.errors.DockerException as exc:
            error = f"docker: {exc}"
        finally:
            pump.finish()  # the container is gone: read what is left in the pipes
            if container is not None:
                with contextlib.suppress(docker.errors.DockerException):
                    container.remove(force=True)
            if relay is not None:
                relay.__exit__()
            for name in (stdin_name, out_name, err_name, ready_name):
                (workspace / name).unlink(missing_ok=True)
        return ProcessResult(
            exit_code=exit_code,
            stdout=out.text(),
            stderr=err.text(),
            timed_out=timed_out,
            duration_ms=(time.perf_counter() - started) * 1000,
            cpu_ms=None,  # the container's cgroup is gone once it exits
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            error=error,
            limit_exceeded=limit_exceeded,
            refused_connections=list(relay.refused) if relay is not None else [],
        )


# The process that made a container (owners.this_process()): another one removes it once
# that process has died without removing it (a SIGKILL), and the agent with it.
OWNER_LABEL = "keystone.owner"
# When this process last looked for them: a look is a request to the engine.
_looks = owners.Looks()


def _remove_orphaned_containers(client: Any) -> None:
    """Remove the containers, running or not, of Keystone's processes that died before they
    could (on this host, in this PID namespace: the engine may serve others), at most once
    every owners.LOOK_SECONDS per process."""
    import docker.errors

    if not _looks.due(client.api.base_url):
        return
    for container in client.api.containers(all=True, filters={"label": OWNER_LABEL}):
        if owners.ended((container.get("Labels") or {}).get(OWNER_LABEL, "")):
            with contextlib.suppress(docker.errors.DockerException):
                client.api.remove_container(container["Id"], force=True)


def remove_orphaned_containers_now() -> None:
    """At once, for a process of `keystone run` that has seen another one die: remove the
    containers of the processes that died, rather than at the next look of a process that
    starts one. Only where this process has imported the Docker SDK: it does for a run whose
    sandbox is Docker (docker_missing, DockerSandbox), before it forks, and a process that
    never needed it (most runs) does not pay for importing it."""
    if "docker" not in sys.modules:
        return
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=10)
    except docker.errors.DockerException:  # no engine: none of its containers to remove
        return
    try:
        _looks.forget()
        _remove_orphaned_containers(client)
    finally:
        client.close()


def _kill_container(container: Any) -> None:
    import docker.errors
    import requests.exceptions

    # Already gone means nothing is left to stop.
    with contextlib.suppress(docker.errors.DockerException, requests.exceptions.RequestException):
        container.kill()


def _container_user(workspace: Path) -> str:
    """The user the container runs as: the worker's own, or `nobody` when the worker is root
    (root in a container is root on the host's files); the workspace is then handed to it."""
    if os.getuid() != 0:
        return f"{os.getuid()}:{os.getgid()}"
    _hand_to(workspace, NOBODY)
    return f"{NOBODY}:{NOBODY}"


class _FifoPump:
    """Reads named pipes into capped buffers on a thread until `finish()`.

    Each pipe is opened for reading and, by us too, for writing: without a writer a FIFO
    reads as end-of-file before the container has even opened it. `finish()` drops our
    writer, so the pipes end once the container's writers are gone."""

    def __init__(self, workspace: Path, pipes: dict[str, _CappedBuffer]) -> None:
        self._readers: dict[int, _CappedBuffer] = {}
        self._writers: list[int] = []
        # In the agent's workspace: made and opened without following links it planted.
        for relative, buffer in pipes.items():
            safe_files.make_fifo(workspace, relative)
            self._readers[safe_files.open_fifo(workspace, relative, os.O_RDONLY)] = buffer
            self._writers.append(safe_files.open_fifo(workspace, relative, os.O_WRONLY))
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        with selectors.DefaultSelector() as selector:
            for fd, buffer in self._readers.items():
                selector.register(fd, selectors.EVENT_READ, buffer)
            while selector.get_map():
                for key, _events in selector.select(timeout=1.0):
                    try:
                        chunk = os.read(key.fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return  # finish() gave up waiting and closed the pipes
                    if chunk:
                        key.data.feed(chunk)
                    else:
                        selector.unregister(key.fd)

    def finish(self) -> None:
        for fd in self._writers:
            os.close(fd)
        self._writers = []
        self._thread.join(timeout=_DRAIN_SECONDS)
        for fd in self._readers:
            with contextlib.suppress(OSError):
                os.close(fd)


BUSYBOX_IMAGE = "keystone-busybox:test"
_BUSYBOX_APPLETS = (
    "sh",
    "cat",
    "echo",
    "ls",
    "sleep",
    "true",
    "false",
    "env",
    "head",
    "wc",
    "yes",
    "touch",
    "mkdir",
    "grep",
)


def build_busybox_image(tag: str = BUSYBOX_IMAGE) -> str:
    """A tiny image from the host's static busybox, made with `docker import`: for tests,
    benchmarks and CI on hosts that reach no registry. Reused when it already exists."""
    import docker
    import docker.errors

    client = docker.from_env()
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not Path(busybox).exists():
        raise RuntimeError("busybox-static is not installed; cannot build the Docker test image")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for directory in ("bin", "tmp", "workspace"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in _BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    repository, _, version = tag.partition(":")
    client.api.import_image_from_data(
        archive.getvalue(), repository=repository, tag=version or "latest"
    )
    return tag


# --------------------------------------------------------------------------- selection


def select_backend(
    preferred: str | None = None, *, docker_image: str | None = None
) -> tuple[Sandbox, str | None]:
    """The sandbox to use and a warning for the run, if any. Default: bwrap where it works,
    else local with a visible warning. An explicitly requested docker that cannot run raises."""
    if preferred == "local":
        return LocalSandbox(), None
    if preferred == "docker":
        ok, reason = docker_status()
        if not ok:
            raise SandboxUnavailable(
                f"sandbox backend 'docker' requested but no Docker engine could be reached: {reason}"
            )
        return DockerSandbox(docker_image or DEFAULT_DOCKER_IMAGE), None
    if preferred not in (None, "", "bwrap"):
        raise ValueError(f"unknown sandbox backend {preferred!r} (expected local, bwrap or docker)")
    if bwrap_available():
        return BwrapSandbox(), None
    return LocalSandbox(), LOCAL_FALLBACK_WARNING


def shell_join(argv: Sequence[str]) -> str:
    """Quote an argv as one `sh -c` command string."""
    return " ".join(shlex.quote(part) for part in argv)
