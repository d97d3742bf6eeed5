"""The regressions report of a project: a page with filters, and the same report as
Markdown (for a pull request or a chat message), JSON and CSV."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import numberformat
from django.utils.formats import get_format
from django.utils.safestring import SafeString, mark_safe

from evaluations import selectors
from evaluations.access import project_for
from evaluations.markup import escape
from evaluations.models import Role
from evaluations.selectors.reports import RegressionRow, parse_since
from evaluations.templatetags.keystone import fixed

EXPORTS = {
    "md": "text/markdown; charset=utf-8",
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
}


def _export_body(report: selectors.RegressionReport, export: str) -> str:
    if export == "md":
        return selectors.report_markdown(report, base_url=settings.KEYSTONE_BASE_URL)
    return selectors.report_json(report) if export == "json" else selectors.report_csv(report)


@login_required
def regressions(request: HttpRequest, project_slug: str) -> HttpResponse:
    access = project_for(request, project_slug, Role.VIEWER)
    project = access.project
    filters = {
        name: request.GET.get(name, "").strip() for name in ("spec", "branch", "label", "since")
    }
    export = request.GET.get("format", "")
    error = ""
    try:
        since = parse_since(filters["since"])
    except ValueError as exc:
        error, since = str(exc), None
    if filters["label"] and "=" not in filters["label"]:
        error = f"label {filters['label']!r}: write key=value, e.g. model=gpt-4o"
    if export and export not in EXPORTS:
        error = f"format {export!r}: use one of {', '.join(EXPORTS)}"
    if error and export:
        return HttpResponse(error + "\n", status=400, content_type="text/plain")
    status = 400 if error else 200
    report = selectors.regression_report(
        project,
        since=since,
        spec=filters["spec"],
        branch=filters["branch"],
        label=filters["label"] if not error else "",
    )
    if export:
        response = HttpResponse(_export_body(report, export), content_type=EXPORTS[export])
        name = f"regressions-{project.slug}.{export}"
        response["Content-Disposition"] = f'inline; filename="{name}"'
        return response
    context = {
        "access": access,
        "report": report,
        "regression_rows": _regression_rows(report.rows, project.slug),
        "improvement_rows": _improvement_rows(report.improvements),
        "filters": filters,
        "error": error,
        "spec_slugs": selectors.project_spec_slugs(project),
        "query": request.GET.urlencode(),
    }
    return render(request, "projects/regressions.html", context, status=status)


# The report's table rows, as the template wrote them, made here: a row has about twenty
# values and links, and the bench project a hundred rows, where the template's per-value
# work (lookups, filters, escaping, localization) was most of the page. Every value is
# escaped (evaluations.markup); numbers are localized as a template localizes them (Django's
# numberformat with the active language's decimal separator, looked up once per page: a
# lookup per value was a third of these rows' time).


def _rate(value: float | None, decimal_separator: str) -> str:
    return "–" if value is None else str(numberformat.format(value, decimal_separator))


def _regression_rows(rows: list[RegressionRow], project_slug: str) -> list[SafeString]:
    spec_urls: dict[str, str] = {}
    separator = get_format("DECIMAL_SEPARATOR")
    made = []
    for row in rows:
        if row.spec not in spec_urls:
            spec_urls[row.spec] = reverse("spec_detail", args=[project_slug, row.spec])
        made.append(_regression_row(row, spec_urls[row.spec], separator))
    return made


def _improvement_rows(rows: list[RegressionRow]) -> list[SafeString]:
    separator = get_format("DECIMAL_SEPARATOR")
    return [_improvement_row(row, separator) for row in rows]


def _regression_row(row: RegressionRow, spec_url: str, separator: str) -> SafeString:
    counts = (
        f"{escape(row.baseline_counts)} → {escape(row.current_counts)}"
        if row.baseline_counts
        else "–"
    )
    codes = "".join(f"<code>{escape(code)}</code> " for code in row.failure_codes) or "–"
    since = f'<a href="{escape(row.since_url)}">#{row.since_run_id}</a>' if row.since_url else "–"
    failing = "".join(
        f"{' · failing:' if number == 1 else ''} "
        f'<a href="{escape(url)}" class="failing-execution">{number}</a>'
        for number, url in enumerate(row.failing_urls, 1)
    )
    return mark_safe(  # noqa: S308 - every value is escaped above and here
        "\n            <tr>\n"
        f'              <td><a href="{escape(spec_url)}">{escape(row.spec)}</a></td>\n'
        f"              <td>{escape(row.branch or '–')}</td><td>{escape(row.group)}</td>"
        f"<td>{escape(row.baseline)}</td>\n"
        f"              <td>{_rate(row.baseline_pass_rate, separator)}</td>"
        f"<td>{_rate(row.current_pass_rate, separator)}</td>\n"
        f"              <td>{counts}</td>\n"
        f'              <td title="Fisher\'s exact test, one-sided">'
        f"{fixed(row.p_value, 4) or '–'}</td>\n"
        f"              <td>{escape(row.status)}</td>\n"
        f"              <td>{codes}</td>\n"
        f'              <td class="since">{since}</td>\n'
        f'              <td><a href="{escape(row.run_url)}">#{row.run_id}</a> · '
        f'<a href="{escape(row.compare_url)}">compare</a>\n'
        f"                {failing}\n"
        f'                <span class="muted small">{escape(row.run_finished)}</span></td>\n'
        "            </tr>\n          "
    )


def _improvement_row(row: RegressionRow, separator: str) -> SafeString:
    return mark_safe(  # noqa: S308 - every value is escaped
        "\n            <tr>\n"
        f"              <td>{escape(row.spec)}</td><td>{escape(row.branch or '–')}</td>"
        f"<td>{escape(row.group)}</td>\n"
        f"              <td>{_rate(row.baseline_pass_rate, separator)}</td>"
        f"<td>{_rate(row.current_pass_rate, separator)}</td>\n"
        f'              <td><a href="{escape(row.run_url)}">#{row.run_id}</a></td>\n'
        "            </tr>\n          "
    )
