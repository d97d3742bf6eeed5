"""The trends page's pass rate per invariant in a real browser (issue 18): the page sends
the runs' times, links and tooltips once for all the lines (the figure's "shared"), and
charts.js gives them to every line, so each line's points still show the run in their
tooltip and open it when clicked."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from evaluations.models import Membership, Project, Role
from tests.evaluations.views.run_data import synthetic_run, synthetic_version

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Where a point of a drawn chart is on the page: its line's calculated coordinate,
# through the axes, plus the plot area's offset and the chart's place.
POINT_ON_PAGE = """([chartId, line, index]) => {
  const chart = document.querySelector(`[data-chart="${chartId}"]`);
  const layout = chart._fullLayout;
  const point = chart.calcdata[line][index];
  const box = chart.getBoundingClientRect();
  return [
    box.left + layout._size.l + layout.xaxis.c2p(point.x),
    box.top + layout._size.t + layout.yaxis.c2p(point.y),
  ];
}"""


def test_an_invariant_line_shows_its_runs_and_opens_them(
    browse: Any, django_user_model: Any
) -> None:
    project = Project.objects.create(name="Agents", slug="agents")
    version = synthetic_version(project)
    viewer = django_user_model.objects.create_user(username="vera", password="pw-vera-123")
    Membership.objects.create(project=project, user=viewer, role=Role.VIEWER)
    # `cites` fails in half the first run's results, in none of the second's.
    first = synthetic_run(version, labels={"branch": "main"}, branch="main")
    synthetic_run(
        version, failing_scenario="", flaky_scenario="", labels={"branch": "main"}, branch="main"
    )
    page = browse.page

    browse.login("vera", "pw-vera-123")
    page.goto(f"{browse.base_url}/p/{project.slug}/specs/{version.spec.slug}/trends/")
    page.locator('[data-chart="trend-invariants"].chart-drawn .hoverlayer').wait_for(
        state="attached"
    )
    lines = page.evaluate(
        """() => document.querySelector('[data-chart="trend-invariants"]').data.map(
             (line) => [line.name, line.x.length, line.customdata.length, line.y])"""
    )
    assert lines == [
        ["answers", 2, 2, [1, 1]],
        ["cites", 2, 2, [0.5, 1]],
        ["polite", 2, 2, [1, 1]],
    ]

    page.locator('[data-chart="trend-invariants"]').scroll_into_view_if_needed()
    x, y = page.evaluate(POINT_ON_PAGE, ["trend-invariants", 1, 0])  # cites, first run
    page.mouse.move(x, y)
    tooltip = page.locator('[data-chart="trend-invariants"] .hoverlayer .hovertext')
    tooltip.wait_for()
    when = timezone.localtime(first.created).strftime("%Y-%m-%d %H:%M")
    text = tooltip.text_content() or ""
    assert f"Run #{first.pk} · cites · v1 · main · {when}" in text
    assert "50%" in text

    page.mouse.click(x, y)
    page.wait_for_url(f"**/runs/{first.pk}/")
