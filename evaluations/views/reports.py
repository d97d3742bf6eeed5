"""The regressions report of a project: a page with filters, and the same report as
Markdown (for a pull request or a chat message), JSON and CSV."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from evaluations import selectors
from evaluations.access import project_for
from evaluations.models import Role
from evaluations.selectors.reports import parse_since

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
        "filters": filters,
        "error": error,
        "spec_slugs": selectors.project_spec_slugs(project),
        "query": request.GET.urlencode(),
    }
    return render(request, "projects/regressions.html", context, status=status)
