"""Table rows made in Python instead of a template loop (issue 18): the regressions
report's rows (views/reports.py) and the overview's trend table (views/projects.py). They
must be what the template's loop wrote, for every kind of value a row can hold."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from django.template import engines

from evaluations import charts, selectors
from evaluations.access import ProjectAccess
from evaluations.models import Role
from evaluations.selectors.reports import RegressionRow
from evaluations.views.projects import _overview_charts
from evaluations.views.reports import _improvement_row, _regression_rows

# The loops as templates/projects/regressions.html had them before the rows were made in
# Python (the same text, from {% for %} to {% endfor %}).
REGRESSION_LOOP = """{% load keystone %}{% for row in report.rows %}
            <tr>
              <td><a href="{% url 'spec_detail' slug row.spec %}">{{ row.spec }}</a></td>
              <td>{{ row.branch|default:"–" }}</td><td>{{ row.group }}</td><td>{{ row.baseline }}</td>
              <td>{{ row.baseline_pass_rate|default_if_none:"–" }}</td><td>{{ row.current_pass_rate|default_if_none:"–" }}</td>
              <td>{% if row.baseline_counts %}{{ row.baseline_counts }} → {{ row.current_counts }}{% else %}–{% endif %}</td>
              <td title="Fisher's exact test, one-sided">{{ row.p_value|fixed:4|default:"–" }}</td>
              <td>{{ row.status }}</td>
              <td>{% for code in row.failure_codes %}<code>{{ code }}</code> {% empty %}–{% endfor %}</td>
              <td class="since">{% if row.since_url %}<a href="{{ row.since_url }}">#{{ row.since_run_id }}</a>{% else %}–{% endif %}</td>
              <td><a href="{{ row.run_url }}">#{{ row.run_id }}</a> · <a href="{{ row.compare_url }}">compare</a>
                {% for url in row.failing_urls %}{% if forloop.first %} · failing:{% endif %} <a href="{{ url }}" class="failing-execution">{{ forloop.counter }}</a>{% endfor %}
                <span class="muted small">{{ row.run_finished }}</span></td>
            </tr>
          {% endfor %}"""  # noqa: E501

IMPROVEMENT_LOOP = """{% for row in report.improvements %}
            <tr>
              <td>{{ row.spec }}</td><td>{{ row.branch|default:"–" }}</td><td>{{ row.group }}</td>
              <td>{{ row.baseline_pass_rate|default_if_none:"–" }}</td><td>{{ row.current_pass_rate|default_if_none:"–" }}</td>
              <td><a href="{{ row.run_url }}">#{{ row.run_id }}</a></td>
            </tr>
          {% endfor %}"""  # noqa: E501


def rows() -> list[RegressionRow]:
    """Rows with every kind of value: missing ones, odd floats, text to escape, zero to
    three failing executions."""
    made = []
    kinds = itertools.product(
        [None, 0.0, 1.0, 1 / 3, 0.95, 2.5e-7],
        [("", "", None), ("10/10", "7/10", 0.1021671826625387), ("1/1", "0/1", 0.5)],
        [[], ["CONTAINS_FAILED"], ["A<b>", "x&y"]],
        [None, 7],
        [0, 1, 3],
    )
    for n, (rate, (before, after, p), codes, since, failing) in enumerate(kinds):
        made.append(
            RegressionRow(
                spec="refund-agent" if n % 2 else "support_bot-2",
                branch="" if n % 3 else "feature/<x>",
                baseline="release-1" if n % 2 else 'run "#4"',
                run_id=1000 + n,
                run_finished="" if n % 5 == 0 else "2026-11-25T10:00:00+00:00",
                group="no-chaos / prompt 0" if n % 2 else "says_refund @ <chaos>",
                baseline_pass_rate=1.0 if rate is None else rate,
                current_pass_rate=rate,
                status="flaky" if n % 2 else "fail",
                failure_codes=codes,
                run_url=f"/p/mine/runs/{1000 + n}/",
                compare_url=f"/p/mine/runs/{1000 + n}/compare/#change-group-x&y",
                baseline_counts=before,
                current_counts=after,
                p_value=p,
                since_run_id=since,
                since_url=f"/p/mine/runs/{since}/" if since else "",
                failing_urls=[f"/p/mine/executions/{n * 10 + i}/" for i in range(failing)],
            )
        )
    return made


@pytest.mark.django_db
def test_the_rows_made_in_python_are_what_the_template_wrote() -> None:
    report = {"rows": rows(), "improvements": rows()}
    engine = engines["django"]
    context = {"report": report, "slug": "mine"}

    written = engine.from_string(REGRESSION_LOOP).render(context)
    made = "".join(_regression_rows(report["rows"], "mine"))
    assert made == written
    assert len(report["rows"]) == 324 and made.count('class="failing-execution"') == 432

    written = engine.from_string(IMPROVEMENT_LOOP).render(context)
    assert "".join(_improvement_row(row) for row in report["improvements"]) == written


TREND_LOOP = """{% for row in trend_rows %}
                  <tr><td>{{ row.spec }}</td><td><a href="{{ row.url }}">#{{ row.id }}</a></td><td class="nowrap">{{ row.created|local_minute }}</td>
                    <td class="num">{{ row.resilience|fixed:1|default:"—" }}</td><td class="num">{{ row.pass_rate|percent|default:"—" }}</td></tr>
                {% endfor %}"""  # noqa: E501


@pytest.mark.django_db
def test_the_overviews_trend_rows_are_what_the_template_wrote(
    two_projects: Any, make_spec: Any, make_run: Any
) -> None:
    version = make_spec(two_projects.mine)
    for failing in ((), ["says_refunded"], [("llm-degraded", "says_refunded")]):
        make_run(version, failing=failing)
    make_run(version, resilience=None, pass_rate=None)  # values the table shows as "—"

    _, made = _overview_charts(ProjectAccess(project=two_projects.mine, role=Role.VIEWER))

    points = selectors.project_trend_points(two_projects.mine)
    link = charts.run_links(two_projects.mine.slug)
    rows = [
        {**row, "spec": spec, "url": link(row)} for spec, runs in points.items() for row in runs
    ]
    written = engines["django"].from_string("{% load keystone %}" + TREND_LOOP)
    assert len(made) == 4
    assert "".join(made) == written.render({"trend_rows": rows})
