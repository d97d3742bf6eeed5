"""Placeholder: this area of the dashboard is being built (replace every view here)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse


def spec_list(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def spec_edit(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def spec_validate(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def spec_detail(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def spec_diff(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def spec_run(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def spec_trends(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")
