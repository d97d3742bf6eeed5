"""Placeholder: this area of the dashboard is being built (replace every view here)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse


def run_list(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def run_detail(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def run_cell(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def run_cancel(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def run_rerun_failed(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def run_export(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")
