"""Issue 13, item 3 (evidence): a connection the sandbox refuses under `network: services` is
recorded on the execution, so the spec's `forbidden: {http_except: [...]}` rule fails it,
naming the host and port the agent tried, and checks read it in the audit. The attack is an
agent under bubblewrap that tries the server's Redis port, a port the host listens on (the
server's web port) and the cloud metadata address, besides its own service."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from checks.artifact import RunArtifact
from evaluations.runner.audit import audit_events
from evaluations.runner.egress import Endpoint, trap_ports
from evaluations.runner.sandbox import BwrapSandbox, bwrap_status
from tests.cli_helpers import embedded_env, run_keystone

needs_bwrap = pytest.mark.skipif(
    not bwrap_status()[0], reason=f"bubblewrap does not work here: {bwrap_status()[1]}"
)

AGENT = r"""
import json, os, socket
seen = {}
for name, host, port in (("redis", "127.0.0.1", 6379), ("web", "127.0.0.1", int(os.environ["WEB_PORT"])),
                         ("metadata", "169.254.169.254", 80)):
    try:
        with socket.create_connection((host, port), timeout=3) as conn:
            conn.sendall(b"PING\r\n")
            seen[name] = "answered: " + repr(conn.recv(100))
    except OSError as exc:
        seen[name] = f"refused: {type(exc).__name__}"
print(json.dumps(seen))
"""

SPEC = """
version: 1
id: refused-egress
task: {prompt: "reach out"}
agent: {type: command, command: python agent.py, env: {WEB_PORT: "{web_port}"}}
sandbox: {backend: bwrap, network: services, workspace: ./ws}
services:
  - {name: notify, type: http_mock, routes: [{method: GET, path: /ping, response: {status: 200, body: "pong"}}]}
forbidden: {http_except: [notify]}
invariants:
  audited:
    description: "the refused connections are in the audit the checks read"
    check: {type: command_exit, command: "grep -q connection_refused .keystone/audit.jsonl", exit_code: 0}
"""


@needs_bwrap
def test_refused_connections_fail_the_execution_naming_host_and_port(tmp_path: Path) -> None:
    web = socket.socket()  # stands for the server's web port: listening on the host
    web.bind(("127.0.0.1", 0))
    web.listen()
    web_port = web.getsockname()[1]
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "agent.py").write_text(AGENT)
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("{web_port}", str(web_port)))
    report = tmp_path / "report.json"
    env = embedded_env(tmp_path / "home", KEYSTONE_POLICY_MIN_BACKEND="bwrap")
    done = run_keystone("run", str(spec), "--json", str(report), env=env, timeout=180)
    web.close()
    assert report.exists(), done.stdout + done.stderr
    execution = json.loads(report.read_text())["executions"][0]
    seen = json.loads(execution["output"])

    # Nothing of the server answered.
    assert not any(value.startswith("answered: b'+") for value in seen.values()), seen
    assert seen["metadata"].startswith("refused"), seen
    # Both loopback attempts are violations naming what was tried; the execution fails.
    messages = [v["message"] for v in execution["forbidden_violations"]]
    assert any("localhost:6379" in m for m in messages), messages
    assert any(f"localhost:{web_port}" in m for m in messages), messages
    assert done.returncode == 1, done.stdout + done.stderr  # the run failed on them
    # And a check sees them in the audit.
    audited = [r for r in execution["results"] if r["invariant_id"] == "audited"]
    assert audited and audited[0]["score"] == 1.0, execution["results"]


def test_traps_cover_the_hosts_listeners_but_never_the_declared_endpoints() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        declared = [Endpoint("127.0.0.1", 6379)]
        traps = trap_ports(declared, lowest=1024)
        assert port in traps and 5432 in traps
        assert 6379 not in traps  # relayed, not trapped
        assert all(p >= 1024 for p in traps)
    finally:
        listener.close()


@needs_bwrap
def test_a_connection_to_a_trap_is_recorded_by_the_sandbox(tmp_path: Path) -> None:
    command = (
        "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', 11211), 3); "
        "print('closed' if s.recv(10) == b'' else 'data')\""
    )
    # Traps live in the relay of an execution that has endpoints: declare one (unused).
    service = socket.socket()
    service.bind(("127.0.0.1", 0))
    service.listen()
    endpoint = Endpoint("127.0.0.1", service.getsockname()[1])
    try:
        result = BwrapSandbox().run(
            command, workspace=tmp_path, env={}, timeout=30, egress=[endpoint]
        )
    finally:
        service.close()
    assert result.stdout.strip() == "closed", result.stderr
    assert [(a["host"], a["port"]) for a in result.refused_connections] == [("localhost", 11211)]
    events = audit_events(RunArtifact(refused_connections=result.refused_connections), "agent")
    refused = [e for e in events if e["type"] == "connection_refused"]
    assert refused[0]["details"] == {"host": "localhost", "port": 11211}


@needs_bwrap
def test_an_execution_without_endpoints_starts_no_relay(tmp_path: Path) -> None:
    """No endpoint, no relay and so no trap (docs/security.md): the kernel refuses."""
    command = (
        "python3 -c \"import socket\ntry: socket.create_connection(('127.0.0.1', 11211), 3)"
        "\nexcept OSError as exc: print('refused', type(exc).__name__)\""
    )
    result = BwrapSandbox().run(command, workspace=tmp_path, env={}, timeout=30)
    assert result.stdout.strip() == "refused ConnectionRefusedError", result.stderr
    assert result.refused_connections == []
