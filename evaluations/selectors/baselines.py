"""Baselines as the pages, the API and the CLI read them: the one a run is compared with
(its branch's, else main's) and a spec's history of promotions and rollbacks."""

from __future__ import annotations

from evaluations.models import DEFAULT_BASELINE_BRANCH, Baseline


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
    """Every promotion of the spec, newest first, with who promoted and rolled back."""
    return list(
        Baseline.objects.filter(spec_id=spec_id)
        .select_related("created_by", "rolled_back_by", "previous", "run")
        .defer("data", "run__summary", "run__options", "previous__data")
        .order_by("-created", "-id")
    )
