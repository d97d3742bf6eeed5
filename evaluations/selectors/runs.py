"""Runs: the keyset-paged run list, one run's page, and the executions of a matrix cell."""

from __future__ import annotations

import base64
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast

from checks.report_model import MATRIX_PILLARS
from evaluations.models import (
    Baseline,
    CheckResult,
    Execution,
    Project,
    Run,
    Spec,
    run_large_fields,
)
from evaluations.selectors.bounds import RUN_ROW_FIELDS, SPEC_LIST_MAX

# The run list pages by keyset on (created, id), never OFFSET; the run page reads only the
# parts of the summary JSON it shows; a cell page reads its own rows by index.

RUN_PAGE_SIZE = 50
RUN_CELL_PAGE_SIZE = 100
# Everything in RunSummary.to_dict(per_execution=False), which is what a run stores.
RUN_SUMMARY_PARTS = (
    "verdict",
    "exit_code",
    "overall",
    "pass_rate",
    "pillar_scores",
    "resilience",
    "gates",
    "metrics",
    "groups",
    "matrix",
    "warnings",
    "why_failed",
    "kappa",
)
RESULT_SOURCE_RANK = {"engine": 0, "judge": 1, "human": 2}


@dataclass(frozen=True, slots=True)
class RunFilters:
    """The run list's filters; one left empty filters nothing."""

    spec: str = ""  # spec slug
    status: str = ""
    label: tuple[str, str] | None = None  # (key, value) in Run.labels
    branch: str = ""
    created_from: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    failure_code: str = ""  # a check of the run failed with this code (e.g. CONTAINS_FAILED)
    output: str = ""  # an execution's final output contains this text (any case)


@dataclass(frozen=True, slots=True)
class RunCursor:
    """Where a page of the run list ends: the (created, id) of its last row, as an opaque
    URL-safe token."""

    created: datetime
    id: int

    def encode(self) -> str:
        raw = f"{self.created.isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> RunCursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
            created_text, _, id_text = raw.partition("|")
            created, run_id = datetime.fromisoformat(created_text), int(id_text)
        except ValueError:  # also binascii.Error and UnicodeDecodeError
            raise ValueError(f"{token!r} is not a run list cursor") from None
        if created.tzinfo is None:
            raise ValueError(f"{token!r} is not a run list cursor (no time zone)")
        return cls(created=created, id=run_id)


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of the run list, and where the next starts."""

    runs: list[Run]
    next_cursor: RunCursor | None


def run_page(
    project: Project,
    filters: RunFilters,
    *,
    after: RunCursor | None = None,
    size: int = RUN_PAGE_SIZE,
) -> RunPage:
    """One page of the project's runs, newest first, read along the (project, created, id)
    index (or the spec / status / branch ones): one query whatever the page."""
    runs = Run.objects.filter(project=project)
    if filters.spec:
        runs = runs.filter(spec__slug=filters.spec)
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.branch:
        runs = runs.filter(branch=filters.branch)
    if filters.label is not None:
        runs = runs_labelled(runs, *filters.label)
    if filters.failure_code:
        # EXISTS along the (run, failure_code) index: one probe per run looked at.
        runs = runs.filter(
            Exists(
                CheckResult.objects.filter(
                    run=OuterRef("pk"), failure_code=filters.failure_code, passed=False
                )
            )
        )
    if filters.output:
        # Output text is not indexed: the search reads the outputs of the runs that the
        # other filters (and the page's keyset) leave, newest first, and stops at a page.
        runs = runs.filter(
            Exists(
                Execution.objects.filter(run=OuterRef("pk"), final_output__icontains=filters.output)
            )
        )
    if filters.created_from is not None:
        runs = runs.filter(created__gte=filters.created_from)
    if filters.created_before is not None:
        runs = runs.filter(created__lt=filters.created_before)
    if after is not None:
        # `created <= c` bounds the index scan; the OR picks up ties on `created` by id.
        runs = runs.filter(created__lte=after.created).filter(
            Q(created__lt=after.created) | Q(created=after.created, pk__lt=after.id)
        )
    rows = list(
        runs.select_related("spec", "spec_version")
        .only(*RUN_ROW_FIELDS, "labels", "spec__slug", "spec_version__number")
        .order_by("-created", "-id")[: size + 1]
    )
    next_cursor = None
    if len(rows) > size:
        last = rows[size - 1]
        next_cursor = RunCursor(created=last.created, id=last.pk)
    return RunPage(runs=rows[:size], next_cursor=next_cursor)


def runs_labelled(runs: QuerySet[Run], key: str, value: str) -> QuerySet[Run]:
    """The runs whose label `key` is `value`, the same on PostgreSQL and SQLite.

    A key transform, not `labels__contains` (not on SQLite) nor `labels__<key>` (a key with
    "__" would be read as a lookup). The Cast makes the comparison a plain text one: without
    it SQLite compares JSON and reads the value as JSON text ("malformed JSON" for gpt-4o)."""
    return runs.alias(
        filter_label=Cast(KeyTextTransform(key, "labels"), output_field=TextField())
    ).filter(filter_label=value)


def project_spec_slugs(project: Project, *, limit: int = SPEC_LIST_MAX) -> list[str]:
    return list(
        Spec.objects.filter(project=project).order_by("slug").values_list("slug", flat=True)[:limit]
    )


def run_for_page(project: Project, run_id: int) -> tuple[Run, dict[str, Any]] | None:
    """The run (with spec, version and author, without its summary column) and the parts of
    its summary the page shows, read as JSON paths: one query, whatever the run's size."""
    parts = {f"summary_{name}": KeyTransform(name, "summary") for name in RUN_SUMMARY_PARTS}
    run = (
        Run.objects.filter(project=project, pk=run_id)
        .select_related("spec", "spec_version", "created_by")
        .defer(*run_large_fields(), "spec_version__source_yaml", "spec_version__parsed")
        .annotate(**parts)
        .first()
    )
    if run is None:
        return None
    summary = {name: getattr(run, f"summary_{name}") for name in RUN_SUMMARY_PARTS}
    return run, summary


def run_in_project(project: Project, run_id: int) -> Run | None:
    """The run's light columns (no summary), for actions and exports."""
    return (
        Run.objects.filter(project=project, pk=run_id)
        .select_related("spec", "spec_version")
        .defer(*run_large_fields(), "spec_version__source_yaml")
        .first()
    )


def spec_active_baseline(spec_id: int, branch: str = "") -> Baseline | None:
    """The baseline a run of `branch` is compared with (the branch's, else main's), without
    its frozen data, for the run page: one query."""
    from evaluations.selectors.baselines import active_baseline_for

    return active_baseline_for(spec_id, branch)


def run_execution_counts(run_id: int) -> dict[str, int]:
    """Executions of a run per status, for its live progress (the (run, status) index)."""
    rows = (
        Execution.objects.filter(run_id=run_id)
        .order_by()
        .values_list("status")
        .annotate(count=Count("id"))
    )
    return {status: count for status, count in rows}


def executions_by_id(run_id: int, ids: list[int]) -> dict[int, Execution]:
    """Verdicts of the executions a page lists (replica markers): one query."""
    if not ids:
        return {}
    return (
        Execution.objects.filter(run_id=run_id, pk__in=ids)
        .only("id", "run_id", "status", "passed", "replica", "composite")
        .in_bulk()
    )


@dataclass(frozen=True, slots=True)
class CellRow:
    """One execution behind a matrix cell, with its results for the cell's invariant."""

    execution: Execution
    results: list[CheckResult]  # this invariant on this execution, every source
    effective: CheckResult | None  # the one that counts: human > judge > engine


def run_cell_rows(
    run: Run,
    *,
    scenario: str,
    invariant: str,
    after: int = 0,
    size: int = RUN_CELL_PAGE_SIZE,
) -> tuple[list[CellRow], int | None]:
    """The executions behind one invariant x scenario cell of the matrix, by id after
    `after`, with their results for that invariant; and the id to continue after, if any."""
    executions = list(
        Execution.objects.filter(
            run=run, scenario=scenario, pillar__in=MATRIX_PILLARS, pk__gt=after
        )
        .filter(Q(invariant_id__isnull=True) | Q(invariant_id=invariant))
        .only(
            "id",
            "run_id",
            "scenario",
            "prompt_index",
            "replica",
            "pillar",
            "invariant_id",
            "status",
            "passed",
            "composite",
            "duration_ms",
            "error",
        )
        .order_by("id")[: size + 1]
    )
    page = executions[:size]
    by_execution: dict[int, list[CheckResult]] = defaultdict(list)
    if page:
        results = CheckResult.objects.filter(
            execution_id__in=[e.pk for e in page], invariant_id=invariant
        ).order_by("execution_id", "id")
        for result in results:
            by_execution[result.execution_id].append(result)
    rows = [
        CellRow(
            execution=e,
            results=by_execution[e.pk],
            effective=_strongest_source(by_execution[e.pk]),
        )
        for e in page
    ]
    return rows, (page[-1].pk if len(executions) > size else None)


def _strongest_source(results: list[CheckResult]) -> CheckResult | None:
    if not results:
        return None
    return max(results, key=lambda r: RESULT_SOURCE_RANK.get(r.source, 0))
