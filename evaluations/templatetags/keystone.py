"""Template filters of the dashboard."""

from __future__ import annotations

import json
import math
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django import template
from django.core.serializers.json import DjangoJSONEncoder
from django.template.defaultfilters import floatformat
from django.utils import timezone
from django.utils.formats import localize
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince

from evaluations.charts import id_paths, wall_clock
from evaluations.markup import escape
from evaluations.selectors.bounds import capped_text

register = template.Library()


@register.filter
def capped(value: int) -> str:
    """A count from selectors.capped_count: "1,000+" past the cap, else the number."""
    return capped_text(value)


@register.simple_tag
def id_url(view_name: str, project_slug: str, *ids: int) -> str:
    """`{% url view_name project_slug id... %}` for the rows of a table (the last id is the
    row's): the URL is reversed once, not once per row (charts.id_paths)."""
    *leading, pk = ids
    return id_paths(view_name, project_slug, *leading)(pk)


@register.filter
def ago(value: datetime | None) -> str:
    """ "just now" under a minute ("0 minutes ago" says nothing), else "3 hours ago"."""
    if value is None:
        return ""
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"


# Number and time filters for tables of many rows (a trends page shows 100 runs, the
# overview 150 points). floatformat and date go through Decimal and localized formats, about
# ten times the work of an f-string: in those tables they were most of the rendering. Each
# returns "" for a missing value, so `|default:"—"` still applies.


@register.filter
def fixed(value: float | None, places: int = 1) -> str:
    """A number with `places` (0 or more) decimals, what floatformat writes: the float's
    shortest decimal text rounded half up (93.456|fixed:1 is "93.5", 2.5|fixed:0 is "3",
    never "-0.0"), without floatformat's localization, the slow part of it."""
    if value is None or value == "":
        return ""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or abs(number) >= 1e15:  # rare: leave these to Django
        return str(floatformat(value, places))
    rounded = Decimal(repr(number)).quantize(Decimal(1).scaleb(-int(places)), ROUND_HALF_UP)
    return f"{rounded.copy_abs() if rounded.is_zero() else rounded:f}"


@register.filter
def percent(value: float | None) -> str:
    """A share 0..1 as a whole percentage, rounded as widthratio rounds: 0.955 is "96%"."""
    if value is None or value == "":
        return ""
    return f"{round(float(value) * 100)}%"


@register.filter
def local_minute(value: datetime | None) -> str:
    """A moment as local wall-clock time to the minute, "2026-11-25 18:05"."""
    if value is None:
        return ""
    return wall_clock(value, timezone.get_current_timezone_name())[:16]


@register.filter
def local_second(value: datetime | None) -> str:
    """A moment as local wall-clock time to the second, "2026-11-25 18:05:09"."""
    if value is None:
        return ""
    return wall_clock(value, timezone.get_current_timezone_name())


@register.filter
def iso(value: datetime | None) -> str:
    """A moment in ISO 8601, local time, what `date:'c'` writes (a <time datetime>)."""
    if value is None:
        return ""
    return (timezone.localtime(value) if timezone.is_aware(value) else value).isoformat()


@register.filter
def word_diff_html(segments: list[tuple[str, str]]) -> str:
    """Word-diff segments (selectors.compare.word_diff) as HTML: <del> removed, <ins> added.
    Built here rather than with a template loop, which costs a tag per word of the output."""
    tags = {"delete": "del", "insert": "ins"}
    parts = []
    for op, text in segments:
        tag = tags.get(op)
        parts.append(f"<{tag}>{escape(text)}</{tag}>" if tag else str(escape(text)))
    return mark_safe("".join(parts))  # noqa: S308 - every piece of text is escaped above


@register.filter
def chart_script(figure: Any, element_id: str) -> str:
    """`figure` as `<script id="element_id" type="application/json">`, what json_script
    writes but faster on chart-sized data: json_script escapes with str.translate, which
    walks a 100 kB figure character by character (~7 ms per 100 kB, most of a trends
    page's rendering); str.replace escapes the same three characters in C. Compact
    separators make the page smaller too."""
    text = json.dumps(figure, cls=DjangoJSONEncoder, separators=(",", ":"))
    # The characters that could end the script element or start an HTML entity.
    text = text.replace("&", "\\u0026").replace("<", "\\u003C").replace(">", "\\u003E")
    return format_html(
        '<script id="{}" type="application/json">{}</script>',
        element_id,
        mark_safe(text),  # noqa: S308 - JSON with every HTML-significant character escaped
    )


def run_row_cells(run: Any) -> tuple[str, str, str, str]:
    """What the run table and the run list write alike for a run, as HTML: its progress
    while it runs, its gates badge and exit code, its cost and its p95 duration."""
    progress = f" {run.executions_done}/{run.execution_count}" if run.status == "running" else ""
    if run.gate_passed is None:
        gates = '<span class="muted">—</span>'
    elif run.gate_passed:
        gates = '<span class="badge pass">gates pass</span>'
    else:
        gates = '<span class="badge fail">gates fail</span>'
    if run.exit_code is not None:
        gates += f' <span class="muted small">exit {run.exit_code}</span>'
    cost = f"${fixed(run.cost_usd, 4)}" if run.cost_usd is not None else "—"
    p95 = f"{fixed(run.p95_duration_ms, 0)} ms" if run.p95_duration_ms is not None else "—"
    return progress, gates, cost, p95


@register.filter
def run_table_row(run: Any, show_spec: bool = False) -> str:
    """A row of the run table (projects/overview.html#run-table, on the overview and a
    spec's page), as its template loop wrote it: the loop's forty-odd nodes (lookups,
    conditions, filters, escaping) per row were most of the table's rendering. Needs
    run.url and run.spec_url (charts.link_run_rows). Every text value is escaped."""
    spec = (
        f'<td><a href="{escape(run.spec_url)}">{escape(run.spec.slug)}</a> '
        f'<span class="muted small">v{run.spec_version.number}</span></td>'
        if show_spec
        else ""
    )
    progress, gates, cost, p95 = run_row_cells(run)
    # What {{ run.created }} writes: the moment in the current time zone, localized.
    local = timezone.localtime(run.created) if timezone.is_aware(run.created) else run.created
    created = escape(localize(local))
    return mark_safe(  # noqa: S308 - every text value is escaped; the rest are numbers
        "\n          <tr>\n"
        f'            <td><a href="{escape(run.url)}">#{run.pk}</a></td>\n'
        f"            {spec}\n"
        "            \n"
        f'            <td><span class="badge status-{escape(run.status)}">{escape(run.status)}'
        f"{progress}</span></td>\n"
        f"            <td>{gates}</td>\n"
        f'            <td class="num">{fixed(run.composite, 2) or "—"}</td>\n'
        f'            <td class="num">{fixed(run.resilience, 1) or "—"}</td>\n'
        f'            <td class="num">{percent(run.pass_rate) or "—"}</td>\n'
        f'            <td class="num">{cost}</td>\n'
        f'            <td class="num">{p95}</td>\n'
        f"            <td>{escape(run.branch or '—')}</td>\n"
        f'            <td><time datetime="{iso(run.created)}" title="{created}">'
        f"{escape(ago(run.created))}</time></td>\n"
        "          </tr>\n        "
    )
