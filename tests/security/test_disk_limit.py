"""Issue 13, item 8 (disk): an agent cannot fill the host's disk through its workspace. The
attack is an agent that writes file after file as fast as it can: RLIMIT_FSIZE alone lets it
(every file is small), the workspace watch kills it once the workspace holds more than
`sandbox.resources.disk_mb`, and the execution says which limit it broke."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from evaluations.runner.sandbox import BwrapSandbox, LocalSandbox, Sandbox, bwrap_status, disk_usage
from tests.cli_helpers import embedded_env, run_keystone

BACKENDS = [
    "local",
    pytest.param("bwrap", marks=pytest.mark.skipif(not bwrap_status()[0], reason="no bwrap")),
]

# One megabyte after another into new files, for ever: no single file is large.
FILL = "i=0; while true; do head -c 1048576 /dev/zero > fill-$i || exit 9; i=$((i+1)); done"
MB = 1024 * 1024


def _sandbox(name: str) -> Sandbox:
    return LocalSandbox() if name == "local" else BwrapSandbox()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_agent_writing_many_files_is_killed_at_the_disk_limit(
    backend: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    result = _sandbox(backend).run(FILL, workspace=tmp_path, env={}, timeout=60, disk_mb=20)
    elapsed = time.monotonic() - started

    assert result.limit_exceeded is not None
    assert result.limit_exceeded.startswith("disk limit 20 MB exceeded")
    assert result.exit_code == -9  # killed, not finished
    # Killed within moments, not at the 60 s timeout; what it left is the limit plus what it
    # could write in one watch interval, nowhere near what a minute of writing would leave.
    assert elapsed < 15
    assert disk_usage(tmp_path) < 20 * MB + 150 * MB


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_file_stops_at_the_disk_limit(backend: str, tmp_path: Path) -> None:
    command = "head -c 52428800 /dev/zero > big; echo exit=$?"
    result = _sandbox(backend).run(command, workspace=tmp_path, env={}, timeout=60, disk_mb=20)
    assert "exit=0" not in result.stdout, result.stdout + result.stderr
    assert (tmp_path / "big").stat().st_size <= 20 * MB


SPEC = """
version: 1
id: disk-attack
task: {prompt: "fill the disk"}
agent: {type: command, command: "FILL"}
sandbox: {backend: BACKEND, network: none, files: {"notes.txt": "hello"}, resources: {disk_mb: 20, timeout: 60}}
invariants:
  answered: {description: "the agent answered", check: {type: contains, value: done}}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_execution_says_which_disk_limit_it_broke(backend: str, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("FILL", FILL).replace("BACKEND", backend))
    report = tmp_path / "report.json"
    env = embedded_env(tmp_path / "home", KEYSTONE_POLICY_MIN_BACKEND="local")
    done = run_keystone("run", str(spec), "--json", str(report), env=env, timeout=180)
    assert report.exists(), done.stdout + done.stderr
    execution = json.loads(report.read_text())["executions"][0]
    assert execution["status"] == "failed", execution
    assert "disk limit 20 MB exceeded" in execution["error"], execution
