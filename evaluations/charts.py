"""Plotly figures for the dashboard, built on the server and drawn by plotly.js.

Each builder returns a JSON-ready dict (`{"data": [...], "layout": {...}}`) that a template
embeds with `{{ chart.figure|json_script:chart.id }}` next to
`<div class="chart" data-chart="{{ chart.id }}">`; static/js/charts.js draws every such div
(and again after an htmx swap). A point may carry a link (`customdata`): clicking it opens
that page, e.g. the run the point came from.

Builders write the figure dict directly: plotly.graph_objects validates every property and
costs ~4 ms a figure, too much for pages with six charts of 100 points. The tests pass
every figure through `plotly.graph_objects.Figure` to prove it valid; `figure_dict` turns a
Figure into the same kind of dict for builders that need graph_objects.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.urls import URLResolver, get_resolver, get_script_prefix, get_urlconf, reverse
from django.utils import timezone

if TYPE_CHECKING:
    import plotly.graph_objects as go

# Colour-blind-safe palette (Okabe-Ito), in the order series get them.
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#000000",
)


@dataclass(slots=True)
class Series:
    """One line: x values (datetimes or numbers), y values (None = a gap) and, optionally,
    the page each point links to."""

    name: str
    x: Sequence[Any]
    y: Sequence[float | None]
    links: Sequence[str] | None = None
    hover: Sequence[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Mark:
    """A moment on a time axis drawn as a dotted vertical line with a short label: a new
    spec version, a baseline promoted."""

    x: Any
    text: str
    color: str = "#6b7280"


@dataclass(frozen=True, slots=True)
class Chart:
    """What a template needs: the element id, a title for people and screen readers, and
    the figure (None when there is nothing to draw)."""

    id: str
    title: str
    figure: dict[str, Any] | None


# Lines on top of each other stay apart by their dash and marker as well as their colour.
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star", "hexagon")


def run_hover(name: str, row: dict[str, Any], zone: str | None = None) -> str:
    """What a point's tooltip says about its run: number, line, version, branch and when.
    `zone` (the current time zone's name) saves looking it up again for every point."""
    return " · ".join([f"Run #{row['id']}", name, *_run_details(row, zone, line=name)])


def _run_details(row: dict[str, Any], zone: str | None, line: str | None = None) -> list[str]:
    """The run's version, branch (unless the line is that branch's: it says it already) and
    when, for a tooltip."""
    parts = []
    if row.get("spec_version__number"):
        parts.append(f"v{row['spec_version__number']}")
    if row.get("branch") and row["branch"] != line:
        parts.append(str(row["branch"]))
    created = row.get("created")
    if isinstance(created, datetime):
        parts.append(wall_clock(created, zone or timezone.get_current_timezone_name())[:16])
    return parts


@functools.lru_cache(maxsize=4096)
def wall_clock(value: datetime, zone: str) -> str:
    """value as local wall-clock time, "YYYY-MM-DD HH:MM:SS". Cached: a trends page asks for
    each of its 100 runs' times a dozen times (every chart, every line), and converting
    time zones is most of a chart's Python time. `zone` is part of the key."""
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _x_axis(values: list[Any]) -> dict[str, Any]:
    """A date axis that reads as dates: days (agreement per day) tick by day, never in
    fractions of a second, and a single moment gets room on both sides instead of an axis
    spanning milliseconds."""
    axis: dict[str, Any] = {"type": "date", "gridcolor": "#e6e9ef"}
    moments = [v for v in values if isinstance(v, date)]
    if not moments:
        return axis
    days = all(not isinstance(v, datetime) for v in moments)
    low, high = min(moments), max(moments)
    if days:
        axis["tickformat"] = "%b %d, %Y"
        axis["dtick"] = 86_400_000  # at most one tick a day (Plotly thins them out)
        if (high - low) < timedelta(days=2):
            axis["range"] = [chart_x(low - timedelta(days=1)), chart_x(high + timedelta(days=1))]
    elif high - low < timedelta(minutes=1):
        axis["range"] = [chart_x(low - timedelta(hours=1)), chart_x(high + timedelta(hours=1))]
    return axis


def chart_x(value: Any, zone: str | None = None) -> Any:
    """plotly.js reads dates without a time zone: send local wall-clock time. `zone` (the
    current time zone's name) saves looking it up for every point: that look-up (a
    context-local read) cost more than the cached conversion itself."""
    if isinstance(value, datetime):
        return wall_clock(value, zone or timezone.get_current_timezone_name())
    if isinstance(value, date):
        return value.isoformat()
    return value


def figure_dict(figure: go.Figure) -> dict[str, Any]:
    """A graph_objects Figure as plain JSON data, for json_script. The empty "none"
    template keeps plotly's default styling (~6 kB) out of every chart."""
    figure.update_layout(template="none")
    data: dict[str, Any] = json.loads(figure.to_json())
    return data


def run_links(project_slug: str) -> Callable[[dict[str, Any]], str]:
    """row (with an `id`) -> its run page, for points and tables. One URL is reversed and
    the others made from it: the overview links 150 runs and a trends page 100 from six
    charts and a table, and reversing each showed in their profiles."""
    path = id_paths("run_detail", project_slug)
    return lambda row: path(row["id"])


def id_paths(view_name: str, project_slug: str, *leading: int) -> Callable[[int], str]:
    """pk -> the path of `view_name` (a project's page of one row, by id, after the
    `leading` ids of its other arguments), made from one reversed URL: a table of 50 rows
    need not reverse 50 (~35 µs each). The {% id_url %} tag is the same for templates."""
    prefix, suffix = _around_id(
        get_resolver(get_urlconf()),
        get_script_prefix(),
        view_name,
        project_slug,
        tuple(int(i) for i in leading),
    )

    def path(pk: int) -> str:
        return f"{prefix}/{int(pk)}{suffix}"

    return path


@functools.lru_cache(maxsize=1024)
def _around_id(
    resolver: URLResolver, script_prefix: str, view_name: str, project_slug: str, leading: Any
) -> tuple[str, str]:
    # Reversed once per process. What a path depends on besides its arguments is in the
    # key: the URLconf (its resolver, a new one once the URLconf changes) and the prefix.
    template = reverse(view_name, args=[project_slug, *leading, 0])
    prefix, suffix = template.rsplit("/0", 1)  # the pages' paths end in a slash, the API's not
    if suffix and not suffix.startswith("/"):
        raise ValueError(f"{view_name}: the id is not a whole segment of {template}")
    return prefix, suffix


def link_run_rows(runs: Sequence[Any], project_slug: str) -> None:
    """Give each run of a table its page's path (`run.url`) and its spec's (`run.spec_url`),
    from URLs reversed once per table and spec: a {% url %} per row and link cost more than
    the rest of the row (~35 µs each)."""
    run_url = id_paths("run_detail", project_slug)
    spec_urls: dict[str, str] = {}
    for run in runs:
        run.url = run_url(run.pk)
        slug = run.spec.slug
        if slug not in spec_urls:
            spec_urls[slug] = reverse("spec_detail", args=[project_slug, slug])
        run.spec_url = spec_urls[slug]


def lines_over_runs(
    lines: dict[str, Sequence[float | None]],
    runs: Sequence[dict[str, Any]],
    *,
    link_for: Callable[[dict[str, Any]], str],
    y_title: str = "",
    y_range: tuple[float, float] | None = None,
    y_format: str = "",
    height: int = 280,
) -> dict[str, Any] | None:
    """One line per key of `lines`, each with a value per run of `runs` (rows with `id`,
    `created`, `spec_version__number` and `branch`, oldest first); None when no line has a
    point. The trends page's pass rate per invariant: ten lines over the same 100 runs.

    What every line shares, each point's time, link (`link_for(run)`) and the run's part of
    the tooltip, is sent once in the figure's "shared", and static/js/charts.js gives it to
    each line: with a time, link and tooltip per point and line, this chart was 130 kB of
    the page's JSON. Tooltips read as line_chart's: "Run #12 · line · v3 · main · when"."""
    zone = timezone.get_current_timezone_name()
    hovertemplate = "%{text} · %{fullData.name} · %{hovertext}<br>" + _hover_value(y_format, "")
    traces = [
        {
            "type": "scatter",
            # Four decimals are more than the chart shows (whole percents) and spare the
            # page the sixteen digits of a third.
            "y": [None if y is None else round(y, 4) for y in values],
            "name": name,
            **_line_style(index),
            "hovertemplate": hovertemplate,
        }
        for index, (name, values) in enumerate(lines.items())
        if any(y is not None for y in values)
    ]
    if not traces:
        return None
    figure = _figure(
        traces,
        [run["created"] for run in runs],
        y_title=y_title,
        y_range=y_range,
        y_format=y_format,
        nonnegative=False,
        height=height,
    )
    figure["shared"] = {
        "x": [chart_x(run["created"], zone) for run in runs],
        "customdata": [link_for(run) for run in runs],
        "text": [f"Run #{run['id']}" for run in runs],
        "hovertext": [" · ".join(_run_details(run, zone)) for run in runs],
    }
    return figure


def line_chart(
    series: Sequence[Series],
    *,
    y_title: str = "",
    y_range: tuple[float, float] | None = None,
    y_format: str = "",
    y_label: str = "",
    nonnegative: bool = False,
    height: int = 280,
    marks: Sequence[Mark] = (),
) -> dict[str, Any] | None:
    """Lines with markers, one per series, and `marks` as dotted vertical lines; None when
    no series has a point. `nonnegative` keeps the y axis at 0 and above (costs, latencies:
    never -$1 when every cost is $0)."""
    traces = []
    x_values: list[Any] = []
    zone = timezone.get_current_timezone_name()
    for index, line in enumerate(series):
        if not any(y is not None for y in line.y):
            continue
        x_values.extend(line.x)
        trace: dict[str, Any] = {
            "x": [chart_x(x, zone) for x in line.x],
            "y": list(line.y),
            "name": line.name,
            **_line_style(index),
            **line.extra,
        }
        if line.links is not None:
            trace["customdata"] = list(line.links)
        if line.hover is not None:
            trace["text"] = list(line.hover)
            trace["hovertemplate"] = "%{text}<br>" + _hover_value(y_format, y_label)
        traces.append({"type": "scatter", **trace})
    if not traces:
        return None
    return _figure(
        traces,
        x_values,
        y_title=y_title,
        y_range=y_range,
        y_format=y_format,
        nonnegative=nonnegative,
        height=height,
        marks=marks,
    )


def _line_style(index: int) -> dict[str, Any]:
    """The index-th line's look: lines on top of each other differ by dash and marker too."""
    return {
        "mode": "lines+markers",
        "line": {
            "color": PALETTE[index % len(PALETTE)],
            "width": 2,
            "dash": DASHES[index % len(DASHES)],
        },
        "marker": {"size": 7, "symbol": SYMBOLS[index % len(SYMBOLS)]},
        "connectgaps": False,
    }


def _hover_value(y_format: str, y_label: str) -> str:
    """The tooltip's value line, and the line's name in its side box."""
    value = "%{y" + (f":{y_format}" if y_format else "") + "}"
    return (f"{y_label}: " if y_label else "") + value + "<extra>%{fullData.name}</extra>"


def _figure(
    traces: list[dict[str, Any]],
    x_values: list[Any],
    *,
    y_title: str,
    y_range: tuple[float, float] | None,
    y_format: str,
    nonnegative: bool,
    height: int,
    marks: Sequence[Mark] = (),
) -> dict[str, Any]:
    """The figure of line traces: axes, marks, legend and the page's look."""
    yaxis: dict[str, Any] = {"title": {"text": y_title}, "zeroline": False, "gridcolor": "#e6e9ef"}
    if y_range is not None:
        yaxis["range"] = list(y_range)
    elif nonnegative:
        yaxis["rangemode"] = "nonnegative"
        values = [y for trace in traces for y in trace["y"] if y is not None]
        if values and max(values) <= 0:
            # Plotly would centre an all-zero line on -1..1: show 0 at the bottom instead.
            yaxis["range"] = [0, 1]
    if y_format:
        yaxis["tickformat"] = y_format
    shapes = [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": chart_x(mark.x),
            "x1": chart_x(mark.x),
            "y0": 0,
            "y1": 1,
            "line": {"color": mark.color, "width": 1, "dash": "dot"},
        }
        for mark in marks
    ]
    annotations = [
        {
            "x": chart_x(mark.x),
            "y": 1,
            "xref": "x",
            "yref": "paper",
            "text": mark.text,
            "showarrow": False,
            "xanchor": "left",
            "yanchor": "top",
            "font": {"size": 10, "color": mark.color},
        }
        for mark in marks
    ]
    return {
        "data": traces,
        "layout": {
            "shapes": shapes,
            "annotations": annotations,
            "height": height,
            "margin": {"l": 56, "r": 16, "t": 16, "b": 40},
            "xaxis": _x_axis(x_values),
            "yaxis": yaxis,
            "legend": {"orientation": "h", "y": -0.2},
            "showlegend": len(traces) > 1,
            "hovermode": "closest",
            "font": {"family": "system-ui, sans-serif", "size": 12},
            "paper_bgcolor": "rgba(0,0,0,0)",
            "plot_bgcolor": "rgba(0,0,0,0)",
        },
    }


# Scales of the run metrics: what the y axis shows and how its ticks read.
METRIC_AXES: dict[str, dict[str, Any]] = {
    "resilience": {"title": "Resilience (0–100)", "y_range": (0, 102), "y_format": ".0f"},
    "pass_rate": {"title": "Pass rate", "y_range": (0, 1.02), "y_format": ".0%"},
    "judge_mean": {"title": "Judge average (0–1)", "y_range": (0, 1.02), "y_format": ".2f"},
    "cost_usd": {"title": "Cost (USD)", "y_range": None, "y_format": "$.4f"},
    "p95_duration_ms": {"title": "p95 latency (ms)", "y_range": None, "y_format": ",.0f"},
}


def metric_trend(
    lines: dict[str, list[dict[str, Any]]],
    metric: str,
    *,
    link_for: Any = None,
    height: int = 280,
    marks: Sequence[Mark] = (),
) -> dict[str, Any] | None:
    """One line per key of `lines` (a spec, a branch...), each a list of run rows (dicts
    with `id`, `created` and the metric), oldest first. `link_for(row)` gives a point's URL;
    `marks` are drawn as dotted vertical lines (spec versions, baseline promotions)."""
    axis = METRIC_AXES[metric]
    zone = timezone.get_current_timezone_name()
    series = [
        Series(
            name=name,
            x=[row["created"] for row in rows],
            y=[row.get(metric) for row in rows],
            links=[link_for(row) for row in rows] if link_for else None,
            hover=[run_hover(name, row, zone) for row in rows],
        )
        for name, rows in lines.items()
    ]
    return line_chart(
        series,
        # The page's caption names the metric; an axis title would crowd the tick labels.
        y_title="",
        y_range=axis["y_range"],
        y_format=axis["y_format"],
        y_label=axis["title"],
        nonnegative=axis["y_range"] is None,
        height=height,
        marks=marks,
    )
