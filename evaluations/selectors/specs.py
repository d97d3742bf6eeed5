"""Specs of a project: rows with their latest run, versions and their texts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import OuterRef, Subquery

from evaluations.models import (
    Project,
    Run,
    Spec,
    SpecVersion,
)
from evaluations.selectors.bounds import (
    OVERVIEW_RUNS,
    RUN_ROW_FIELDS,
    SPEC_LIST_MAX,
    SPEC_VERSIONS_MAX,
)


def latest_runs(
    project: Project, *, limit: int = OVERVIEW_RUNS, spec: Spec | None = None
) -> list[Run]:
    """Newest runs first, with their spec slug and version number; light columns only
    (no summary JSON). Reusable by any run table."""
    runs = Run.objects.filter(project=project)
    if spec is not None:
        runs = runs.filter(spec=spec)
    return list(
        runs.select_related("spec", "spec_version")
        .only(*RUN_ROW_FIELDS, "spec__slug", "spec_version__number")
        .order_by("-created", "-id")[:limit]
    )


def latest_run_subquery(status: str | None = None) -> Subquery:
    """The id of the newest run of the outer row's spec (optionally with this status)."""
    runs = Run.objects.filter(project_id=OuterRef("project_id"), spec_id=OuterRef("spec_id"))
    if status is not None:
        runs = runs.filter(status=status)
    return Subquery(runs.order_by("-created", "-id").values("id")[:1])


@dataclass(frozen=True, slots=True)
class SpecRow:
    """A row of the spec list: the spec, its latest version number and its last run."""

    spec: Spec
    latest_number: int | None
    last_run: Run | None


def spec_rows(project: Project) -> list[SpecRow]:
    """The spec list: each spec with its latest version number and its last run (any
    status). Two queries whatever the number of specs and runs."""
    newest_version = (
        SpecVersion.objects.filter(spec_id=OuterRef("pk")).order_by("-number").values("number")
    )
    newest_run = (
        Run.objects.filter(project_id=OuterRef("project_id"), spec_id=OuterRef("pk"))
        .order_by("-created", "-id")
        .values("id")
    )
    specs = list(
        Spec.objects.filter(project=project)
        .annotate(
            latest_number=Subquery(newest_version[:1]),
            last_run_id=Subquery(newest_run[:1]),
        )
        .order_by("slug")[:SPEC_LIST_MAX]
    )
    run_ids = [s.last_run_id for s in specs if s.last_run_id is not None]
    runs = Run.objects.only(*RUN_ROW_FIELDS).in_bulk(run_ids) if run_ids else {}
    return [
        SpecRow(
            spec=s,
            latest_number=s.latest_number,
            last_run=runs.get(s.last_run_id),
        )
        for s in specs
    ]


def spec_versions(spec: Spec, *, limit: int = SPEC_VERSIONS_MAX) -> list[dict[str, Any]]:
    """Version numbers, authors and dates, newest first (no YAML text)."""
    rows = (
        SpecVersion.objects.filter(spec=spec)
        .order_by("-number")
        .values("number", "created", "content_hash", "author__username")[:limit]
    )
    return [dict(row) for row in rows]


def spec_latest_version(spec: Spec) -> SpecVersion | None:
    return SpecVersion.objects.filter(spec=spec).order_by("-number").first()


def spec_version_texts(spec: Spec, numbers: list[int]) -> dict[int, str]:
    rows = SpecVersion.objects.filter(spec=spec, number__in=numbers).values_list(
        "number", "source_yaml"
    )
    return dict(rows)
