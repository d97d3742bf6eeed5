"""A reviewer grades the judge's verdicts with the keyboard only, and the run's scores follow."""

from __future__ import annotations

from typing import Any

import pytest

from evaluations import services
from evaluations.models import Membership, Project, ReviewItem, Role, Run

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Three prompts, one replica: three executions. The scripted judge scores every answer 0.4,
# under the 0.7 threshold of a gate invariant, so every execution fails and so does the run.
# `review: {all: true}` sends all three judge verdicts to people.
SPEC = """\
version: 1
id: polite-refunds
task:
  prompts: ["Refund order 1", "Refund order 2", "Refund order 3"]
agent: {type: command, command: "echo Your refund is on its way, thank you for waiting"}
sandbox: {backend: local}
judge: {provider: scripted, model: judge-small, rules: [{score: 0.4, reason: "too curt"}]}
invariants:
  polite:
    description: "The answer is polite and confirms the refund"
    gate: true
    check:
      type: llm_as_judge
      criteria: "Is the answer polite and does it confirm the refund?"
      rubric: {pass: "Polite and confirms the refund", fail: "Rude or silent about it"}
      pass_threshold: 0.7
  mentions_refund:
    description: "Mentions the refund"
    check: {type: contains, value: refund}
review: {all: true, reviewers_per_item: 1, blind: true}
"""


def test_reviewer_grades_three_items_by_keyboard_and_the_run_passes(
    browse: Any, django_user_model: Any
) -> None:
    project = Project.objects.create(name="Support", slug="support")
    reviewer = django_user_model.objects.create_user(username="rita", password="pw-rita-123")
    Membership.objects.create(project=project, user=reviewer, role=Role.REVIEWER)
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(spec_version=version)  # no broker: planned and run right here
    run.refresh_from_db()
    assert run.status == "completed" and run.execution_count == 3
    assert run.gate_passed is False and run.exit_code == 1 and run.composite == 0.0
    assert ReviewItem.objects.filter(run=run, status="open").count() == 3

    page = browse.page
    browse.login("rita", "pw-rita-123")
    page.goto(f"{browse.base_url}/p/support/review/")
    browse.screenshot("review-queue")
    # Keyboard only from here: focus the "Start reviewing" button by tabbing, Enter on it.
    start = page.get_by_role("button", name="Start reviewing")
    for _ in range(40):
        if start.evaluate("button => button === document.activeElement"):
            break
        page.keyboard.press("Tab")
    else:
        pytest.fail("Tab never reached the 'Start reviewing' button")
    page.keyboard.press("Enter")

    for graded in range(1, 4):
        page.wait_for_selector("#review-form")
        # Blind queue: the judge's verdict is hidden before the reviewer answers.
        assert page.locator("[data-testid=judge-hidden]").is_visible()
        assert page.locator("[data-testid=judge-score]").count() == 0
        if graded == 1:
            browse.screenshot("review-item")
        page.keyboard.press("p")
        assert page.locator('input[name="verdict"][value="pass"]').is_checked()
        assert page.input_value("#review-score") == "1"
        item_url = page.get_attribute("#review-form", "action")
        page.keyboard.press("Enter")
        # htmx swaps the next item in (or the end of the queue): wait for the form to change.
        page.wait_for_function(
            "url => { const f = document.getElementById('review-form');"
            " return !f || f.getAttribute('action') !== url; }",
            arg=item_url,
        )
        done = ReviewItem.objects.filter(run=run, status="complete").count()
        assert done == graded, f"after {graded} grades, {done} items are complete"

    run.refresh_from_db()
    # Every judge verdict is now a human pass with score 1.0: every execution scores 1.0
    # and the gate invariant passes, so the run's verdict flips.
    assert run.composite == 1.0
    assert run.gate_passed is True and run.exit_code == 0
    page.goto(f"{browse.base_url}/p/support/runs/{run.pk}/")
    assert "exit 0" in page.inner_text("body").lower() or "passed" in page.inner_text("body")
    assert Run.objects.get(pk=run.pk).summary["verdict"] == "pass"
