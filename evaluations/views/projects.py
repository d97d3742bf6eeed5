"""Placeholder: this area of the dashboard is being built (replace every view here)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from evaluations.access import projects_of


def home(request: HttpRequest) -> HttpResponse:
    """Signed-in people go to their project (or the list when they have several)."""
    if not request.user.is_authenticated:
        return render(request, "home.html")
    projects = projects_of(request)
    if len(projects) == 1:
        return redirect("overview", project_slug=projects[0].slug)
    return redirect("project_list")


def project_list(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def overview(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def members(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")
