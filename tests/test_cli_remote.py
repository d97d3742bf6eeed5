"""Issue 16, item 5: `keystone run SPEC --remote URL --token T` against a live server
process: `keystone serve` in a subprocess with its own SQLite database in a temporary
KEYSTONE_HOME, its runs executed either by the embedded worker beside it or by a real Celery
worker process (`keystone worker` on a Redis of this test session). The CLI uploads the
spec, starts the run on the server's worker, follows its events, writes the reports, exits
with the run's exit code; SIGINT cancels the run on the server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_helpers import REPO_ROOT, embedded_env, run_keystone

PASSING = """\
version: 1
id: remote-agent
task: {prompt: "Say hello"}
agent: {type: command, command: "echo hello"}
sandbox: {backend: local}
replicas: 2
invariants:
  greets: {description: greets, gate: true, check: {type: contains, value: hello}}
"""
FAILING = PASSING.replace("value: hello", "value: goodbye")
SLOW = PASSING.replace("echo hello", "sleep 60").replace("replicas: 2", "replicas: 1")

# Makes the server's person, project and a personal token in the server's database.
SETUP = """
from evaluations.cli_commands import setup_django
setup_django()
from django.contrib.auth import get_user_model
from evaluations import services
from evaluations.models import Membership, Role
user = get_user_model().objects.create_user(username="ci", password="pw-1234567")
project = services.project_default()
Membership.objects.create(project=project, user=user, role=Role.EDITOR)
print(services.personal_token_issue(user=user, name="ci", scopes=["read", "run"])[1])
"""


@dataclass
class Server:
    url: str
    token: str
    env: dict[str, str]
    log: Path

    def logs(self) -> str:
        """The server's log, and the Celery worker's when there is one."""
        return "\n".join(path.read_text() for path in sorted(self.log.parent.glob("*.log")))

    def api(self, path: str) -> dict:  # type: ignore[type-arg]
        request = urllib.request.Request(
            f"{self.url}/api/projects/default{path}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(params=["embedded", "celery"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    env = embedded_env(tmp_path / "home", NO_COLOR="1", KEYSTONE_EXECUTION_LEASE_SECONDS="6")
    with contextlib.ExitStack() as stack:
        if request.param == "celery":
            env["CELERY_BROKER_URL"] = stack.enter_context(_claimed_broker(request))
        yield from _serve(env, tmp_path, stack, celery=request.param == "celery")


@contextlib.contextmanager
def _claimed_broker(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis database of this session's Redis that no other test is using."""
    from tests.evaluations.test_celery_workers import _claim_redis_database

    client, url = _claim_redis_database(request.getfixturevalue("test_redis_url"))
    try:
        yield url
    finally:
        client.flushdb()  # the lock key too: the database is free again
        client.close()


def _serve(
    env: dict[str, str], tmp_path: Path, stack: contextlib.ExitStack, *, celery: bool
) -> Iterator[Server]:
    token = (
        subprocess.run(
            [sys.executable, "-c", SETUP],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    port = _free_port()
    log = tmp_path / "serve.log"
    if celery:
        worker_log = tmp_path / "worker.log"
        with worker_log.open("wb") as out:
            worker = subprocess.Popen(
                [sys.executable, "-m", "evaluations.cli", "worker", "--concurrency", "1"],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Celery's pool children go with it
            )
        stack.callback(_stop_group, worker)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "evaluations.cli", "serve", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail(f"keystone serve did not start:\n{log.read_text()}")
                time.sleep(0.3)
        yield Server(url=url, token=token, env=env, log=log)
    finally:
        process.terminate()
        process.wait(timeout=30)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _client_env(server: Server, **extra: str) -> dict[str, str]:
    # The CLI's own home is elsewhere: nothing of the run may happen in this process's database.
    env = embedded_env(Path(server.log).parent / "client-home", NO_COLOR="1", **extra)
    return env


def test_a_passing_and_a_failing_run_on_the_server(server: Server, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(PASSING)
    junit, report, summary = tmp_path / "junit.xml", tmp_path / "r.json", tmp_path / "s.md"
    done = run_keystone(
        "run",
        str(spec),
        "--remote",
        server.url,
        "--token",
        server.token,
        "--label",
        "pr=7",
        "--junit",
        str(junit),
        "--json",
        str(report),
        "--markdown",
        str(summary),
        env=_client_env(server),
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr + server.logs()
    assert "execution 2/2" in done.stdout
    run_id = int(done.stdout.split("run ", 1)[1].split()[0])
    suite = ET.parse(junit).getroot()
    assert suite.find(".//testcase") is not None
    assert int(suite.get("failures") or suite.find("testsuite").get("failures")) == 0  # type: ignore[union-attr]
    assert json.loads(report.read_text())["format"]
    assert summary.read_text().strip()
    remote = server.api(f"/runs/{run_id}")
    assert remote["status"] == "completed" and remote["exit_code"] == 0
    assert remote["labels"]["pr"] == "7" and remote["trigger"] == "api"
    assert not (tmp_path / "client-home" / "keystone.sqlite3").exists()

    spec.write_text(FAILING)
    # KEYSTONE_URL and KEYSTONE_TOKEN instead of the flags.
    failed = run_keystone(
        "run",
        str(spec),
        "--junit",
        str(junit),
        env=_client_env(server, KEYSTONE_URL=server.url, KEYSTONE_TOKEN=server.token),
        timeout=180,
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr + server.logs()
    assert 'failures="0"' not in junit.read_text()


def test_a_spec_the_server_refuses_names_its_line(server: Server, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(PASSING.replace("type: contains", "type: no_such_check"))
    done = run_keystone(
        "run",
        str(spec),
        "--remote",
        server.url,
        "--token",
        server.token,
        env=_client_env(server),
        timeout=60,
    )
    assert done.returncode == 2
    assert "line 8" in done.stderr and "invariants.greets.check.type" in done.stderr
    refused = run_keystone(
        "run",
        str(spec),
        "--remote",
        server.url,
        "--token",
        "ks_wrong",
        env=_client_env(server),
        timeout=60,
    )
    assert refused.returncode == 4 and "refused the token" in refused.stderr


def test_sigint_cancels_the_run_on_the_server(server: Server, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SLOW)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "evaluations.cli",
            "run",
            str(spec),
            "--remote",
            server.url,
            "--token",
            server.token,
        ],
        cwd=REPO_ROOT,
        env=_client_env(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("run "), first + (process.stderr.read() if process.stderr else "")
        run_id = int(first.split()[1])
        deadline = time.monotonic() + 60
        while server.api(f"/runs/{run_id}")["status"] != "running":
            assert time.monotonic() < deadline, server.api(f"/runs/{run_id}")
            time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, out + err
    assert f"run {run_id} cancelled on the server" in err
    assert server.api(f"/runs/{run_id}")["status"] == "cancelled"


def test_timeout_cancels_the_run_on_the_server(server: Server, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SLOW)
    started = time.monotonic()
    done = run_keystone(
        "run",
        str(spec),
        "--remote",
        server.url,
        "--token",
        server.token,
        "--timeout",
        "3",
        env=_client_env(server),
        timeout=120,
    )
    assert done.returncode == 4, done.stdout + done.stderr
    assert "did not finish within 3 s; it was cancelled" in done.stderr
    assert time.monotonic() - started < 30
    run_id = int(done.stdout.split("run ", 1)[1].split()[0])
    assert server.api(f"/runs/{run_id}")["status"] == "cancelled"
