"""`agent.start` (issue 19): Keystone starts an HTTP agent's server when nothing answers on
its ready URL, once per process, and says why when it cannot."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from evaluations.runner import agent_start, owners
from evaluations.runner.agent_start import _started, _stop, ensure_started, ready


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_agent_is_started_once_and_answers(tmp_path: Path) -> None:
    port = _free_port()
    (tmp_path / "index.html").write_text("ok")
    agent = {
        "type": "http",
        "endpoint": f"http://127.0.0.1:{port}/",
        # `python` is the interpreter that runs Keystone, first on PATH.
        "start": {
            "command": f"python -m http.server {port} --bind 127.0.0.1",
            "ready_url": f"http://127.0.0.1:{port}/",
        },
    }
    assert not ready(f"http://127.0.0.1:{port}/")
    try:
        assert ensure_started(agent, spec_dir=tmp_path, allowed=True) is None
        assert ready(f"http://127.0.0.1:{port}/")
        server = _started[(agent["start"]["command"], str(tmp_path))]
        assert ensure_started(agent, spec_dir=tmp_path, allowed=True) is None
        assert _started[(agent["start"]["command"], str(tmp_path))] is server  # not twice
    finally:
        _stop(_started.pop((agent["start"]["command"], str(tmp_path))))
    assert not ready(f"http://127.0.0.1:{port}/")


def test_a_command_that_exits_says_so_with_its_output(tmp_path: Path) -> None:
    port = _free_port()
    agent = {
        "type": "http",
        "endpoint": f"http://127.0.0.1:{port}/",
        "start": {
            "command": f"{sys.executable} -c \"print('no model key'); raise SystemExit(3)\"",
            "ready_url": f"http://127.0.0.1:{port}/health",
            "timeout": 20,
        },
    }
    error = ensure_started(agent, spec_dir=tmp_path, allowed=True)
    assert error is not None
    assert "exited with code 3 before" in error and "no model key" in error


def test_a_spec_from_the_browser_may_not_start_a_host_command(tmp_path: Path) -> None:
    port = _free_port()
    agent = {
        "type": "http",
        "endpoint": f"http://127.0.0.1:{port}/",
        "start": {"command": "touch started", "ready_url": f"http://127.0.0.1:{port}/"},
    }
    error = ensure_started(agent, spec_dir=tmp_path, allowed=False)
    assert error is not None and "KEYSTONE_ALLOW_HOST_SCRIPTS=true" in error
    assert not (tmp_path / "started").exists()


_START_THEN_WAIT = """
import sys, time
from pathlib import Path
from evaluations.runner.agent_start import ensure_started
port, spec_dir = sys.argv[1], Path(sys.argv[2])
agent = {"type": "http", "start": {
    "command": f"python -m http.server {port} --bind 127.0.0.1",
    "ready_url": f"http://127.0.0.1:{port}/"}}
print(ensure_started(agent, spec_dir=spec_dir, allowed=True), flush=True)
time.sleep(300)
"""


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_a_server_a_killed_keystone_left_running_is_stopped_before_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keystone killed (kill -9, the OOM killer) left its agent's server running, and the
    next run took it as a server somebody else runs: it answered from the agent's code as it
    was then, not as it is now."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    then, now = tmp_path / "then", tmp_path / "now"
    for spec_dir in (then, now):
        spec_dir.mkdir()
        (spec_dir / "index.html").write_text(spec_dir.name)
    killed = subprocess.Popen(
        [sys.executable, "-c", _START_THEN_WAIT, str(port), str(then)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert killed.stdout is not None and killed.stdout.readline().strip() == "None"
    killed.kill()
    killed.wait()
    assert _page(url) == "then"  # its server runs on
    assert _files_of(killed.pid)
    monkeypatch.setattr(agent_start, "_looks", owners.Looks())  # this process's first look
    agent = {
        "type": "http",
        "start": {"command": f"python -m http.server {port} --bind 127.0.0.1", "ready_url": url},
    }
    try:
        assert ensure_started(agent, spec_dir=now, allowed=True) is None
        assert _page(url) == "now"
    finally:
        server = _started.pop((agent["start"]["command"], str(now)), None)
        if server is not None:
            _stop(server)
    assert not _files_of(killed.pid)  # nor are its files left


def _files_of(owner: int) -> list[Path]:
    """The files of the servers the process `owner` started, in the temporary directory."""
    return [
        path
        for path in Path(tempfile.gettempdir()).glob("keystone-agent-*.owner")
        if path.read_text().split()[0].endswith(f"/{owner}")
    ]


def test_a_file_another_user_planted_names_no_process_to_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone may write in the temporary directory: a file there naming a process of
    Keystone's user, as if a dead Keystone had started it, must not get it killed."""
    if os.getuid() != 0:
        pytest.skip("only root can give the planted file to another user")
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead_owner = f"{owners.this_process().rpartition('/')[0]}/{ended.pid}"
    planted = Path(tempfile.gettempdir()) / "keystone-agent-planted.owner"
    planted.write_text(f"{dead_owner} {victim.pid} {owners.start_time(victim.pid)}\n")
    os.chown(planted, 65534, 65534)
    try:
        monkeypatch.setattr(agent_start, "_looks", owners.Looks())
        agent_start._stop_orphaned_servers()
        assert victim.poll() is None
        # The same file of Keystone's own user is obeyed.
        os.chown(planted, os.getuid(), os.getgid())
        agent_start._stop_orphaned_servers()
        assert victim.wait(timeout=10) == -9
    finally:
        victim.kill()
        victim.wait()
        planted.unlink(missing_ok=True)


def test_a_record_of_a_server_that_had_already_ended_names_no_process_to_kill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that ended before its record was written has no start time ("None"), and
    nothing then tells its process group from a later one given the same number: the group
    is not killed once the record's maker dies."""
    group = subprocess.Popen(  # a group whose first process has ended: its number is free
        ["sh", "-c", "sleep 60 & echo $!"], start_new_session=True, stdout=subprocess.PIPE
    )
    assert group.stdout is not None
    member = int(group.stdout.readline())
    group.wait()
    ended = subprocess.Popen(["true"])
    ended.wait()
    dead_owner = f"{owners.this_process().rpartition('/')[0]}/{ended.pid}"
    record = Path(tempfile.gettempdir()) / "keystone-agent-ended-at-once.owner"
    record.write_text(f"{dead_owner} {group.pid} None\n")
    try:
        monkeypatch.setattr(agent_start, "_looks", owners.Looks())
        agent_start._stop_orphaned_servers()
        assert owners.running(member)
        assert not record.exists()  # the record itself is cleaned up
    finally:
        with contextlib.suppress(ProcessLookupError):  # none left, if it was killed
            os.killpg(group.pid, signal.SIGKILL)
        record.unlink(missing_ok=True)
