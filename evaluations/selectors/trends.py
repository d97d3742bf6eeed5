"""Trends: per-run aggregates of a spec (or a project) over time, per invariant too."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db import connection
from django.db.models import F, Subquery, Window
from django.db.models.fields.json import KeyTransform
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
    """The spec's newest completed runs (oldest first) with the trend metrics: aggregate
    columns only, no summary JSON."""
    runs = Run.objects.filter(project_id=spec.project_id, spec=spec, status=RunStatus.COMPLETED)
    if branch:
        runs = runs.filter(branch=branch)
    if label is not None:
        runs = runs_labelled(runs, *label)
    rows = list(
        runs.order_by("-created", "-id").values(
            "id", "created", "branch", "git_sha", "spec_version__number", *TREND_METRICS
        )[:limit]
    )
    rows.reverse()
    return rows


def run_invariant_counts(run_ids: list[int]) -> dict[int, dict[str, tuple[int, int]]]:
    """run id -> invariant id -> (results passed, results total), summed over the
    invariant's cells (one per scenario) in the run summary's `matrix`. One query."""
    if not run_ids:
        return {}
    if connection.vendor == "postgresql":
        # Summed by PostgreSQL: a matrix is ~10 kB of JSON per run, its sums a few rows.
        matrix = "run.summary -> 'matrix'"
        sql = f"""
            SELECT run.id, cell ->> 'invariant_id',
                   SUM(COALESCE((cell ->> 'results_passed')::int, 0)),
                   SUM(COALESCE((cell ->> 'results_total')::int, 0))
            FROM {Run._meta.db_table} AS run,
                 jsonb_array_elements(
                     CASE WHEN jsonb_typeof({matrix}) = 'array' THEN {matrix} ELSE '[]' END
                 ) AS cell
            WHERE run.id = ANY(%s) AND cell ->> 'invariant_id' IS NOT NULL
            GROUP BY 1, 2
        """  # noqa: S608 (no user input: the table name comes from the model)
        with connection.cursor() as cursor:
            cursor.execute(sql, [list(run_ids)])
            rows = cursor.fetchall()
    else:  # the embedded SQLite default: small histories, summed here
        rows = []
        matrices = (
            Run.objects.filter(pk__in=run_ids)
            .annotate(matrix=KeyTransform("matrix", "summary"))
            .values_list("id", "matrix")
        )
        for run_id, cells in matrices:
            for cell in cells if isinstance(cells, list) else []:
                if isinstance(cell, dict) and cell.get("invariant_id") is not None:
                    rows.append(
                        (
                            run_id,
                            str(cell["invariant_id"]),
                            int(cell.get("results_passed") or 0),
                            int(cell.get("results_total") or 0),
                        )
                    )
    counts: dict[int, dict[str, tuple[int, int]]] = defaultdict(dict)
    for run_id, invariant_id, passed, total in rows:
        before = counts[run_id].get(invariant_id, (0, 0))
        counts[run_id][invariant_id] = (before[0] + int(passed), before[1] + int(total))
    return dict(counts)


def invariant_pass_rates(runs: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """invariant id -> its pass rate in each of `runs` (rows with an `id`, in order): passed
    results over all its results, every scenario together; None where it did not run."""
    counts = run_invariant_counts([run["id"] for run in runs])
    invariants = sorted({name for per_run in counts.values() for name in per_run})
    rates: dict[str, list[float | None]] = {}
    for invariant in invariants:
        line: list[float | None] = []
        for run in runs:
            passed, total = counts.get(run["id"], {}).get(invariant, (0, 0))
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
