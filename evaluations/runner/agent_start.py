"""`agent.start` of an HTTP agent: the command that starts the agent's server, and the URL
that answers once it is ready. Before an execution, the runner probes `ready_url`; when nothing
answers, it starts the command on the Keystone host (with `sh -c` in the spec's directory, the
Python that runs Keystone first on PATH, and none of the server's environment variables),
waits until the probe answers 2xx, and keeps the server for the next executions of this
process; it is stopped when the process exits, or, should the process be killed first, by the
next Keystone process on the host to run an agent with `agent.start` (else the server would
answer the next runs from the agent's code as it was then). A server that somebody else
already runs on that URL is used as it is.

The command runs outside any sandbox, so it is allowed only for specs read from a directory
on this machine (`keystone run`, the demo) or with KEYSTONE_ALLOW_HOST_SCRIPTS=true.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluations.runner import owners

DEFAULT_READY_TIMEOUT = 30.0
_lock = threading.Lock()
# The files of a started server, in the temporary directory: its output (PREFIX*.log) and
# who started it (PREFIX*.owner).
_PREFIX = "keystone-agent-"
_OWNER_SUFFIX = ".owner"
# When this process last looked for the servers of processes that died.
_looks = owners.Looks()


@dataclass(slots=True)
class _Server:
    """An agent server started here: its process, and the file its output goes to."""

    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def owner_path(self) -> Path:
        """Beside the log: the process that started the server, and the server's pid and
        start time."""
        return self.log_path.with_suffix(_OWNER_SUFFIX)

    def tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f" (its output ends: {' | '.join(lines[-3:])})" if lines else ""


_started: dict[tuple[str, str], _Server] = {}


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return 200 <= response.status < 300
    except (OSError, ValueError):  # refused, reset, timed out, HTTP error, bad URL
        return False


def ensure_started(agent: dict[str, Any], *, spec_dir: Path, allowed: bool) -> str | None:
    """None when the agent answers on its ready URL (started here if need be); else why not."""
    start = agent.get("start")
    if not start:
        return None
    url = str(start["ready_url"])
    with _lock:  # no thread probes before an orphaned server on the URL is stopped
        if _looks.due("servers"):
            _stop_orphaned_servers()
    if ready(url):
        return None
    if not allowed:
        return (
            "agent.start runs a command on the Keystone host: allowed for specs read from a "
            "directory (keystone run, the demo) or with KEYSTONE_ALLOW_HOST_SCRIPTS=true; "
            f"start the agent yourself so that {url} answers"
        )
    command = str(start["command"])
    timeout = float(start.get("timeout") or DEFAULT_READY_TIMEOUT)
    with _lock:  # one start per process, even with executions in several threads
        server = _started.get((command, str(spec_dir)))
        if server is None or server.process.poll() is not None:
            server = _spawn(command, spec_dir)
            _started[(command, str(spec_dir))] = server
        deadline = time.monotonic() + timeout
        while not ready(url):
            code = server.process.poll()
            if code is not None:
                return (
                    f"agent.start: `{command}` exited with code {code} before {url} "
                    f"answered{server.tail()}"
                )
            if time.monotonic() > deadline:
                return (
                    f"agent.start: `{command}` started but {url} did not answer 2xx within "
                    f"{timeout:g} s{server.tail()}"
                )
            time.sleep(0.2)
    return None


# What the started server may see of the worker's environment: where programs are, its home
# and locale. Nothing else: the worker's environment holds the server's secrets.
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")


def _server_env() -> dict[str, str]:
    """The environment of the agent's server: the agent under test, untrusted like any agent,
    so never the worker's own environment (SECRET_KEY, DATABASE_URL, the model key, the
    broker, KEYSTONE_* settings), as the sandboxes never pass it either. Its endpoints come
    per call in the X-Keystone-Env header."""
    env = {key: os.environ[key] for key in _INHERITED if key in os.environ}
    # `python` in the command is the Python that runs Keystone (it has the agents' SDKs).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _spawn(command: str, spec_dir: Path) -> _Server:
    handle, name = tempfile.mkstemp(prefix=_PREFIX, suffix=".log")
    env = _server_env()
    with os.fdopen(handle, "wb") as log:
        process = subprocess.Popen(
            ["sh", "-c", command],
            cwd=spec_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped with all it started
        )
    server = _Server(process, Path(name))
    # Who started it, and which process it is (a pid alone may be a later process's).
    server.owner_path.write_text(
        f"{owners.this_process()} {process.pid} {owners.start_time(process.pid)}\n"
    )
    atexit.register(_stop, server)
    return server


def _stop_orphaned_servers() -> None:
    """Stop the servers that Keystone processes which died (kill -9, the OOM killer) left
    running, with everything in their process groups."""
    for owner_path in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*{_OWNER_SUFFIX}"):
        try:
            owner, pid, started = owners.read_own_file(owner_path).split()
            if not owners.ended(owner):
                continue
            # Still that server: a record written after the server had already ended says
            # "None", and the pid it names may since be a new process's.
            running_since = owners.start_time(int(pid))
            if running_since is not None and str(running_since) == started:
                os.killpg(int(pid), signal.SIGKILL)
                deadline = time.monotonic() + 10  # until its port is free for the next one
                while owners.running(int(pid)) and time.monotonic() < deadline:
                    time.sleep(0.05)
        except (OSError, ValueError):
            continue
        owner_path.unlink(missing_ok=True)
        owner_path.with_suffix(".log").unlink(missing_ok=True)


def _stop(server: _Server) -> None:
    process = server.process
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
    server.log_path.unlink(missing_ok=True)
    server.owner_path.unlink(missing_ok=True)
