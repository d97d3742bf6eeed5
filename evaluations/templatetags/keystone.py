"""Template filters of the dashboard."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince

from evaluations.selectors.bounds import capped_text

register = template.Library()


@register.filter
def capped(value: int) -> str:
    """A count from selectors.capped_count: "1,000+" past the cap, else the number."""
    return capped_text(value)


@register.filter
def ago(value: datetime | None) -> str:
    """ "just now" under a minute ("0 minutes ago" says nothing), else "3 hours ago"."""
    if value is None:
        return ""
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"


@register.filter
def word_diff_html(segments: list[tuple[str, str]]) -> str:
    """Word-diff segments (selectors.compare.word_diff) as HTML: <del> removed, <ins> added.
    Built here rather than with template loops: the compare page shows up to 200 of them."""
    tags = {"delete": "del", "insert": "ins"}
    parts = []
    for op, text in segments:
        tag = tags.get(op)
        parts.append(f"<{tag}>{escape(text)}</{tag}>" if tag else str(escape(text)))
    return mark_safe("".join(parts))  # noqa: S308 - every piece of text is escaped above
