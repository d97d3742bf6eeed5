"""What every view does differently for an htmx request: render only the page's region,
and answer a refusal with 200 (htmx swaps only 2xx answers, so the error shows in the region)."""

from __future__ import annotations

from django.http import HttpRequest


def is_htmx(request: HttpRequest) -> bool:
    return bool(getattr(request, "htmx", False))  # set by django_htmx's middleware


def page_or_region(request: HttpRequest, template: str, region: str) -> str:
    """The whole page, or only its `{% partialdef %}` region for an htmx request (same URL)."""
    return f"{template}#{region}" if is_htmx(request) else template


def refusal_status(request: HttpRequest, status: int) -> int:
    """`status` for a full page; 200 for htmx, whose fragment carries the error."""
    return 200 if is_htmx(request) else status
