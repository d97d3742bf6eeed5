"""Placeholder: this area of the dashboard is being built (replace every view here)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest, HttpResponse


def queue(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def item(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def agreement(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")


def send_to_review(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    raise Http404("not built yet")
