"""The compare page in a real browser (issue 14): a viewer ticks two runs in the runs list,
opens the comparison, sees the regression, opens a changed execution and sees both outputs
diffed word by word and the two tool-call sequences."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evaluations.models import Membership, Project, Role, Run
from evaluations.selectors.compare import EXECUTION_PAIRS_PAGE
from tests.evaluations.execution_helpers import run_spec

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SPEC = """\
version: 1
id: refunder
task: {prompt: "Refund order 1042"}
agent: {type: command, command: "echo %s"}
sandbox: {backend: local}
invariants:
  says_refunded:
    description: mentions the refund
    check: {type: contains, value: refunded}
replicas: 3
"""


def two_runs_seen_by_a_viewer(
    browse: Any, django_user_model: Any, tmp_path: Path, replicas: int = 3
) -> tuple[Run, Run]:
    """Two runs of SPEC, every replica's answer changed from the first to the second, and a
    viewer of their project signed in."""
    project = Project.objects.create(name="Agents", slug="agents")
    viewer = django_user_model.objects.create_user(username="vera", password="pw-vera-123")
    Membership.objects.create(project=project, user=viewer, role=Role.VIEWER)
    spec = SPEC.replace("replicas: 3", f"replicas: {replicas}")
    good = run_spec(project, spec % "Order 1042 refunded today", spec_dir=tmp_path)
    worse = run_spec(project, spec % "Order 1042 declined today", spec_dir=tmp_path)
    browse.login("vera", "pw-vera-123")
    return good, worse


def test_pick_two_runs_open_compare_and_a_changed_cell(
    browse: Any, django_user_model: Any, tmp_path: Path
) -> None:
    good, worse = two_runs_seen_by_a_viewer(browse, django_user_model, tmp_path)
    page = browse.page

    page.goto(f"{browse.base_url}/p/agents/runs/")
    page.check(f"input[name=run][value='{good.pk}']")
    page.check(f"input[name=run][value='{worse.pk}']")
    page.click("#compare-selected")

    page.wait_for_url(f"**/runs/{worse.pk}/compare/?against={good.pk}")
    assert "Regressed" in page.inner_text("#compare-verdict")
    pairs = page.locator("details.execution-pair")
    assert pairs.count() == 3  # every replica changed its answer
    first = pairs.first
    assert first.locator("pre.word-diff").count() == 0  # loaded when the pair is opened
    first.locator("summary").click()
    diff = first.locator("pre.word-diff")
    diff.wait_for(state="visible")
    assert diff.locator("del").all_inner_texts() == ["refunded"]
    assert diff.locator("ins").all_inner_texts() == ["declined"]
    assert diff.inner_text().strip() == "Order 1042 refundeddeclined today"
    assert first.locator("ol.tools-before li").all_inner_texts() == ["none"]
    browse.screenshot("compare-diff")
    # Closing and opening it again does not load it a second time.
    first.locator("summary").click()
    first.locator("summary").click()
    assert first.locator("pre.word-diff").count() == 1

    # Ticking one run is refused with a message, back on the list.
    page.goto(f"{browse.base_url}/p/agents/runs/")
    page.check(f"input[name=run][value='{good.pk}']")
    page.click("#compare-selected")
    page.wait_for_url("**/p/agents/runs/")
    assert "Tick exactly two runs of this project to compare (1 ticked)." in page.content()


def test_more_executions_appends_the_next_page_and_its_pairs_open(
    browse: Any, django_user_model: Any, tmp_path: Path
) -> None:
    good, worse = two_runs_seen_by_a_viewer(
        browse, django_user_model, tmp_path, replicas=EXECUTION_PAIRS_PAGE + 2
    )
    page = browse.page
    page.goto(f"{browse.base_url}/p/agents/runs/{worse.pk}/compare/?against={good.pk}")
    pairs = page.locator("details.execution-pair")
    assert pairs.count() == EXECUTION_PAIRS_PAGE
    assert f"{EXECUTION_PAIRS_PAGE + 2} executions of run #{worse.pk} differ" in page.inner_text(
        "#pairs-count"
    )
    page.click("text=More executions")
    page.wait_for_function(
        f"document.querySelectorAll('details.execution-pair').length == {EXECUTION_PAIRS_PAGE + 2}"
    )
    assert page.locator("text=More executions").count() == 0
    assert page.url.endswith(f"/compare/?against={good.pk}")  # htmx: the page stayed
    last = pairs.last
    assert "replica " + str(EXECUTION_PAIRS_PAGE + 1) in last.locator("summary").inner_text()
    last.locator("summary").click()
    last.locator("pre.word-diff").wait_for(state="visible")
    assert last.locator("pre.word-diff ins").all_inner_texts() == ["declined"]
