"""The execution path end to end, in-process and through the `keystone run` CLI.

In-process tests call the services the way the CLI does (no broker): a spec version from
YAML text, a run planned into Execution rows, each execution claimed, run in a real sandbox
and recorded, then the run finalized. The CLI tests start `keystone run` as a real
subprocess on the embedded default (SQLite under a temporary KEYSTONE_HOME).

The in-process tests commit their rows (transaction=True) because the execution's lease
watcher thread talks to the database on its own connection.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from django.core.files.storage import default_storage
from django.db import connection
from django.test import override_settings

from checks.spec import SpecValidationError
from evaluations import services
from evaluations.models import (
    Artifact,
    ArtifactKind,
    CheckResult,
    Execution,
    ExecutionStatus,
    Project,
    Run,
    RunStatus,
)
from evaluations.selectors.exports import run_report
from tests.evaluations.execution_helpers import planned_run, run_spec

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SPECS = Path(__file__).parent / "specs"
REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = "test-worker:1"

# Two prompts x two replicas of a deterministic shell agent. Three invariants pass and one
# (`says_goodbye`, not a gate) fails, so every execution fails one check but no gate does.
MIXED_SPEC = """\
version: 1
id: path-mixed
description: "Echo agent: three invariants pass, one fails"
task:
  prompts: ["Say hello", "Say hello again"]
agent:
  type: command
  command: "sh -c 'echo \\"hello from replica $KEYSTONE_REPLICA\\"; echo noted > note.txt'"
  timeout: 30
sandbox: {backend: local}
invariants:
  greets:
    description: "The answer greets"
    gate: true
    check: {type: contains, value: hello}
  note_written:
    description: "The agent wrote note.txt"
    check: {type: file_exists, path: note.txt}
  no_password:
    description: "No password in the answer"
    check: {type: not_contains, value: password}
  says_goodbye:
    description: "The answer says goodbye"
    weight: 0.1
    check: {type: contains, value: goodbye}
replicas: 2
scoring:
  pass_threshold: 0.5
"""

SLOW_SPEC = """\
version: 1
id: path-slow
description: "An agent that sleeps far longer than the test waits"
task: {prompt: "Take your time"}
agent:
  type: command
  command: "sh -c 'sleep 30; echo done'"
  timeout: 60
sandbox: {backend: local}
invariants:
  done:
    description: "Says done"
    check: {type: contains, value: done}
replicas: 3
"""


@pytest.fixture
def project() -> Project:
    return services.project_default()


# --- In-process -------------------------------------------------------------------------


def test_spec_version_create_refuses_invalid_text_and_reuses_identical_text(
    project: Project,
) -> None:
    with pytest.raises(SpecValidationError):
        services.spec_version_create(
            project=project, source_yaml=(SPECS / "typo-check-type.yaml").read_text()
        )
    first = services.spec_version_create(project=project, source_yaml=MIXED_SPEC)
    again = services.spec_version_create(project=project, source_yaml=MIXED_SPEC)
    changed = services.spec_version_create(
        project=project, source_yaml=MIXED_SPEC.replace("replicas: 2", "replicas: 3")
    )
    assert again.pk == first.pk
    assert (first.number, changed.number) == (1, 2)


def test_a_runs_stored_summary_does_not_grow_with_its_replicas(project: Project) -> None:
    """Each execution's score lives in its own row: what a run stores of its summary grows
    with its prompts, scenarios and invariants, not its replicas. Its report still scores
    and lists every execution, from the stored results."""
    stored = {}
    for replicas in (1, 5):
        source = MIXED_SPEC.replace("replicas: 2", f"replicas: {replicas}")
        run = run_spec(project, source, spec_dir=SPECS)
        assert run.status == RunStatus.COMPLETED
        assert "executions" not in run.summary
        stored[replicas] = len(json.dumps(run.summary))
        report = run_report(run)
        assert len(report.executions) == 2 * replicas
        assert all(
            score.composite == pytest.approx(0.9677, abs=1e-3) for score in report.executions
        )
        assert report.verdict == run.summary["verdict"]
    assert stored[5] < stored[1] * 1.1, stored


def test_in_process_run_records_results_artifacts_and_finalizes(project: Project) -> None:
    run, execution_ids = planned_run(project, MIXED_SPEC, spec_dir=str(SPECS))
    assert len(execution_ids) == 4  # 2 prompts x 2 replicas
    run.refresh_from_db()
    assert (run.status, run.execution_count) == (RunStatus.RUNNING, 4)

    for execution_id in execution_ids:
        assert services.execution_execute(execution_id=execution_id, worker=WORKER) is not None
    services.run_finalize_if_done(run_id=run.pk)

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.executions_done == 4
    assert run.exit_code == 0, run.summary
    assert run.gate_passed is True
    assert run.finished is not None
    assert run.summary["exit_code"] == 0

    executions = list(Execution.objects.filter(run=run).order_by("prompt_index", "replica"))
    assert [e.status for e in executions] == [ExecutionStatus.SUCCESS] * 4
    assert [(e.prompt_index, e.replica) for e in executions] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for execution in executions:
        assert execution.final_output.strip() == f"hello from replica {execution.replica}"
        assert execution.claimed_by == WORKER
        assert execution.lease_expires is None
        assert execution.duration_ms is not None and execution.duration_ms > 0
        codes = dict(
            CheckResult.objects.filter(execution=execution).values_list(
                "invariant_id", "failure_code"
            )
        )
        assert codes == {
            "greets": "",
            "note_written": "",
            "no_password": "",
            "says_goodbye": "CONTAINS_FAILED",
        }
        assert execution.passed is True  # 3.0 / 3.1 of the weight is above the 0.5 threshold
    assert CheckResult.objects.filter(run=run).count() == 16


def test_artifacts_are_stored_as_files_not_in_rows(project: Project) -> None:
    run, execution_ids = planned_run(project, MIXED_SPEC, spec_dir=str(SPECS))
    services.execution_execute(execution_id=execution_ids[0], worker=WORKER)

    stdout = Artifact.objects.get(execution_id=execution_ids[0], kind=ArtifactKind.STDOUT)
    assert stdout.file.name, "the row keeps only the blob's name"
    assert default_storage.exists(stdout.file.name)
    with default_storage.open(stdout.file.name) as handle:
        data = handle.read()
    assert data.decode().strip() == "hello from replica 0"
    assert stdout.size == len(data)
    # The workspace diff (note.txt added) is a blob too.
    diff = Artifact.objects.get(execution_id=execution_ids[0], kind=ArtifactKind.WORKSPACE_DIFF)
    with default_storage.open(diff.file.name) as handle:
        assert "note.txt" in handle.read().decode()


def test_an_execution_comes_back_as_it_was_recorded(project: Project) -> None:
    """What execution_execute returns is what the progress lines print: it must be the row
    as stored, for a recorded outcome and for an error recorded before the agent ran."""
    run, execution_ids = planned_run(project, MIXED_SPEC, spec_dir=str(SPECS))
    returned = services.execution_execute(execution_id=execution_ids[0], worker=WORKER)
    stored = Execution.objects.get(pk=execution_ids[0])
    assert returned is not None and returned.pk == stored.pk
    assert (returned.status, returned.passed, returned.composite) == (
        stored.status,
        stored.passed,
        stored.composite,
    )
    assert stored.status == ExecutionStatus.SUCCESS and stored.passed is True

    # The server's policy now refuses the local backend: recorded as an error.
    with override_settings(KEYSTONE_POLICY_MIN_BACKEND="docker"):
        refused = services.execution_execute(execution_id=execution_ids[1], worker=WORKER)
    stored = Execution.objects.get(pk=execution_ids[1])
    assert refused is not None
    assert (refused.status, refused.passed) == (stored.status, stored.passed)
    assert stored.status == ExecutionStatus.ERROR and stored.passed is False


def test_executing_a_finished_execution_again_writes_nothing(project: Project) -> None:
    run, execution_ids = planned_run(project, MIXED_SPEC, spec_dir=str(SPECS))
    first = execution_ids[0]
    assert services.execution_execute(execution_id=first, worker=WORKER) is not None
    before = Execution.objects.get(pk=first)
    results_before = CheckResult.objects.filter(execution_id=first).count()
    artifacts_before = Artifact.objects.filter(execution_id=first).count()

    # The same worker, another worker: neither can claim a finished execution.
    assert services.execution_execute(execution_id=first, worker=WORKER) is None
    assert services.execution_execute(execution_id=first, worker="other:2") is None

    after = Execution.objects.get(pk=first)
    assert (after.status, after.attempt, after.finished) == (
        before.status,
        before.attempt,
        before.finished,
    )
    assert CheckResult.objects.filter(execution_id=first).count() == results_before == 4
    assert Artifact.objects.filter(execution_id=first).count() == artifacts_before
    run.refresh_from_db()
    assert run.executions_done == 1


def test_cancel_marks_pending_executions_and_stops_the_running_agent(
    project: Project, settings: Any
) -> None:
    # A short lease makes the watcher look for the cancellation about once a second.
    settings.KEYSTONE_EXECUTION_LEASE_SECONDS = 3
    run, execution_ids = planned_run(project, SLOW_SPEC, spec_dir=str(SPECS))
    assert len(execution_ids) == 3
    returned: list[str | None] = []

    def execute() -> None:
        try:
            ran = services.execution_execute(execution_id=execution_ids[0], worker=WORKER)
            returned.append(ran.status if ran is not None else None)
        finally:
            connection.close()  # this thread's own connection to the test database

    thread = threading.Thread(target=execute)
    started = time.monotonic()
    thread.start()
    _wait_for(lambda: Execution.objects.get(pk=execution_ids[0]).status == "running", 15)

    services.run_cancel(run_id=run.pk)
    thread.join(timeout=20)
    elapsed = time.monotonic() - started

    assert not thread.is_alive(), "the running execution did not stop after the cancel"
    assert elapsed < 20, f"the agent (sleep 30) was not stopped: {elapsed:.1f} s"
    assert returned == [ExecutionStatus.ERROR]  # cancelled, as its row says
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.finished is not None
    statuses = dict(Execution.objects.filter(run=run).values_list("id", "status"))
    assert statuses[execution_ids[0]] == ExecutionStatus.ERROR
    for pending in execution_ids[1:]:
        assert statuses[pending] == ExecutionStatus.ERROR
    assert set(Execution.objects.filter(run=run).values_list("error", flat=True)) == {"cancelled"}
    # Nothing of a cancelled run is recorded or started afterwards.
    assert CheckResult.objects.filter(run=run).count() == 0
    assert services.execution_execute(execution_id=execution_ids[1], worker=WORKER) is None
    services.run_finalize_if_done(run_id=run.pk)
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


def _wait_for(condition: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout} s")


# --- `keystone run` as a subprocess on the embedded default -----------------------------


def _keystone_run(tmp_path: Path, spec: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "CI"}
    }
    env["KEYSTONE_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [sys.executable, "-m", "evaluations.cli", "run", str(SPECS / spec), *extra],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_cli_passing_spec_exits_0_and_writes_json_and_junit(tmp_path: Path) -> None:
    json_path, junit_path = tmp_path / "report.json", tmp_path / "report.xml"
    result = _keystone_run(
        tmp_path, "echo-pass.yaml", "--json", str(json_path), "--junit", str(junit_path)
    )
    assert result.returncode == 0, _describe(result)
    assert "execution 4/4" in result.stdout
    # The run is recorded on the embedded SQLite default, not on the test database.
    assert (tmp_path / "home" / "keystone.sqlite3").is_file()

    report = json.loads(json_path.read_text())
    assert report["summary"]["exit_code"] == 0
    assert len(report["executions"]) == 4
    suites = ET.parse(junit_path).getroot()
    cases = suites.findall(".//testcase")
    assert cases, "the JUnit report has no test cases"
    assert not suites.findall(".//failure")


def test_cli_failing_gate_exits_1_and_junit_shows_the_failure(tmp_path: Path) -> None:
    json_path, junit_path = tmp_path / "report.json", tmp_path / "report.xml"
    result = _keystone_run(
        tmp_path, "echo-gate-fails.yaml", "--json", str(json_path), "--junit", str(junit_path)
    )
    assert result.returncode == 1, _describe(result)
    report = json.loads(json_path.read_text())
    assert report["summary"]["exit_code"] == 1
    codes = {r["invariant_id"]: r["failure_code"] for r in report["executions"][0]["results"]}
    assert codes == {"greets": None, "says_goodbye": "CONTAINS_FAILED"}
    assert ET.parse(junit_path).getroot().findall(".//failure")


def test_cli_invalid_spec_exits_2_with_line_and_column(tmp_path: Path) -> None:
    json_path = tmp_path / "report.json"
    result = _keystone_run(tmp_path, "typo-check-type.yaml", "--json", str(json_path))
    assert result.returncode == 2, _describe(result)
    assert "unknown check type 'containz'" in result.stderr
    assert "line 9, col 19" in result.stderr
    assert "typo-check-type.yaml: invalid (1 error); nothing was run" in result.stderr
    assert not json_path.exists()
