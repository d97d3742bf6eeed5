"""Baselines: a completed run frozen as its spec's reference."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Avg, Min, Q, Sum
from django.db.models.functions import Substr

from evaluations.models import (
    Baseline,
    Execution,
    Role,
    Run,
    RunStatus,
    Spec,
)
from evaluations.selectors.regressions import group_key

#
# A baseline freezes a completed run's results as the reference of its spec: the overview
# lists a group (scenario x prompt) that passed in the active baseline and fails in the
# spec's latest run (selectors.project_regressions). `data` keeps the run summary's groups,
# each with its first passing output, mean latency and cost (as KindLM stores them), so a
# baseline outlives the run it came from.

BASELINE_OUTPUT_MAX_CHARS = 4000
BASELINE_NAME_MAX = 200


class BaselineError(ValueError):
    """A run that cannot become a baseline; the message says why."""


def baseline_promote(*, run_id: int, user: Any, name: str = "") -> Baseline:
    """Make a completed run its spec's active baseline. The spec's previous active baseline
    is deactivated in the same transaction (the database allows one active per spec)."""
    name = name.strip()
    if len(name) > BASELINE_NAME_MAX:
        raise BaselineError(f"name: at most {BASELINE_NAME_MAX} characters, got {len(name)}")
    with transaction.atomic():
        run = Run.objects.select_related("project").get(pk=run_id)
        if user is not None and not run.project.has_role(user, Role.EDITOR):
            raise BaselineError(f"Promoting a baseline needs the editor role in {run.project}.")
        if run.status != RunStatus.COMPLETED or not run.summary.get("groups"):
            raise BaselineError(
                f"run {run.pk} is {run.status}: only a completed, scored run can be a baseline"
            )
        # Two people promoting runs of one spec at once: the second waits for the first.
        Spec.objects.select_for_update().filter(pk=run.spec_id).first()
        current = Baseline.objects.filter(spec_id=run.spec_id, active=True).first()
        if current is not None and current.run_id == run.pk:
            if name and name != current.name:
                current.name = name
                current.save(update_fields=["name"])
            return current
        Baseline.objects.filter(spec_id=run.spec_id, active=True).update(active=False)
        return Baseline.objects.create(
            project_id=run.project_id,
            spec_id=run.spec_id,
            run=run,
            name=name or f"run #{run.pk}",
            active=True,
            data=_baseline_data(run),
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )


def _baseline_data(run: Run) -> dict[str, Any]:
    """The run summary's groups with, per group, the first passing output, the mean
    latency and the total cost of its executions (two queries), and the run's metrics."""

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
    }
