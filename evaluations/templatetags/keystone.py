"""Template filters of the dashboard."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

register = template.Library()


@register.filter
def ago(value: datetime | None) -> str:
    """ "just now" under a minute ("0 minutes ago" says nothing), else "3 hours ago"."""
    if value is None:
        return ""
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"
