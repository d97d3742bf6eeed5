"""The regressions report of a project: what got worse against the active baselines, with
the reason when there is nothing to show.

`regression_rows` is the one place the report, its exports, the CLI and the
`any_regression` alert read regressions from. Today it wraps
selectors.regressions.project_regressions (a group that passed in the baseline and does
not pass in the spec's latest completed run); the statistical verdicts of the
baselines/compare work replace it here, and every reader follows.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import F, Q, TextField, Window
from django.db.models.functions import Cast, DenseRank, RowNumber
from django.utils import timezone

from checks.reporters import cap_markdown
from evaluations.charts import id_paths
from evaluations.models import (
    Baseline,
    CheckResult,
    Execution,
    Project,
    Run,
)
from evaluations.selectors.regressions import (
    Regression,
    project_group_changes,
)


@dataclass(frozen=True, slots=True)
class RegressionRow:
    """One row of the regressions report (a regression or an improvement), with the run
    details and links the page, its exports and the alerts show."""

    spec: str
    branch: str
    baseline: str
    run_id: int
    run_finished: str
    group: str
    baseline_pass_rate: float | None
    current_pass_rate: float | None
    status: str
    failure_codes: list[str]
    run_url: str
    # The compare page: this run against its spec's baseline, cell by cell, with p-values.
    compare_url: str = ""
    baseline_counts: str = ""
    current_counts: str = ""
    p_value: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # Set for an invariant x scenario row; empty for a scenario x prompt group.
    invariant: str = ""
    # The first run of the streak in which it has not passed (of the spec's last
    # SINCE_LOOKBACK completed runs), and up to three of the latest run's failing executions.
    since_run_id: int | None = None
    since_url: str = ""
    failing_urls: list[str] = field(default_factory=list)

    @property
    def finished_at(self) -> datetime | None:
        return datetime.fromisoformat(self.run_finished) if self.run_finished else None


@dataclass(slots=True)
class RegressionReport:
    """The regressions report of a project: its regressions, its improvements, and why it is
    empty when it is."""

    project: str
    since: str | None
    rows: list[RegressionRow] = field(default_factory=list)
    # Groups that failed in the baseline and pass now, listed below the regressions.
    improvements: list[RegressionRow] = field(default_factory=list)
    # Why the report is empty, when it is: no baseline, no run since, nothing regressed.
    empty_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "project": self.project,
            "since": self.since,
            "empty_reason": self.empty_reason,
            "regressions": [asdict(row) for row in self.rows],
            "improvements": [asdict(row) for row in self.improvements],
        }


CSV_COLUMNS = [
    "change",
    "spec",
    "branch",
    "baseline",
    "run_id",
    "run_finished",
    "group",
    "baseline_pass_rate",
    "current_pass_rate",
    "baseline_counts",
    "current_counts",
    "p_value",
    "status",
    "failure_codes",
    "invariant",
    "since_run_id",
    "run_url",
    "compare_url",
    "since_url",
    "failing_urls",
]


_SINCE = re.compile(r"^(?P<count>\d+)(?P<unit>[hdw])$")
_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, *, now: datetime | None = None) -> datetime | None:
    """`7d`, `24h`, `2w` (back from now) or an ISO date / time; empty means no limit."""
    text = (text or "").strip()
    if not text:
        return None
    match = _SINCE.match(text)
    if match:
        delta = timedelta(**{_UNITS[match["unit"]]: int(match["count"])})
        return (now or timezone.now()) - delta
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"since {text!r}: use a period such as 24h, 7d, 2w or a date such as 2026-11-01"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# How far back "since which run" looks, per spec.
SINCE_LOOKBACK = 50


def regression_changes(
    project: Project, *, with_history: bool = True
) -> tuple[list[RegressionRow], list[RegressionRow]]:
    """(regressions, improvements) of the project now, per scenario x prompt group and per
    invariant x scenario cell, in two queries. Without `with_history`, a regression's
    since-which-run and failing executions are left out (two to four queries more, and one
    for each spec whose streak goes past its newest runs), for readers that show neither:
    the digest and the alerts' count."""
    regressions, improvements = project_group_changes(project, cells=True)
    history: dict[str, _SpecHistory] = {}
    failing: dict[tuple[Any, ...], list[int]] = {}
    if with_history:
        history = _recent_failing_keys(project, {r.spec_slug for r in regressions})
        failing = _failing_executions(regressions)
    # Each row links three or more pages by id: made from URLs reversed once, as a reverse()
    # per link (~35 µs) over a hundred rows showed in the report's profile.
    run_url = id_paths("run_detail", project.slug)
    compare_url = id_paths("run_compare", project.slug)
    execution_url = id_paths("execution_detail", project.slug)

    def row(r: Regression) -> RegressionRow:
        return RegressionRow(
            spec=r.spec_slug,
            branch=r.run_branch,
            baseline=r.baseline_name,
            run_id=r.run_id,
            run_finished=_iso(r.run_finished),
            group=r.group,
            baseline_pass_rate=r.baseline_pass_rate,
            current_pass_rate=r.current_pass_rate,
            status=r.current_status,
            failure_codes=r.failure_codes,
            run_url=run_url(r.run_id),
            compare_url=f"{compare_url(r.run_id)}#{r.compare_anchor}",
            baseline_counts=r.baseline_counts,
            current_counts=r.current_counts,
            p_value=r.p_value,
            labels={str(k): str(v) for k, v in (r.run_labels or {}).items()},
            invariant=r.invariant,
        )

    def regressed(r: Regression) -> RegressionRow:
        if not with_history:
            return row(r)
        since = _failing_since(r, history[r.spec_slug])
        return replace(
            row(r),
            since_run_id=since,
            since_url=run_url(since) if since else "",
            failing_urls=[execution_url(pk) for pk in failing.get(_failing_key(r), [])],
        )

    return [regressed(r) for r in regressions], [row(r) for r in improvements]


# The newest runs of a spec whose failing keys come with the runs; an older run's are read
# only when a streak reaches it (most streaks end at the run before the regressed one).
SINCE_FIRST_READ = 5


class _SpecHistory:
    """A spec's last SINCE_LOOKBACK completed runs, newest first, and the keys of the groups
    and cells that did not pass in each (Run.failing_keys), decoded when a streak first
    reaches the run. The newest runs' keys come read (`keys_json`, shared by the specs);
    an older run's are read with the rest of its spec's when first needed: most streaks end
    at the run before the regressed one, and reading every run's keys, 250 of them for five
    specs, was the larger part of the report's time."""

    def __init__(self, run_ids: list[int], keys_json: dict[int, str | None]) -> None:
        self.run_ids = run_ids
        self._keys_json = keys_json
        self._failing: dict[int, dict[str, set[str]]] = {}

    def failing(self, run_id: int, kind: str) -> set[str]:
        if run_id not in self._failing:
            if run_id not in self._keys_json:
                unread = [pk for pk in self.run_ids if pk not in self._keys_json]
                self._keys_json.update(_failing_keys_json(unread))
            keys = json.loads(self._keys_json[run_id] or "{}") or {}
            self._failing[run_id] = {
                part: set(keys.get(part) or ()) for part in ("groups", "cells")
            }
        return self._failing[run_id][kind]


def _failing_keys_json(run_ids: list[int]) -> dict[int, str | None]:
    """Run.failing_keys of these runs as JSON text (decoded only where a streak reaches)."""
    found: dict[int, str | None] = dict.fromkeys(run_ids)
    found.update(
        Run.objects.filter(pk__in=run_ids)
        .annotate(failing_keys_json=Cast("failing_keys", output_field=TextField()))
        .order_by()
        .values_list("id", "failing_keys_json")
    )
    return found


def _recent_failing_keys(project: Project, specs: set[str]) -> dict[str, _SpecHistory]:
    """Per spec, its last SINCE_LOOKBACK completed runs, newest first (one query for every
    spec: the runs numbered per spec by the database, from run_spec_recent_idx alone), with
    the failing keys of each one's newest SINCE_FIRST_READ runs read (one more query)."""
    if not specs:
        return {}
    newest_first = [F("finished").desc(), F("id").desc()]
    runs = (
        Run.objects.filter(project=project, spec__slug__in=specs, status="completed")
        .annotate(recency=Window(RowNumber(), partition_by=F("spec_id"), order_by=newest_first))
        .filter(recency__lte=SINCE_LOOKBACK)
        .order_by("spec_id", "recency")
        .values_list("spec__slug", "id")
    )
    by_spec: dict[str, list[int]] = {spec: [] for spec in specs}
    for spec, run_id in runs:
        by_spec[spec].append(run_id)
    keys_json = _failing_keys_json(
        [run_id for run_ids in by_spec.values() for run_id in run_ids[:SINCE_FIRST_READ]]
    )
    return {spec: _SpecHistory(run_ids, keys_json) for spec, run_ids in by_spec.items()}


def _failing_since(r: Regression, history: _SpecHistory) -> int | None:
    """The oldest run of the unbroken streak, ending at the regressed run, in which the
    group or cell did not pass (a run without it, or where it passed, ends the streak)."""
    since = None
    kind = "cells" if r.invariant else "groups"
    for run_id in history.run_ids:
        if run_id > r.run_id:
            continue  # newer than the run the regression was read from
        if r.group not in history.failing(run_id, kind):
            break
        since = run_id
    return since


def _failing_key(r: Regression) -> tuple[Any, ...]:
    """What a regression's failing executions are looked up by in _failing_executions."""
    if r.invariant:
        return ("cell", r.run_id, r.invariant, r.scenario)
    return ("group", r.run_id, r.scenario, r.prompt_index)


def _failing_executions(
    regressions: list[Regression], limit: int = 3
) -> dict[tuple[Any, ...], list[int]]:
    """Up to `limit` failing executions of each regression (the first by id), by
    _failing_key: two queries for all of them, each partition of the rows numbered by the
    database, instead of a query per regression. A cell's are the executions of its
    scenario with a failing result of its invariant; a group's, its scenario's failing
    executions (of its prompt, when it has one)."""
    found: dict[tuple[Any, ...], list[int]] = {}
    cells = [r for r in regressions if r.invariant]
    if cells:
        results = (
            CheckResult.objects.filter(
                run_id__in={r.run_id for r in cells},
                invariant_id__in={r.invariant for r in cells},
                passed=False,
            )
            # DENSE_RANK: an execution with two failing results of the invariant counts once.
            .annotate(
                rank=Window(
                    DenseRank(),
                    partition_by=[F("run_id"), F("invariant_id"), F("execution__scenario")],
                    order_by=F("execution_id").asc(),
                )
            )
            .filter(rank__lte=limit)
            .order_by("execution_id")
            .values_list("run_id", "invariant_id", "execution__scenario", "execution_id")
        )
        for run_id, invariant, scenario, execution_id in results:
            ids = found.setdefault(("cell", run_id, invariant, scenario), [])
            if execution_id not in ids:
                ids.append(execution_id)
    groups = [r for r in regressions if not r.invariant]
    if groups:
        by_scenario = [F("run_id"), F("scenario")]
        executions = (
            Execution.objects.filter(
                run_id__in={r.run_id for r in groups},
                scenario__in={r.scenario for r in groups},
                passed=False,
            )
            # A group without a prompt index takes its scenario's first failing executions.
            .annotate(
                in_scenario=Window(RowNumber(), partition_by=by_scenario, order_by=F("id").asc()),
                in_prompt=Window(
                    RowNumber(),
                    partition_by=[*by_scenario, F("prompt_index")],
                    order_by=F("id").asc(),
                ),
            )
            .filter(Q(in_scenario__lte=limit) | Q(in_prompt__lte=limit))
            .order_by("id")
            .values_list("run_id", "scenario", "prompt_index", "id", "in_scenario", "in_prompt")
        )
        for run_id, scenario, prompt_index, pk, in_scenario, in_prompt in executions:
            if in_scenario <= limit:
                found.setdefault(("group", run_id, scenario, None), []).append(pk)
            if in_prompt <= limit:
                found.setdefault(("group", run_id, scenario, prompt_index), []).append(pk)
    return found


def regression_rows(project: Project, *, with_history: bool = True) -> list[RegressionRow]:
    """Every current regression of the project (alerts and the digest read these)."""
    return regression_changes(project, with_history=with_history)[0]


def _iso(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else ""


def regressions_in_runs(project: Project, run_ids: list[int]) -> list[RegressionRow]:
    wanted = set(run_ids)
    rows = regression_rows(project, with_history=False)  # the alerts count them
    return [row for row in rows if row.run_id in wanted]


def regression_report(
    project: Project,
    *,
    since: datetime | None = None,
    spec: str = "",
    branch: str = "",
    label: str = "",
) -> RegressionReport:
    """`label` is `key=value` (a run label, e.g. `model=gpt-4o`)."""
    report = RegressionReport(project=project.slug, since=_iso(since) or None)
    key, _, value = label.partition("=")

    def wanted(row: RegressionRow) -> bool:
        return (
            (not label or row.labels.get(key.strip()) == value.strip())
            and (not spec or row.spec == spec)
            and (not branch or row.branch == branch)
            and (since is None or (row.finished_at is not None and row.finished_at >= since))
        )

    regressions, improvements = regression_changes(project)
    report.rows = [r for r in regressions if wanted(r)]
    report.improvements = [r for r in improvements if wanted(r)]
    if not report.rows:
        report.empty_reason = _empty_reason(project, since=since, spec=spec, branch=branch)
        if label and report.empty_reason.startswith("Nothing regressed"):
            report.empty_reason = f"Nothing regressed in runs labelled {label}."
    return report


def _empty_reason(project: Project, *, since: datetime | None, spec: str, branch: str) -> str:
    baselines = Baseline.objects.filter(project=project, active=True)
    if spec:
        baselines = baselines.filter(spec__slug=spec)
    if not baselines.exists():
        where = f"spec {spec}" if spec else "any spec of this project"
        return f"No active baseline for {where}: promote a run to a baseline to compare against."
    runs = Run.objects.filter(
        project=project, status="completed", spec__baselines__active=True
    ).distinct()
    if spec:
        runs = runs.filter(spec__slug=spec)
    if branch:
        runs = runs.filter(branch=branch)
    if since is not None:
        runs = runs.filter(finished__gte=since)
    if not runs.exists():
        return "No completed run since " + (_iso(since) if since else "the baseline") + "."
    return "Nothing regressed: every group that passed in its baseline still passes."


def report_json(report: RegressionReport) -> str:
    return json.dumps(report.to_dict(), indent=2)


def report_csv(report: RegressionReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for change, rows in (("regressed", report.rows), ("improved", report.improvements)):
        for row in rows:
            data = {
                **asdict(row),
                "change": change,
                "failure_codes": " ".join(row.failure_codes),
                "failing_urls": " ".join(row.failing_urls),
            }
            writer.writerow([data[c] for c in CSV_COLUMNS])
    return out.getvalue()


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def report_markdown(report: RegressionReport, *, base_url: str = "") -> str:
    """Short enough for a pull request or a chat message; links back to the runs."""
    title = f"**Keystone regressions: {report.project}**"
    if report.since:
        title += f" since {report.since}"
    lines = [title, ""]
    if not report.rows:
        lines.append(report.empty_reason)
    else:
        lines += [f"{len(report.rows)} regressed group(s) and invariant(s):", ""]
        lines += [
            "| spec | branch | group or invariant @ scenario | baseline | now | codes | since | run |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in report.rows:
            codes = ", ".join(f"`{c}`" for c in row.failure_codes) or "–"
            since = f"[#{row.since_run_id}]({base_url}{row.since_url})" if row.since_url else "–"
            failing = "".join(
                f" · [failing {n}]({base_url}{url})" for n, url in enumerate(row.failing_urls, 1)
            )
            lines.append(
                f"| {row.spec} | {row.branch or '–'} | {row.group} | {_rate(row.baseline_pass_rate)}"
                f" | {_rate(row.current_pass_rate)} | {codes} | {since}"
                f" | [#{row.run_id}]({base_url}{row.run_url})"
                f" · [compare]({base_url}{row.compare_url}){failing} |"
            )
    if report.improvements:
        improved = ", ".join(
            f"{row.spec} {row.group} ([#{row.run_id}]({base_url}{row.run_url}))"
            for row in report.improvements
        )
        lines += ["", f"Improved ({len(report.improvements)}): {improved}"]
    return cap_markdown("\n".join(lines) + "\n")
