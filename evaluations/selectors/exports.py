"""Exports of a run: result rows for CSV and the report summary."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from checks.report_model import RunSummary
from checks.scoring import score_run
from checks.spec.model import Spec as EngineSpec
from evaluations.models import (
    CheckResult,
    Run,
)
from evaluations.selectors.records import run_records

RESULT_CSV_COLUMNS = (
    "execution_id",
    "scenario",
    "prompt_index",
    "replica",
    "invariant",
    "check_type",
    "source",
    "passed",
    "score",
    "failure_code",
    "message",
)


def run_result_rows(run_id: int) -> Iterator[tuple[Any, ...]]:
    """Every check result of a run in RESULT_CSV_COLUMNS order, streamed from a server-side
    cursor in chunks: memory stays bounded whatever the number of results."""
    return (
        CheckResult.objects.filter(run_id=run_id)
        .order_by("execution_id", "invariant_id", "source")
        .values_list(
            "execution_id",
            "execution__scenario",
            "execution__prompt_index",
            "execution__replica",
            "invariant_id",
            "check_type",
            "source",
            "passed",
            "score",
            "failure_code",
            "message",
        )
        .iterator(chunk_size=2000)
    )


def run_report(run: Run) -> RunSummary:
    """The run scored from its stored results, as the CLI's reports see it (the reporters
    in checks.reporters render it as JSON, JUnit or Markdown)."""
    spec = EngineSpec.from_dict(run.spec_version.parsed)
    summary = score_run(spec, run_records(run))
    for warning in run.warnings:
        if warning not in summary.warnings:
            summary.warnings.append(warning)
    return summary
