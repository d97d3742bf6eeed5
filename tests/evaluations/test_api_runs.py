"""Issue 16, item 2: a run's inside through the API. Executions (filters, cursor pages), one
execution with its check results and artifacts, artifact downloads with their content type,
re-running the failed groups, progress as Server-Sent Events; specs validated without
saving, listed, their versions, sources and diffs; runs created from inline YAML with labels.
A real run executes in-process (transaction=True: the runner's lease thread needs committed
rows)."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from evaluations import selectors, services
from evaluations.models import (
    Execution,
    ExecutionStatus,
    Membership,
    Project,
    Role,
    Run,
    RunStatus,
    Spec,
    Trigger,
)
from tests.evaluations.execution_helpers import execute_run, run_spec

pytestmark = pytest.mark.django_db(transaction=True)

# Two scenarios x two replicas; `greets` fails in `quiet`, where the agent prints nothing.
SPEC = """\
version: 1
id: api-agent
task: {prompt: "Say hello"}
agent: {type: command, command: "sh -c 'test \\"$KEYSTONE_SCENARIO\\" = quiet || echo hello'"}
replicas: 2
chaos_matrix:
  - name: no-chaos
  - name: quiet
invariants:
  greets:
    description: "The answer greets"
    check: {type: contains, value: hello}
"""


@pytest.fixture
def bearer(project: Project, django_user_model: Any) -> Any:
    def make(role: str = "editor", where: Project | None = None) -> dict[str, str]:
        where = where or project
        user = django_user_model.objects.create_user(
            username=f"{role}-{django_user_model.objects.count()}", password="pw-123456"
        )
        Membership.objects.create(project=where, user=user, role=Role(role))
        _, raw = services.token_issue(project=where, user=user, name="ci")
        return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}

    return make


@pytest.fixture
def finished_run(project: Project, tmp_path: Path) -> Run:
    return run_spec(project, SPEC, spec_dir=tmp_path)


def _get(url: str, headers: dict[str, str], **query: Any) -> Any:
    return Client().get(url, query, **headers)


def test_executions_filter_and_page_with_a_cursor(finished_run: Run, bearer: Any) -> None:
    headers = bearer("viewer")
    url = f"/api/projects/demo/runs/{finished_run.pk}/executions"
    everything = _get(url, headers).json()
    assert len(everything["items"]) == 4 and everything["next_cursor"] is None

    seen: list[int] = []
    cursor = ""
    while True:
        page = _get(url, headers, limit=3, cursor=cursor).json()
        seen += [item["id"] for item in page["items"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert seen == [item["id"] for item in everything["items"]] and len(set(seen)) == 4

    quiet = _get(url, headers, scenario="quiet").json()["items"]
    assert {e["scenario"] for e in quiet} == {"quiet"} and len(quiet) == 2
    failed = _get(url, headers, failed="true").json()["items"]
    assert {e["scenario"] for e in failed} == {"quiet"}
    assert all(e["passed"] is False for e in failed)
    # The status is how the agent's process ended; the verdict is `passed`.
    ended = _get(url, headers, status="success").json()["items"]
    assert len(ended) == 4
    assert _get(url, headers, status="timed_out").json()["items"] == []
    refused = _get(url, headers, status="sideways")
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "status"
    refused = _get(url, headers, cursor="not-a-cursor")
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "cursor"


def test_one_execution_with_check_results_and_artifact_downloads(
    finished_run: Run, bearer: Any
) -> None:
    headers = bearer("viewer")
    target = Execution.objects.get(run=finished_run, scenario="quiet", replica=0)
    detail = _get(f"/api/projects/demo/executions/{target.pk}", headers)
    assert detail.status_code == 200
    body = detail.json()
    assert body["run_id"] == finished_run.pk and body["scenario"] == "quiet"
    (result,) = [r for r in body["check_results"] if r["invariant_id"] == "greets"]
    assert result["passed"] is False and result["source"] == "engine"
    assert "artifact_json" in {a["kind"] for a in body["artifacts"]}

    hello = Execution.objects.get(run=finished_run, scenario="no-chaos", replica=0)
    artifacts = _get(f"/api/projects/demo/executions/{hello.pk}", headers).json()["artifacts"]
    stdout = next(a for a in artifacts if a["kind"] == "stdout")
    download = Client().get(stdout["url"], **headers)
    assert download.status_code == 200
    assert download["Content-Type"] == "text/plain; charset=utf-8"
    assert "attachment" in download["Content-Disposition"]
    assert b"hello" in b"".join(download.streaming_content)
    for artifact in artifacts:
        if artifact["kind"] in ("trace", "artifact_json"):
            trace = Client().get(artifact["url"], **headers)
            assert trace["Content-Type"] == "application/json"
            json.loads(b"".join(trace.streaming_content))

    other = Project.objects.create(name="Other", slug="other")
    outsider = bearer("admin", other)
    assert Client().get(stdout["url"], **outsider).status_code == 404
    assert _get(f"/api/projects/demo/executions/{hello.pk}", outsider).status_code == 404
    assert _get(f"/api/projects/other/executions/{hello.pk}", outsider).status_code == 404


def test_rerun_failed_queues_only_the_failed_groups(finished_run: Run, bearer: Any) -> None:
    answer = Client().post(
        f"/api/projects/demo/runs/{finished_run.pk}/rerun-failed", **bearer("editor")
    )
    assert answer.status_code == 202, answer.content
    rerun = Run.objects.get(pk=answer.json()["id"])
    assert rerun.trigger == Trigger.API and rerun.labels["rerun_of"] == str(finished_run.pk)
    execute_run(rerun)
    assert set(Execution.objects.filter(run=rerun).values_list("scenario", flat=True)) == {"quiet"}
    # A run that has not completed has no verdicts to re-run.
    queued = services.run_create(spec_version=finished_run.spec_version, enqueue=False)
    refused = Client().post(f"/api/projects/demo/runs/{queued.pk}/rerun-failed", **bearer())
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "conflict"
    viewer = Client().post(
        f"/api/projects/demo/runs/{finished_run.pk}/rerun-failed", **bearer("viewer")
    )
    assert viewer.status_code == 403


def _events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in body.decode().split("\n\n"):
        lines = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_progress_events_one_per_execution_then_the_verdict(
    project: Project, bearer: Any, tmp_path: Path
) -> None:
    headers = bearer("viewer")
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(spec_version=version, spec_dir=str(tmp_path), enqueue=False)

    # The run executes in another thread while the stream is read, as a worker would.
    def work() -> None:
        try:
            time.sleep(0.5)
            execute_run(Run.objects.get(pk=run.pk))
        finally:
            close_old_connections()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        response = Client().get(
            f"/api/projects/demo/runs/{run.pk}/events", {"interval": 0.2, "timeout": 120}, **headers
        )
        assert response.status_code == 200
        assert response["Content-Type"] == "text/event-stream"
        events = _events(b"".join(response.streaming_content))
    finally:
        worker.join(timeout=120)
    kinds = [kind for kind, _ in events]
    assert kinds == ["execution"] * 4 + ["run"], kinds
    assert sorted(data["done"] for _, data in events[:4]) == [1, 2, 3, 4]
    assert {data["scenario"] for _, data in events[:4]} == {"no-chaos", "quiet"}
    final = events[-1][1]
    run.refresh_from_db()
    assert final["status"] == RunStatus.COMPLETED and final["exit_code"] == run.exit_code
    assert final["verdict"] == run.summary["verdict"] and final["verdict"]


def test_progress_events_end_with_timeout_when_the_run_does_not(
    project: Project, bearer: Any
) -> None:
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(spec_version=version, enqueue=False)
    started = time.monotonic()
    response = Client().get(
        f"/api/projects/demo/runs/{run.pk}/events", {"interval": 0.1, "timeout": 0.5}, **bearer()
    )
    events = _events(b"".join(response.streaming_content))
    assert [kind for kind, _ in events] == ["timeout"]
    assert events[0][1]["status"] == RunStatus.QUEUED
    assert time.monotonic() - started < 10


def test_progress_events_of_a_finished_run_read_none_of_its_large_columns(
    project: Project, bearer: Any, tmp_path: Path
) -> None:
    """The closing `run` event needs the summary's verdict alone: read as a JSON path, not
    the summary, verdicts and keys whole, which grow with the run's groups and cells."""
    run = run_spec(project, SPEC, spec_dir=tmp_path)
    with CaptureQueriesContext(connection) as queries:
        response = Client().get(
            f"/api/projects/demo/runs/{run.pk}/events", {"interval": 0.1}, **bearer("viewer")
        )
        events = _events(b"".join(response.streaming_content))
    assert (
        events[-1] == ("run", events[-1][1]) and events[-1][1]["verdict"] == run.summary["verdict"]
    )
    # A column read whole is listed between commas in a SELECT; a JSON path of it is inside
    # a function or an operator's parentheses.
    whole = re.compile(
        r'(?:(?<=SELECT )|(?<=, ))"evaluations_run"\."(summary|verdicts|failing_keys)"(?=,| FROM)'
    )
    read = [match for q in queries.captured_queries for match in whole.findall(q["sql"])]
    assert read == []


def test_progress_events_of_a_large_finished_run_tell_each_execution_in_bounded_statements(
    project: Project, bearer: Any
) -> None:
    """A finished run of 1,200 executions, asked for its events: every execution is told once,
    a batch at a time (each in the order its executions ended), before the run's own event;
    no statement lists more than a batch of ids (a large run listed them all, past SQLite's
    limit on parameters)."""
    batch = selectors.EXECUTIONS_FINISHED_BATCH
    version = services.spec_version_create(
        project=project, source_yaml=SPEC.replace("replicas: 2", "replicas: 600")
    )
    run = services.run_create(spec_version=version, enqueue=False)
    services.run_plan(run_id=run.pk)
    executions = list(Execution.objects.filter(run=run).order_by("-id"))
    start = timezone.now()
    for offset, execution in enumerate(executions):  # ended last to first
        execution.status = ExecutionStatus.SUCCESS
        execution.finished = start + timedelta(seconds=offset)
    Execution.objects.bulk_update(executions, ["status", "finished"], batch_size=200)
    ids = [execution.pk for execution in executions]
    Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)
    params: list[int] = []

    def count(execute: Any, sql: str, values: Any, many: bool, context: Any) -> Any:
        params.append(len(values or ()))
        return execute(sql, values, many, context)

    with connection.execute_wrapper(count):
        response = Client().get(
            f"/api/projects/demo/runs/{run.pk}/events", {"timeout": 60}, **bearer("viewer")
        )
        events = _events(b"".join(response.streaming_content))
    told = [data["id"] for kind, data in events if kind == "execution"]
    # They ended in the reverse order of their ids: each batch of ids, the lowest batch first,
    # is told highest id (the first to end) first.
    assert told == [
        pk for start in range(0, 1200, batch) for pk in sorted(ids)[start : start + batch][::-1]
    ]
    assert [data["done"] for kind, data in events if kind == "execution"] == list(range(1, 1201))
    assert [kind for kind, _ in events[-2:]] == ["execution", "run"]
    assert len(ids) > 2 * batch and max(params) <= batch, max(params)


# --- Specs -----------------------------------------------------------------------------------


def test_validate_stores_nothing_and_names_path_line_column(project: Project, bearer: Any) -> None:
    headers = bearer("viewer")
    url = "/api/projects/demo/specs/validate"
    broken = SPEC.replace("type: contains", "type: no_such_check")
    answer = Client().post(
        url, json.dumps({"source_yaml": broken}), content_type="application/json", **headers
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["valid"] is False and body["spec"] == "api-agent"
    (error,) = body["errors"]
    assert error["path"] == "invariants.greets.check.type"
    assert (error["line"], error["column"]) == (12, 19)  # the value of `type:`
    good = (
        Client()
        .post(url, json.dumps({"source_yaml": SPEC}), content_type="application/json", **headers)
        .json()
    )
    assert good == {"valid": True, "spec": "api-agent", "errors": []}
    assert not Spec.objects.exists()


def test_spec_list_versions_source_parsed_and_diff(project: Project, bearer: Any) -> None:
    headers = bearer("viewer")
    services.spec_version_create(project=project, source_yaml=SPEC)
    services.spec_version_create(project=project, source_yaml=SPEC.replace("Say hello", "Say hi"))
    (row,) = _get("/api/projects/demo/specs", headers).json()
    assert row["slug"] == "api-agent" and row["latest_version"] == 2

    versions = _get("/api/projects/demo/specs/api-agent/versions", headers).json()
    assert [v["number"] for v in versions] == [2, 1]
    first = _get("/api/projects/demo/specs/api-agent/versions/1", headers).json()
    assert first["source_yaml"] == SPEC
    assert first["parsed"]["task"]["prompt"] == "Say hello"
    assert _get("/api/projects/demo/specs/api-agent/versions/7", headers).status_code == 404

    diff = _get("/api/projects/demo/specs/api-agent/diff", headers, a=1, b=2).json()
    assert '-task: {prompt: "Say hello"}' in diff["diff"]
    assert '+task: {prompt: "Say hi"}' in diff["diff"]
    missing = _get("/api/projects/demo/specs/api-agent/diff", headers, a=1, b=9)
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "b"


def test_a_run_from_inline_yaml_with_labels(project: Project, bearer: Any) -> None:
    headers = bearer("editor")
    body = {
        "source_yaml": SPEC,
        "replicas": 1,
        "labels": {"git_sha": "abc123", "branch": "feature/x", "pr": "42"},
    }
    answer = Client().post(
        "/api/projects/demo/runs", json.dumps(body), content_type="application/json", **headers
    )
    assert answer.status_code == 202, answer.content
    run = Run.objects.get(pk=answer.json()["id"])
    assert (run.git_sha, run.branch, run.labels["pr"]) == ("abc123", "feature/x", "42")
    assert run.replicas_override == 1 and run.spec.slug == "api-agent"
    invalid = Client().post(
        "/api/projects/demo/runs",
        json.dumps({"source_yaml": "version: 1\nid: x\n"}),
        content_type="application/json",
        **headers,
    )
    assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "spec_invalid"
    assert Run.objects.count() == 1

    # A retried POST with its Idempotency-Key gets the same run; another body is a 409.
    keyed = {**headers, "HTTP_IDEMPOTENCY_KEY": "ci-job-7"}
    post = Client().post
    first = post("/api/projects/demo/runs", json.dumps(body), "application/json", **keyed)
    again = post("/api/projects/demo/runs", json.dumps(body), "application/json", **keyed)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"] != run.pk
    other = {**body, "replicas": 2}
    conflict = post("/api/projects/demo/runs", json.dumps(other), "application/json", **keyed)
    assert conflict.status_code == 409 and conflict.json()["error"]["field"] == "Idempotency-Key"
    assert Run.objects.count() == 2


def test_compare_two_runs_as_keystone_compare_does(
    finished_run: Run, project: Project, bearer: Any, tmp_path: Path
) -> None:
    from evaluations.selectors.compare import run_comparison

    headers = bearer("viewer")
    fixed = run_spec(project, SPEC.replace("|| echo hello", "; echo hello"), spec_dir=tmp_path)
    url = f"/api/projects/demo/runs/{fixed.pk}/compare"
    answer = _get(url, headers, against=str(finished_run.pk))
    assert answer.status_code == 200, answer.content
    body = answer.json()
    expected = run_comparison(finished_run, fixed).to_dict()
    assert body == {"before": finished_run.pk, "after": fixed.pk, **expected}
    quiet = [cell for cell in body["cells"] if "quiet" in json.dumps(cell)]
    assert quiet and all(cell["after_passed"] == cell["after_total"] for cell in quiet)

    no_baseline = _get(url, headers)
    assert no_baseline.status_code == 422 and no_baseline.json()["error"]["field"] == "against"
    assert "no active baseline" in no_baseline.json()["error"]["message"]
    other = run_spec(project, SPEC.replace("id: api-agent", "id: other-agent"), spec_dir=tmp_path)
    refused = _get(url, headers, against=str(other.pk))
    assert (
        refused.status_code == 422 and "only runs of one spec" in refused.json()["error"]["message"]
    )
