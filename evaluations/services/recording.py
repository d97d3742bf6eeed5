"""Recording an execution's outcome exactly once: status, check results, scores and
artifacts; the last execution of a run hands the run to finalisation."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import IntegrityError, transaction
from django.utils import timezone

from checks.artifact import RunArtifact
from checks.report_model import ExecutionRecord
from checks.results import ERROR_CODES
from checks.scoring import score_execution
from checks.spec.model import Spec as EngineSpec
from evaluations import queue
from evaluations.models import (
    Artifact,
    ArtifactKind,
    CheckResult,
    Execution,
    ExecutionStatus,
    Run,
    RunStatus,
    artifact_upload_to,
    sha256_hex,
)
from evaluations.services import statements
from evaluations.services.runs import run_warning_note


def execution_record(*, execution: Execution, worker: str, outcome: Any, spec: EngineSpec) -> None:
    """Write an execution's results exactly once: only the worker holding the claim writes
    (a conditional UPDATE, in the same transaction as the results), and the unique
    constraints refuse a second set of results. Everything that needs no row is computed,
    and the artifact files written, before the transaction: SQLite has one writer at a time."""
    artifact = outcome.artifact
    status = artifact.status
    if status == "success" and any(r.failure_code in ERROR_CODES for r in outcome.results):
        status = ExecutionStatus.ERROR
    record = ExecutionRecord.from_artifact(
        artifact,
        outcome.results,
        id=str(execution.pk),
        scenario=execution.scenario,
        forbidden_violations=outcome.forbidden_violations,
    )
    score = score_execution(record, pass_threshold=spec.scoring.pass_threshold)
    results = [
        CheckResult.from_engine(_storable_result(r), execution=execution) for r in outcome.results
    ]
    cap = settings.KEYSTONE_FINAL_OUTPUT_MAX_CHARS
    fields = {
        "status": status,
        "composite": score.composite,
        "passed": score.passed,
        "finished": timezone.now(),
        "duration_ms": artifact.duration_ms,
        "agent_cpu_ms": outcome.agent_cpu_ms,
        "cost_usd": artifact.cost_usd,
        "unpriced_models": record.unpriced_models,
        "input_tokens": artifact.input_tokens,
        "output_tokens": artifact.output_tokens,
        "tool_call_count": len(artifact.all_tool_calls()),
        "tool_error_count": len(artifact.failed_tool_calls()),
        "gateway_call_count": record.gateway_calls,
        "proxy_call_count": record.proxy_calls,
        "final_output": _storable(artifact.final_output[:cap]),
        "tool_sequence": _storable(tool_sequence(artifact)),
        "error": _storable(artifact.error or ""),
        "forbidden_violations": outcome.forbidden_violations,
        "lease_expires": None,
    }
    # Before the results: the last execution's commit finalises the run (at once, without
    # a broker), and the run's report carries its warnings.
    for warning in outcome.warnings:
        run_warning_note(execution.run, warning)
    artifacts = _write_artifact_files(execution, artifact)
    try:
        with transaction.atomic():
            owned = statements.update(
                Execution,
                where={"id": execution.pk, "claimed_by": worker, "status": ExecutionStatus.RUNNING},
                values=fields,
            )
            if owned:
                statements.insert(CheckResult, results)
                statements.insert(Artifact, artifacts)
                _count_done(execution.run_id)
    except IntegrityError:
        # Another worker's results of this execution, stored first, once it is no longer ours;
        # while it still is, the database refused these rows themselves: an error to report.
        if Execution.objects.filter(
            pk=execution.pk, claimed_by=worker, status=ExecutionStatus.RUNNING
        ).exists():
            _delete_files(artifacts)
            raise
        owned = 0
    except BaseException:
        _delete_files(artifacts)
        raise
    if not owned:  # another worker took over after our lease expired, and owns the results
        _delete_files(artifacts)
        return
    for name, value in fields.items():  # the row in memory as it was written
        setattr(execution, name, value)


TOOL_SEQUENCE_MAX_CALLS = 200


def tool_sequence(artifact: RunArtifact) -> list[dict[str, Any]]:
    """The tool calls in order as {name, arguments}: what drift by `tool-sequence` and the
    compare page need, kept in the row (capped) so they outlive the trace artifact."""
    return [
        {"name": call.name, "arguments": call.arguments}
        for call in artifact.all_tool_calls()[:TOOL_SEQUENCE_MAX_CALLS]
    ]


def _storable(value: Any) -> Any:
    """PostgreSQL text and jsonb refuse NUL characters, which agents (and the garbage LLM
    fault) do produce: they are stored as U+FFFD. The artifact files keep the exact bytes."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value


def _storable_result(result: Any) -> Any:
    from dataclasses import replace

    return replace(result, message=_storable(result.message), details=_storable(result.details))


def execution_record_error(*, execution_id: int, worker: str, error: str) -> None:
    with transaction.atomic():
        updated = Execution.objects.filter(
            pk=execution_id, claimed_by=worker, status=ExecutionStatus.RUNNING
        ).update(
            status=ExecutionStatus.ERROR,
            error=error[:10000],
            composite=0.0,
            passed=False,
            finished=timezone.now(),
            lease_expires=None,
        )
        if updated:
            run_id = Execution.objects.values_list("run_id", flat=True).get(pk=execution_id)
            _count_done(run_id)


def _count_done(run_id: int) -> None:
    """Count one more finished execution; the last one hands the run to run_finalize. The
    count's UPDATE says whether it reached the plan; only then a second UPDATE moves the run
    on (if it still runs). Both in the caller's transaction: the first holds the run's row
    locked until the commit, so no other execution is counted in between."""
    reached = statements.update_reading(
        Run,
        where={"id": run_id},
        values={"executions_done": statements.Add(1)},
        read="executions_done >= execution_count",
    )
    if reached is not None and not reached[0]:
        return  # the common case: one statement per execution, not two
    last = statements.update(
        Run,
        where={"id": run_id, "status": RunStatus.RUNNING},
        values={"status": RunStatus.FINALIZING},
        condition="executions_done >= execution_count",
    )
    if last:
        queue.run_finalize_later(run_id)


_EMPTY_TRACE = '{"llm_calls": [], "tool_calls": []}'


def _write_artifact_files(execution: Execution, artifact: Any) -> list[Artifact]:
    """Large blobs go to Django storage; the rows (returned, for the caller to insert with
    the results) keep only their names, sizes and hashes. A failure (a full disk) deletes
    the files this call wrote before it raises: nothing is left half-stored."""
    # stdout and stderr are stored once, in their own files, not again in artifact.json.
    summary = {k: v for k, v in artifact.to_dict().items() if k not in ("stdout", "stderr")}
    blobs: dict[str, tuple[str, str]] = {
        ArtifactKind.STDOUT: ("stdout.txt", artifact.stdout),
        ArtifactKind.STDERR: ("stderr.txt", artifact.stderr),
        ArtifactKind.TRACE: (
            "trace.json",
            _json({"llm_calls": artifact.llm_calls, "tool_calls": artifact.tool_calls}),
        ),
        ArtifactKind.WORKSPACE_DIFF: ("workspace_diff.json", _json(artifact.workspace_diff)),
        ArtifactKind.HTTP_LOG: ("http_log.json", _json(artifact.http_calls)),
        ArtifactKind.DB_WRITES: ("db_writes.json", _json(artifact.db_writes)),
        ArtifactKind.ARTIFACT_JSON: ("artifact.json", _json(summary)),
    }
    rows: list[Artifact] = []
    written: list[str] = []
    try:
        for kind, (name, text) in blobs.items():
            if not text or text in ("[]", "{}", _EMPTY_TRACE):
                continue
            data = text.encode()
            row = Artifact(
                execution=execution, kind=kind, name=name, size=len(data), sha256=sha256_hex(data)
            )
            row.truncated = "truncated" in text[-200:] and kind in (
                ArtifactKind.STDOUT,
                ArtifactKind.STDERR,
            )
            # A write that fails leaves no file (ArtifactStorage removes it); one that
            # succeeds is removed below if a later one fails.
            row.file.name = default_storage.save(artifact_upload_to(row, name), ContentFile(data))
            written.append(row.file.name)
            rows.append(row)
    except BaseException:
        for path in written:
            with contextlib.suppress(OSError):
                default_storage.delete(path)
        raise
    return rows


def _delete_files(rows: list[Artifact]) -> None:
    for row in rows:
        with contextlib.suppress(OSError):
            default_storage.delete(row.file.name)


def execution_orphan_files_remove(*, execution_id: int) -> list[str]:
    """Delete the files under an execution's artifact directory that no Artifact row names:
    what a worker killed between writing a file and its row left behind. Called when another
    worker takes the execution over; returns the names removed."""
    row = Execution.objects.filter(pk=execution_id).values("run_id").first()
    if row is None:
        return []
    kept = set(Artifact.objects.filter(execution_id=execution_id).values_list("file", flat=True))
    removed = []
    for name in _files_under(f"runs/{row['run_id']}/executions/{execution_id}"):
        if name not in kept:
            with contextlib.suppress(OSError):
                default_storage.delete(name)
                removed.append(name)
    return removed


def _files_under(directory: str) -> list[str]:
    try:
        directories, files = default_storage.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    names = [f"{directory}/{name}" for name in files]
    for child in directories:
        names += _files_under(f"{directory}/{child}")
    return names


def _json(value: Any) -> str:
    from dataclasses import asdict, is_dataclass

    def default(obj: Any) -> Any:
        if is_dataclass(obj) and not isinstance(obj, type):
            return asdict(obj)
        return str(obj)

    return json.dumps(value, default=default, ensure_ascii=False)
