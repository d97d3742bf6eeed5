"""Runs: the list (filters, keyset pages), a run's page (live progress, scores, gates, the
invariant x scenario heatmap, replica groups), one heatmap cell, the cancel, re-run-failed
and promote-to-baseline actions, and the exports (JSON, JUnit, Markdown, CSV of check results)."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import localize
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseStopPolling

from checks import reporters
from evaluations import charts, selectors, services
from evaluations.access import ProjectAccess, project_for
from evaluations.markup import escape
from evaluations.models import Role, Run, RunStatus
from evaluations.numbers import whole_number
from evaluations.templatetags.keystone import (
    fixed,
    iso,
    local_minute,
    local_second,
    percent,
    run_row_cells,
)
from evaluations.views.htmx import is_htmx, page_or_region, refusal_status

GROUPS_SHOWN = 300  # replica groups drawn on the run page; the exports have them all


# --- List ---------------------------------------------------------------------------------


class RunFilterForm(forms.Form):
    spec = forms.SlugField(required=False)
    status = forms.ChoiceField(required=False, choices=[("", "any"), *RunStatus.choices])
    label = forms.CharField(required=False, max_length=500)
    branch = forms.CharField(required=False, max_length=255)
    created_from = forms.DateField(required=False)
    created_to = forms.DateField(required=False)
    failure_code = forms.RegexField(
        required=False,
        max_length=64,
        regex=r"^[A-Za-z0-9_]*$",
        error_messages={"invalid": "a failure code is letters, digits and _ (CONTAINS_FAILED)"},
    )
    output = forms.CharField(required=False, max_length=200)
    after = forms.CharField(required=False, max_length=200)

    def clean_label(self) -> tuple[str, str] | None:
        text = self.cleaned_data["label"].strip()
        if not text:
            return None
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise forms.ValidationError(f"expected key=value, got {text!r}")
        return key.strip(), value.strip()

    def clean_after(self) -> selectors.RunCursor | None:
        token = self.cleaned_data["after"].strip()
        if not token:
            return None
        try:
            return selectors.RunCursor.decode(token)
        except ValueError as exc:
            raise forms.ValidationError(f"{exc}; start again from the first page") from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("created_from"), data.get("created_to")
        if start and end and start > end:
            self.add_error("created_to", f"{end} is before the start date {start}")
        return data

    def filters(self) -> selectors.RunFilters:
        data = self.cleaned_data
        return selectors.RunFilters(
            spec=data["spec"],
            status=data["status"],
            label=data["label"],
            branch=data["branch"].strip(),
            created_from=_day_start(data["created_from"]),
            # The end date is inclusive: runs before the next day's midnight.
            created_before=_day_start(data["created_to"], days_later=1),
            failure_code=data["failure_code"].strip().upper(),
            output=data["output"].strip(),
        )


def _day_start(day: date | None, *, days_later: int = 0) -> datetime | None:
    if day is None:
        return None
    start = datetime.combine(day + timedelta(days=days_later), time.min)
    return timezone.make_aware(start)


def _run_list_row(run: Any) -> SafeString:
    """A row of the run list as its template loop wrote it: about forty template nodes a
    row (lookups, conditions, filters, escaping) over 50 rows were most of the page's
    rendering. Needs run.url and run.spec_url (charts.link_run_rows); every text value
    (spec, status, branch, labels) is escaped, label values localized as a template does."""
    progress, gates, cost, p95 = run_row_cells(run)
    pass_rate = percent(run.pass_rate) if run.pass_rate is not None else "—"
    branch = f'<span class="mono">{escape(run.branch)}</span>' if run.branch else ""
    labels = "".join(
        f'<span class="label-tag">{escape(localize(key))}={escape(localize(value))}</span> '
        for key, value in run.labels.items()
        if key not in ("branch", "git_sha")
    )
    status = escape(run.status)
    return mark_safe(  # noqa: S308 - every text value is escaped; the rest are numbers
        f'\n              <tr data-run-id="{run.pk}">\n'
        f'                <td><input type="checkbox" name="run" value="{run.pk}" '
        f'aria-label="Pick run #{run.pk} to compare"></td>\n'
        f'                <td><a href="{escape(run.url)}">#{run.pk}</a></td>\n'
        f'                <td class="nowrap"><a href="{escape(run.spec_url)}">'
        f"{escape(run.spec.slug)}</a></td>\n"
        f"                <td>v{run.spec_version.number}</td>\n"
        f'                <td class="nowrap"><span class="badge status-{status}">{status}'
        f"{progress}</span></td>\n"
        f'                <td class="nowrap">{gates}</td>\n'
        f'                <td class="num">{fixed(run.composite, 3) or "—"}</td>\n'
        f'                <td class="num">{pass_rate}</td>\n'
        f'                <td class="num">{fixed(run.resilience, 1) or "—"}</td>\n'
        f'                <td class="num">{cost}</td>\n'
        f'                <td class="num">{p95}</td>\n'
        '                <td class="small">\n'
        f"                  {branch}\n"
        f"                  {labels}\n"
        "                </td>\n"
        f'                <td class="nowrap"><time datetime="{iso(run.created)}" '
        f'title="{local_second(run.created)}">{local_minute(run.created)}</time></td>\n'
        "              </tr>\n            "
    )


@login_required
@require_GET
def run_list(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Runs newest first, filtered, one keyset page at a time; the "next" link carries the
    (created, id) cursor of the page's last row. htmx requests get the table region."""
    access = project_for(request, project_slug)
    form = RunFilterForm(request.GET)
    page: selectors.RunPage | None = None
    next_query = ""
    if form.is_valid():
        page = selectors.run_page(access.project, form.filters(), after=form.cleaned_data["after"])
        if page.next_cursor is not None:
            query = request.GET.copy()
            query["after"] = page.next_cursor.encode()
            next_query = query.urlencode()
    first_query = request.GET.copy()
    first_query.pop("after", None)
    runs = page.runs if page else []
    # Each row's two links from URLs reversed once: a tenth of the page's time otherwise.
    charts.link_run_rows(runs, access.project.slug)
    context = {
        "access": access,
        "form": form,
        "page": page,
        "runs": runs,
        "run_rows": [_run_list_row(run) for run in runs],
        "next_query": next_query,
        "next_url": f"{request.path}?{next_query}" if next_query else "",
        "first_query": first_query.urlencode(),
        "paged": bool(request.GET.get("after")),
        "spec_slugs": selectors.project_spec_slugs(access.project),
        "statuses": RunStatus.choices,
    }
    # htmx swaps only 2xx answers: an invalid filter is shown in the fragment, as a 200.
    status = 200 if form.is_valid() else refusal_status(request, 400)
    template = page_or_region(request, "runs/run_list.html", "run-table")
    return render(request, template, context, status=status)


# --- Detail -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heatmap:
    """The run page's matrix: the scenario columns and, per invariant, its cells in that order
    (None where there is no cell)."""

    scenarios: list[str]
    rows: list[tuple[str, list[dict[str, Any] | None]]]  # invariant, cells by scenario


def _heatmap(matrix: list[dict[str, Any]] | None, cell_path: str) -> Heatmap | None:
    """The summary's matrix cells as invariant rows x scenario columns, in spec order, each
    with the URL of its executions (`cell_path`, the run's cell page, reversed once: two
    {% url %} per cell were most of the reversing a 100-cell run page did)."""
    if not matrix:
        return None
    scenarios: list[str] = []
    invariants: list[str] = []
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for cell in matrix:
        scenario, invariant = str(cell["scenario"]), str(cell["invariant_id"])
        if scenario not in scenarios:
            scenarios.append(scenario)
        if invariant not in invariants:
            invariants.append(invariant)
        total = int(cell.get("results_total") or 0)
        passed = int(cell.get("results_passed") or 0)
        # Shade: a failing cell where some results passed is "mixed", not plain "fail".
        shade = cell["status"]
        if shade == "fail" and passed:
            shade = "mixed"
        cells[(invariant, scenario)] = {
            **cell,
            "shade": shade,
            "passed_count": passed,
            "total": total,
            "url": f"{cell_path}?{urlencode({'scenario': scenario, 'invariant': invariant})}",
        }
    rows = [(inv, [cells.get((inv, scenario)) for scenario in scenarios]) for inv in invariants]
    return Heatmap(scenarios=scenarios, rows=rows)


def _groups(
    run: Run, groups: list[dict[str, Any]] | None, project_slug: str
) -> tuple[list[dict[str, Any]], int]:
    """The first GROUPS_SHOWN groups with their replicas' verdicts (one query) and pages'
    paths (`url`, from one reversed URL), and how many more the run has."""
    groups = groups or []
    shown = groups[:GROUPS_SHOWN]
    ids = [int(i) for g in shown for i in g.get("execution_ids") or [] if str(i).isdigit()]
    executions = selectors.executions_by_id(run.pk, ids)
    execution_url = charts.id_paths("execution_detail", project_slug)
    rows = []
    for group in shown:
        replicas = [
            {"execution": executions[int(i)], "url": execution_url(int(i))}
            for i in group.get("execution_ids") or []
            if str(i).isdigit() and int(i) in executions
        ]
        rows.append({**group, "replicas": replicas})
    return rows, max(0, len(groups) - len(shown))


def _run_context(access: ProjectAccess, run: Run, summary: dict[str, Any]) -> dict[str, Any]:
    terminal = run.is_terminal
    slug = access.project.slug
    groups, hidden_groups = _groups(run, summary.get("groups"), slug) if terminal else ([], 0)
    failed_groups = [g for g in summary.get("groups") or [] if not g.get("passed")]
    rerun_of = str(run.labels.get("rerun_of", ""))
    return {
        "access": access,
        "run": run,
        "summary": summary,
        "terminal": terminal,
        "counts": None if terminal else selectors.run_execution_counts(run.pk),
        "heatmap": (
            _heatmap(summary.get("matrix"), reverse("run_cell", args=[slug, run.pk]))
            if terminal
            else None
        ),
        "groups": groups,
        "hidden_groups": hidden_groups,
        "failed_group_count": len(failed_groups),
        "can_rerun": run.status == RunStatus.COMPLETED and bool(failed_groups),
        "progress_percent": (
            round(100 * run.executions_done / run.execution_count) if run.execution_count else 0
        ),
        # A label anyone can set (--label rerun_of=...): linked only when it is a run id.
        "rerun_of": rerun_of if whole_number(rerun_of) is not None else "",
        # Only an ended run can be (or be compared with) the spec's baseline.
        "baseline": selectors.spec_active_baseline(run.spec_id, run.branch) if terminal else None,
    }


@login_required
@require_GET
def run_detail(request: HttpRequest, project_slug: str, run_id: int) -> HttpResponse:
    """The run page. Its live region polls this URL every 2 s (htmx) while the run goes on;
    once the run has ended the answer is status 286 with the final region, which stops the
    polling."""
    access = project_for(request, project_slug)
    found = selectors.run_for_page(access.project, run_id)
    if found is None:
        raise Http404("No such run in this project.")
    run, summary = found
    if run.is_terminal:
        # Blind review: what the summary says of results this person has not graded yet.
        cells = selectors.blind_hidden_cells(request.user, run_id=run.pk)
        summary = selectors.blind_summary(summary, cells)
    context = _run_context(access, run, summary)
    if is_htmx(request):
        content = render_to_string("runs/run_detail.html#live", context, request=request)
        if run.is_terminal:
            return HttpResponseStopPolling(content)
        return HttpResponse(content)
    return render(request, "runs/run_detail.html", context)


@login_required
@require_GET
def run_cell(request: HttpRequest, project_slug: str, run_id: int) -> HttpResponse:
    """The executions of one invariant x scenario cell with their result for that invariant:
    a page, or the fragment the heatmap loads under itself."""
    access = project_for(request, project_slug)
    run = _project_run(access, run_id)
    scenario = request.GET.get("scenario", "")
    invariant = request.GET.get("invariant", "")
    missing = [
        name for name, value in (("scenario", scenario), ("invariant", invariant)) if not value
    ]
    if missing:
        return HttpResponseBadRequest(
            f"run_cell: the query parameter {' and '.join(missing)} is required "
            "(?scenario=NAME&invariant=ID)",
            content_type="text/plain",
        )
    after_text = request.GET.get("after", "0") or "0"
    after = whole_number(after_text)
    if after is None:
        return HttpResponseBadRequest(
            f"run_cell: after={after_text!r} is not an execution id", content_type="text/plain"
        )
    rows, next_after = selectors.run_cell_rows(
        run, scenario=scenario, invariant=invariant, after=after
    )
    # Blind review: the results this person may not see yet (one query for the page).
    hidden = selectors.blind_hidden_results(
        request.user, run_id=run.pk, result_ids=[r.pk for row in rows for r in row.results]
    )
    context = {
        "access": access,
        "run": run,
        "scenario": scenario,
        "invariant": invariant,
        "rows": [
            {
                "execution": row.execution,
                "results": row.results,
                "effective": row.effective,
                "hidden_item": hidden.get(row.effective.pk) if row.effective else None,
            }
            for row in rows
        ],
        "blind_hidden": selectors.BLIND_HIDDEN,
        "next_after": next_after,
        "paged": after_text != "0",
    }
    template = page_or_region(request, "runs/run_cell.html", "cell")
    return render(request, template, context)


# --- Actions ------------------------------------------------------------------------------


def _project_run(access: ProjectAccess, run_id: int) -> Run:
    """The run `run_id` of the project the request was let into; 404 for any other run."""
    run = selectors.run_in_project(access.project, run_id)
    if run is None:
        raise Http404("No such run in this project.")
    return run


def _run_for_action(request: HttpRequest, project_slug: str, run_id: int) -> Run:
    return _project_run(project_for(request, project_slug, Role.EDITOR), run_id)


@login_required
@require_POST
def run_cancel(request: HttpRequest, project_slug: str, run_id: int) -> HttpResponse:
    run = _run_for_action(request, project_slug, run_id)
    if run.is_terminal:
        messages.info(request, f"Run {run.pk} had already ended ({run.status}).")
    else:
        services.run_cancel(run_id=run.pk)
        messages.success(request, f"Run {run.pk} cancelled: nothing more of it will start.")
    return redirect("run_detail", project_slug=project_slug, run_id=run.pk)


@login_required
@require_POST
def run_rerun_failed(request: HttpRequest, project_slug: str, run_id: int) -> HttpResponse:
    run = _run_for_action(request, project_slug, run_id)
    try:
        new_run = services.run_rerun_failed(run_id=run.pk, created_by=request.user)
    except ValueError as exc:
        messages.error(request, f"Nothing re-run: {exc}.")
        return redirect("run_detail", project_slug=project_slug, run_id=run.pk)
    groups = len(new_run.options.get("only") or [])
    messages.success(
        request, f"Run {new_run.pk} re-runs the {groups} failed group(s) of run {run.pk}."
    )
    return redirect("run_detail", project_slug=project_slug, run_id=new_run.pk)


@login_required
@require_POST
def run_baseline(request: HttpRequest, project_slug: str, run_id: int) -> HttpResponse:
    """Freeze this completed run's results as its spec's active baseline (editors). htmx gets
    the page's baseline region back; a plain form post is redirected to the run page."""
    access = project_for(request, project_slug, Role.EDITOR)
    run = _project_run(access, run_id)
    notice, error = "", ""
    baseline_scope = run.branch
    try:
        baseline = services.baseline_promote(
            run_id=run.pk,
            user=request.user,
            name=request.POST.get("name", ""),
            branch=request.POST.get("branch") or None,
            reason=request.POST.get("reason", ""),
        )
    except services.BaselineError as exc:
        error = f"Not promoted: {exc}."
    else:
        baseline_scope = baseline.branch
        notice = (
            f"Run {run.pk} is now the baseline of {run.spec.slug} ({baseline.name}) "
            f"on {baseline.branch}."
        )
    if is_htmx(request):
        context = {
            "access": access,
            "run": run,
            "baseline": selectors.spec_active_baseline(run.spec_id, baseline_scope),
            "baseline_notice": notice,
            "baseline_error": error,
        }
        # htmx swaps 2xx answers only: a refusal is shown in the region.
        return render(request, "runs/run_detail.html#baseline", context)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, notice)
    return redirect("run_detail", project_slug=project_slug, run_id=run.pk)


# --- Exports ------------------------------------------------------------------------------

REPORT_FORMATS = {
    # fmt in the URL: (renderer, content type, file name suffix)
    "json": (reporters.render_json, "application/json", ".json"),
    "junit": (reporters.render_junit, "application/xml", "-junit.xml"),
    "md": (reporters.render_markdown, "text/markdown; charset=utf-8", ".md"),
}


class _Echo:
    """A file-like object whose write returns the line, so csv.writer can feed a stream."""

    def write(self, value: str) -> str:
        return value


def _csv_lines(run_id: int, hidden: dict[int, int]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(selectors.RESULT_CSV_COLUMNS)
    for row in selectors.run_result_rows(run_id, hidden):
        yield writer.writerow(row)


@login_required
@require_GET
def run_export(request: HttpRequest, project_slug: str, run_id: int, fmt: str) -> HttpResponseBase:
    """The run's reports as the CLI writes them (checks.reporters, from the stored results),
    or every check result as CSV, streamed row by row. The results under blind review that
    this person has not graded are hidden (selectors.blind_hidden_results)."""
    access = project_for(request, project_slug)
    if fmt not in REPORT_FORMATS and fmt != "csv":
        raise Http404(f"Unknown export format {fmt!r}: json, junit, md or csv.")
    run = _project_run(access, run_id)
    stem = f"{run.spec.slug}-run-{run.pk}"
    hidden = selectors.blind_hidden_results(request.user, run_id=run.pk)
    response: HttpResponse | StreamingHttpResponse
    if fmt == "csv":
        response = StreamingHttpResponse(
            _csv_lines(run.pk, hidden), content_type="text/csv; charset=utf-8"
        )
        response["Content-Disposition"] = f'attachment; filename="{stem}-results.csv"'
        return response
    render_report, content_type, suffix = REPORT_FORMATS[fmt]
    response = HttpResponse(
        render_report(selectors.run_report(run, hidden)), content_type=content_type
    )
    response["Content-Disposition"] = f'attachment; filename="{stem}{suffix}"'
    return response


# The run figures the compare page puts side by side: (label, Run field, decimals).
COMPARE_FIGURES = (
    ("composite", "composite", 3),
    ("pass rate", "pass_rate", 3),
    ("resilience", "resilience", 1),
    ("overall", "overall", 3),
    ("judge mean", "judge_mean", 3),
    ("cost (USD)", "cost_usd", 4),
    ("p95 latency (ms)", "p95_duration_ms", 0),
)


@login_required
@require_GET
def run_compare(request: HttpRequest, project_slug: str, run_id: int) -> HttpResponse:
    """A run beside its spec's baseline (or `?against=RUN`): the figures and their deltas,
    then every cell that changed with its statistical verdict (checks.compare), then the
    executions that differ, a page at a time (`?cursor=`; htmx asks for the next page alone)."""
    from evaluations.selectors.compare import (
        ComparisonRefused,
        comparison_reference,
        execution_pairs,
        pair_cursor,
        run_comparison,
    )

    access = project_for(request, project_slug)
    after = _project_run(access, run_id)
    against = request.GET.get("against") or "baseline"
    try:
        cursor = pair_cursor(request.GET["cursor"]) if "cursor" in request.GET else None
    except ValueError as exc:
        return HttpResponseBadRequest(f"run_compare: {exc}", content_type="text/plain")
    context: dict[str, Any] = {"access": access, "run": after, "against": against}
    try:
        before = comparison_reference(after, against)
    except ComparisonRefused as exc:
        context["problem"] = str(exc)
        return render(request, "runs/run_compare.html", context, status=200)
    page = execution_pairs(before, after, cursor=cursor)
    context.update(
        before=before,
        pairs=page.pairs,
        remaining=page.remaining,
        next_cursor=page.next_cursor,
        paged=cursor is not None,
    )
    if cursor is not None and is_htmx(request):
        return render(request, "runs/run_compare.html#pairs", context)
    comparison = run_comparison(before, after)
    figures = []
    for label, name, digits in COMPARE_FIGURES:
        old, new = getattr(before, name), getattr(after, name)
        delta = None if old is None or new is None else new - old
        figures.append(
            {"label": label, "before": old, "after": new, "delta": delta, "digits": digits}
        )
    context.update(
        comparison=comparison,
        matrix=_compare_matrix(comparison.cells),
        changed=comparison.changed(),
        figures=figures,
    )
    return render(request, "runs/run_compare.html", context)


@login_required
@require_GET
def run_compare_pair(
    request: HttpRequest, project_slug: str, run_id: int, execution_id: int
) -> HttpResponse:
    """One execution of the run beside the same cell of the run it is compared with
    (`?against=`, as on the compare page): both outputs diffed word by word and both
    tool-call sequences. The compare page loads it into a pair when the pair is opened."""
    from evaluations.selectors.compare import (
        ComparisonRefused,
        comparison_reference,
        execution_pair,
    )

    access = project_for(request, project_slug)
    after = _project_run(access, run_id)
    try:
        before = comparison_reference(after, request.GET.get("against") or "baseline")
    except ComparisonRefused as exc:
        return HttpResponseBadRequest(f"run_compare_pair: {exc}", content_type="text/plain")
    pair = execution_pair(before, after, execution_id)
    if pair is None:
        raise Http404(f"Run #{after.pk} has no execution #{execution_id}.")
    context = {"access": access, "run": after, "before": before, "pair": pair}
    return render(request, page_or_region(request, "runs/run_compare_pair.html", "body"), context)


def _compare_matrix(cells: list[Any]) -> dict[str, Any]:
    """The invariant x scenario cells of a comparison as a grid (rows of invariants, one
    column per scenario), so the changed cells stand out among those that did not."""
    by_position: dict[tuple[str, str], Any] = {}
    invariants: list[str] = []
    scenarios: list[str] = []
    for cell in cells:
        if cell.kind != "invariant":
            continue
        invariant_id, _, scenario = cell.key.partition(" @ ")
        if invariant_id not in invariants:
            invariants.append(invariant_id)
        if scenario not in scenarios:
            scenarios.append(scenario)
        by_position[(invariant_id, scenario)] = cell
    rows = [(i, [by_position.get((i, s)) for s in scenarios]) for i in invariants]
    return {"scenarios": scenarios, "rows": rows}


@login_required
@require_GET
def run_compare_pick(request: HttpRequest, project_slug: str) -> HttpResponse:
    """The two runs ticked in the runs list: the older is the reference, the newer is
    compared with it. Anything but two runs of this project goes back to the list, told."""
    access = project_for(request, project_slug)
    picked = request.GET.getlist("run")
    ids = [i for i in map(whole_number, picked) if i is not None]
    runs = [
        run for run in (selectors.run_in_project(access.project, i) for i in ids) if run is not None
    ]
    if len(picked) != 2 or len(runs) != 2:
        messages.error(
            request, f"Tick exactly two runs of this project to compare ({len(picked)} ticked)."
        )
        return redirect("run_list", project_slug=project_slug)
    before, after = sorted(runs, key=lambda r: (r.created, r.pk))
    url = reverse("run_compare", args=[project_slug, after.pk])
    return redirect(f"{url}?against={before.pk}")
