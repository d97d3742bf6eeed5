"""The weekly digest of a project, as Markdown: what regressed and recovered, the trend of pass rate and
resilience per spec (a text sparkline), the review backlog and judge-human kappa per judge
version, the alerts that fired, and the cost of the week.

The trend is a text sparkline, which reads the same in email, Slack and a PR; email also
gets a PNG chart made with Plotly's static export (Kaleido driving the machine's Chromium,
offline), and goes without it, saying so in the log, when that export fails.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Count, Q

from evaluations.models import AlertFiring, FiringStatus, Project, ReviewItem, ReviewStatus, Run
from evaluations.selectors.bounds import capped_counts, capped_text
from evaluations.selectors.reports import regression_changes
from evaluations.selectors.reviews import review_agreement

logger = logging.getLogger(__name__)

DIGEST_PERIOD = timedelta(days=7)
SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None]) -> str:
    """Rates in [0, 1] on a fixed scale (so 0.9 always looks the same); a gap for None."""
    return "".join(
        " " if v is None else SPARK[round(min(max(v, 0.0), 1.0) * (len(SPARK) - 1))] for v in values
    )


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _trend(values: list[float | None], *, full_scale: float = 1.0) -> str:
    """A sparkline of values in [0, full_scale], then the first and the last value: rates
    (full scale 1) as percentages, resilience (0-100) as points."""
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    line = sparkline([None if v is None else v / full_scale for v in values])

    def show(value: float) -> str:
        return _pct(value) if full_scale == 1.0 else f"{value:.1f}"

    return f"`{line}` {show(present[0])} → {show(present[-1])}"


def digest_markdown(project: Project, *, end: datetime, base_url: str = "") -> str:
    start = end - DIGEST_PERIOD
    runs = list(
        Run.objects.filter(
            project=project, status="completed", finished__gt=start, finished__lte=end
        )
        .order_by("finished", "id")
        .values_list("spec__slug", "pass_rate", "resilience", "cost_usd")
    )
    lines = [
        f"# Keystone weekly digest: {project.name}",
        "",
        f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC · {len(runs)} completed run(s)",
        "",
        "## Regressions and recoveries",
        "",
    ]
    regressions, recoveries = (
        [r for r in rows if r.finished_at and start < r.finished_at <= end]
        for rows in regression_changes(project, with_history=False)  # shown without either
    )
    for row in regressions:
        codes = ", ".join(f"`{c}`" for c in row.failure_codes) or "no failure code"
        branch = f" ({row.branch})" if row.branch else ""
        lines.append(
            f"- **{row.spec}**{branch} {row.group}: {_pct(row.baseline_pass_rate)} → "
            f"{_pct(row.current_pass_rate)}, {codes} · [run #{row.run_id}]({base_url}{row.run_url})"
        )
    if not regressions:
        lines.append("Nothing regressed against the active baselines this week.")
    for row in recoveries:
        branch = f" ({row.branch})" if row.branch else ""
        lines.append(
            f"- Recovered: **{row.spec}**{branch} {row.group}: {_pct(row.baseline_pass_rate)} → "
            f"{_pct(row.current_pass_rate)} · [run #{row.run_id}]({base_url}{row.run_url})"
        )
    lines += ["", "## Trend per spec", ""]
    by_spec: dict[str, list[tuple[float | None, float | None]]] = defaultdict(list)
    for slug, run_pass_rate, run_resilience, _ in runs:
        by_spec[slug].append((run_pass_rate, run_resilience))
    if by_spec:
        lines += ["| spec | runs | pass rate | resilience |", "|---|---|---|---|"]
        for slug in sorted(by_spec):
            pass_rates = [p for p, _ in by_spec[slug]]
            resilience = [r for _, r in by_spec[slug]]
            lines.append(
                f"| {slug} | {len(pass_rates)} | {_trend(pass_rates)} "
                f"| {_trend(resilience, full_scale=100.0)} |"
            )
    else:
        lines.append("No completed run this week.")
    # Capped like the queue's own counts: an exact count reads every pending item.
    pending = ReviewItem.objects.filter(project=project).exclude(status=ReviewStatus.COMPLETE)
    counts = capped_counts(
        {"backlog": pending, "adjudication": pending.filter(status=ReviewStatus.ADJUDICATION)}
    )
    backlog, adjudication = capped_text(counts["backlog"]), capped_text(counts["adjudication"])
    lines += [
        "",
        "## Review",
        "",
        f"- Backlog: {backlog} open item(s), {adjudication} of them awaiting adjudication",
    ]
    for judge in review_agreement(project, with_trend=False):
        kappa = judge.agreement.kappa
        version = f" / prompt {judge.prompt_version}" if judge.prompt_version else ""
        lines.append(
            f"- Judge {judge.judge_model}{version}: kappa "
            + ("–" if kappa is None else f"{kappa:.2f}")
            + f" over {judge.agreement.n} graded item(s)"
        )
    firings = AlertFiring.objects.filter(
        project=project, created__gt=start, created__lte=end
    ).aggregate(total=Count("id"), failed=Count("id", filter=Q(status=FiringStatus.FAILED)))
    cost = sum(run_cost or 0.0 for *_, run_cost in runs)
    lines += [
        "",
        "## Alerts and cost",
        "",
        f"- Alerts fired: {firings['total']} ({firings['failed']} not delivered)",
        f"- Cost of the week: ${cost:.2f} over {len(runs)} run(s)",
        "",
        f"[Regressions report]({base_url}/p/{project.slug}/regressions/?since=7d)",
        "",
    ]
    return "\n".join(lines)


def digest_chart_png(project: Project, *, end: datetime) -> bytes | None:
    """Pass rate and resilience per spec over the week as a PNG; None with no run to draw
    or when the static export cannot run here."""
    import plotly.graph_objects as go

    rows = list(
        Run.objects.filter(
            project=project, status="completed", finished__gt=end - DIGEST_PERIOD, finished__lte=end
        )
        .order_by("finished", "id")
        .values_list("spec__slug", "finished", "pass_rate", "resilience")
    )
    if not rows:
        return None
    figure = go.Figure()
    for slug in sorted({row[0] for row in rows}):
        runs = [row for row in rows if row[0] == slug]
        pass_rates = [row[2] for row in runs]
        # Resilience (0-100) is drawn on the pass rate's axis as a fraction of 100.
        resilience = [None if row[3] is None else row[3] / 100 for row in runs]
        for values, metric in ((pass_rates, "pass rate"), (resilience, "resilience")):
            figure.add_trace(
                go.Scatter(
                    x=[row[1] for row in runs],
                    y=values,
                    mode="lines+markers",
                    name=f"{slug} {metric}",
                    line={"dash": "solid" if metric == "pass rate" else "dot"},
                )
            )
    figure.update_layout(
        title=f"{project.name}: the week to {end:%Y-%m-%d}",
        yaxis={"range": [0, 1.05], "tickformat": ".0%"},
        margin={"l": 50, "r": 20, "t": 50, "b": 40},
    )
    try:
        return bytes(figure.to_image(format="png", width=800, height=360))
    except Exception as exc:  # no Kaleido or no Chromium here: the text sparkline stays
        logger.warning("digest chart not drawn: %s: %s", type(exc).__name__, exc)
        return None
