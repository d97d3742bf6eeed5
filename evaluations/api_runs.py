"""The API's view of a run's inside: its executions (filtered, in cursor pages), one
execution with its check results, artifact downloads, re-running the failed groups, and the
run's progress as Server-Sent Events. Same auth and project rules as evaluations/api.py."""

from __future__ import annotations

import json
import mimetypes
import os
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db.models.fields.json import KeyTextTransform
from django.http import FileResponse, Http404, HttpRequest, StreamingHttpResponse
from ninja import Field, Query, Schema, Status

from evaluations import selectors, services
from evaluations.api import (
    ApiConflict,
    ApiInputError,
    ErrorOut,
    RowId,
    RunCreatedOut,
    _caller,
    _run,
    router,
    run_created_out,
)
from evaluations.charts import id_paths
from evaluations.models import (
    RUN_TERMINAL_STATUSES,
    Artifact,
    ArtifactKind,
    Execution,
    ExecutionStatus,
    Role,
    Run,
    Trigger,
    run_large_fields,
)
from evaluations.numbers import whole_number

# The content type of each kind of blob; a `file` is typed by its name.
ARTIFACT_CONTENT_TYPES = {
    ArtifactKind.STDOUT: "text/plain; charset=utf-8",
    ArtifactKind.STDERR: "text/plain; charset=utf-8",
    ArtifactKind.TRACE: "application/json",
    ArtifactKind.WORKSPACE_DIFF: "application/json",
    ArtifactKind.HTTP_LOG: "application/json",
    ArtifactKind.DB_WRITES: "application/json",
    ArtifactKind.ARTIFACT_JSON: "application/json",
}
EVENTS_TIMEOUT_MAX = 3600.0  # seconds one event stream stays open at most
EVENTS_KEEPALIVE_SECONDS = 15.0  # a comment line so proxies keep an idle stream open


class ExecutionOut(Schema):
    id: int
    key: str
    scenario: str
    prompt_index: int
    replica: int
    attempt: int
    pillar: str
    mutation_type: str
    status: str
    passed: bool | None
    composite: float | None
    duration_ms: float | None
    cost_usd: float
    # Models of calls the gateway had no price for: cost_usd leaves them out.
    unpriced_models: list[str]
    error: str
    started: datetime | None
    finished: datetime | None
    url: str


class ExecutionListOut(Schema):
    items: list[ExecutionOut]
    next_cursor: str | None


class ExecutionListQuery(Schema):
    status: str = ""
    scenario: str = ""
    failed: bool = Field(default=False, description="only executions that failed or errored")
    cursor: str = ""
    limit: int = Field(
        default=selectors.EXECUTION_PAGE_SIZE, ge=1, le=selectors.EXECUTION_PAGE_SIZE
    )


class CheckResultOut(Schema):
    invariant_id: str
    check_type: str
    source: str
    passed: bool | None  # null while hidden for blind review
    score: float | None  # null while hidden for blind review
    failure_code: str
    message: str
    severity: str
    gate: bool
    details: dict[str, Any]
    # Blind review: the result waits in an open blind review item you have not graded;
    # its verdict (passed, score, failure code, message, details) is left out until you do.
    hidden_for_blind_review: bool = False
    review_item_id: int | None = None  # the item that hides it


def check_result_out(result: Any, hidden: dict[int, int]) -> CheckResultOut:
    """One stored result as the API shows it to a person: in full, or, when `hidden`
    (selectors.blind_hidden_results) holds it, without its verdict."""
    item_id = hidden.get(result.pk)
    shown = item_id is None
    return CheckResultOut(
        invariant_id=result.invariant_id,
        check_type=result.check_type,
        source=result.source,
        passed=result.passed if shown else None,
        score=result.score if shown else None,
        failure_code=result.failure_code if shown else "",
        message=result.message if shown else selectors.BLIND_HIDDEN,
        severity=result.severity,
        gate=result.gate,
        details=(result.details if isinstance(result.details, dict) else {}) if shown else {},
        hidden_for_blind_review=not shown,
        review_item_id=item_id,
    )


class ArtifactOut(Schema):
    id: int
    kind: str
    name: str
    size: int
    sha256: str
    truncated: bool
    url: str


class ExecutionDetailOut(ExecutionOut):
    run_id: int
    prompt: str
    final_output: str
    check_results: list[CheckResultOut]
    artifacts: list[ArtifactOut]


def _execution_url(request: HttpRequest, slug: str, execution: Execution) -> str:
    # A list's rows share one reversed URL (charts.id_paths), not one reverse() each.
    return request.build_absolute_uri(id_paths("api:execution_detail", slug)(execution.pk))


def _execution_out(request: HttpRequest, slug: str, execution: Execution) -> ExecutionOut:
    return ExecutionOut(
        id=execution.pk,
        key=execution.key,
        scenario=execution.scenario,
        prompt_index=execution.prompt_index,
        replica=execution.replica,
        attempt=execution.attempt,
        pillar=execution.pillar,
        mutation_type=execution.mutation_type,
        status=execution.status,
        passed=execution.passed,
        composite=execution.composite,
        duration_ms=execution.duration_ms,
        cost_usd=execution.cost_usd,
        unpriced_models=execution.unpriced_models,
        error=execution.error,
        started=execution.started,
        finished=execution.finished,
        url=_execution_url(request, slug, execution),
    )


def _cursor(token: str) -> int | None:
    """The execution list's cursor is the last id of the page before, as text."""
    if not token:
        return None
    cursor = whole_number(token)
    if cursor is None:
        raise ApiInputError("cursor", f"{token[:40]!r} is not an execution list cursor")
    return cursor


@router.get(
    "/projects/{slug}/runs/{run_id}/executions", response=ExecutionListOut, url_name="executions"
)
def execution_list(
    request: HttpRequest, slug: str, run_id: RowId, query: Query[ExecutionListQuery]
) -> ExecutionListOut:
    """The run's executions in id order, a page at a time (pass `next_cursor` back as
    `cursor`); filter by status, scenario, or `failed=true` for those that failed or erred."""
    caller = _caller(request, slug, Role.VIEWER)
    run = _run(caller, run_id)
    if query.status and query.status not in ExecutionStatus.values:
        raise ApiInputError("status", f"expected one of {', '.join(ExecutionStatus.values)}")
    page = selectors.execution_page(
        run,
        status=query.status,
        scenario=query.scenario,
        failed=query.failed,
        after=_cursor(query.cursor),
        size=query.limit,
    )
    return ExecutionListOut(
        items=[_execution_out(request, slug, e) for e in page.executions],
        next_cursor=str(page.next_after) if page.next_after is not None else None,
    )


def _execution(caller: Any, execution_id: int) -> Execution:
    execution = selectors.execution_for_page(caller.project, execution_id)
    if execution is None:
        raise Http404("No such execution in this project.")
    return execution


@router.get(
    "/projects/{slug}/executions/{execution_id}",
    response=ExecutionDetailOut,
    url_name="execution_detail",
)
def execution_detail(request: HttpRequest, slug: str, execution_id: RowId) -> ExecutionDetailOut:
    """One execution with every check result (each source: engine, judge, human) and its
    artifacts, each with a download URL.

    Blind review: a result waiting in an open blind review item that you have not graded
    comes with `hidden_for_blind_review: true`, `review_item_id`, a null `score` and
    `passed`, no failure code or details, and a message saying why; grade the item (or wait
    until it closes) to see it. The execution's own `passed` and `composite` are aggregates
    and stay."""
    caller = _caller(request, slug, Role.VIEWER)
    execution = _execution(caller, execution_id)
    hidden = selectors.blind_hidden_results(caller.user, execution_id=execution.pk)
    results = [check_result_out(r, hidden) for r in selectors.execution_results(execution)]
    artifacts = [
        ArtifactOut(
            id=a.pk,
            kind=a.kind,
            name=a.name,
            size=a.size,
            sha256=a.sha256,
            truncated=a.truncated,
            url=request.build_absolute_uri(
                id_paths("api:artifact_download", slug, execution.pk)(a.pk)
            ),
        )
        for a in selectors.execution_artifacts(execution)
    ]
    return ExecutionDetailOut(
        **_execution_out(request, slug, execution).dict(),
        run_id=execution.run_id,
        prompt=execution.prompt,
        final_output=execution.final_output,
        check_results=results,
        artifacts=artifacts,
    )


def artifact_content_type(artifact: Artifact) -> str:
    known = ARTIFACT_CONTENT_TYPES.get(ArtifactKind(artifact.kind)) if artifact.kind else None
    if known:
        return known
    guessed, _ = mimetypes.guess_type(artifact.name or artifact.file.name)
    return guessed or "application/octet-stream"


@router.get(
    "/projects/{slug}/executions/{execution_id}/artifacts/{artifact_id}",
    url_name="artifact_download",
)
def artifact_download(
    request: HttpRequest, slug: str, execution_id: RowId, artifact_id: RowId
) -> FileResponse:
    """The artifact's bytes, streamed as an attachment, with the content type of its kind
    (text for stdout and stderr, JSON for traces, logs and diffs, by name for files)."""
    caller = _caller(request, slug, Role.VIEWER)
    artifact = selectors.artifact_in_project(caller.project, execution_id, artifact_id)
    if artifact is None:
        raise Http404("No such artifact in this project.")
    try:
        handle = artifact.file.storage.open(artifact.file.name, "rb")
    except FileNotFoundError:
        raise Http404("The artifact's file is missing from storage.") from None
    filename = os.path.basename(artifact.name or artifact.file.name) or artifact.kind
    return FileResponse(
        handle,
        as_attachment=True,
        filename=f"execution-{execution_id}-{filename}",
        content_type=artifact_content_type(artifact),
    )


@router.post(
    "/projects/{slug}/runs/{run_id}/rerun-failed",
    response={202: RunCreatedOut, 409: ErrorOut},
    url_name="run_rerun_failed",
)
def run_rerun_failed(request: HttpRequest, slug: str, run_id: RowId) -> Status[RunCreatedOut]:
    """A new run of the failed (scenario x prompt) groups of a completed run, every replica
    of each; 409 when the run has not completed or nothing failed."""
    caller = _caller(request, slug, Role.EDITOR)
    run = _run(caller, run_id)
    try:
        new = services.run_rerun_failed(run_id=run.pk, created_by=caller.user, trigger=Trigger.API)
    except ValueError as exc:
        raise ApiConflict(str(exc)) from None
    return Status(202, run_created_out(request, new))


# --- Progress as Server-Sent Events ---------------------------------------------------------


def _sse(event: str, data: dict[str, Any], event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def run_events_stream(
    run_id: int, *, timeout: float, interval: float, execution_url: Any
) -> Iterator[str]:
    """`execution` for each execution that ends (in the order they are seen), then one
    `run` event with the verdict once the run has ended, or `timeout` after `timeout` s."""
    told: set[int] = set()
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while True:
        # The run's status first: every execution that ended before it did is told below.
        run = Run.objects.only("status", "execution_count").get(pk=run_id)
        ended = selectors.executions_finished(run_id, exclude=told)
        for execution in ended:
            told.add(execution.pk)
            yield _sse(
                "execution",
                {
                    "id": execution.pk,
                    "scenario": execution.scenario,
                    "prompt_index": execution.prompt_index,
                    "replica": execution.replica,
                    "status": execution.status,
                    "passed": execution.passed,
                    "composite": execution.composite,
                    "done": len(told),
                    "total": run.execution_count,
                    "url": execution_url(execution),
                },
                execution.pk,
            )
            quiet_since = time.monotonic()
        if len(ended) == selectors.EXECUTIONS_FINISHED_BATCH:
            continue  # more may have ended already: told at once, and before the run's end
        if run.status in RUN_TERMINAL_STATUSES:
            # The verdict alone of the summary (a JSON path), not the large columns.
            final = (
                Run.objects.defer(*run_large_fields())
                .annotate(verdict=KeyTextTransform("verdict", "summary"))
                .get(pk=run_id)
            )
            yield _sse(
                "run",
                {
                    "id": final.pk,
                    "status": final.status,
                    "verdict": final.verdict,
                    "exit_code": final.exit_code,
                    "gate_passed": final.gate_passed,
                    "composite": final.composite,
                    "pass_rate": final.pass_rate,
                },
            )
            return
        now = time.monotonic()
        if now >= deadline:
            yield _sse("timeout", {"id": run_id, "status": run.status, "done": len(told)})
            return
        if now - quiet_since >= EVENTS_KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            quiet_since = now
        time.sleep(min(interval, max(0.0, deadline - now)))


@router.get(
    "/projects/{slug}/runs/{run_id}/events",
    url_name="run_events",
    response={200: None, 404: ErrorOut},
    openapi_extra={
        "responses": {
            200: {
                "description": "text/event-stream: `execution` events, then `run` (or `timeout`)",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        }
    },
)
def run_events(
    request: HttpRequest,
    slug: str,
    run_id: RowId,
    timeout: float = Query(600.0, ge=0, le=EVENTS_TIMEOUT_MAX),
    interval: float = Query(1.0, ge=0.1, le=30.0),
) -> StreamingHttpResponse:
    """The run's progress as Server-Sent Events: one `execution` event per execution that
    ends, a final `run` event with the status, verdict and exit code; after `timeout`
    seconds without the run ending, a `timeout` event (reconnect to go on)."""
    caller = _caller(request, slug, Role.VIEWER)
    run = _run(caller, run_id)

    def execution_url(execution: Execution) -> str:
        return _execution_url(request, slug, execution)

    stream = run_events_stream(
        run.pk, timeout=timeout, interval=interval, execution_url=execution_url
    )
    response = StreamingHttpResponse(stream, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events on as they come
    return response


# --- Comparison -------------------------------------------------------------------------------


class CompareOut(Schema):
    before: int
    after: int
    alpha: float
    regressed: bool
    cells: list[dict[str, Any]]  # per cell: counts before and after, p-value, verdict


@router.get("/projects/{slug}/runs/{run_id}/compare", response=CompareOut, url_name="run_compare")
def run_compare(
    request: HttpRequest,
    slug: str,
    run_id: RowId,
    against: str = Query("baseline", description="'baseline' (the spec's active one) or a run id"),
    alpha: float = Query(0.05, gt=0, lt=1),
) -> CompareOut:
    """The run against its spec's active baseline or another run of the spec, as `keystone
    compare` says it: each cell's verdict by Fisher's exact test, and whether any regressed."""
    from evaluations.selectors.compare import (
        ComparisonRefused,
        comparison_reference,
        run_comparison,
    )

    caller = _caller(request, slug, Role.VIEWER)
    after = _run(caller, run_id)
    try:
        before = comparison_reference(after, against)
    except ComparisonRefused as exc:
        raise ApiInputError("against", str(exc)) from None
    comparison = run_comparison(before, after, alpha=alpha)
    return CompareOut(before=before.pk, after=after.pk, **comparison.to_dict())
