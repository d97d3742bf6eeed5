"""The execution page and the review queue: reviewers send any engine or judge result to the
queue from the page (htmx swaps the form for a link to the item), results already queued say
"in review", and the human verdicts that replaced a result are listed with who, when, before
and after. Viewers see the states but get no form, and their POST is refused."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evaluations import services
from evaluations.models import CheckResult, Execution, ReviewItem, ReviewReason, Run
from tests.evaluations.review_world import add_check, add_execution, add_judge, make_run

from .conftest import ALL_ROLES

pytestmark = pytest.mark.django_db

SEND_BUTTON = re.compile(r'<button type="submit" class="secondary small">Send to review')


def page_url(execution: Execution, project: str = "mine") -> str:
    return reverse("execution_detail", args=[project, execution.pk])


def send_url(result: CheckResult, project: str = "mine") -> str:
    return reverse("review_send", args=[project, result.pk])


def results_section(html: str) -> str:
    start = html.index('id="results-title"')
    return html[start : html.index("</section>", start)]


def result_row(html: str, result: CheckResult) -> str:
    """The results table row holding this result's send URL or its review-item link."""
    rows = re.findall(r"<tr class=\"[^\"]*\">.*?</tr>", results_section(html), re.S)
    matching = [row for row in rows if f"/results/{result.pk}/" in row]
    assert len(matching) == 1, rows
    return matching[0]


def make_execution(project: Any) -> tuple[Run, Execution, CheckResult, CheckResult]:
    """A completed run with one execution: a judge result (failing) and an engine result."""
    run = make_run(project)
    execution = add_execution(run, 0)
    judge = add_judge(execution, score=0.4)
    engine = add_check(execution, passed=True)
    return services.run_finalize(run_id=run.pk), execution, judge, engine


@pytest.fixture
def world(two_projects: Any) -> tuple[Run, Execution, CheckResult, CheckResult]:
    return make_execution(two_projects.mine)


def test_reviewer_sees_a_send_button_per_judged_result_and_sending_queues_it(
    world: Any, client_as: Callable[..., Client]
) -> None:
    run, execution, judge, engine = world
    client = client_as("reviewer")

    before = client.get(page_url(execution)).content.decode()
    response = client.post(send_url(judge), HTTP_HX_REQUEST="true")
    after = client.get(page_url(execution)).content.decode()

    # Only the judge's result offers it: the engine's `contains` is a fact a person would
    # only repeat (issue 17).
    assert len(SEND_BUTTON.findall(results_section(before))) == 1
    assert f'action="{send_url(engine)}"' not in before
    form = result_row(before, judge)
    assert f'hx-post="{send_url(judge)}" hx-target="this" hx-swap="outerHTML"' in form
    assert f'action="{send_url(judge)}"' in form and "csrfmiddlewaretoken" in form
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<span class="review-sent"')
    item = ReviewItem.objects.get(check_result=judge)
    assert item.reason == ReviewReason.MANUAL and item.sent_by.username.startswith("reviewer")
    assert item.run_id == run.pk and item.judge_score == 0.4 and item.judge_model
    assert f'href="{reverse("review_item", args=["mine", item.pk])}"' in body
    # The queued result now says so (for every member), with no form any more.
    assert len(SEND_BUTTON.findall(results_section(after))) == 0
    assert f"/results/{judge.pk}/" not in results_section(after)
    assert f'in review: <a href="/p/mine/review/{item.pk}/">item #{item.pk}</a> (open)' in after


def test_sending_without_htmx_redirects_back_to_the_execution(
    world: Any, client_as: Callable[..., Client]
) -> None:
    _, execution, _, engine = world

    response = client_as("editor").post(send_url(engine), follow=True)

    assert response.redirect_chain == [(page_url(execution), 302)]
    html = response.content.decode()
    assert "no_insult sent to the review queue" in html
    item = ReviewItem.objects.get(check_result=engine)
    assert f'in review: <a href="/p/mine/review/{item.pk}/">' in html


def test_viewer_sees_no_button_and_cannot_send(
    world: Any, client_as: Callable[..., Client], member: Callable[..., Any]
) -> None:
    _, execution, judge, engine = world
    item = services.review_send(result_id=engine.pk, user=member("reviewer"))
    client = client_as("viewer")

    html = client.get(page_url(execution)).content.decode()
    plain = client.post(send_url(judge))
    fragment = client.post(send_url(judge), HTTP_HX_REQUEST="true")

    assert "Send to review" not in html
    assert f'in review: <a href="/p/mine/review/{item.pk}/">item #{item.pk}</a>' in html
    assert (plain.status_code, fragment.status_code) == (403, 403)
    assert not ReviewItem.objects.filter(check_result=judge).exists()


@pytest.mark.parametrize("role", ALL_ROLES)
def test_who_may_send_a_result_to_review(
    world: Any, client_as: Callable[..., Client], role: str
) -> None:
    _, execution, judge, _ = world
    client = client_as(role)

    page = client.get(page_url(execution))
    fragment = client.get(page_url(execution), HTTP_HX_REQUEST="true")
    sent = client.post(send_url(judge), HTTP_HX_REQUEST="true")

    if role == "outsider":
        assert [page.status_code, fragment.status_code, sent.status_code] == [404, 404, 404]
        assert not ReviewItem.objects.exists()
        return
    may_review = role != "viewer"
    assert page.status_code == fragment.status_code == 200
    assert fragment.content.decode().lstrip().startswith('<div id="execution-body">')
    for response in (page, fragment):
        assert bool(SEND_BUTTON.search(response.content.decode())) == may_review
    assert sent.status_code == (200 if may_review else 403)
    assert ReviewItem.objects.filter(check_result=judge).exists() == may_review


def test_another_projects_result_cannot_be_sent_under_this_slug(
    world: Any, two_projects: Any, client_as: Callable[..., Client]
) -> None:
    _, _, foreign_judge, _ = make_execution(two_projects.other)

    response = client_as("admin").post(send_url(foreign_judge))

    assert response.status_code == 404
    assert not ReviewItem.objects.exists()


def test_overrides_by_people_are_listed_with_who_when_before_and_after(
    world: Any, client_as: Callable[..., Client], member: Callable[..., Any]
) -> None:
    _, execution, judge, _ = world
    reviewer = member("reviewer")
    item = services.review_send(result_id=judge.pk, user=reviewer)
    services.review_claim(item_id=item.pk, user=reviewer)
    services.review_submit(item_id=item.pk, user=reviewer, passed=True, score=1.0, note="fine")
    execution.refresh_from_db()

    html = client_as("viewer").get(page_url(execution)).content.decode()

    start = html.index('id="changes-title"')
    changes = html[start : html.index("</section>", start)]
    rows = re.findall(r"<tr>\s*<td class=\"nowrap\">.*?</tr>", changes, re.S)
    assert len(rows) == 1
    row = rows[0]
    assert reviewer.username in row and '<td class="mono">polite</td>' in row
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT', row)
    before, after = re.findall(r'<td class="small">(.*?)</td>', row, re.S)
    assert 'badge fail">fail' in before and "0.40" in before and "source-judge" in before
    assert 'badge pass">pass' in after and "1.00" in after and "source-human" in after
    # The execution had no composite of its own (rows made here); now it is rescored.
    assert execution.composite == 1.0 and "— → 1.000" in row
    assert f'href="/p/mine/review/{item.pk}/">item #{item.pk}' in row
    # The human row has no send button; the judge row it overrides may be sent again.
    results = results_section(html)
    human = CheckResult.objects.get(execution=execution, source="human")
    assert f"/results/{human.pk}/" not in results
    assert "in review" not in results  # the item is complete
    reviewer_page = client_as("reviewer").get(page_url(execution)).content.decode()
    assert f'action="{send_url(judge)}"' in result_row(reviewer_page, judge)


def test_execution_without_changes_has_no_changes_section(
    world: Any, client_as: Callable[..., Client]
) -> None:
    _, execution, _, _ = world
    assert 'id="changes-title"' not in client_as("viewer").get(page_url(execution)).content.decode()


def test_review_state_and_history_add_a_constant_number_of_queries(
    two_projects: Any, client_as: Callable[..., Client], member: Callable[..., Any]
) -> None:
    client = client_as("reviewer")
    reviewer = member("reviewer")

    def count(execution: Execution) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(page_url(execution)).status_code == 200
        return len(queries)

    _, quiet, _, _ = make_execution(two_projects.mine)
    run, busy, judge, engine = make_execution(two_projects.mine)
    for invariant in ("a", "b", "c"):
        extra = add_check(busy, passed=False, invariant_id=invariant)
        services.review_send(result_id=extra.pk, user=reviewer)
    item = services.review_send(result_id=judge.pk, user=reviewer)
    services.review_claim(item_id=item.pk, user=reviewer)
    services.review_submit(item_id=item.pk, user=reviewer, passed=True, score=1.0)
    services.review_send(result_id=engine.pk, user=reviewer)

    assert count(busy) == count(quiet)
