"""The local backend runs the agent as a uid of its own when the worker is root, "so the agent can neither
signal the worker nor read its files" (LocalSandbox). It has no mount namespace: KEYSTONE_HOME
is on its way to the workspace and must stay traversable. The attack is a local agent run by
`keystone run` that reads the embedded database next to its workspace (every user's sessions,
password and token hashes, every project's results) and lists the stored artifacts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from evaluations.runner import local_uids
from tests.cli_helpers import embedded_env, run_keystone

SPEC = """\
version: 1
id: home-reader
task: {prompt: "p"}
agent:
  type: command
  timeout: 30
  command: >-
    home="$KEYSTONE_WORKSPACE/../..";
    echo "db=$(head -c 15 "$home/keystone.sqlite3")";
    echo "artifacts=$(ls "$home/artifacts" | wc -l)";
    echo "uid=$(id -u)"
sandbox: {backend: local}
invariants:
  ran: {description: d, check: {type: contains, value: uid}}
"""


@pytest.mark.skipif(os.getuid() != 0, reason="the worker is not root: the agent keeps its uid")
def test_a_local_agent_cannot_read_the_embedded_database_or_the_artifacts(
    reachable: Path, tmp_path: Path
) -> None:
    home = reachable  # the KEYSTONE_HOME: the local backend's agent user must traverse it
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    report = tmp_path / "report.json"
    env = embedded_env(home, KEYSTONE_POLICY_MIN_BACKEND="local")
    # A home an older Keystone left: its database and artifacts readable by everyone.
    (home / "keystone.sqlite3").touch(mode=0o644)
    (home / "artifacts").mkdir(mode=0o755)
    os.chmod(home / "keystone.sqlite3", 0o644)
    os.chmod(home / "artifacts", 0o755)
    # Twice: the second run finds the database and artifacts the first one left.
    for _ in range(2):
        done = run_keystone("run", str(spec), "--json", str(report), env=env)
        assert done.returncode == 0, done.stdout + done.stderr
    output = json.loads(report.read_text())["executions"][0]["output"]
    # Really as the execution's own uid (not root, not nobody), next to the database.
    uid = int(output.split("uid=")[1].split()[0])
    assert uid in local_uids.configured_range()
    assert "db=SQLite format 3" not in output, output
    assert "db=\n" in output
    assert "artifacts=0" in output
    assert (home / "keystone.sqlite3").stat().st_mode & 0o077 == 0
