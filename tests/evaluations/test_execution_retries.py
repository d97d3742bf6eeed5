"""Issue 20, item 3 (and issue 19, never stuck): an execution that cannot start (here a
`postgres` service whose server does not answer) is tried a bounded number of times, waiting
longer each time, then ends as `error` with the reason on the execution and the run; and
meanwhile the worker takes the executions of other runs instead of waiting behind it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from evaluations import services
from evaluations.embedded_worker import work_once
from evaluations.models import Execution, ExecutionStatus, Project, Run, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NEEDS_POSTGRES = """\
version: 1
id: needs-postgres
task: {prompt: "p"}
agent: {type: command, command: "echo hi", timeout: 30}
sandbox: {backend: local}
services:
  - {name: db, type: postgres, sql: "CREATE TABLE t (id int)"}
invariants:
  hi: {description: hi, check: {type: contains, value: hi}}
"""

QUICK = """\
version: 1
id: quick
task: {prompts: ["a", "b", "c"]}
agent: {type: command, command: "echo hi", timeout: 30}
sandbox: {backend: local}
invariants:
  hi: {description: hi, check: {type: contains, value: hi}}
"""


def _start(project: Project, source: str) -> Run:
    version = services.spec_version_create(project=project, source_yaml=source)
    run = services.run_create(spec_version=version, enqueue=False)
    services.run_plan(run_id=run.pk)
    return run


@pytest.fixture
def no_postgres_server(settings: Any) -> None:
    # Configured, but nothing answers there: a server away, which a later attempt may find.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.KEYSTONE_POSTGRES_URL = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    settings.KEYSTONE_EXECUTION_MAX_ATTEMPTS = 3
    settings.KEYSTONE_EXECUTION_RETRY_BASE_SECONDS = 0


def test_an_execution_that_cannot_start_ends_as_error_after_the_last_attempt(
    project: Project, no_postgres_server: None
) -> None:
    run = _start(project, NEEDS_POSTGRES)
    for _ in range(10):
        if work_once("test-worker:1") is None:
            break
    execution = Execution.objects.get(run=run)
    run.refresh_from_db()
    assert execution.status == ExecutionStatus.ERROR
    assert execution.attempt == 3
    assert execution.error.startswith("Keystone internal error: could not start after 3 attempts:")
    assert run.exit_code == 4  # the platform's environment failed, not the agent
    assert "postgres" in execution.error.lower()
    assert run.status == RunStatus.COMPLETED
    assert any("could not start after 3 attempts" in w for w in run.warnings)


def test_a_run_keeps_a_bounded_number_of_warnings_whatever_its_size(
    project: Project, no_postgres_server: None, settings: Any
) -> None:
    """Each execution that cannot start warns the run with its own id: 25 of them leave the
    run its first RUN_WARNINGS_KEPT and a line saying more were not kept, while every
    execution keeps its own error."""
    from evaluations.services.runs import RUN_WARNINGS_KEPT, RUN_WARNINGS_MORE

    settings.KEYSTONE_EXECUTION_MAX_ATTEMPTS = 1
    run = _start(project, NEEDS_POSTGRES + "replicas: 25\n")
    while work_once("test-worker:1") is not None:
        pass
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    errors = list(Execution.objects.filter(run=run).values_list("status", "error"))
    assert len(errors) == 25
    assert all(status == ExecutionStatus.ERROR and "could not start" in e for status, e in errors)
    started = [w for w in run.warnings if "could not start after 1 attempts" in w]
    assert len(started) == RUN_WARNINGS_KEPT, run.warnings
    assert RUN_WARNINGS_MORE in run.warnings
    assert len(run.warnings) <= RUN_WARNINGS_KEPT + 2, run.warnings  # and the run's own


def test_a_copy_of_a_full_run_adds_no_more_warnings_and_asks_the_database_nothing(
    project: Project, django_assert_num_queries: Any
) -> None:
    """How an execution's recording warns its run (run_warning_note, one copy of the run
    for many executions): the copy and the row fill up alike, and a full copy stops there."""
    from evaluations.services.runs import RUN_WARNINGS_KEPT, RUN_WARNINGS_MORE, run_warning_note

    run = _start(project, QUICK)
    for index in range(RUN_WARNINGS_KEPT + 5):
        run_warning_note(run, f"provider said: try again in {index}.0s")
    stored = Run.objects.get(pk=run.pk).warnings
    assert stored == run.warnings
    assert stored[-1] == RUN_WARNINGS_MORE and len(stored) == RUN_WARNINGS_KEPT + 1
    with django_assert_num_queries(0):
        run_warning_note(run, "one more")


def test_each_failed_attempt_is_counted_with_its_reason_and_waits(
    project: Project, no_postgres_server: None, settings: Any
) -> None:
    settings.KEYSTONE_EXECUTION_RETRY_BASE_SECONDS = 3600
    run = _start(project, NEEDS_POSTGRES)
    work_once("test-worker:1")
    execution = Execution.objects.get(run=run)
    assert (execution.status, execution.attempt) == (ExecutionStatus.PENDING, 2)
    assert execution.error.startswith("attempt 1 of 3 could not start:")
    assert execution.retry_at is not None
    # Waiting out its backoff, it is not taken again: nothing else is ready.
    assert work_once("test-worker:1") is None


def test_other_runs_are_served_while_one_cannot_start(
    project: Project, no_postgres_server: None, settings: Any
) -> None:
    settings.KEYSTONE_EXECUTION_RETRY_BASE_SECONDS = 3600
    stuck = _start(project, NEEDS_POSTGRES)
    quick = _start(project, QUICK)
    served = []
    last = 0
    for _ in range(10):
        run_id = work_once("test-worker:1", after_run=last)
        if run_id is None:
            break
        served.append(run_id)
        last = run_id
    quick.refresh_from_db()
    assert quick.status == RunStatus.COMPLETED  # all three executions ran
    assert served.count(stuck.pk) == 1  # one attempt, then it waits its turn


def test_a_database_server_this_keystone_has_none_of_is_said_at_once_not_retried(
    project: Project, settings: Any
) -> None:
    settings.KEYSTONE_POSTGRES_URL = ""
    settings.KEYSTONE_POSTGRES_LOCAL_CLUSTER = False
    run = _start(project, NEEDS_POSTGRES)
    work_once("test-worker:1")
    execution = Execution.objects.get(run=run)
    run.refresh_from_db()
    assert (execution.status, execution.attempt) == (ExecutionStatus.ERROR, 1)
    assert "set KEYSTONE_POSTGRES_URL" in execution.error
    assert run.status == RunStatus.COMPLETED and run.exit_code == 1


def test_with_no_postgres_setting_the_execution_gets_a_throwaway_cluster(
    project: Project, settings: Any
) -> None:
    """Issue 19: a demo spec with a postgres service runs on a fresh machine with no setting:
    the machine's initdb/pg_ctl start a cluster of this process's own."""
    settings.KEYSTONE_POSTGRES_URL = ""
    settings.KEYSTONE_POSTGRES_LOCAL_CLUSTER = True
    run = _start(project, NEEDS_POSTGRES)
    work_once("test-worker:1")
    execution = Execution.objects.get(run=run)
    run.refresh_from_db()
    assert (execution.status, execution.error) == (ExecutionStatus.SUCCESS, "")
    assert run.status == RunStatus.COMPLETED and run.exit_code == 0


def test_a_throwaway_cluster_that_cannot_start_is_said_at_once_naming_the_setting(
    project: Project, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evaluations.runner import local_postgres

    broken = tmp_path / "bin"
    broken.mkdir()
    for name in ("initdb", "pg_ctl"):
        (broken / name).write_text(
            "#!/bin/sh\necho 'initdb: cannot create the cluster' >&2\nexit 1\n"
        )
        (broken / name).chmod(0o755)
    monkeypatch.setattr(local_postgres, "_url", None)
    monkeypatch.setattr(local_postgres, "postgres_bin", lambda: broken)
    settings.KEYSTONE_POSTGRES_URL = ""
    settings.KEYSTONE_POSTGRES_LOCAL_CLUSTER = True
    run = _start(project, NEEDS_POSTGRES)
    work_once("test-worker:1")
    execution = Execution.objects.get(run=run)
    assert (execution.status, execution.attempt) == (ExecutionStatus.ERROR, 1)
    assert "set KEYSTONE_POSTGRES_URL" in execution.error
    assert "the throwaway PostgreSQL cluster did not start (initdb:" in execution.error


def test_a_docker_spec_with_no_engine_ends_as_error_at_once_saying_why(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19: on a worker, a spec that needs Docker where no engine answers is an error
    with the reason at once, not an internal error and not an execution left claimed."""
    from checks.results import INTERNAL_ERROR_PREFIX
    from evaluations.runner.sandbox import docker_status

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    docker_status.cache_clear()
    try:
        run = _start(project, NEEDS_POSTGRES.replace("backend: local", "backend: docker"))
        work_once("test-worker:1")
    finally:
        docker_status.cache_clear()
    execution = Execution.objects.get(run=run)
    run.refresh_from_db()
    assert (execution.status, execution.attempt) == (ExecutionStatus.ERROR, 1)
    assert "no Docker engine could be reached" in execution.error
    assert not execution.error.startswith(INTERNAL_ERROR_PREFIX)
    assert run.status == RunStatus.COMPLETED and run.exit_code == 1
