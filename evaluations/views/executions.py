"""Placeholder: this area of the dashboard is being built (replace every view here)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse


def execution_detail(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def artifact_download(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")
