"""Baselines as the pages, the API and the CLI read them: the one a run is compared with
(its branch's, else main's) and a spec's history of promotions and rollbacks."""

from __future__ import annotations

from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce

from evaluations.models import DEFAULT_BASELINE_BRANCH, Baseline, BaselineCell


def active_baseline_for(spec_id: int, branch: str = "") -> Baseline | None:
    """The active baseline of `branch` (a run's branch label), else main's: one query."""
    branch = branch or DEFAULT_BASELINE_BRANCH
    scopes = [branch] if branch == DEFAULT_BASELINE_BRANCH else [branch, DEFAULT_BASELINE_BRANCH]
    candidates = {
        b.branch: b
        for b in Baseline.objects.filter(spec_id=spec_id, active=True, branch__in=scopes)
        .select_related("created_by")
        .defer("data")
    }
    return candidates.get(branch) or candidates.get(DEFAULT_BASELINE_BRANCH)


def spec_baseline_history(spec_id: int) -> list[Baseline]:
    """Every promotion of the spec, newest first, with who promoted and rolled back, what it
    replaced (by name) and how many executions it froze (`cell_count`): one query, without
    the frozen data or verdicts of any."""
    cells = (
        BaselineCell.objects.filter(baseline=OuterRef("pk"))
        .order_by()
        .values("baseline")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return list(
        Baseline.objects.filter(spec_id=spec_id)
        .select_related("created_by", "rolled_back_by", "previous")
        .defer("data", "verdicts", "previous__data", "previous__verdicts")
        .annotate(cell_count=Coalesce(Subquery(cells), 0))
        .order_by("-created", "-id")
    )
