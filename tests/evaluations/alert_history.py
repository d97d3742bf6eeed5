"""Hand-built run histories for the alert tests: completed runs with chosen metrics and
finish times, drift results, review items and baselines, written straight to the tables."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from evaluations.models import (
    Baseline,
    CheckResult,
    Execution,
    Project,
    ReviewItem,
    ReviewReason,
    Run,
    RunStatus,
    Spec,
    SpecVersion,
)
from evaluations.selectors.regressions import compared_verdicts, summary_failing_keys

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
_numbers = itertools.count(1)


def spec_in(project: Project, slug: str = "refund-agent") -> Spec:
    spec, _ = Spec.objects.get_or_create(project=project, slug=slug)
    if not spec.versions.exists():
        SpecVersion.objects.create(spec=spec, number=1, source_yaml=f"id: {slug}\n", parsed={})
    return spec


def finished_run(
    spec: Spec,
    *,
    finished: datetime,
    branch: str = "",
    groups: list[dict[str, Any]] | None = None,
    **metrics: Any,
) -> Run:
    """A completed run of `spec` that finished at `finished`, with the given Run columns."""
    return Run.objects.create(
        project=spec.project,
        spec=spec,
        spec_version=spec.versions.get(number=1),
        status=RunStatus.COMPLETED,
        branch=branch,
        created=finished - timedelta(minutes=5),
        finished=finished,
        summary={"groups": groups or []},
        # What run_finalize stores beside the summary (the regressions report reads it).
        failing_keys=summary_failing_keys({"groups": groups or []}),
        verdicts=compared_verdicts({"groups": groups or []}),
        **metrics,
    )


def drift_result(run: Run, score: float, **details: Any) -> CheckResult:
    execution = Execution.objects.create(
        run=run, project=run.project, key=f"drift-{next(_numbers)}", scenario="no-chaos"
    )
    return CheckResult.objects.create(
        execution=execution,
        run=run,
        invariant_id="stays_close",
        check_type="drift",
        score=score,
        passed=score >= 0.5,
        details=details,
    )


def open_review_item(run: Run) -> ReviewItem:
    result = drift_result(run, 0.9)
    return ReviewItem.objects.create(
        project=run.project,
        spec=run.spec,
        run=run,
        execution=result.execution,
        check_result=result,
        invariant_id=result.invariant_id,
        reason=ReviewReason.ALL,
    )


def baseline_of(spec: Spec, run: Run, groups: list[dict[str, Any]]) -> Baseline:
    return Baseline.objects.create(
        project=spec.project,
        spec=spec,
        run=run,
        name="release-1",
        active=True,
        data={"groups": groups},
        verdicts=compared_verdicts({"groups": groups}),
    )


# A group as RunSummary.to_dict writes it: c of n replicas passed.
PASSING = [
    {
        "key": "no-chaos / prompt 0",
        "passed": True,
        "pass_rate": 1.0,
        "status": "pass",
        "c": 1,
        "n": 1,
    }
]
FAILING = [
    {
        "key": "no-chaos / prompt 0",
        "passed": False,
        "pass_rate": 0.0,
        "status": "fail",
        "c": 0,
        "n": 1,
        "failure_codes": ["CONTAINS_FAILED"],
    }
]
