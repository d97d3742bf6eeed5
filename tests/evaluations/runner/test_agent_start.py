"""`agent.start` (issue 19): Keystone starts an HTTP agent's server when nothing answers on
its ready URL, once per process, and says why when it cannot."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

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
