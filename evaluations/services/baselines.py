"""Baselines: a completed run frozen as its spec's reference."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Avg, Min, Q, Sum
from django.db.models.functions import Substr
from django.utils import timezone

from evaluations.models import (
    DEFAULT_BASELINE_BRANCH,
    Baseline,
    BaselineCell,
    Execution,
    Role,
    Run,
    RunStatus,
    Spec,
)
from evaluations.selectors.records import effective_results, executions_with_rows
from evaluations.selectors.regressions import compared_verdicts, group_key

#
# A baseline freezes a completed run's results as the reference of its spec: the overview
# lists a group (scenario x prompt) that passed in the active baseline and fails in the
# spec's latest run (selectors.project_regressions). Each execution is frozen as a
# BaselineCell (output, tool calls, results, latency, cost) for drift and the compare page.
# `data` keeps the run summary's groups,
# each with its first passing output, mean latency and cost (as KindLM stores them), so a
# baseline outlives the run it came from.

BASELINE_OUTPUT_MAX_CHARS = 4000
BASELINE_NAME_MAX = 200
BASELINE_BRANCH_MAX = 255


class BaselineError(ValueError):
    """A run that cannot become a baseline; the message says why."""


def baseline_branch(run: Run, branch: str | None = None) -> str:
    """The scope a promotion of `run` lands in: the branch asked for, else the run's
    `branch` label, else main."""
    chosen = (branch if branch is not None else run.branch).strip()
    if len(chosen) > BASELINE_BRANCH_MAX:
        raise BaselineError(f"branch: at most {BASELINE_BRANCH_MAX} characters, got {len(chosen)}")
    return chosen or DEFAULT_BASELINE_BRANCH


def baseline_promote(
    *, run_id: int, user: Any, name: str = "", branch: str | None = None, reason: str = ""
) -> Baseline:
    """Make a completed run its spec's active baseline for `branch` (default: the run's
    branch label, else main). The scope's previous baseline is deactivated in the same
    transaction (the database allows one active per spec and branch) and recorded as
    `previous`, so the promotion can be rolled back. Each execution is frozen as a cell."""
    name = name.strip()
    reason = reason.strip()
    if len(name) > BASELINE_NAME_MAX:
        raise BaselineError(f"name: at most {BASELINE_NAME_MAX} characters, got {len(name)}")
    with transaction.atomic():
        run = Run.objects.select_related("project").filter(pk=run_id).first()
        if run is None:
            raise BaselineError(f"no run {run_id}")
        if user is not None and not run.project.has_role(user, Role.EDITOR):
            raise BaselineError(f"Promoting a baseline needs the editor role in {run.project}.")
        if run.status != RunStatus.COMPLETED or not run.summary.get("groups"):
            raise BaselineError(
                f"run {run.pk} is {run.status}: only a completed, scored run can be a baseline"
            )
        scope = baseline_branch(run, branch)
        # Two people promoting runs of one spec at once: the second waits for the first.
        Spec.objects.select_for_update().filter(pk=run.spec_id).first()
        current = Baseline.objects.filter(spec_id=run.spec_id, branch=scope, active=True).first()
        if current is not None and current.run_id == run.pk:
            if name and name != current.name:
                current.name = name
                current.save(update_fields=["name"])
            return current
        Baseline.objects.filter(spec_id=run.spec_id, branch=scope, active=True).update(active=False)
        data = _baseline_data(run)
        baseline = Baseline.objects.create(
            project_id=run.project_id,
            spec_id=run.spec_id,
            run=run,
            branch=scope,
            name=name or f"run #{run.pk}",
            reason=reason,
            previous=current,
            active=True,
            data=data,
            verdicts=compared_verdicts(data),
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
        BaselineCell.objects.bulk_create(_baseline_cells(baseline, run), batch_size=500)
        return baseline


def baseline_rollback(*, spec_id: int, branch: str, user: Any) -> Baseline:
    """Undo the last promotion of (spec, branch): the active baseline is marked rolled back
    (who, when) and the one it replaced is active again. Returns the now active baseline."""
    branch = branch.strip() or DEFAULT_BASELINE_BRANCH
    with transaction.atomic():
        spec = Spec.objects.select_for_update().select_related("project").filter(pk=spec_id).first()
        if spec is None:
            raise BaselineError(f"no spec {spec_id}")
        if user is not None and not spec.project.has_role(user, Role.EDITOR):
            raise BaselineError(f"Rolling back a baseline needs the editor role in {spec.project}.")
        current = Baseline.objects.filter(spec=spec, branch=branch, active=True).first()
        if current is None:
            raise BaselineError(f"spec {spec.slug} has no active baseline on branch {branch}")
        previous = current.previous
        if previous is None:
            raise BaselineError(
                f"the baseline {current.name!r} of {spec.slug} on {branch} replaced none: "
                "nothing to roll back to"
            )
        current.active = False
        current.rolled_back = timezone.now()
        current.rolled_back_by = user if getattr(user, "is_authenticated", False) else None
        current.save(update_fields=["active", "rolled_back", "rolled_back_by"])
        previous.active = True
        previous.save(update_fields=["active"])
        return previous


def _baseline_cells(baseline: Baseline, run: Run) -> list[BaselineCell]:
    """Every finished execution of the run with its effective check results (two queries)."""
    cells = []
    for execution, rows in executions_with_rows(run):
        cells.append(
            BaselineCell(
                baseline=baseline,
                key=execution.key,
                scenario=execution.scenario,
                prompt_index=execution.prompt_index,
                replica=execution.replica,
                pillar=execution.pillar,
                status=execution.status,
                final_output=execution.final_output,
                tool_sequence=execution.tool_sequence,
                results=[
                    {
                        "invariant_id": r.invariant_id,
                        "check_type": r.check_type,
                        "passed": r.passed,
                        "score": r.score,
                        "failure_code": r.failure_code,
                    }
                    for r in effective_results(rows)
                ],
                composite=execution.composite,
                passed=execution.passed,
                duration_ms=execution.duration_ms,
                cost_usd=execution.cost_usd,
            )
        )
    return cells


def _baseline_data(run: Run) -> dict[str, Any]:
    """The run summary's groups with, per group, the first passing output, the mean
    latency and the total cost of its executions (two queries), its matrix, and the run's
    metrics."""

    per_group = {
        group_key(row): row
        for row in Execution.objects.filter(run=run)
        .values("pillar", "scenario", "prompt_index", "mutation_type")
        .annotate(
            mean_duration_ms=Avg("duration_ms"),
            cost_usd=Sum("cost_usd"),
            first_passing_id=Min("id", filter=Q(passed=True)),
        )
        .order_by()
    }
    passing_ids = [row["first_passing_id"] for row in per_group.values() if row["first_passing_id"]]
    outputs = dict(
        Execution.objects.filter(pk__in=passing_ids)
        .annotate(head=Substr("final_output", 1, BASELINE_OUTPUT_MAX_CHARS))
        .values_list("pk", "head")
    )
    groups = []
    for group in run.summary.get("groups") or []:
        row = per_group.get(group_key(group), {})
        first_passing_id = row.get("first_passing_id")
        groups.append(
            {
                **group,
                "first_passing_output": outputs.get(first_passing_id) if first_passing_id else None,
                "mean_duration_ms": row.get("mean_duration_ms"),
                "cost_usd": row.get("cost_usd"),
            }
        )
    return {
        "run_id": run.pk,
        "spec_version_id": run.spec_version_id,
        "pass_rate": run.pass_rate,
        "composite": run.composite,
        "resilience": run.resilience,
        "overall": run.overall,
        "exit_code": run.exit_code,
        "metrics": run.summary.get("metrics") or {},
        "groups": groups,
        # The invariant x scenario cells: the regressions report's per-invariant rows.
        "matrix": run.summary.get("matrix") or [],
    }
