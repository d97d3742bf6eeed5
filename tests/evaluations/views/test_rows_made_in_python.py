"""Table rows made in Python instead of a template loop (issue 18): the regressions
report's rows (views/reports.py), the overview's trend table (views/projects.py), the run
table of the overview and a spec's page (the run_table_row filter), the review queue's
rows (views/review.py), the trends page's run table (views/specs.py) and the run list
(views/runs.py). They must be what the template's loop wrote, for every kind of
value a row can hold."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.template import engines
from django.utils import timezone

from evaluations import charts, selectors
from evaluations.access import ProjectAccess
from evaluations.models import ReviewItem, Role, Run, Spec
from evaluations.selectors.reports import RegressionRow
from evaluations.templatetags.keystone import run_table_row
from evaluations.views.projects import _overview_charts
from evaluations.views.reports import _improvement_rows, _regression_rows
from evaluations.views.review import _queue_rows
from evaluations.views.runs import _run_list_row
from evaluations.views.specs import _trend_table_row

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
def test_the_report_rows_are_what_the_template_wrote() -> None:
    report = {"rows": rows(), "improvements": rows()}
    engine = engines["django"]
    context = {"report": report, "slug": "mine"}

    written = engine.from_string(REGRESSION_LOOP).render(context)
    made = "".join(_regression_rows(report["rows"], "mine"))
    assert made == written
    assert len(report["rows"]) == 324 and made.count('class="failing-execution"') == 432

    written = engine.from_string(IMPROVEMENT_LOOP).render(context)
    assert "".join(_improvement_rows(report["improvements"])) == written


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


# The run table's loop as projects/overview.html#run-table had it (from {% for %} to
# {% endfor %}, the leading indentation dropped), before the run_table_row filter.
RUN_LOOP = """{% load keystone %}{% for run in runs %}
          <tr>
            <td><a href="{{ run.url }}">#{{ run.pk }}</a></td>
            {% if show_spec %}<td><a href="{{ run.spec_url }}">{{ run.spec.slug }}</a> <span class="muted small">v{{ run.spec_version.number }}</span></td>{% endif %}
            {# run-status and run-verdict below, written out: an include per row cost more than the row. run.url and run.spec_url: charts.link_run_rows, in the views that show this table. #}
            <td><span class="badge status-{{ run.status }}">{{ run.status }}{% if run.status == "running" %} {{ run.executions_done }}/{{ run.execution_count }}{% endif %}</span></td>
            <td>{% if run.gate_passed is None %}<span class="muted">—</span>{% elif run.gate_passed %}<span class="badge pass">gates pass</span>{% else %}<span class="badge fail">gates fail</span>{% endif %}{% if run.exit_code is not None %} <span class="muted small">exit {{ run.exit_code }}</span>{% endif %}</td>
            <td class="num">{{ run.composite|fixed:2|default:"—" }}</td>
            <td class="num">{{ run.resilience|fixed:1|default:"—" }}</td>
            <td class="num">{{ run.pass_rate|percent|default:"—" }}</td>
            <td class="num">{% if run.cost_usd is not None %}${{ run.cost_usd|fixed:4 }}{% else %}—{% endif %}</td>
            <td class="num">{% if run.p95_duration_ms is not None %}{{ run.p95_duration_ms|fixed:0 }} ms{% else %}—{% endif %}</td>
            <td>{{ run.branch|default:"—" }}</td>
            <td><time datetime="{{ run.created|iso }}" title="{{ run.created }}">{{ run.created|ago }}</time></td>
          </tr>
        {% endfor %}"""  # noqa: E501


@pytest.mark.django_db
def test_the_run_table_rows_are_what_the_template_wrote(
    two_projects: Any, make_spec: Any, make_run: Any
) -> None:
    version = make_spec(two_projects.mine)
    now = timezone.now()
    kinds = itertools.product(
        [("completed", True, 0), ("completed", False, 1), ("running", None, None)],
        [(None, None, None, None), (0.5, 0.0123, 1234.5, 2.5)],
        ["", "feature/<x>&y"],
        [now, now - timedelta(days=3, hours=2)],
    )
    runs = []
    for (status, gates, exit_code), (composite, cost, p95, resilience), branch, at in kinds:
        run = make_run(version, branch=branch, created=at, executions_done=3)
        Run.objects.filter(pk=run.pk).update(
            status=status, gate_passed=gates, exit_code=exit_code, composite=composite,
            cost_usd=cost, p95_duration_ms=p95, resilience=resilience,
            pass_rate=None if composite is None else 0.955,
        )  # fmt: skip
        runs.append(run)
    runs = list(
        Run.objects.filter(pk__in=[run.pk for run in runs])
        .select_related("spec", "spec_version")
        .order_by("id")
    )
    charts.link_run_rows(runs, two_projects.mine.slug)
    template = engines["django"].from_string(RUN_LOOP)

    for show_spec in (True, False):
        written = template.render({"runs": runs, "show_spec": show_spec})
        made = "".join(run_table_row(run, show_spec) for run in runs)
        assert made == written
    assert len(runs) == 24 and "just now" in made and "3\xa0days, 2\xa0hours ago" in made


# The review queue's loop as review/queue.html had it, before views/review.py made its rows.
QUEUE_LOOP = """{% load keystone %}{% for it in items %}
              <tr>
                <td><a href="{{ it.url }}{{ filter_query }}">#{{ it.pk }}</a></td>
                <td>{{ it.get_reason_display }}</td>
                <td>{{ it.spec.slug }}</td>
                <td>#{{ it.run_id }}</td>
                <td><span class="mono">{{ it.invariant_id }}</span> <span class="muted small">{{ it.criteria|truncatechars:80 }}</span></td>
                <td class="num">{% if it.blind and it.status == "open" %}<span class="muted">blind</span>{% elif it.judge_score is not None %}{{ it.judge_score|fixed:2 }} <span class="badge {% if it.judge_passed %}pass{% else %}fail{% endif %}">{% if it.judge_passed %}pass{% else %}fail{% endif %}</span>{% else %}—{% endif %}</td>
                {% if status == "complete" %}<td class="num">{{ it.final_score|fixed:2 }} <span class="badge {% if it.final_passed %}pass{% else %}fail{% endif %}">{% if it.final_passed %}pass{% else %}fail{% endif %}</span></td>{% endif %}
                <td class="num">{{ it.verdict_count }}/{{ it.reviews_required }}</td>
                <td>{% if it.claim_is_live %}{{ it.claimed_by.get_username }}{% else %}<span class="muted">—</span>{% endif %}</td>
                <td class="small">{{ it.created|local_minute }}</td>
              </tr>
            {% endfor %}"""  # noqa: E501


def test_the_review_queue_rows_are_what_the_template_wrote() -> None:
    now = timezone.now()
    reviewer = get_user_model()(pk=7, username="r<v>")
    kinds = itertools.product(
        ["open", "adjudication", "complete"],
        [False, True],  # blind
        [None, 0.0, 0.456],  # the judge's score
        [None, now + timedelta(hours=1), now - timedelta(hours=1)],  # claim expiry
        ["Is the answer polite?", "x" * 79 + "<&>" * 5],
    )
    items = []
    for n, (status, blind, score, expires, criteria) in enumerate(kinds):
        item = ReviewItem(
            pk=n + 1,
            run_id=1000 + n,
            spec=Spec(slug="refund-agent" if n % 2 else "a_b"),
            status=status,
            reason=["all", "borderline", "manual"][n % 3],
            blind=blind,
            judge_score=score,
            judge_passed=bool(score),
            final_score=None if n % 4 == 0 else 0.75,
            final_passed=n % 3 == 0,
            invariant_id="is_polite" if n % 2 else "cites<src>",
            criteria=criteria,
            reviews_required=1 + n % 2,
            claimed_by=reviewer if expires else None,
            claim_expires=expires,
            created=now - timedelta(minutes=n),
        )
        item.url, item.verdict_count = f"/p/mine/review/{item.pk}/", n % 3
        items.append(item)
    template = engines["django"].from_string(QUEUE_LOOP)

    for status, query in (("open", ""), ("complete", "?spec=a&criteria=b")):
        context = {"items": items, "status": status, "filter_query": query}
        made = "".join(_queue_rows(items, status=status, filter_query=query))
        assert made == template.render(context)
    assert len(items) == 108 and made.count("blind") == 18 and "r&lt;v&gt;" in made


# The trends page's run table loop as specs/trends.html had it.
TRENDS_LOOP = """{% load keystone %}{% for row in rows %}
                <tr>
                  <td><a href="{{ row.url }}">#{{ row.id }}</a></td>
                  <td>v{{ row.spec_version__number }}</td>
                  <td>{{ row.branch|default:"—" }}</td>
                  <td><time datetime="{{ row.created|iso }}">{{ row.created|local_minute }}</time></td>
                  <td class="num">{{ row.resilience|fixed:1|default:"—" }}</td>
                  <td class="num">{{ row.pass_rate|percent|default:"—" }}</td>
                  <td class="num">{{ row.judge_mean|fixed:2|default:"—" }}</td>
                  <td class="num">{% if row.cost_usd is not None %}${{ row.cost_usd|fixed:4 }}{% else %}—{% endif %}</td>
                  <td class="num">{% if row.p95_duration_ms is not None %}{{ row.p95_duration_ms|fixed:0 }} ms{% else %}—{% endif %}</td>
                </tr>
              {% endfor %}"""  # noqa: E501


def test_the_trends_run_rows_are_what_the_template_wrote() -> None:
    now = timezone.now()
    figures = itertools.product(
        [None, 0.0, 93.456], [None, 0.955], [None, 0.5], [None, 0.0123], [None, 1234.5]
    )
    rows = [
        {
            "id": 1000 + n,
            "url": f"/p/mine/runs/{1000 + n}/",
            "spec_version__number": 1 + n % 3,
            "branch": ["", "main", "feature/<x>&y"][n % 3],
            "created": now - timedelta(hours=n),
            "resilience": resilience,
            "pass_rate": pass_rate,
            "judge_mean": judge,
            "cost_usd": cost,
            "p95_duration_ms": p95,
        }
        for n, (resilience, pass_rate, judge, cost, p95) in enumerate(figures)
    ]
    written = engines["django"].from_string(TRENDS_LOOP).render({"rows": rows})
    assert "".join(_trend_table_row(row) for row in rows) == written
    assert len(rows) == 48 and "feature/&lt;x&gt;&amp;y" in written


# The run list's loop as runs/run_list.html had it.
RUN_LIST_LOOP = """{% load keystone %}{% for run in runs %}
              <tr data-run-id="{{ run.pk }}">
                <td><input type="checkbox" name="run" value="{{ run.pk }}" aria-label="Pick run #{{ run.pk }} to compare"></td>
                <td><a href="{{ run.url }}">#{{ run.pk }}</a></td>
                <td class="nowrap"><a href="{{ run.spec_url }}">{{ run.spec.slug }}</a></td>
                <td>v{{ run.spec_version.number }}</td>
                <td class="nowrap"><span class="badge status-{{ run.status }}">{{ run.status }}{% if run.status == "running" %} {{ run.executions_done }}/{{ run.execution_count }}{% endif %}</span></td>
                <td class="nowrap">{% if run.gate_passed is None %}<span class="muted">—</span>{% elif run.gate_passed %}<span class="badge pass">gates pass</span>{% else %}<span class="badge fail">gates fail</span>{% endif %}{% if run.exit_code is not None %} <span class="muted small">exit {{ run.exit_code }}</span>{% endif %}</td>
                <td class="num">{{ run.composite|fixed:3|default:"—" }}</td>
                <td class="num">{% if run.pass_rate is not None %}{{ run.pass_rate|percent }}{% else %}—{% endif %}</td>
                <td class="num">{{ run.resilience|fixed:1|default:"—" }}</td>
                <td class="num">{% if run.cost_usd is not None %}${{ run.cost_usd|fixed:4 }}{% else %}—{% endif %}</td>
                <td class="num">{% if run.p95_duration_ms is not None %}{{ run.p95_duration_ms|fixed:0 }} ms{% else %}—{% endif %}</td>
                <td class="small">
                  {% if run.branch %}<span class="mono">{{ run.branch }}</span>{% endif %}
                  {% for key, value in run.labels.items %}{% if key != "branch" and key != "git_sha" %}<span class="label-tag">{{ key }}={{ value }}</span> {% endif %}{% endfor %}
                </td>
                <td class="nowrap"><time datetime="{{ run.created|iso }}" title="{{ run.created|local_second }}">{{ run.created|local_minute }}</time></td>
              </tr>
            {% endfor %}"""  # noqa: E501


@pytest.mark.django_db
def test_the_run_list_rows_are_what_the_template_wrote(
    two_projects: Any, make_spec: Any, make_run: Any
) -> None:
    version = make_spec(two_projects.mine)
    kinds = itertools.product(
        [("completed", True, 0), ("failed", False, 4), ("running", None, None)],
        [(None, None, None, None), (0.5, 0.0123, 1234.5, 0.955)],
        [{}, {"branch": "main", "git_sha": "abc", "model": "gpt-<4>&o", "n": 3, "t": 0.5}],
    )
    made_runs = []
    for (status, gates, exit_code), (composite, cost, p95, rate), labels in kinds:
        run = make_run(version, labels=labels, executions_done=2)
        Run.objects.filter(pk=run.pk).update(
            status=status, gate_passed=gates, exit_code=exit_code, composite=composite,
            cost_usd=cost, p95_duration_ms=p95, pass_rate=rate,
        )  # fmt: skip
        made_runs.append(run.pk)
    runs = list(
        Run.objects.filter(pk__in=made_runs).select_related("spec", "spec_version").order_by("id")
    )
    charts.link_run_rows(runs, two_projects.mine.slug)

    written = engines["django"].from_string(RUN_LIST_LOOP).render({"runs": runs})
    assert "".join(_run_list_row(run) for run in runs) == written
    assert len(runs) == 12 and "model=gpt-&lt;4&gt;&amp;o" in written and "t=0.5" in written


@pytest.mark.parametrize("script_prefix", ["/", "/keystone/"])
def test_id_url_writes_what_the_url_tag_wrote(script_prefix: str) -> None:
    """{% id_url %} reverses a view once and puts each row's id in its path: the same text
    as {% url %} for every view a table links by id (one id or two), for ids of any length,
    and under a server mounted below a path prefix (the prefix is part of what is kept)."""
    from django.urls import get_script_prefix, set_script_prefix

    links = [
        ("api:execution_detail", []),  # the API's paths end without a slash
        ("api:artifact_download", [42]),
        ("run_detail", []),
        ("execution_detail", []),
        ("review_item", []),
        ("review_send", []),
        ("run_compare", []),
        ("run_compare_pair", [7]),
        ("artifact_download", [123456]),
    ]
    previous = get_script_prefix()
    set_script_prefix(script_prefix)
    try:
        for view, leading in links:
            for slug, pk in itertools.product(["mine", "team-0"], [0, 5, 90210]):
                context = {"view": view, "slug": slug, "ids": [*leading, pk]}
                args = " ".join(f"ids.{i}" for i in range(len(leading) + 1))
                by_url, by_id_url = (
                    engines["django"]
                    .from_string(f"{{% load keystone %}}{{% {tag} view slug {args} %}}")
                    .render(context)
                    for tag in ("url", "id_url")
                )
                assert by_id_url == by_url, (view, slug, pk)
                assert f"/{slug}/" in by_url and by_url.startswith(script_prefix)
    finally:
        set_script_prefix(previous)
