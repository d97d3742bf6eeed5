"""Projects: the home redirect, the project list, a project's overview and its members."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.text import slugify
from django.views.decorators.http import require_http_methods

from evaluations import charts, selectors, services
from evaluations.access import ProjectAccess, project_for, projects_of
from evaluations.models import RUN_TERMINAL_STATUSES, Role


def home(request: HttpRequest) -> HttpResponse:
    """Signed-in people go to their project (or the list when they have several)."""
    if not request.user.is_authenticated:
        return render(request, "home.html")
    projects = projects_of(request)
    if len(projects) == 1:
        return redirect("overview", project_slug=projects[0].slug)
    return redirect("project_list")


def _template(request: HttpRequest, template: str, region: str) -> str:
    """The template to render: the whole page, or only its region for an htmx request."""
    return f"{template}#{region}" if request.htmx else template  # type: ignore[attr-defined]


@login_required
@require_http_methods(["GET", "POST"])
def project_list(request: HttpRequest) -> HttpResponse:
    """The user's projects with their role; a superuser may create one here."""
    form: dict[str, str] = {"name": "", "slug": ""}
    error = ""
    status = 200
    if request.method == "POST":
        if not request.user.is_superuser:
            raise PermissionDenied("Only a superuser may create projects.")
        form = {
            "name": request.POST.get("name", "").strip(),
            "slug": request.POST.get("slug", "").strip(),
        }
        slug = form["slug"] or slugify(form["name"])
        try:
            project = services.project_create(name=form["name"], slug=slug, created_by=request.user)
        except services.MembershipError as exc:
            error, status = str(exc), 400
        else:
            messages.success(request, f"Project {project.name} created; you are its admin.")
            return redirect("overview", project_slug=project.slug)
    projects = projects_of(request)
    roles = selectors.membership_roles(request.user, [p.pk for p in projects])
    context = {
        "rows": [(project, roles.get(project.pk)) for project in projects],
        "can_create": request.user.is_superuser,
        "form": form,
        "error": error,
    }
    template = _template(request, "projects/list.html", "project-list")
    return render(request, template, context, status=status)


def _overview_charts(access: ProjectAccess) -> list[charts.Chart]:
    points = selectors.project_trend_points(access.project)
    link = charts.run_links(access.project.slug)

    return [
        charts.Chart(
            id="chart-resilience",
            title="Resilience score per spec",
            figure=charts.metric_trend(points, "resilience", link_for=link),
        ),
        charts.Chart(
            id="chart-pass-rate",
            title="Pass rate per spec",
            figure=charts.metric_trend(points, "pass_rate", link_for=link),
        ),
    ]


@login_required
def overview(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Latest runs and their verdicts, regressions against each spec's active baseline, and
    resilience / pass-rate trends per spec. An htmx request gets the latest-runs table,
    which polls itself while a run is still going."""
    access = project_for(request, project_slug)
    runs = selectors.latest_runs(access.project)
    context: dict[str, Any] = {
        "access": access,
        "runs": runs,
        "runs_active": any(run.status not in RUN_TERMINAL_STATUSES for run in runs),
    }
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "projects/overview.html#latest-runs", context)
    context["regressions"] = selectors.project_regressions(access.project)
    context["charts"] = _overview_charts(access)
    return render(request, "projects/overview.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def members(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Members and roles; admins add people by username, change roles and remove members.
    Refusals (unknown user, the last admin) come back as a message on the page."""
    access = project_for(request, project_slug)
    notice, error = "", ""
    status = 200
    if request.method == "POST":
        access = project_for(request, project_slug, Role.ADMIN)
        try:
            notice = _member_action(request, access)
        except services.MembershipError as exc:
            error, status = str(exc), 400
        if not request.htmx and not error:  # type: ignore[attr-defined]
            messages.success(request, notice)
            return redirect("members", project_slug=access.project.slug)
        if request.htmx:  # type: ignore[attr-defined]
            status = 200  # htmx swaps 2xx only; the refusal is in the fragment
    context = {
        "access": access,
        "memberships": selectors.project_members(access.project),
        "roles": Role.choices,
        "notice": notice,
        "error": error,
        "username": request.POST.get("username", "") if error else "",
    }
    template = _template(request, "projects/members.html", "member-list")
    return render(request, template, context, status=status)


def _member_action(request: HttpRequest, access: ProjectAccess) -> str:
    action = request.POST.get("action", "")
    project = access.project
    if action == "add":
        membership = services.membership_add(
            project=project,
            username=request.POST.get("username", ""),
            role=request.POST.get("role", Role.VIEWER),
        )
        return f"{membership.user.get_username()} added as {membership.role}."
    try:
        membership_id = int(request.POST.get("membership", ""))
    except ValueError:
        raise services.MembershipError("No member was chosen.") from None
    if action == "set_role":
        membership = services.membership_set_role(
            project=project, membership_id=membership_id, role=request.POST.get("role", "")
        )
        return f"{membership.user.get_username()} is now {membership.role}."
    if action == "remove":
        services.membership_remove(project=project, membership_id=membership_id)
        return "Member removed."
    raise services.MembershipError(f"Unknown action {action!r}: add, set_role or remove.")
