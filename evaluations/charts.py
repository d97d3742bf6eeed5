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

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.urls import reverse
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


def chart_x(value: Any) -> Any:
    """plotly.js reads dates without a time zone: send local wall-clock time."""
    if isinstance(value, datetime):
        if timezone.is_aware(value):
            value = timezone.localtime(value)
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return value


def figure_dict(figure: go.Figure) -> dict[str, Any]:
    """A graph_objects Figure as plain JSON data, for json_script. The empty "none"
    template keeps plotly's default styling (~6 kB) out of every chart."""
    figure.update_layout(template="none")
    data: dict[str, Any] = json.loads(figure.to_json())
    return data


def run_links(project_slug: str) -> Callable[[dict[str, Any]], str]:
    """row (with an `id`) -> its run page, for points and tables. Each URL is reversed once:
    a trends page links the same 100 runs from six charts and a table."""
    urls: dict[int, str] = {}

    def link(row: dict[str, Any]) -> str:
        run_id = row["id"]
        if run_id not in urls:
            urls[run_id] = reverse("run_detail", args=[project_slug, run_id])
        return urls[run_id]

    return link


def line_chart(
    series: Sequence[Series],
    *,
    y_title: str = "",
    y_range: tuple[float, float] | None = None,
    y_format: str = "",
    height: int = 280,
    marks: Sequence[Mark] = (),
) -> dict[str, Any] | None:
    """Lines with markers, one per series, and `marks` as dotted vertical lines; None when
    no series has a point."""
    traces = []
    for index, line in enumerate(series):
        if not any(y is not None for y in line.y):
            continue
        trace: dict[str, Any] = {
            "x": [chart_x(x) for x in line.x],
            "y": list(line.y),
            "name": line.name,
            "mode": "lines+markers",
            "line": {"color": PALETTE[index % len(PALETTE)], "width": 2},
            "marker": {"size": 6},
            "connectgaps": False,
            **line.extra,
        }
        if line.links is not None:
            trace["customdata"] = list(line.links)
        if line.hover is not None:
            trace["text"] = list(line.hover)
            trace["hovertemplate"] = "%{text}<br>%{y" + (f":{y_format}" if y_format else "") + "}"
            trace["hovertemplate"] += "<extra>%{fullData.name}</extra>"
        traces.append({"type": "scatter", **trace})
    if not traces:
        return None
    yaxis: dict[str, Any] = {"title": {"text": y_title}, "zeroline": False, "gridcolor": "#e6e9ef"}
    if y_range is not None:
        yaxis["range"] = list(y_range)
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
            "xaxis": {"type": "date", "gridcolor": "#e6e9ef"},
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
    series = [
        Series(
            name=name,
            x=[row["created"] for row in rows],
            y=[row.get(metric) for row in rows],
            links=[link_for(row) for row in rows] if link_for else None,
            hover=[f"{name} · run {row['id']}" for row in rows],
        )
        for name, rows in lines.items()
    ]
    return line_chart(
        series,
        # The page's caption names the metric; an axis title would crowd the tick labels.
        y_title="",
        y_range=axis["y_range"],
        y_format=axis["y_format"],
        height=height,
        marks=marks,
    )
