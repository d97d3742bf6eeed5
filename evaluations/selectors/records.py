"""Stored rows as the engine's execution records, for scoring and reports: per invariant the
strongest result counts (a person's over the judge's over the engine's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from checks.report_model import ExecutionRecord
from checks.scoring import score_execution
from evaluations.models import (
    CheckResult,
    Execution,
    Run,
    SpecVersion,
)


def run_records(run: Run) -> list[ExecutionRecord]:
    """The run's executions as the engine's records: two queries whatever the run's size."""
    one_copy = OneCopy()
    return [
        _execution_record(execution, rows, one_copy)
        for execution, rows in executions_with_rows(run)
    ]


def run_records_with_rows(run: Run) -> list[tuple[ExecutionRecord, list[CheckResult]]]:
    """run_records, each record with the stored rows it was made from (for what needs
    their ids, such as leaving out the results hidden for blind review)."""
    one_copy = OneCopy()
    return [
        (_execution_record(execution, rows, one_copy), rows)
        for execution, rows in executions_with_rows(run)
    ]


class OneCopy(dict[str, str]):
    """One copy of each text that repeats across a run's rows. The database hands over a new
    string for every column of every row, and a run's results repeat the same few: invariant
    ids, check types, severities, and mostly the same messages and details. Kept once, the
    records of 10,000 executions x 10 invariants take 48 MB of heap instead of 84."""

    def __call__(self, text: str) -> str:
        return self.setdefault(text, text)


# Rows fetched at a time by executions_with_rows. Django's default chunk, 2,000 rows of each
# query held at once, was most of what finalising a 2,000-execution run added to the Python
# heap at its peak (8.6 MB against 4.5 MB with 200; tracemalloc).
_CHUNK_ROWS = 200


def executions_with_rows(run: Run) -> Iterator[tuple[Execution, list[CheckResult]]]:
    """The run's executions in id order, each with its result rows (in id order), in two
    queries read in chunks: a caller that keeps what it makes of an execution's rows rather
    than the rows holds an execution's or two at a time, never the run's (all 20,000 rows of
    a run at once were 17.7 MB more heap while it was finalised)."""
    ordered = CheckResult.objects.filter(run=run).order_by("execution_id", "id")
    results = ordered.iterator(chunk_size=_CHUNK_ROWS)
    row = next(results, None)
    executions = Execution.objects.filter(run=run).order_by("id")
    for execution in executions.iterator(chunk_size=_CHUNK_ROWS):
        rows = []
        while row is not None and row.execution_id == execution.pk:  # both in id order
            rows.append(row)
            row = next(results, None)
        yield execution, rows


def execution_record(execution: Execution) -> ExecutionRecord:
    """One execution as the engine's record, with its effective results (one query)."""
    rows = list(CheckResult.objects.filter(execution=execution).order_by("id"))
    return _execution_record(execution, rows)


def _execution_record(
    execution: Execution, rows: list[CheckResult], one_copy: Callable[[str], str] = str
) -> ExecutionRecord:
    return ExecutionRecord(
        id=str(execution.pk),
        scenario=one_copy(execution.scenario),
        prompt_index=execution.prompt_index,
        prompt=one_copy(execution.prompt),
        replica=execution.replica,
        attempt=execution.attempt,
        status=one_copy(execution.status),
        duration_ms=execution.duration_ms or 0.0,
        cost_usd=execution.cost_usd,
        input_tokens=execution.input_tokens,
        output_tokens=execution.output_tokens,
        results=[r.to_engine(one_copy) for r in effective_results(rows)],
        forbidden_violations=list(execution.forbidden_violations),
        pillar=one_copy(execution.pillar),
        mutation_type=execution.mutation_type or None,
        tool_calls=execution.tool_call_count,
        tool_errors=execution.tool_error_count,
        output=execution.final_output,
        error=execution.error or None,
        gateway_calls=execution.gateway_call_count,
        proxy_calls=execution.proxy_call_count,
        unpriced_models=list(execution.unpriced_models),
    )


def execution_reason(execution: Execution, rows: list[CheckResult]) -> str:
    """Why the execution did not pass, in words ("" when it passed), from its stored result
    rows (already read by the caller); one query, for the spec's pass_threshold."""
    threshold = (
        SpecVersion.objects.filter(pk=execution.run.spec_version_id)
        .values_list("parsed__scoring__pass_threshold", flat=True)
        .first()
    )
    record = _execution_record(execution, rows)
    pass_threshold = float(threshold) if isinstance(threshold, int | float) else None
    return score_execution(record, pass_threshold=pass_threshold).reason


def effective_results(rows: list[CheckResult]) -> list[CheckResult]:
    """A human verdict overrides the judge's (and the engine's) for the same invariant."""
    by_invariant: dict[str, CheckResult] = {}
    rank = {"engine": 0, "judge": 1, "human": 2}
    for row in rows:
        current = by_invariant.get(row.invariant_id)
        if current is None or rank.get(row.source, 0) >= rank.get(current.source, 0):
            by_invariant[row.invariant_id] = row
    return list(by_invariant.values())


def run_progress(run_id: int) -> tuple[str, int, int]:
    run = Run.objects.only("status", "executions_done", "execution_count").get(pk=run_id)
    return run.status, run.executions_done, run.execution_count
