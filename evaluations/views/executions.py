"""Executions: one agent invocation in full (transcript, output streams, workspace diff,
HTTP mock requests, database writes, check results with their review state and the changes
people made, forbidden violations, a reproducer command) and the download of its stored
artifacts."""

from __future__ import annotations

import json
import os
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from checks.results import gradable
from evaluations import selectors
from evaluations.access import project_for
from evaluations.models import Artifact, ArtifactKind, CheckResult, ReviewItem
from evaluations.views.htmx import page_or_region

DETAILS_MAX_CHARS = 8000  # a check result's details as shown; the JSON export has them whole
FILE_CONTENT_MAX_CHARS = 20000  # one changed file's content in the workspace diff
BODY_MAX_CHARS = 4000  # one HTTP request or response body


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more chars)"


def _pretty(value: Any, limit: int = DETAILS_MAX_CHARS) -> str:
    if value in (None, "", {}, []):
        return ""
    return _clip(json.dumps(value, indent=2, ensure_ascii=False, default=str), limit)


def _result_rows(
    results: list[CheckResult],
    pending_reviews: dict[int, ReviewItem],
    hidden: dict[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Results with their details as text, whether a stronger source (a person over the
    judge, the judge over the engine) overrides them for their invariant, and the review
    item each one is waiting in, if any. A result in `hidden` (selectors.blind_hidden_results:
    under blind review, not graded by this person yet) keeps its verdict, score, failure
    code, message and details out of the page; `hidden_item` is the item that hides it."""
    hidden = hidden or {}
    strongest: dict[str, CheckResult] = {}
    for result in results:
        current = strongest.get(result.invariant_id)
        rank = selectors.RESULT_SOURCE_RANK
        if current is None or rank.get(result.source, 0) > rank.get(current.source, 0):
            strongest[result.invariant_id] = result
    return [
        {
            "result": result,
            "hidden_item": hidden.get(result.pk),
            "details": "" if result.pk in hidden else _pretty(result.details),
            "overridden": strongest[result.invariant_id].pk != result.pk,
            "review_item": pending_reviews.get(result.pk),
            "gradable": gradable(result.check_type, result.details),
        }
        for result in results
    ]


def _changes(changes: list[Any], hidden: dict[int, int]) -> list[Any]:
    for change in changes:
        change.hidden = change.check_result_id in hidden
    return changes


def _reason(execution: Any, results: list[CheckResult], hidden: dict[int, int]) -> str:
    """Why the execution did not pass, unless the words come from a result hidden for
    blind review (a gate's score, a judge's message). The execution's own verdict and
    composite are an aggregate, and stay."""
    reason = selectors.execution_reason(execution, results)
    return selectors.blind_reason(reason, {r.invariant_id for r in results if r.pk in hidden})


def _blob(artifact: Artifact | None) -> selectors.ArtifactText | None:
    return selectors.artifact_text(artifact) if artifact is not None else None


def _json_artifact(artifact: Artifact | None, shape: type) -> tuple[Any, str]:
    """An artifact's parsed JSON (of the expected shape), and why it cannot be shown:
    "" when it can (or there is no such artifact), else "too large", "missing", "not JSON"."""
    if artifact is None:
        return shape(), ""
    parsed = selectors.artifact_json(artifact)
    if parsed.problem:
        return shape(), parsed.problem
    if not isinstance(parsed.data, shape):
        return shape(), "not JSON"
    return parsed.data, ""


def _file_changes(changes: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for change in changes:
        if not isinstance(change, dict):
            continue
        content = change.get("content")
        rows.append(
            {
                **change,
                "content": _clip(content, FILE_CONTENT_MAX_CHARS)
                if isinstance(content, str)
                else None,
            }
        )
    return rows


def _http_calls(calls: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        rows.append(
            {
                **call,
                "headers_text": _pretty(call.get("headers") or {}, BODY_MAX_CHARS),
                "body": _clip(str(call.get("body") or ""), BODY_MAX_CHARS),
                "response_body": _clip(str(call.get("response_body") or ""), BODY_MAX_CHARS),
            }
        )
    return rows


@login_required
@require_GET
def execution_detail(request: HttpRequest, project_slug: str, execution_id: int) -> HttpResponse:
    """Everything one execution left behind. Artifacts are read with a size cap: a large one
    shows its beginning (text) or only its download link (JSON)."""
    access = project_for(request, project_slug)
    execution = selectors.execution_for_page(access.project, execution_id)
    if execution is None:
        raise Http404("No such execution in this project.")
    artifacts = selectors.execution_artifacts(execution)
    by_kind: dict[str, Artifact] = {}
    for artifact in artifacts:
        if artifact.kind != ArtifactKind.FILE:
            by_kind.setdefault(artifact.kind, artifact)
    trace, trace_problem = _json_artifact(by_kind.get(ArtifactKind.TRACE), dict)
    diff, diff_problem = _json_artifact(by_kind.get(ArtifactKind.WORKSPACE_DIFF), list)
    http_log, http_problem = _json_artifact(by_kind.get(ArtifactKind.HTTP_LOG), list)
    db_writes, db_problem = _json_artifact(by_kind.get(ArtifactKind.DB_WRITES), list)
    previous_id, next_id = selectors.execution_neighbours(execution)
    results = selectors.execution_results(execution)
    hidden = selectors.blind_hidden_results(request.user, execution_id=execution.pk)
    context = {
        "access": access,
        "execution": execution,
        "run": execution.run,
        "artifacts": artifacts,
        "by_kind": by_kind,
        "results": _result_rows(results, selectors.pending_review_items(execution), hidden),
        # Human verdicts that replaced a result: who, when, before and after (the before
        # side of a result now under blind review again stays hidden).
        "changes": _changes(selectors.result_changes(execution), hidden),
        "forbidden": [_pretty(v) for v in execution.forbidden_violations],
        "transcript": selectors.execution_transcript(trace),
        "timeline": selectors.execution_timeline(trace, http_log, started=execution.started),
        "trace_problem": trace_problem,
        "stdout": _blob(by_kind.get(ArtifactKind.STDOUT)),
        "stderr": _blob(by_kind.get(ArtifactKind.STDERR)),
        "file_changes": _file_changes(diff),
        "diff_problem": diff_problem,
        "http_calls": _http_calls(http_log),
        "http_problem": http_problem,
        "db_writes": [w for w in db_writes if isinstance(w, dict)],
        "db_problem": db_problem,
        "reproducer": selectors.execution_reproducer(execution),
        "reason": _reason(execution, results, hidden),
        "blind_hidden": selectors.BLIND_HIDDEN,
        "previous_id": previous_id,
        "next_id": next_id,
        "plan_invariants": execution.plan.get("invariant_ids") or [],
    }
    template = "executions/execution_detail.html"
    return render(request, page_or_region(request, template, "execution-body"), context)


@login_required
@require_GET
def artifact_download(
    request: HttpRequest, project_slug: str, execution_id: int, artifact_id: int
) -> FileResponse:
    """The artifact's file, streamed, always as an attachment: what an agent wrote is never
    rendered as a page of this site."""
    access = project_for(request, project_slug)
    artifact = selectors.artifact_in_project(access.project, execution_id, artifact_id)
    if artifact is None:
        raise Http404("No such artifact in this project.")
    try:
        handle = artifact.file.storage.open(artifact.file.name, "rb")
    except FileNotFoundError:
        raise Http404("The artifact's file is missing from storage.") from None
    filename = os.path.basename(artifact.name or artifact.file.name) or artifact.kind
    return FileResponse(handle, as_attachment=True, filename=f"execution-{execution_id}-{filename}")
