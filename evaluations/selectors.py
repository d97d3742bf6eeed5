"""Reads: what pages, the API, the CLI and the scoring need, in few queries."""

from __future__ import annotations

import base64
import json
import shlex
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, F, OuterRef, Q, Subquery, TextField, Window
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, RowNumber
from django.utils import timezone

from checks.report_model import MATRIX_PILLARS, ExecutionRecord, RunSummary
from checks.scoring import score_run
from checks.spec.model import Spec as EngineSpec
from evaluations.agreement import Pair, agreement, agreement_trend, cohen_kappa
from evaluations.models import (
    ApiToken,
    Artifact,
    Baseline,
    CheckResult,
    Execution,
    Membership,
    Project,
    ResultChange,
    ReviewItem,
    ReviewStatus,
    Role,
    Run,
    RunStatus,
    Spec,
    SpecVersion,
)


def run_records(run: Run) -> list[ExecutionRecord]:
    """The run's executions as the engine's records: two queries whatever the run's size."""
    results: dict[int, list] = defaultdict(list)
    for row in CheckResult.objects.filter(run=run).order_by("id"):
        results[row.execution_id].append(row)
    return [
        _execution_record(execution, results.get(execution.pk, []))
        for execution in Execution.objects.filter(run=run).order_by("id")
    ]


def execution_record(execution: Execution) -> ExecutionRecord:
    """One execution as the engine's record, with its effective results (one query)."""
    rows = list(CheckResult.objects.filter(execution=execution).order_by("id"))
    return _execution_record(execution, rows)


def _execution_record(execution: Execution, rows: list[CheckResult]) -> ExecutionRecord:
    return ExecutionRecord(
        id=str(execution.pk),
        scenario=execution.scenario,
        prompt_index=execution.prompt_index,
        prompt=execution.prompt,
        replica=execution.replica,
        attempt=execution.attempt,
        status=execution.status,
        duration_ms=execution.duration_ms or 0.0,
        cost_usd=execution.cost_usd,
        input_tokens=execution.input_tokens,
        output_tokens=execution.output_tokens,
        results=[r.to_engine() for r in _effective_results(rows)],
        forbidden_violations=list(execution.forbidden_violations),
        pillar=execution.pillar,
        mutation_type=execution.mutation_type or None,
        tool_calls=execution.tool_call_count,
        tool_errors=execution.tool_error_count,
        output=execution.final_output,
        error=execution.error or None,
    )


def _effective_results(rows: list[CheckResult]) -> list[CheckResult]:
    """A human verdict overrides the judge's (and the engine's) for the same invariant."""
    by_invariant: dict[str, CheckResult] = {}
    rank = {"engine": 0, "judge": 1, "human": 2}
    for row in rows:
        current = by_invariant.get(row.invariant_id)
        if current is None or rank.get(row.source, 0) >= rank.get(current.source, 0):
            by_invariant[row.invariant_id] = row
    return list(by_invariant.values())


def run_progress(run_id: int) -> tuple[str, int, int]:
    run = Run.objects.only("status", "executions_done", "execution_count").get(pk=run_id)
    return run.status, run.executions_done, run.execution_count


# --- Dashboard: projects, overview, specs and trends ------------------------------------------
# Every list here is bounded (a slice or a per-spec window), reads only the columns its page
# shows, and never scans executions or check results: pages use the per-run aggregates that
# run_finalize writes (composite, pass_rate, resilience, cost_usd, p95_duration_ms, ...).

OVERVIEW_RUNS = 20  # latest runs on the overview
OVERVIEW_TREND_RUNS = 30  # points per spec in the overview's trend charts
OVERVIEW_TREND_WINDOW = 1000  # newest completed runs of the project those points come from
SPEC_LIST_MAX = 500
SPEC_VERSIONS_MAX = 100
SPEC_RUNS = 20
TREND_RUNS = 100  # runs per spec in the trends page
BRANCHES_MAX = 50

# The run columns a run row in a table needs (verdict, scores, cost, latency).
RUN_ROW_FIELDS = (
    "id",
    "project_id",
    "spec_id",
    "spec_version_id",
    "status",
    "trigger",
    "branch",
    "git_sha",
    "composite",
    "pass_rate",
    "resilience",
    "overall",
    "gate_passed",
    "exit_code",
    "cost_usd",
    "p95_duration_ms",
    "execution_count",
    "executions_done",
    "created",
    "finished",
)


def membership_roles(user: Any, project_ids: list[int]) -> dict[int, Role]:
    """The user's role in each of these projects, in one query (admin everywhere for a
    superuser, as Project.role_of says)."""
    if getattr(user, "is_superuser", False):
        return dict.fromkeys(project_ids, Role.ADMIN)
    rows = Membership.objects.filter(user_id=user.pk, project_id__in=project_ids).values_list(
        "project_id", "role"
    )
    return {project_id: Role(role) for project_id, role in rows}


def project_members(project: Project) -> list[Membership]:
    return list(
        Membership.objects.filter(project=project)
        .select_related("user")
        .only("id", "role", "created", "user", "user__username", "user__is_active")
        .order_by("user__username")
    )


API_TOKENS_SHOWN = 200


def project_api_tokens(project: Project, *, limit: int = API_TOKENS_SHOWN) -> list[ApiToken]:
    """The project's tokens for the settings page, newest first, without their hashes."""
    return list(
        ApiToken.objects.filter(project=project)
        .select_related("user")
        .only("id", "name", "prefix", "created", "last_used", "revoked", "user__username")
        .order_by("-created", "-id")[:limit]
    )


def admin_count(project: Project) -> int:
    return Membership.objects.filter(project=project, role=Role.ADMIN).count()


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


def _latest_run_subquery(status: str | None = None) -> Subquery:
    """The id of the newest run of the outer row's spec (optionally with this status)."""
    runs = Run.objects.filter(project_id=OuterRef("project_id"), spec_id=OuterRef("spec_id"))
    if status is not None:
        runs = runs.filter(status=status)
    return Subquery(runs.order_by("-created", "-id").values("id")[:1])


@dataclass(frozen=True, slots=True)
class SpecRow:
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


# --- Regressions against the active baseline ----------------------------------------------
#
# A baseline's `data["groups"]` holds (scenario x prompt) groups in the shape of a run
# summary's `groups` (RunSummary.to_dict: key, scenario, prompt_index, passed, status,
# pass_at_1, ...); a mapping of key -> group is read too. A group *regressed* when it passed
# in the baseline and does not pass in the spec's latest completed run. Groups that are new
# or gone are not regressions. Nothing here reads executions.


@dataclass(frozen=True, slots=True)
class Regression:
    spec_slug: str
    baseline_name: str
    run_id: int
    group: str
    baseline_pass_rate: float | None
    current_pass_rate: float | None
    current_status: str
    failure_codes: list[str]


def group_key(group: dict[str, Any]) -> str:
    """A group's identity, as ReplicaAggregate.key writes it (for data stored without one)."""
    if group.get("key"):
        return str(group["key"])
    label = f"{group.get('scenario', 'no-chaos')} / prompt {group.get('prompt_index', 0)}"
    if group.get("mutation_type"):
        label += f" / {group['mutation_type']}"
    pillar = group.get("pillar") or "contract"
    return label if pillar in ("contract", "chaos") else f"{pillar}: {label}"


def _groups_by_key(groups: Any) -> dict[str, dict[str, Any]]:
    if isinstance(groups, dict):
        return {str(k): {"key": str(k), **v} for k, v in groups.items() if isinstance(v, dict)}
    if isinstance(groups, list):
        return {group_key(g): g for g in groups if isinstance(g, dict)}
    return {}


def _group_passed(group: dict[str, Any]) -> bool:
    if "passed" in group:
        return bool(group["passed"])
    rate = _group_pass_rate(group)
    return rate is not None and rate >= 1.0


def _group_pass_rate(group: dict[str, Any]) -> float | None:
    for name in ("pass_rate", "pass_at_1"):
        if isinstance(group.get(name), int | float):
            return float(group[name])
    return None


def project_regressions(project: Project) -> list[Regression]:
    """Every regression of every spec that has an active baseline: two queries."""
    baselines = list(
        Baseline.objects.filter(project=project, active=True)
        .annotate(latest_run_id=_latest_run_subquery(RunStatus.COMPLETED))
        .values("name", "spec_id", "spec__slug", "run_id", "data", "latest_run_id")
    )
    run_ids = [b["latest_run_id"] for b in baselines if b["latest_run_id"] is not None]
    current = {
        row["id"]: row["groups"]
        for row in Run.objects.filter(pk__in=run_ids)
        .annotate(groups=KeyTransform("groups", "summary"))
        .values("id", "groups")
    }
    regressions = []
    for baseline in sorted(baselines, key=lambda b: b["spec__slug"]):
        run_id = baseline["latest_run_id"]
        if run_id is None or run_id == baseline["run_id"]:
            continue  # nothing ran since the baseline was taken
        before = _groups_by_key((baseline["data"] or {}).get("groups"))
        after = _groups_by_key(current.get(run_id))
        for key, old in before.items():
            new = after.get(key)
            if new is None or not _group_passed(old) or _group_passed(new):
                continue
            regressions.append(
                Regression(
                    spec_slug=baseline["spec__slug"],
                    baseline_name=baseline["name"],
                    run_id=run_id,
                    group=key,
                    baseline_pass_rate=_group_pass_rate(old),
                    current_pass_rate=_group_pass_rate(new),
                    current_status=str(new.get("status") or "fail"),
                    failure_codes=[str(c) for c in new.get("failure_codes") or []],
                )
            )
    return regressions


# --- Trends -------------------------------------------------------------------------------


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
        # A key transform, not `labels__contains` (not on SQLite) nor `labels__<key>` (a key
        # with "__" would be read as a lookup).
        # The Cast makes it a plain text comparison on SQLite too (not a JSON one).
        runs = runs.annotate(
            label_value=Cast(KeyTextTransform(label[0], "labels"), output_field=TextField())
        ).filter(label_value=label[1])
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


# --- Dashboard: runs, matrix cells, executions, artifacts and exports ---------------------
# The run list pages by keyset on (created, id), never OFFSET; the run page reads only the
# parts of the summary JSON it shows (not the per-execution list, which grows with the run);
# a cell or an execution page reads its own rows by index; artifacts are read with a cap.

RUN_PAGE_SIZE = 50
RUN_CELL_PAGE_SIZE = 100
ARTIFACT_TEXT_PREVIEW_BYTES = 64 * 1024
ARTIFACT_JSON_MAX_BYTES = 2 * 1024 * 1024
TRANSCRIPT_TEXT_MAX_CHARS = 4000
# Everything in RunSummary.to_dict() but "executions".
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
    "kappa",
)
RESULT_SOURCE_RANK = {"engine": 0, "judge": 1, "human": 2}


@dataclass(frozen=True, slots=True)
class RunFilters:
    spec: str = ""  # spec slug
    status: str = ""
    label: tuple[str, str] | None = None  # (key, value) in Run.labels
    branch: str = ""
    created_from: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive


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
        # A key transform works on PostgreSQL and SQLite, and a key with "__" stays a key.
        runs = runs.alias(filter_label=KeyTextTransform(filters.label[0], "labels")).filter(
            filter_label=filters.label[1]
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
        .defer("summary", "spec_version__source_yaml", "spec_version__parsed")
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
        .defer("summary", "spec_version__source_yaml")
        .first()
    )


def spec_active_baseline(spec_id: int) -> Baseline | None:
    """The spec's active baseline without its frozen data, for the run page: one query."""
    return (
        Baseline.objects.filter(spec_id=spec_id, active=True)
        .select_related("created_by")
        .defer("data")
        .first()
    )


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


# --- Executions and artifacts -------------------------------------------------------------


def execution_for_page(project: Project, execution_id: int) -> Execution | None:
    """The execution with its run, spec and version (no run summary, no spec text)."""
    return (
        Execution.objects.filter(project=project, pk=execution_id)
        .select_related("run__spec", "run__spec_version")
        .defer("run__summary", "run__spec_version__source_yaml", "run__spec_version__parsed")
        .first()
    )


def execution_neighbours(execution: Execution) -> tuple[int | None, int | None]:
    """The previous and next execution of the same run, by id."""
    siblings = Execution.objects.filter(run_id=execution.run_id)
    previous = (
        siblings.filter(pk__lt=execution.pk).order_by("-id").values_list("id", flat=True).first()
    )
    following = (
        siblings.filter(pk__gt=execution.pk).order_by("id").values_list("id", flat=True).first()
    )
    return previous, following


def execution_results(execution: Execution) -> list[CheckResult]:
    """Every check result of the execution, each invariant's sources together."""
    rows = list(CheckResult.objects.filter(execution=execution))
    rows.sort(key=lambda r: (r.invariant_id, RESULT_SOURCE_RANK.get(r.source, 0)))
    return rows


def execution_artifacts(execution: Execution) -> list[Artifact]:
    return list(Artifact.objects.filter(execution=execution).order_by("kind", "name"))


def artifact_in_project(project: Project, execution_id: int, artifact_id: int) -> Artifact | None:
    return (
        Artifact.objects.filter(
            pk=artifact_id, execution_id=execution_id, execution__project=project
        )
        .select_related("execution")
        .first()
    )


@dataclass(frozen=True, slots=True)
class ArtifactText:
    text: str
    clipped: bool  # the file is longer than what was read
    missing: bool = False  # the row exists but its file is gone from storage


def artifact_text(artifact: Artifact, *, limit: int = ARTIFACT_TEXT_PREVIEW_BYTES) -> ArtifactText:
    """At most `limit` bytes of an artifact, decoded: a page never loads a large blob."""
    try:
        with artifact.file.storage.open(artifact.file.name, "rb") as handle:
            data = handle.read(limit + 1)
    except (FileNotFoundError, OSError):
        return ArtifactText(text="", clipped=False, missing=True)
    return ArtifactText(
        text=data[:limit].decode("utf-8", errors="replace"), clipped=len(data) > limit
    )


@dataclass(frozen=True, slots=True)
class ArtifactJson:
    data: Any
    problem: str = ""  # "" | "too large" | "missing" | "not JSON": then `data` is None


def artifact_json(artifact: Artifact, *, limit: int = ARTIFACT_JSON_MAX_BYTES) -> ArtifactJson:
    """The parsed JSON of an artifact no larger than `limit` bytes, or why there is none
    (the page then offers the download instead)."""
    if artifact.size > limit:
        return ArtifactJson(None, "too large")
    blob = artifact_text(artifact, limit=limit)
    if blob.missing:
        return ArtifactJson(None, "missing")
    if blob.clipped:
        return ArtifactJson(None, "too large")
    try:
        return ArtifactJson(json.loads(blob.text))
    except ValueError:
        return ArtifactJson(None, "not JSON")


def _clip(value: Any, limit: int = TRANSCRIPT_TEXT_MAX_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more chars)"


def _message_text(message: Any) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    if not isinstance(message, dict):
        return _clip(message)
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    if content:
        return _clip(content)
    if message.get("tool_calls"):
        return ""  # the tool calls are shown as such
    return _clip({k: v for k, v in message.items() if k != "role"}) if message else ""


def _llm_step(index: int, call: dict[str, Any]) -> dict[str, Any]:
    raw_request = call.get("request")
    request: dict[str, Any] = raw_request if isinstance(raw_request, dict) else {}
    raw_messages = request.get("messages")
    messages: list[Any] = raw_messages if isinstance(raw_messages, list) else []
    response = call.get("response")
    reply = ""
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reply = _message_text(choices[0].get("message") or {})
    elif response:
        reply = _clip(response)
    return {
        "kind": "llm",
        "number": index + 1,
        "model": call.get("model") or request.get("model") or "",
        "status": call.get("status"),
        "fault": call.get("fault"),
        "input_tokens": call.get("input_tokens") or 0,
        "output_tokens": call.get("output_tokens") or 0,
        "cost_usd": call.get("cost_usd") or 0.0,
        "latency_ms": call.get("latency_ms") or 0.0,
        "message_count": len(messages),
        "last_message_role": messages[-1].get("role", "")
        if messages and isinstance(messages[-1], dict)
        else "",
        "last_message": _message_text(messages[-1]) if messages else "",
        "reply": reply,
        "requested_tools": [
            f"{t.get('name', '')}({_clip(t.get('arguments') or {}, 300)})"
            for t in call.get("tool_calls") or []
            if isinstance(t, dict)
        ],
    }


def _tool_step(call: dict[str, Any], *, requested: dict[str, Any] | None) -> dict[str, Any]:
    response = call.get("response")
    return {
        "kind": "tool",
        "name": call.get("name", ""),
        "arguments": _clip(call.get("arguments") or {}),
        # What the model asked for, when the call the agent made looks different.
        "requested_arguments": (
            _clip(requested.get("arguments") or {})
            if requested is not None
            and requested is not call
            and (requested.get("arguments") or {}) != (call.get("arguments") or {})
            else ""
        ),
        "response": _clip(response) if response is not None else "",
        "status": call.get("status"),
        "error": call.get("error") or "",
        "fault": call.get("fault"),
        "latency_ms": call.get("latency_ms") or 0.0,
        "source": call.get("source", "agent"),
        # The model asked for this call in the LLM call just before it.
        "requested_by_model": requested is not None,
    }


def execution_transcript(trace: Any) -> list[dict[str, Any]]:
    """The LLM calls and tool calls of a stored trace ({"llm_calls", "tool_calls"}), in order.

    Calls carry no timestamps, so the order is rebuilt: each LLM call, then the tool calls it
    asked for, each paired with the next call of that tool the agent made through the tool
    proxy. Proxy calls no model asked for keep their order among the others; a requested call
    that never went through the proxy is shown as the model's request.
    """
    if not isinstance(trace, dict):
        return []
    llm_calls = [c for c in trace.get("llm_calls") or [] if isinstance(c, dict)]
    proxied = [c for c in trace.get("tool_calls") or [] if isinstance(c, dict)]
    steps: list[dict[str, Any]] = []
    next_proxied = 0
    for index, call in enumerate(llm_calls):
        steps.append(_llm_step(index, call))
        for wanted in call.get("tool_calls") or []:
            if not isinstance(wanted, dict):
                continue
            match = next(
                (
                    j
                    for j in range(next_proxied, len(proxied))
                    if proxied[j].get("name") == wanted.get("name")
                ),
                None,
            )
            if match is None:
                steps.append(_tool_step(wanted, requested=wanted))
                continue
            steps.extend(_tool_step(c, requested=None) for c in proxied[next_proxied:match])
            steps.append(_tool_step(proxied[match], requested=wanted))
            next_proxied = match + 1
    steps.extend(_tool_step(c, requested=None) for c in proxied[next_proxied:])
    return steps


def execution_reproducer(execution: Execution) -> str | None:
    """A `keystone run` command that runs this one execution again: same cell, same run
    seed (so the same per-execution seed and faults). None for mutation and replay
    executions, which a run generates and cannot be planned one by one."""
    if execution.pillar not in MATRIX_PILLARS:
        return None
    run = execution.run
    words = [
        "keystone",
        "run",
        f"{run.spec.slug}.yaml",
        "--scenario",
        execution.scenario,
        "--prompt-index",
        str(execution.prompt_index),
        "--replica",
        str(execution.replica),
    ]
    if run.replicas_override:
        words += ["--replicas", str(run.replicas_override)]
    if execution.invariant_id:
        words += ["--invariant", execution.invariant_id]
    words += ["--seed", str(int(run.options.get("seed", 0)))]
    return shlex.join(words)


# --- Exports ------------------------------------------------------------------------------

RESULT_CSV_COLUMNS = (
    "execution_id",
    "scenario",
    "prompt_index",
    "replica",
    "invariant",
    "check_type",
    "source",
    "passed",
    "score",
    "failure_code",
    "message",
)


def run_result_rows(run_id: int) -> Iterator[tuple[Any, ...]]:
    """Every check result of a run in RESULT_CSV_COLUMNS order, streamed from a server-side
    cursor in chunks: memory stays bounded whatever the number of results."""
    return (
        CheckResult.objects.filter(run_id=run_id)
        .order_by("execution_id", "invariant_id", "source")
        .values_list(
            "execution_id",
            "execution__scenario",
            "execution__prompt_index",
            "execution__replica",
            "invariant_id",
            "check_type",
            "source",
            "passed",
            "score",
            "failure_code",
            "message",
        )
        .iterator(chunk_size=2000)
    )


def run_report(run: Run) -> RunSummary:
    """The run scored from its stored results, as the CLI's reports see it (the reporters
    in checks.reporters render it as JSON, JUnit or Markdown)."""
    spec = EngineSpec.from_dict(run.spec_version.parsed)
    summary = score_run(spec, run_records(run))
    for warning in run.warnings:
        if warning not in summary.warnings:
            summary.warnings.append(warning)
    return summary


# --- Review: the queue, one item, judge-human agreement -----------------------------------

REVIEW_QUEUE_MAX = 100  # rows in the queue table
REVIEW_CHOICES_MAX = 100  # entries per filter drop-down
TRACE_READ_MAX = 512 * 1024  # bytes of trace.json read for the transcript summary
TOOL_CALLS_SHOWN = 50


@dataclass(frozen=True, slots=True)
class ReviewFilters:
    """The queue's filters: spec slug, run id, criteria (the invariant id)."""

    spec: str = ""
    run: int | None = None
    criteria: str = ""

    @classmethod
    def from_query(cls, query: Any) -> ReviewFilters:
        run = str(query.get("run") or "").strip()
        return cls(
            spec=str(query.get("spec") or "").strip(),
            run=int(run) if run.isdigit() else None,
            criteria=str(query.get("criteria") or "").strip(),
        )

    def apply(self, items: Any) -> Any:
        if self.spec:
            items = items.filter(spec__slug=self.spec)
        if self.run is not None:
            items = items.filter(run_id=self.run)
        if self.criteria:
            items = items.filter(invariant_id=self.criteria)
        return items

    def as_dict(self) -> dict[str, str]:
        values = {"spec": self.spec, "run": str(self.run or ""), "criteria": self.criteria}
        return {k: v for k, v in values.items() if v}


@dataclass(frozen=True, slots=True)
class JudgeView:
    """A stored judge verdict, read from CheckResult.details whatever its shape: the judge
    client's `details["judge"]` block, or the older flat keys."""

    model: str
    prompt_version: str
    score: float | None
    passed: bool | None
    reasoning: str
    threshold: float
    spread: float | None
    samples: int | None
    dimensions: dict[str, Any]


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def judge_view(row: CheckResult) -> JudgeView:
    details = _mapping(row.details)
    judge = _mapping(details.get("judge"))
    errored = row.to_engine().is_error
    threshold = details.get("pass_threshold", judge.get("pass_threshold", 0.5))
    spread = judge.get("spread", details.get("spread"))
    samples = judge.get("samples", details.get("samples"))
    dimensions = judge.get("dimensions", details.get("dimensions"))
    return JudgeView(
        model=str(judge.get("model") or details.get("model") or ""),
        prompt_version=str(judge.get("prompt_version") or details.get("prompt_version") or ""),
        score=None if errored else row.score,
        passed=None if errored else row.passed,
        reasoning=str(judge.get("reasoning") or details.get("reasoning") or ""),
        threshold=float(threshold) if isinstance(threshold, int | float) else 0.5,
        spread=float(spread) if isinstance(spread, int | float) else None,
        samples=len(samples) if isinstance(samples, list) else _optional_int(samples),
        dimensions=_mapping(dimensions),
    )


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def review_counts(project: Project, filters: ReviewFilters) -> dict[str, int]:
    items = filters.apply(ReviewItem.objects.filter(project=project))
    now = timezone.now()
    counts = items.aggregate(
        open=Count("id", filter=Q(status=ReviewStatus.OPEN)),
        adjudication=Count("id", filter=Q(status=ReviewStatus.ADJUDICATION)),
        complete=Count("id", filter=Q(status=ReviewStatus.COMPLETE)),
        claimed=Count("id", filter=Q(status=ReviewStatus.OPEN, claim_expires__gt=now)),
    )
    return {name: int(value or 0) for name, value in counts.items()}


def review_queue_items(
    project: Project, filters: ReviewFilters, *, status: str, limit: int = REVIEW_QUEUE_MAX
) -> list[Any]:
    items = filters.apply(ReviewItem.objects.filter(project=project, status=status))
    order = ("-completed", "-id") if status == "complete" else ("created", "id")
    return list(
        items.select_related("spec", "claimed_by")
        .annotate(verdict_count=Count("verdicts"))
        .order_by(*order)[:limit]
    )


def review_filter_choices(project: Project) -> dict[str, list[Any]]:
    """What the filter drop-downs offer: specs, recent runs and criteria that have items."""
    items = ReviewItem.objects.filter(project=project)
    criteria: dict[str, str] = {}
    for invariant_id, text in (
        items.order_by("invariant_id")
        .values_list("invariant_id", "criteria")
        .distinct()[: REVIEW_CHOICES_MAX * 2]
    ):
        criteria.setdefault(invariant_id, text)
    return {
        "specs": list(
            items.order_by("spec__slug")
            .values_list("spec__slug", flat=True)
            .distinct()[:REVIEW_CHOICES_MAX]
        ),
        "runs": list(
            items.order_by("-run_id")
            .values_list("run_id", flat=True)
            .distinct()[:REVIEW_CHOICES_MAX]
        ),
        "criteria": sorted(criteria.items())[:REVIEW_CHOICES_MAX],
    }


@dataclass(frozen=True, slots=True)
class ToolCallLine:
    name: str
    arguments: str
    response: str


@dataclass(frozen=True, slots=True)
class ReviewItemView:
    """Everything the item page shows about the graded result."""

    item: Any
    result: CheckResult
    judge: JudgeView
    criteria: str
    rubric: dict[str, str]
    input_from: str
    judged_input: str
    prompt: str
    final_output: str
    tool_calls: list[ToolCallLine]
    tool_calls_total: int
    verdicts: list[Any]


def review_item_view(item: Any) -> ReviewItemView:
    result = item.check_result
    execution = item.execution
    invariants = _mapping(item.run.spec_version.parsed.get("invariants"))
    check = _mapping(_mapping(invariants.get(item.invariant_id)).get("check"))
    details = _mapping(result.details)
    input_from = str(check.get("input_from") or details.get("input_from") or "agent_output")
    if input_from == "agent_output":
        judged_input = execution.final_output
    else:
        judge = _mapping(details.get("judge"))
        judged_input = str(judge.get("judged_input") or details.get("judged_input_preview") or "")
    rubric = _mapping(check.get("rubric"))
    calls = _trace_tool_calls(execution)
    return ReviewItemView(
        item=item,
        result=result,
        judge=judge_view(result),
        criteria=item.criteria or str(check.get("criteria") or ""),
        rubric={str(k): str(v) for k, v in rubric.items()},
        input_from=input_from,
        judged_input=judged_input,
        prompt=execution.prompt,
        final_output=execution.final_output,
        tool_calls=calls[:TOOL_CALLS_SHOWN],
        tool_calls_total=len(calls),
        verdicts=list(item.verdicts.select_related("reviewer").order_by("slot")),
    )


def _trace_tool_calls(execution: Execution) -> list[ToolCallLine]:
    """The tool calls of the execution's stored trace (trace.json), compact. A missing or
    unreadable trace gives none: the page still shows the output."""
    artifact = Artifact.objects.filter(execution=execution, kind="trace").first()
    if artifact is None:
        return []
    try:
        with artifact.file.open("rb") as handle:
            raw = handle.read(TRACE_READ_MAX + 1)
        if len(raw) > TRACE_READ_MAX:
            return []
        trace = json.loads(raw)
    except (OSError, ValueError):
        return []
    calls = trace.get("tool_calls") if isinstance(trace, dict) else None
    if not calls and isinstance(trace, dict):
        calls = [
            call
            for llm in trace.get("llm_calls") or []
            if isinstance(llm, dict)
            for call in llm.get("tool_calls") or []
        ]
    lines = []
    for call in calls or []:
        if not isinstance(call, dict):
            continue
        arguments = call.get("arguments")
        lines.append(
            ToolCallLine(
                name=str(call.get("name") or "?"),
                arguments=_short(json.dumps(arguments, ensure_ascii=False, default=str), 200),
                response=_short(str(call.get("response") or ""), 200),
            )
        )
    return lines


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class AgreementRow:
    judge_model: str
    criteria: str
    prompt_version: str
    agreement: Any  # evaluations.agreement.Agreement
    trend: list[Any]  # evaluations.agreement.TrendPoint


def review_agreement(project: Project, *, spec: Spec | None = None) -> list[AgreementRow]:
    """Judge-human agreement per (judge model, criteria, prompt version), from completed
    items whose judge gave a verdict, with a cumulative trend by day. One query."""
    items = ReviewItem.objects.filter(
        project=project,
        status=ReviewStatus.COMPLETE,
        judge_passed__isnull=False,
        final_passed__isnull=False,
    ).exclude(judge_model="")
    if spec is not None:
        items = items.filter(spec=spec)
    groups: dict[tuple[str, str, str], list[tuple[Any, Any]]] = defaultdict(list)
    for row in items.order_by("completed", "id").values(
        "judge_model",
        "criteria",
        "prompt_version",
        "judge_passed",
        "final_passed",
        "judge_score",
        "final_score",
        "completed",
    ):
        pair = Pair(
            judge_passed=bool(row["judge_passed"]),
            human_passed=bool(row["final_passed"]),
            judge_score=row["judge_score"],
            human_score=row["final_score"],
        )
        key = (row["judge_model"], row["criteria"], row["prompt_version"])
        completed = row["completed"] or timezone.now()
        groups[key].append((timezone.localdate(completed), pair))
    return [
        AgreementRow(
            judge_model=model,
            criteria=criteria,
            prompt_version=version,
            agreement=agreement(pair for _, pair in dated),
            trend=agreement_trend(dated),
        )
        for (model, criteria, version), dated in sorted(groups.items())
    ]


def review_kappa(*, project_id: int, spec_id: int, judge_models: set[str]) -> float | None:
    """Cohen's kappa between these judge models and people on this spec's completed
    items (every criteria and prompt version together); None with no pairs or when kappa
    is undefined."""
    if not judge_models:
        return None
    rows = ReviewItem.objects.filter(
        project_id=project_id,
        spec_id=spec_id,
        status=ReviewStatus.COMPLETE,
        judge_model__in=judge_models,
        judge_passed__isnull=False,
        final_passed__isnull=False,
    ).values_list("judge_passed", "final_passed")
    return cohen_kappa([Pair(judge_passed=bool(j), human_passed=bool(h)) for j, h in rows])


def result_changes(execution: Execution) -> list[ResultChange]:
    """The history of results people changed on this execution, newest first."""
    return list(
        ResultChange.objects.filter(execution=execution)
        .select_related("changed_by", "review_item")
        .order_by("-created", "-id")
    )


def pending_review_items(execution: Execution) -> dict[int, ReviewItem]:
    """check result id -> its pending review item, for the execution page's results table."""
    return {
        item.check_result_id: item
        for item in ReviewItem.objects.filter(execution=execution).exclude(
            status=ReviewStatus.COMPLETE
        )
    }
