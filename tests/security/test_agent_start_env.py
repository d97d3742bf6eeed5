"""An HTTP agent's server started by Keystone (`agent.start`) is the agent under test: untrusted
code. The attack is a start command that records the environment it was given, on a worker
whose environment holds the server's secrets (SECRET_KEY, DATABASE_URL, the model key, the
broker, KEYSTONE_* settings). None of them may reach it; `python` is still the interpreter
that runs Keystone."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from evaluations.runner.agent_start import _started, _stop, ensure_started

CANARY = "server-only-3f9a"
SERVER_ENV = {
    "SECRET_KEY": f"django-{CANARY}",
    "DATABASE_URL": f"postgresql://keystone:{CANARY}@db/keystone",
    "CELERY_BROKER_URL": f"redis://:{CANARY}@broker:6379/0",
    "OPENAI_API_KEY": f"sk-{CANARY}",
    "KEYSTONE_POSTGRES_URL": f"postgresql://postgres:{CANARY}@db/postgres",
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_started_agent_gets_none_of_the_servers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SERVER_ENV.items():
        monkeypatch.setenv(name, value)
    port = _free_port()
    command = f"env > seen.env; exec python -m http.server {port} --bind 127.0.0.1"
    agent = {
        "type": "http",
        "endpoint": f"http://127.0.0.1:{port}/",
        "start": {"command": command, "ready_url": f"http://127.0.0.1:{port}/"},
    }
    try:
        assert ensure_started(agent, spec_dir=tmp_path, allowed=True) is None
    finally:
        server = _started.pop((command, str(tmp_path)), None)
        if server is not None:
            _stop(server)
    seen = dict(
        line.split("=", 1)
        for line in (tmp_path / "seen.env").read_text().splitlines()
        if "=" in line
    )
    assert CANARY not in (tmp_path / "seen.env").read_text()
    assert not set(SERVER_ENV) & set(seen)
    assert seen["HOME"] == os.environ["HOME"]  # what a program needs of the host remains
    assert seen["PATH"].split(":")[0] == str(Path(sys.executable).parent)
