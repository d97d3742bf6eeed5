"""Trends: per-run aggregates of a spec (or a project) over time, per invariant too."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import F, Subquery, Window
from django.db.models.functions import RowNumber

from evaluations.models import (
    Baseline,
    Project,
    Run,
    RunStatus,
    Spec,
)
from evaluations.selectors.bounds import (
    BRANCHES_MAX,
    OVERVIEW_TREND_RUNS,
    OVERVIEW_TREND_WINDOW,
    TREND_RUNS,
)
from evaluations.selectors.runs import runs_labelled


def project_trend_points(
    project: Project, *, per_spec: int = OVERVIEW_TREND_RUNS
) -> dict[str, list[dict[str, Any]]]:
    """spec slug -> its newest completed runs (oldest first) with resilience and pass rate.
    Bounded twice: the project's newest OVERVIEW_TREND_WINDOW completed runs, and at most
    `per_spec` of them per spec (a window function, so one query)."""
    window = (
        Run.objects.filter(project=project, status=RunStatus.COMPLETED)
        .order_by("-created", "-id")
        .values("id")[:OVERVIEW_TREND_WINDOW]
    )
    rows = (
        Run.objects.filter(pk__in=Subquery(window))
        .annotate(
            recent_rank=Window(
                RowNumber(),
                partition_by=[F("spec_id")],
                order_by=[F("created").desc(), F("id").desc()],
            )
        )
        .filter(recent_rank__lte=per_spec)
        .values("id", "spec__slug", "created", "resilience", "pass_rate")
    )
    points: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["spec__slug"], r["created"], r["id"])):
        points[row["spec__slug"]].append(row)
    return dict(points)


TREND_METRICS = ("resilience", "pass_rate", "judge_mean", "cost_usd", "p95_duration_ms")


def spec_trend_runs(
    spec: Spec,
    *,
    branch: str = "",
    label: tuple[str, str] | None = None,
    limit: int = TREND_RUNS,
) -> list[dict[str, Any]]:
    """The spec's newest completed runs (oldest first) with the trend metrics and the
    per-invariant counts: aggregate columns only, no summary JSON."""
    runs = Run.objects.filter(project_id=spec.project_id, spec=spec, status=RunStatus.COMPLETED)
    if branch:
        runs = runs.filter(branch=branch)
    if label is not None:
        runs = runs_labelled(runs, *label)
    rows = list(
        runs.order_by("-created", "-id").values(
            "id",
            "created",
            "branch",
            "git_sha",
            "spec_version__number",
            "invariant_counts",
            *TREND_METRICS,
        )[:limit]
    )
    rows.reverse()
    return rows


def invariant_pass_rates(runs: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """invariant id -> its pass rate in each of `runs` (rows with the run's stored
    `invariant_counts`, in order): passed results over all its results, every scenario
    together; None where it did not run."""
    counts: list[dict[str, list[int]]] = [run.get("invariant_counts") or {} for run in runs]
    invariants = sorted({name for per_run in counts for name in per_run})
    rates: dict[str, list[float | None]] = {}
    for invariant in invariants:
        line: list[float | None] = []
        for per_run in counts:
            passed, total = per_run.get(invariant, (0, 0))
            line.append(passed / total if total else None)
        rates[invariant] = line
    return rates


def spec_branches(spec: Spec, *, limit: int = BRANCHES_MAX) -> list[str]:
    return list(
        Run.objects.filter(project_id=spec.project_id, spec=spec)
        .exclude(branch="")
        .order_by("branch")
        .values_list("branch", flat=True)
        .distinct()[:limit]
    )


def spec_trend_marks(spec: Spec, rows: list[dict[str, Any]]) -> list[tuple[Any, str, str]]:
    """(when, label, kind) of what changed between the trend's runs (oldest first): the first
    run of each new spec version, and each baseline promoted since the trend's first run
    (one query). kind: version | baseline."""
    marks: list[tuple[Any, str, str]] = []
    for earlier, row in zip(rows, rows[1:], strict=False):
        if row["spec_version__number"] != earlier["spec_version__number"]:
            marks.append((row["created"], f"v{row['spec_version__number']}", "version"))
    if rows:
        promoted = (
            Baseline.objects.filter(spec=spec, created__gte=rows[0]["created"])
            .order_by("created", "id")
            .values_list("created", "name", "branch")
        )
        marks.extend(
            (created, f"baseline {name} ({branch})", "baseline")
            for created, name, branch in promoted
        )
    return marks
