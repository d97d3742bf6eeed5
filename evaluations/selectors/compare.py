"""Two runs of a spec side by side: the reference a run is compared with (its spec's active
baseline, or a run named), and the statistical verdicts of checks.compare."""

from __future__ import annotations

from checks.compare import DEFAULT_ALPHA, Comparison, compare_summaries
from checks.report_model import RunSummary
from checks.scoring import score_run
from checks.spec.model import Spec as EngineSpec
from evaluations.models import RUN_TERMINAL_STATUSES, Run
from evaluations.selectors.baselines import active_baseline_for
from evaluations.selectors.records import run_records


class ComparisonRefused(ValueError):
    """The two runs cannot be compared; the message says why, for people."""


def comparison_reference(after: Run, against: str) -> Run:
    """The run `after` is compared with: `baseline` (its spec's active one) or a run id."""
    if against == "baseline":
        baseline = active_baseline_for(after.spec_id, after.branch)
        if baseline is None:
            raise ComparisonRefused(
                f"spec {after.spec.slug} has no active baseline for branch "
                f"{after.branch or 'main'} (nor main): promote a run on its page, "
                "or compare with another run"
            )
        if baseline.run_id is None:
            raise ComparisonRefused(f"the baseline {baseline.name!r} has lost its run (deleted)")
        before_id = baseline.run_id
    else:
        try:
            before_id = int(against)
        except ValueError:
            raise ComparisonRefused(
                f"compare against 'baseline' or a run id, not {against!r}"
            ) from None
    before = Run.objects.select_related("spec", "spec_version").filter(pk=before_id).first()
    if before is None or before.project_id != after.project_id:
        raise ComparisonRefused(f"no run {before_id}")
    if before.spec_id != after.spec_id:
        raise ComparisonRefused(
            f"run {before.pk} is of spec {before.spec.slug} and run {after.pk} of "
            f"{after.spec.slug}: only runs of one spec compare"
        )
    for run in (before, after):
        if run.status not in RUN_TERMINAL_STATUSES:
            raise ComparisonRefused(f"run {run.pk} is still {run.status}")
    return before


def run_comparison(before: Run, after: Run, *, alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Every cell, group and gate of `after` against `before`, from their stored results."""

    def summary(run: Run) -> RunSummary:
        return score_run(EngineSpec.from_dict(run.spec_version.parsed), run_records(run))

    return compare_summaries(summary(before), summary(after), alpha=alpha)
