"""One execution: its results, artifacts (read with a cap), transcript and reproducer."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q

from checks.report_model import MATRIX_PILLARS
from evaluations.models import (
    Artifact,
    CheckResult,
    Execution,
    ExecutionStatus,
    Project,
    Run,
    run_large_fields,
)
from evaluations.selectors.runs import RESULT_SOURCE_RANK

ARTIFACT_TEXT_PREVIEW_BYTES = 64 * 1024

ARTIFACT_JSON_MAX_BYTES = 2 * 1024 * 1024

TRANSCRIPT_TEXT_MAX_CHARS = 4000


def execution_for_page(project: Project, execution_id: int) -> Execution | None:
    """The execution with its run, spec and version (no run summary, no spec text)."""
    return (
        Execution.objects.filter(project=project, pk=execution_id)
        .select_related("run__spec", "run__spec_version")
        .defer(
            *run_large_fields("run__"),
            "run__spec_version__source_yaml",
            "run__spec_version__parsed",
        )
        .first()
    )


def execution_neighbours(execution: Execution) -> tuple[int | None, int | None]:
    """The previous and next execution of the same run, by id."""
    siblings = Execution.objects.filter(run_id=execution.run_id)
    previous = (
        siblings.filter(pk__lt=execution.pk).order_by("-id").values_list("id", flat=True).first()
    )
    following = (
        siblings.filter(pk__gt=execution.pk).order_by("id").values_list("id", flat=True).first()
    )
    return previous, following


def execution_results(execution: Execution) -> list[CheckResult]:
    """Every check result of the execution, each invariant's sources together."""
    rows = list(CheckResult.objects.filter(execution=execution))
    rows.sort(key=lambda r: (r.invariant_id, RESULT_SOURCE_RANK.get(r.source, 0)))
    return rows


def execution_artifacts(execution: Execution) -> list[Artifact]:
    return list(Artifact.objects.filter(execution=execution).order_by("kind", "name"))


def artifact_in_project(project: Project, execution_id: int, artifact_id: int) -> Artifact | None:
    return (
        Artifact.objects.filter(
            pk=artifact_id, execution_id=execution_id, execution__project=project
        )
        .select_related("execution")
        .first()
    )


@dataclass(frozen=True, slots=True)
class ArtifactText:
    """The start of an artifact's file as text, and whether there is more, or no file at all."""

    text: str
    clipped: bool  # the file is longer than what was read
    missing: bool = False  # the row exists but its file is gone from storage


def artifact_text(artifact: Artifact, *, limit: int = ARTIFACT_TEXT_PREVIEW_BYTES) -> ArtifactText:
    """At most `limit` bytes of an artifact, decoded: a page never loads a large blob."""
    try:
        with artifact.file.storage.open(artifact.file.name, "rb") as handle:
            data = handle.read(limit + 1)
    except (FileNotFoundError, OSError):
        return ArtifactText(text="", clipped=False, missing=True)
    return ArtifactText(
        text=data[:limit].decode("utf-8", errors="replace"), clipped=len(data) > limit
    )


@dataclass(frozen=True, slots=True)
class ArtifactJson:
    """An artifact's parsed JSON, or why the page shows none."""

    data: Any
    problem: str = ""  # "" | "too large" | "missing" | "not JSON": then `data` is None


def artifact_json(artifact: Artifact, *, limit: int = ARTIFACT_JSON_MAX_BYTES) -> ArtifactJson:
    """The parsed JSON of an artifact no larger than `limit` bytes, or why there is none
    (the page then offers the download instead)."""
    if artifact.size > limit:
        return ArtifactJson(None, "too large")
    blob = artifact_text(artifact, limit=limit)
    if blob.missing:
        return ArtifactJson(None, "missing")
    if blob.clipped:
        return ArtifactJson(None, "too large")
    try:
        return ArtifactJson(json.loads(blob.text))
    except ValueError:
        return ArtifactJson(None, "not JSON")


def _clip(value: Any, limit: int = TRANSCRIPT_TEXT_MAX_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more chars)"


def _message_text(message: Any) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    if not isinstance(message, dict):
        return _clip(message)
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    if content:
        return _clip(content)
    if message.get("tool_calls"):
        return ""  # the tool calls are shown as such
    return _clip({k: v for k, v in message.items() if k != "role"}) if message else ""


LLM_MESSAGES_SHOWN = 200  # messages listed per LLM call; each is clipped as well


def message_line(message: Any) -> dict[str, str]:
    if not isinstance(message, dict):
        return {"role": "", "text": _clip(message), "extra": ""}
    extra = []
    if message.get("name"):
        extra.append(f"name {message['name']}")
    if message.get("tool_call_id"):
        extra.append(f"answers {message['tool_call_id']}")
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            extra.append(
                f"asks {function.get('name', '')}({_clip(function.get('arguments'), 300)})"
            )
    return {
        "role": str(message.get("role", "")),
        "text": _message_text(message),
        "extra": " · ".join(extra),
    }


def _llm_step(index: int, call: dict[str, Any]) -> dict[str, Any]:
    raw_request = call.get("request")
    request: dict[str, Any] = raw_request if isinstance(raw_request, dict) else {}
    raw_messages = request.get("messages")
    messages: list[Any] = raw_messages if isinstance(raw_messages, list) else []
    response = call.get("response")
    reply = ""
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reply = _message_text(choices[0].get("message") or {})
    elif response:
        reply = _clip(response)
    return {
        "kind": "llm",
        "number": index + 1,
        "model": call.get("model") or request.get("model") or "",
        "status": call.get("status"),
        "fault": call.get("fault"),
        "input_tokens": call.get("input_tokens") or 0,
        "output_tokens": call.get("output_tokens") or 0,
        "cost_usd": call.get("cost_usd") or 0.0,
        "priced": call.get("priced", True),  # traces written before Keystone said so: priced
        "latency_ms": call.get("latency_ms") or 0.0,
        "message_count": len(messages),
        "last_message_role": messages[-1].get("role", "")
        if messages and isinstance(messages[-1], dict)
        else "",
        "last_message": _message_text(messages[-1]) if messages else "",
        # Every message the model was sent (system prompt, earlier turns, tool results),
        # for the collapsed "all messages" list.
        "messages": [message_line(m) for m in messages[:LLM_MESSAGES_SHOWN]],
        "reply": reply,
        "requested_tools": [
            f"{t.get('name', '')}({_clip(t.get('arguments') or {}, 300)})"
            for t in call.get("tool_calls") or []
            if isinstance(t, dict)
        ],
    }


def _tool_step(call: dict[str, Any], *, requested: dict[str, Any] | None) -> dict[str, Any]:
    response = call.get("response")
    return {
        "kind": "tool",
        "name": call.get("name", ""),
        "arguments": _clip(call.get("arguments") or {}),
        # What the model asked for, when the call the agent made looks different.
        "requested_arguments": (
            _clip(requested.get("arguments") or {})
            if requested is not None
            and requested is not call
            and (requested.get("arguments") or {}) != (call.get("arguments") or {})
            else ""
        ),
        # The HTTP request as the tool proxy forwarded it (REST tools carry arguments in it).
        "sent": _request_line(call.get("request")),
        "response": _clip(response) if response is not None else "",
        "status": call.get("status"),
        "error": call.get("error") or "",
        "fault": call.get("fault"),
        "latency_ms": call.get("latency_ms") or 0.0,
        "source": call.get("source", "agent"),
        # The model asked for this call in the LLM call just before it.
        "requested_by_model": requested is not None,
    }


def _request_line(request: Any) -> str:
    if not isinstance(request, dict):
        return ""
    line = f"{request.get('method', '')} {request.get('path') or '/'}"
    if request.get("query"):
        line += f"?{request['query']}"
    return _clip(line)


def execution_transcript(trace: Any) -> list[dict[str, Any]]:
    """The LLM calls and tool calls of a stored trace ({"llm_calls", "tool_calls"}), in order.

    Calls carry no timestamps, so the order is rebuilt: each LLM call, then the tool calls it
    asked for, each paired with the next call of that tool the agent made through the tool
    proxy. Proxy calls no model asked for keep their order among the others; a requested call
    that never went through the proxy is shown as the model's request.
    """
    if not isinstance(trace, dict):
        return []
    llm_calls = [c for c in trace.get("llm_calls") or [] if isinstance(c, dict)]
    proxied = [c for c in trace.get("tool_calls") or [] if isinstance(c, dict)]
    steps: list[dict[str, Any]] = []
    next_proxied = 0
    for index, call in enumerate(llm_calls):
        steps.append(_llm_step(index, call))
        for wanted in call.get("tool_calls") or []:
            if not isinstance(wanted, dict):
                continue
            match = next(
                (
                    j
                    for j in range(next_proxied, len(proxied))
                    if proxied[j].get("name") == wanted.get("name")
                ),
                None,
            )
            if match is None:
                steps.append(_tool_step(wanted, requested=wanted))
                continue
            steps.extend(_tool_step(c, requested=None) for c in proxied[next_proxied:match])
            steps.append(_tool_step(proxied[match], requested=wanted))
            next_proxied = match + 1
    steps.extend(_tool_step(c, requested=None) for c in proxied[next_proxied:])
    return steps


def execution_timeline(
    trace: Any, http_calls: Any, *, started: datetime | None = None
) -> dict[str, Any] | None:
    """The execution as a trace view: every LLM call, tool call and HTTP mock request that
    carries its start time, on one time axis from the execution's start (or the first call),
    with durations and faults. None when nothing carries a start time (older traces)."""
    events: list[dict[str, Any]] = []
    trace = trace if isinstance(trace, dict) else {}
    for index, call in enumerate(c for c in trace.get("llm_calls") or [] if isinstance(c, dict)):
        events.append(
            {
                "kind": "llm",
                "label": f"LLM call {index + 1} · {call.get('model') or ''}",
                "at": call.get("started_at") or 0.0,
                "ms": float(call.get("latency_ms") or 0.0),
                "fault": call.get("fault") or "",
                "failed": int(call.get("status") or 200) >= 400,
            }
        )
    for call in trace.get("tool_calls") or []:
        if isinstance(call, dict):
            events.append(
                {
                    "kind": "tool",
                    "label": f"tool {call.get('name', '')}",
                    "at": call.get("started_at") or 0.0,
                    "ms": float(call.get("latency_ms") or 0.0),
                    "fault": call.get("fault") or "",
                    "failed": bool(call.get("error")) or int(call.get("status") or 0) >= 400,
                }
            )
    for call in http_calls if isinstance(http_calls, list) else []:
        if isinstance(call, dict):
            events.append(
                {
                    "kind": "http",
                    "label": f"HTTP {call.get('method', '')} {call.get('service', '')}"
                    f"{call.get('path', '')}",
                    "at": call.get("time") or 0.0,
                    "ms": 0.0,  # the mock answers at once; its request time is what counts
                    "fault": "",
                    "failed": int(call.get("status") or 0) >= 400,
                }
            )
    events = [e for e in events if e["at"]]
    if not events:
        return None
    origin = min(e["at"] for e in events)
    if started is not None and started.timestamp() <= origin:
        origin = started.timestamp()
    end = max(e["at"] + e["ms"] / 1000 for e in events)
    total_ms = max((end - origin) * 1000, 1.0)
    for event in sorted(events, key=lambda e: e["at"]):
        offset = (event["at"] - origin) * 1000
        event.update(
            offset_ms=offset,
            left=round(100 * offset / total_ms, 2),
            # A bar is at least a sliver wide, so an instant still shows.
            width=round(max(100 * event["ms"] / total_ms, 0.4), 2),
        )
    return {"events": sorted(events, key=lambda e: e["at"]), "total_ms": total_ms}


def execution_reproducer(execution: Execution) -> str | None:
    """A `keystone run` command that runs this one execution again: same cell, same run
    seed (so the same per-execution seed and faults). None for mutation and replay
    executions, which a run generates and cannot be planned one by one."""
    if execution.pillar not in MATRIX_PILLARS:
        return None
    run = execution.run
    words = [
        "keystone",
        "run",
        f"{run.spec.slug}.yaml",
        "--scenario",
        execution.scenario,
        "--prompt-index",
        str(execution.prompt_index),
        "--replica",
        str(execution.replica),
    ]
    if run.replicas_override:
        words += ["--replicas", str(run.replicas_override)]
    if execution.invariant_id:
        words += ["--invariant", execution.invariant_id]
    words += ["--seed", str(int(run.options.get("seed", 0)))]
    return shlex.join(words)


# --- The API's execution list ----------------------------------------------------------------

EXECUTION_PAGE_SIZE = 100
# What "failed only" keeps: a verdict of failed, or an end that gave no verdict.
EXECUTION_FAILED_STATUSES = (
    ExecutionStatus.FAILED,
    ExecutionStatus.TIMED_OUT,
    ExecutionStatus.INVALID,
    ExecutionStatus.PROVIDER_ERROR,
    ExecutionStatus.ERROR,
)


@dataclass(frozen=True, slots=True)
class ExecutionPage:
    """One page of a run's executions for the API, and the cursor of the next."""

    executions: list[Execution]
    next_after: int | None  # the id to pass back as the cursor, None on the last page


def execution_page(
    run: Run,
    *,
    status: str = "",
    scenario: str = "",
    failed: bool = False,
    after: int | None = None,
    size: int = EXECUTION_PAGE_SIZE,
) -> ExecutionPage:
    """A page of the run's executions in id order, read along the (run, status) or
    (run, scenario) index: one query whatever the page."""
    rows = Execution.objects.filter(run=run)
    if status:
        rows = rows.filter(status=status)
    if scenario:
        rows = rows.filter(scenario=scenario)
    if failed:
        rows = rows.filter(Q(passed=False) | Q(status__in=EXECUTION_FAILED_STATUSES))
    if after is not None:
        rows = rows.filter(pk__gt=after)
    page = list(rows.defer("plan", "final_output").order_by("id")[: size + 1])
    next_after = page[size - 1].pk if len(page) > size else None
    return ExecutionPage(executions=page[:size], next_after=next_after)


# The most executions executions_finished returns at once: its second query lists their ids,
# which for a large finished run were all of them in one statement, past SQLite's limit on
# a statement's parameters (32,766 by default; 250,000 in Debian's build) and PostgreSQL's
# with server-side binding (65,535), and all of the rows held at once.
EXECUTIONS_FINISHED_BATCH = 500


def executions_finished(run_id: int, *, exclude: set[int]) -> list[Execution]:
    """The run's executions that have ended, but those in `exclude` (already told), in the
    order they ended: at most EXECUTIONS_FINISHED_BATCH of them, the lowest ids first (a full
    batch means the caller may have more to ask for): ordering every ended execution by
    when it ended, at each poll, would sort the whole run."""
    ended = (
        Execution.objects.filter(run_id=run_id)
        .exclude(status__in=(ExecutionStatus.PENDING, ExecutionStatus.RUNNING))
        .values_list("id", flat=True)
    )
    new = sorted(pk for pk in ended if pk not in exclude)[:EXECUTIONS_FINISHED_BATCH]
    if not new:
        return []
    return list(
        Execution.objects.filter(pk__in=new)
        .defer("plan", "final_output")
        .order_by("finished", "id")
    )
