"""Exports of a run: result rows for CSV and the report summary."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from checks.report_model import RunSummary
from checks.scoring import score_run
from checks.spec.model import Spec as EngineSpec
from evaluations.models import (
    CheckResult,
    Run,
)
from evaluations.selectors.records import effective_results, run_records_with_rows
from evaluations.selectors.reviews import BLIND_HIDDEN, blind_reason

# Each column of the results CSV, in order, and the CheckResult field that fills it.
RESULT_CSV_FIELDS = {
    "execution_id": "execution_id",
    "scenario": "execution__scenario",
    "prompt_index": "execution__prompt_index",
    "replica": "execution__replica",
    "invariant": "invariant_id",
    "check_type": "check_type",
    "source": "source",
    "passed": "passed",
    "score": "score",
    "failure_code": "failure_code",
    "message": "message",
}
RESULT_CSV_COLUMNS = tuple(RESULT_CSV_FIELDS)


def run_result_rows(run_id: int, hidden: dict[int, int] | None = None) -> Iterator[tuple[Any, ...]]:
    """Every check result of a run in RESULT_CSV_COLUMNS order, streamed from a server-side
    cursor in chunks: memory stays bounded whatever the number of results. A result in
    `hidden` (selectors.blind_hidden_results: under blind review, not graded by the person
    exporting) has no passed, score or failure code, and says why in its message."""
    hidden = hidden or {}
    # By name, so that a column added or moved cannot uncover a hidden verdict (a verdict
    # column renamed fails here, loudly, rather than being left shown).
    columns = list(RESULT_CSV_FIELDS)
    verdict = [columns.index(name) for name in ("passed", "score", "failure_code")]
    message = columns.index("message")
    rows = (
        CheckResult.objects.filter(run_id=run_id)
        .order_by("execution_id", "invariant_id", "source")
        .values_list("id", *RESULT_CSV_FIELDS.values())
        .iterator(chunk_size=2000)
    )
    for result_id, *row in rows:
        if result_id in hidden:
            for index in verdict:
                row[index] = ""
            row[message] = f"{BLIND_HIDDEN} (review item {hidden[result_id]})"
        yield tuple(row)


def run_report(run: Run, hidden: dict[int, int] | None = None) -> RunSummary:
    """The run scored from its stored results, as the CLI's reports see it (the reporters
    in checks.reporters render it as JSON, JUnit or Markdown).

    The results in `hidden` (selectors.blind_hidden_results) count in the run's scores as
    they do everywhere, but the report leaves them out of its executions (and so of its
    JUnit cases and Markdown failures), with the reasons, failure codes and per-invariant
    scores that would tell them, and says so in its warnings."""
    spec = EngineSpec.from_dict(run.spec_version.parsed)
    pairs = run_records_with_rows(run)
    summary = score_run(spec, [record for record, _ in pairs])
    for warning in run.warnings:
        if warning not in summary.warnings:
            summary.warnings.append(warning)
    if hidden:
        _leave_out_hidden(summary, pairs, hidden)
    return summary


def _leave_out_hidden(
    summary: RunSummary, pairs: list[tuple[Any, list[CheckResult]]], hidden: dict[int, int]
) -> None:
    # execution id -> {invariant id: failure code} of its results hidden from this person.
    left_out: dict[str, dict[str, str]] = {}
    records = []
    for record, rows in pairs:
        gone = {r.invariant_id: r.failure_code for r in effective_results(rows) if r.pk in hidden}
        if gone:
            left_out[record.id] = gone
            record = replace(
                record, results=[r for r in record.results if r.invariant_id not in gone]
            )
        records.append(record)
    if not left_out:
        return
    summary.records = records

    by_id = {record.id: record for record in records}
    for score in summary.executions:
        hidden_codes = left_out.get(score.execution_id)
        if hidden_codes is None:
            continue
        gone = hidden_codes
        kept = {r.failure_code.value for r in by_id[score.execution_id].results if r.failure_code}
        score.reason = blind_reason(score.reason, gone)
        score.failure_codes = [
            c for c in score.failure_codes if c not in set(gone.values()) or c in kept
        ]
        score.gate_failed = [i for i in score.gate_failed if i not in gone]
    for group in summary.groups:
        hidden_here = [left_out[i] for i in group.execution_ids if i in left_out]
        if not hidden_here:
            continue
        gone_codes = {code for entry in hidden_here for code in entry.values()}
        gone_invariants = {invariant for entry in hidden_here for invariant in entry}
        kept = {
            r.failure_code.value
            for i in group.execution_ids
            if i in by_id
            for r in by_id[i].results
            if r.failure_code
        }
        group.invariant_scores = {
            k: v for k, v in group.invariant_scores.items() if k not in gone_invariants
        }
        group.failure_codes = [c for c in group.failure_codes if c not in gone_codes or c in kept]
    # Each matrix cell (invariant x scenario) loses the failure codes of its hidden results.
    cell_codes: dict[tuple[str, str], set[str]] = {}
    for record_id, gone in left_out.items():
        scenario = by_id[record_id].scenario
        for invariant_id, code in gone.items():
            cell_codes.setdefault((invariant_id, scenario), set()).add(code)
    for cell in summary.matrix:
        codes = cell_codes.get((cell.invariant_id, cell.scenario))
        if codes:
            cell.failure_codes = [c for c in cell.failure_codes if c not in codes]
    items = sorted(set(hidden.values()))
    summary.warnings.append(
        f"{sum(len(g) for g in left_out.values())} check result(s) {BLIND_HIDDEN}: left out "
        f"of this report's executions (review items {', '.join(f'#{i}' for i in items)}); "
        "the run's scores count them"
    )
