"""The review pages: queue, item (grading with and without htmx), agreement, send to review,
for every role. Rows come from the real services on PostgreSQL."""

from __future__ import annotations

import csv as csv_module
import html
import io
import json
import re
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import plotly.graph_objects as go
import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evaluations import services
from evaluations.models import (
    CheckResult,
    Project,
    ReviewItem,
    ReviewStatus,
    ReviewVerdict,
    Run,
)
from evaluations.views.review import GRADE_COLUMNS
from tests.evaluations.review_world import add_check, add_execution, add_judge, make_run

pytestmark = pytest.mark.django_db

REASONING = "Polite, and it confirms refund 1042."


def url(name: str, *args: Any, query: str = "") -> str:
    return reverse(name, args=["mine", *args]) + query


def make_world(
    project: Project, *, blind: bool = False, scores: tuple[float, ...] = (0.3, 0.9, 0.65)
) -> Run:
    """A completed run of `project` whose judge results are all queued."""
    run = make_run(project, review={"all": True, "blind": blind})
    for index, score in enumerate(scores):
        execution = add_execution(run, index)
        add_judge(execution, score=score, reasoning=f"{REASONING} ({index})")
        add_check(execution, passed=True)
    return services.run_finalize(run_id=run.pk)


@pytest.fixture
def world(two_projects: Any) -> Run:
    return make_world(two_projects.mine)


def items(run: Run) -> list[ReviewItem]:
    return list(ReviewItem.objects.filter(run=run).order_by("id"))


def login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- Roles ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "status"),
    [("viewer", 200), ("reviewer", 200), ("editor", 200), ("admin", 200), ("outsider", 404)],
)
def test_queue_item_and_agreement_pages_by_role(
    world: Run, client_as: Callable[..., Client], role: str, status: int
) -> None:
    client = client_as(role)
    item = items(world)[0]
    assert client.get(url("review_queue")).status_code == status
    assert client.get(url("review_item", item.pk)).status_code == status
    assert client.get(url("review_agreement")).status_code == status


def test_anonymous_people_are_sent_to_log_in(world: Run) -> None:
    response = Client().get(url("review_queue"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("outsider", 404)])
def test_viewers_and_outsiders_cannot_claim_grade_or_send(
    world: Run, client_as: Callable[..., Client], role: str, status: int
) -> None:
    client = client_as(role)
    item = items(world)[0]
    assert client.post(url("review_queue")).status_code == status
    for action in ("claim", "grade", "skip", "adjudicate"):
        response = client.post(url("review_item", item.pk), {"action": action, "verdict": "pass"})
        assert response.status_code == status, action
    result = item.check_result
    assert client.post(url("review_send", result.pk)).status_code == status
    assert not ReviewVerdict.objects.exists()
    item.refresh_from_db()
    assert item.claimed_by is None and ReviewItem.objects.count() == 3


def test_items_of_another_project_are_not_found(
    two_projects: Any, world: Run, client_as: Callable[..., Client]
) -> None:
    theirs = make_world(two_projects.other, scores=(0.5,))
    client = client_as("admin")
    other_item = items(theirs)[0]
    page = client.get(url("review_item", other_item.pk))
    assert page.status_code == 404
    assert page.context["exception"] == "No such review item in this project."
    assert client.post(url("review_item", other_item.pk), {"verdict": "pass"}).status_code == 404
    sent = client.post(url("review_send", other_item.check_result_id))
    assert sent.status_code == 404
    assert sent.context["exception"] == "No such check result in this project."


def test_an_item_is_read_without_its_runs_summary_by_the_page_and_the_api(
    two_projects: Any, world: Run, member: Callable[..., Any]
) -> None:
    """An item's page and the API's item show its run's spec version, not the run's
    summary (~0.5 kB of JSON an execution: megabytes for a large run) or verdicts; the API
    read them all."""
    item = items(world)[0]
    admin = member("admin")
    _, token = services.token_issue(project=two_projects.mine, user=admin, name="ci")
    browser = Client()
    browser.force_login(admin)
    requests = {
        "page": lambda: browser.get(url("review_item", item.pk)),
        "API": lambda: Client().get(
            reverse("api:review_item", args=[two_projects.mine.slug, item.pk]),
            headers={"Authorization": f"Bearer {token}"},
        ),
    }
    large = ['"evaluations_run"."summary"', '"evaluations_run"."verdicts"']
    for name, request in requests.items():
        with CaptureQueriesContext(connection) as queries:
            response = request()
        assert response.status_code == 200, name
        assert item.invariant_id in response.content.decode(), name
        read = " ".join(q["sql"] for q in queries.captured_queries)
        assert '"evaluations_reviewitem"' in read, name
        assert [column for column in large if column in read] == [], name


# --- The queue ------------------------------------------------------------------------------


def test_queue_lists_items_counts_and_filters(
    two_projects: Any, world: Run, client_as: Callable[..., Client]
) -> None:
    second = make_run(two_projects.mine, spec_id="second-spec", review={"all": True})
    add_judge(add_execution(second, 0), score=0.5)
    services.run_finalize(run_id=second.pk)
    client = client_as("viewer")

    page = client.get(url("review_queue")).content.decode()
    assert re.search(r'data-count="open">4<', page)
    assert page.count('href="/p/mine/review/') >= 4 + 1  # four items and the agreement link

    filtered = client.get(url("review_queue", query=f"?run={second.pk}")).content.decode()
    assert re.search(r'data-count="open">1<', filtered)
    assert f"/review/{items(second)[0].pk}/" in filtered
    assert f"/review/{items(world)[0].pk}/" not in filtered
    by_spec = client.get(url("review_queue", query="?spec=review-demo")).content.decode()
    assert re.search(r'data-count="open">3<', by_spec)
    by_criteria = client.get(url("review_queue", query="?criteria=polite")).content.decode()
    assert re.search(r'data-count="open">4<', by_criteria)
    assert "Grading needs the reviewer role" in page

    region = client.get(url("review_queue", query="?run=999999"), HTTP_HX_REQUEST="true")
    body = region.content.decode()
    assert body.lstrip().startswith('<div id="queue-region">') and "<html" not in body
    assert re.search(r'data-count="open">0<', body)


def test_start_reviewing_claims_the_oldest_open_item(
    world: Run, member: Callable[..., Any]
) -> None:
    reviewer = member("reviewer")
    response = login(reviewer).post(url("review_queue"), {"run": str(world.pk)})
    first = items(world)[0]
    assert response.status_code == 302
    assert response["Location"] == url("review_item", first.pk, query=f"?run={world.pk}")
    first.refresh_from_db()
    assert first.claimed_by == reviewer


# --- Grading ----------------------------------------------------------------------------------


def test_a_reviewer_grades_without_javascript(world: Run, member: Callable[..., Any]) -> None:
    reviewer = member("reviewer")
    client = login(reviewer)
    first, second, _ = items(world)
    # An item nobody holds is claimed by its button, then graded by a plain form POST.
    page = client.get(url("review_item", first.pk)).content.decode()
    assert 'value="claim"' in page and 'id="review-form"' not in page
    claimed = client.post(url("review_item", first.pk), {"action": "claim"})
    assert claimed.status_code == 302
    page = client.get(url("review_item", first.pk)).content.decode()
    assert 'id="review-form"' in page
    # The shortcuts are on the page.
    for key in ("<kbd>p</kbd>", "<kbd>f</kbd>", "<kbd>0</kbd>", "<kbd>n</kbd>", "<kbd>Enter</kbd>"):
        assert key in page

    response = client.post(
        url("review_item", first.pk), {"verdict": "pass", "score": "0.9", "note": "fine"}
    )
    assert response.status_code == 302
    assert response["Location"] == url("review_item", second.pk, query=f"?previous={first.pk}")
    next_page = client.get(response["Location"]).content.decode()
    assert f"Item #{first.pk} graded" in next_page and "(0)" in next_page  # judge revealed
    assert 'id="review-form"' in next_page  # the next item is already claimed
    human = CheckResult.objects.get(execution=first.execution, source="human")
    assert (human.score, human.passed) == (0.9, True)


def test_htmx_grading_swaps_in_the_next_item(world: Run, member: Callable[..., Any]) -> None:
    reviewer = member("reviewer")
    client = login(reviewer)
    first, second, third = items(world)
    services.review_claim(item_id=first.pk, user=reviewer)
    response = client.post(
        url("review_item", first.pk),
        {"verdict": "fail", "score": "", "note": "", "run": str(world.pk)},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="review-item"') and "<html" not in body
    assert f"Review item #{second.pk}" in body and 'id="review-form"' in body
    assert f"Item #{first.pk} graded" in body
    assert response["HX-Push-Url"] == url(
        "review_item", second.pk, query=f"?run={world.pk}&previous={first.pk}"
    )
    verdict = ReviewVerdict.objects.get(item=first)
    assert (verdict.passed, verdict.score) == (False, 0.0)  # an empty score follows the verdict

    # Skipping gives the item back and moves on.
    skipped = client.post(url("review_item", second.pk), {"action": "skip"}, HTTP_HX_REQUEST="true")
    assert f"Review item #{third.pk}" in skipped.content.decode()
    second.refresh_from_db()
    assert second.claimed_by is None

    # After the third, the skipped one comes back; after it, nothing is left.
    back = client.post(url("review_item", third.pk), {"verdict": "pass"}, HTTP_HX_REQUEST="true")
    assert f"Review item #{second.pk}" in back.content.decode()
    last = client.post(url("review_item", second.pk), {"verdict": "pass"}, HTTP_HX_REQUEST="true")
    assert "Nothing left to grade" in last.content.decode()
    assert last["HX-Push-Url"] == url("review_queue")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"verdict": "pass", "score": "1.7"}, "score: must be between 0 and 1"),
        ({"verdict": "pass", "score": "abc"}, "score: &#x27;abc&#x27; is not a number"),
        ({"score": "0.5"}, "passed: choose pass or fail"),
    ],
)
def test_bad_grades_are_refused_with_the_field_named(
    world: Run, member: Callable[..., Any], data: dict[str, str], message: str
) -> None:
    reviewer = member("reviewer")
    client = login(reviewer)
    first = items(world)[0]
    services.review_claim(item_id=first.pk, user=reviewer)
    plain = client.post(url("review_item", first.pk), data)
    assert plain.status_code == 400 and message in plain.content.decode()
    swapped = client.post(url("review_item", first.pk), data, HTTP_HX_REQUEST="true")
    assert swapped.status_code == 200 and message in swapped.content.decode()
    assert 'id="review-form"' in swapped.content.decode()  # still gradable, values kept
    assert not ReviewVerdict.objects.exists()


def test_an_item_held_by_someone_else_cannot_be_graded(
    world: Run, member: Callable[..., Any]
) -> None:
    holder, other = member("reviewer"), member("reviewer")
    first = items(world)[0]
    services.review_claim(item_id=first.pk, user=holder)
    client = login(other)
    page = client.get(url("review_item", first.pk)).content.decode()
    assert f"Being graded by {holder.username}" in page and 'id="review-form"' not in page
    response = client.post(url("review_item", first.pk), {"verdict": "pass"})
    assert response.status_code == 409
    assert f"being graded by {holder.username}" in response.content.decode()
    assert not ReviewVerdict.objects.exists()


def test_blind_items_hide_the_judge_until_the_reviewer_answered(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run = make_world(two_projects.mine, blind=True, scores=(0.3, 0.9))
    reviewer = member("reviewer")
    client = login(reviewer)
    first = items(run)[0]
    services.review_claim(item_id=first.pk, user=reviewer)

    queue = client.get(url("review_queue")).content.decode()
    assert "blind" in queue and "0.30" not in queue
    page = client.get(url("review_item", first.pk)).content.decode()
    assert 'data-testid="judge-hidden"' in page
    assert REASONING not in page and 'data-testid="judge-score"' not in page
    # The judged input and the criteria are shown.
    assert "Your refund for order 1042 is on its way." in page
    assert "Is the answer polite" in page and "Polite and confirms the refund" in page

    response = client.post(url("review_item", first.pk), {"verdict": "pass"})
    revealed = client.get(response["Location"]).content.decode()
    assert f"{REASONING} (0)" in revealed  # the judge on the item just graded
    assert f"{REASONING} (1)" not in revealed  # not on the next one, still blind
    after = client.get(url("review_item", first.pk)).content.decode()
    assert 'data-testid="judge-score"' in after and f"{REASONING} (0)" in after


def test_not_blind_items_show_the_judge_to_everyone(
    world: Run, client_as: Callable[..., Client]
) -> None:
    page = client_as("viewer").get(url("review_item", items(world)[0].pk)).content.decode()
    assert 'data-testid="judge-score"' in page and f"{REASONING} (0)" in page
    assert 'id="review-form"' not in page and 'value="claim"' not in page


def test_the_transcript_shows_stored_tool_calls(
    world: Run, client_as: Callable[..., Client]
) -> None:
    from django.core.files.base import ContentFile

    from evaluations.models import Artifact

    first = items(world)[0]
    trace = {
        "llm_calls": [],
        "tool_calls": [
            {
                "name": "lookup_order",
                "arguments": {"order": 1042},
                "response": '{"status": "paid"}',
            },
            {"name": "refund", "arguments": {"order": 1042}, "response": "ok"},
        ],
    }
    artifact = Artifact(execution=first.execution, kind="trace", name="trace.json")
    artifact.file.save("trace.json", ContentFile(json.dumps(trace).encode()), save=True)
    page = client_as("viewer").get(url("review_item", first.pk)).content.decode()
    assert "Tool calls (2)" in page and "lookup_order" in page and "refund" in page


def test_blind_reviewers_see_the_whole_conversation_with_the_model(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    from django.core.files.base import ContentFile

    from evaluations.models import Artifact

    run = make_world(two_projects.mine, blind=True)
    first = items(run)[0]
    # The trace as the gateway stores it: each LLM call carries the history before it.
    history = [
        {"role": "system", "content": "You are a refunds agent. Be polite."},
        {"role": "user", "content": "Refund order 1042"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "function": {"name": "refund", "arguments": '{"order": 1042}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "refund 1042 accepted"},
    ]
    trace = {
        "llm_calls": [
            {"request": {"messages": history[:2]}, "response": {}},
            {
                "request": {"messages": history},
                "response": {"choices": [{"message": {"role": "assistant", "content": "Done!"}}]},
            },
        ],
        "tool_calls": [],
    }
    artifact = Artifact(execution=first.execution, kind="trace", name="trace.json")
    artifact.file.save("trace.json", ContentFile(json.dumps(trace).encode()), save=True)
    reviewer = member("reviewer")
    services.review_claim(item_id=first.pk, user=reviewer)
    page = login(reviewer).get(url("review_item", first.pk)).content.decode()

    assert 'data-testid="judge-hidden"' in page  # blind: the judge is hidden...
    conversation = page[page.index('data-testid="conversation"') :]
    conversation = conversation[: conversation.index("</details>")]
    # ...but not what the agent and its model said, system prompt included.
    assert "The whole conversation with the model (5 messages)" in conversation
    roles = re.findall(r'<span class="message-role">([^<]+)</span>', conversation)
    assert roles == ["system", "user", "assistant", "tool", "assistant (reply)"]
    assert "You are a refunds agent. Be polite." in conversation
    assert "asks refund(" in conversation and "refund 1042 accepted" in conversation
    assert "Done!" in conversation
    assert "Pass when" in page  # with the rubric


# --- Adjudication --------------------------------------------------------------------------------


def test_only_admins_adjudicate(two_projects: Any, member: Callable[..., Any]) -> None:
    run = make_run(two_projects.mine, review={"all": True, "reviewers_per_item": 2})
    add_judge(add_execution(run, 0), score=0.3)
    services.run_finalize(run_id=run.pk)
    item = items(run)[0]
    services.review_submit(item_id=item.pk, user=member("reviewer"), passed=True)
    services.review_submit(item_id=item.pk, user=member("reviewer"), passed=False)
    item.refresh_from_db()
    assert item.status == ReviewStatus.ADJUDICATION

    editor = login(member("editor"))
    refused = editor.post(url("review_item", item.pk), {"action": "adjudicate", "verdict": "pass"})
    assert refused.status_code == 403
    admin = login(member("admin"))
    page = admin.get(url("review_item", item.pk)).content.decode()
    assert 'value="adjudicate"' in page and "Grades" in page
    response = admin.post(
        url("review_item", item.pk), {"action": "adjudicate", "verdict": "pass", "score": "1"}
    )
    assert response.status_code == 302
    item.refresh_from_db()
    assert item.status == ReviewStatus.COMPLETE and item.final_passed is True
    assert Run.objects.get(pk=run.pk).exit_code == 0


# --- Agreement -----------------------------------------------------------------------------------


def test_the_agreement_page_shows_kappa_mae_agreement_and_a_trend(
    two_projects: Any, member: Callable[..., Any], client_as: Callable[..., Client]
) -> None:
    # Judge pass, pass, fail, fail, pass (0.9 / 0.2); people pass, fail, fail, fail, pass
    # (scores 1 / 0 by default). kappa = (0.8 - 0.48) / 0.52 = 0.615; agreement 4/5 = 80%;
    # MAE = (0.1 + 0.9 + 0.2 + 0.2 + 0.1) / 5 = 0.3.
    run = make_world(two_projects.mine, scores=(0.9, 0.9, 0.2, 0.2, 0.9))
    reviewer = member("reviewer")
    for item, passed in zip(items(run), [True, False, False, False, True], strict=True):
        services.review_submit(item_id=item.pk, user=reviewer, passed=passed)
    page = client_as("viewer").get(url("review_agreement")).content.decode()
    assert re.search(r'data-metric="kappa">0\.615<', page)
    assert re.search(r'data-metric="mae">0\.300<', page)
    assert re.search(r'data-metric="percent">80%<', page)
    assert re.search(r'data-metric="n">5<', page)
    assert "judge-model-a" in page and "pv-0001" in page
    assert "vendor/plotly.min.js" in page
    figure = json.loads(
        re.search(
            r'<script id="kappa-trend" type="application/json">(.*?)</script>', page, re.S
        ).group(1)
    )
    assert figure["data"][0]["y"] == [pytest.approx(0.32 / 0.52)]
    # One day of grades: the time axis reads in days around it (a day either side), not
    # one point at midnight with ticks in fractions of a second.
    [day] = figure["data"][0]["x"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", day)
    xaxis = figure["layout"]["xaxis"]
    assert xaxis["dtick"] == 86_400_000 and "%S" not in xaxis["tickformat"]
    low, high = (date.fromisoformat(v[:10]) for v in xaxis["range"])
    assert (low, high) == (
        date.fromisoformat(day) - timedelta(days=1),
        date.fromisoformat(day) + timedelta(days=1),
    )
    go.Figure(figure)  # still a valid Plotly figure


def test_the_agreement_page_without_reviews(world: Run, client_as: Callable[..., Client]) -> None:
    page = client_as("viewer").get(url("review_agreement")).content.decode()
    assert "No completed reviews of judge results yet." in page


# --- Send to review --------------------------------------------------------------------------


def test_send_a_result_to_review_from_the_execution_page(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run = make_run(two_projects.mine)
    execution = add_execution(run, 0)
    check = add_check(execution, passed=False)
    client = login(member("reviewer"))
    assert client.get(url("review_send", check.pk)).status_code == 405
    response = client.post(url("review_send", check.pk))
    assert response.status_code == 302
    assert response["Location"] == url("execution_detail", execution.pk)
    item = ReviewItem.objects.get(check_result=check)
    assert item.reason == "manual"
    # Back to where the form said, if it is on this site; htmx gets a fragment.
    back = client.post(url("review_send", check.pk), {"next": "/p/mine/runs/"})
    assert back["Location"] == "/p/mine/runs/"
    elsewhere = client.post(url("review_send", check.pk), {"next": "https://evil.example/"})
    assert elsewhere["Location"] == url("execution_detail", execution.pk)
    fragment = client.post(url("review_send", check.pk), HTTP_HX_REQUEST="true")
    assert f"item #{item.pk}" in fragment.content.decode()
    assert ReviewItem.objects.count() == 1


def test_skipped_items_wait_until_nothing_else_is_left(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run = make_world(two_projects.mine, scores=(0.3, 0.9, 0.65, 0.5))
    a, b, c, d = items(run)
    client = login(member("reviewer"))
    start = client.post(url("review_queue"))
    assert start["Location"] == url("review_item", a.pk)

    def post(item: ReviewItem, data: dict[str, str]) -> str:
        response = client.post(url("review_item", item.pk), data, HTTP_HX_REQUEST="true")
        assert response.status_code == 200
        return response.content.decode()

    def shown(body: str) -> int:
        match = re.search(r"Review item #(\d+)</h1>", body)
        assert match, body[:500]
        return int(match.group(1))

    # Skipping a then b moves on for good: a does not come back while c and d wait.
    assert shown(post(a, {"action": "skip"})) == b.pk
    assert shown(post(b, {"action": "skip"})) == c.pk
    body = post(c, {"verdict": "pass", "score": "0.8"})
    assert shown(body) == d.pk
    progress = re.search(r'data-testid="progress">(.*?)</p>', body, re.S)
    assert progress and "1 of 4</strong> graded by you, 2 skipped" in " ".join(
        progress.group(1).split()
    )
    # "Previous item" opens the one graded last.
    assert f'href="{url("review_item", c.pk)}" data-testid="previous-item"' in body
    # Only skipped items are left: they come back, oldest first.
    assert shown(post(d, {"verdict": "fail"})) == a.pk
    assert shown(post(a, {"verdict": "pass"})) == b.pk
    assert "Nothing left to grade" in post(b, {"verdict": "pass"})


def test_the_score_keys_are_written_on_the_page(world: Run, member: Callable[..., Any]) -> None:
    reviewer = member("reviewer")
    first = items(world)[0]
    services.review_claim(item_id=first.pk, user=reviewer)
    page = login(reviewer).get(url("review_item", first.pk)).content.decode()
    assert "<kbd>1</kbd>–<kbd>9</kbd></dt><dd>score 0.1–0.9" in page
    assert "<kbd>0</kbd></dt><dd>score 1.0" in page


def test_grades_export_as_csv_and_jsonl_with_judge_and_human_sides(
    world: Run, member: Callable[..., Any], client_as: Callable[..., Client]
) -> None:
    reviewer = member("reviewer")
    first, second, _third = items(world)
    services.review_submit(item_id=first.pk, user=reviewer, passed=True, score=0.8, note="ok")
    services.review_submit(item_id=second.pk, user=reviewer, passed=False)
    viewer = client_as("viewer")

    csv_response = viewer.get(url("review_export", "csv"))
    assert csv_response.status_code == 200
    assert csv_response["Content-Type"].startswith("text/csv")
    assert 'filename="mine-review-grades.csv"' in csv_response["Content-Disposition"]
    rows = list(
        csv_module.DictReader(io.StringIO(b"".join(csv_response.streaming_content).decode()))
    )
    assert [int(r["item"]) for r in rows] == [first.pk, second.pk]
    assert rows[0]["judge_score"] == "0.3" and rows[0]["human_score"] == "0.8"
    assert rows[0]["reviewer"] == reviewer.username and rows[0]["note"] == "ok"
    assert rows[1]["human_passed"] == "False" and rows[1]["judge_model"]
    assert rows[0]["graded_at"]

    jsonl = viewer.get(url("review_export", "jsonl"))
    lines = [json.loads(line) for line in b"".join(jsonl.streaming_content).splitlines()]
    assert [line["item"] for line in lines] == [first.pk, second.pk]
    assert lines[0]["judge_score"] == 0.3 and lines[0]["human_score"] == 0.8
    # The queue's filters apply; an unknown format is a 404 that says what to use.
    filtered = viewer.get(url("review_export", "csv", query=f"?run={world.pk + 999}"))
    assert b"".join(filtered.streaming_content).decode().splitlines() == [",".join(GRADE_COLUMNS)]
    bad = viewer.get(url("review_export", "xlsx"))
    assert bad.status_code == 404 and b"grades.csv or grades.jsonl" in bad.content


def test_a_reviewer_undoes_the_last_grade_and_grades_again(
    world: Run, member: Callable[..., Any]
) -> None:
    from datetime import timedelta as _td

    from django.utils import timezone

    from evaluations.models import ResultChange

    reviewer = member("reviewer")
    client = login(reviewer)
    first, second, _ = items(world)
    composite_before = Run.objects.get(pk=world.pk).composite
    services.review_claim(item_id=first.pk, user=reviewer)
    graded = client.post(
        url("review_item", first.pk), {"verdict": "pass", "score": "1"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert f"Review item #{second.pk}" in graded and 'id="review-undo"' in graded
    assert CheckResult.objects.filter(execution=first.execution, source="human").exists()
    assert Run.objects.get(pk=world.pk).composite != composite_before  # the grade counted

    undone = client.post(url("review_item", first.pk), {"action": "undo"}, HTTP_HX_REQUEST="true")
    assert undone.status_code == 200
    assert f"Review item #{first.pk}" in undone.content.decode()
    assert 'id="review-form"' in undone.content.decode()  # claimed again, to grade anew
    assert undone["HX-Push-Url"] == url("review_item", first.pk)
    first.refresh_from_db()
    assert first.status == ReviewStatus.OPEN and first.claimed_by == reviewer
    assert first.final_passed is None and not ReviewVerdict.objects.filter(item=first).exists()
    assert not CheckResult.objects.filter(execution=first.execution, source="human").exists()
    assert Run.objects.get(pk=world.pk).composite == composite_before  # rescored back
    # Both changes are on record: the grade and its undoing.
    changes = list(ResultChange.objects.filter(review_item=first).order_by("id"))
    assert [c.after.get("source") for c in changes] == ["human", "judge"]

    # Graded again, with another verdict: it counts as any grade.
    client.post(url("review_item", first.pk), {"verdict": "fail"})
    assert ReviewVerdict.objects.get(item=first).passed is False

    # Too late: a grade older than the claim time stays.
    ReviewVerdict.objects.filter(item=first).update(created=timezone.now() - _td(hours=2))
    late = client.post(url("review_item", first.pk), {"action": "undo"})
    assert late.status_code == 409 and "too late to undo" in late.content.decode()
    # Someone who did not grade it has nothing to undo.
    other = login(member("reviewer")).post(url("review_item", first.pk), {"action": "undo"})
    assert other.status_code == 409 and "no grade on review item" in other.content.decode()


def test_the_queue_pages_by_keyset_oldest_first(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run = make_world(two_projects.mine, scores=tuple(0.5 for _ in range(60)))
    client = login(member("viewer"))
    first = client.get(url("review_queue")).content.decode()
    found = re.search(r'href="([^"]*after=[^"]*)" rel="next"', first)
    assert found is not None
    with CaptureQueriesContext(connection) as queries:
        second = client.get(url("review_queue") + html.unescape(found.group(1))).content.decode()

    def shown(page: str) -> list[int]:
        return [int(i) for i in re.findall(r">#(\d+)</a></td>", page)]

    expected = [item.pk for item in items(run)]
    assert shown(first) + shown(second) == expected
    assert len(shown(first)) == 50 and 'rel="next"' not in second
    assert not any("OFFSET" in q["sql"].upper() for q in queries)


def test_counts_stop_at_the_cap_and_read_as_more_than_it(world: Run) -> None:
    from evaluations.selectors.bounds import capped_count, capped_text

    queued = ReviewItem.objects.filter(run=world)
    assert queued.count() == 3
    assert capped_count(queued, cap=5) == 3 and capped_text(3, cap=5) == "3"
    assert capped_count(queued, cap=2) == 3 and capped_text(3, cap=2) == "2+"


def test_the_queues_counts_are_one_query_and_capped_each(
    world: Run, django_assert_num_queries: Any
) -> None:
    from evaluations import selectors
    from evaluations.selectors.bounds import capped_count, capped_counts

    queued = ReviewItem.objects.filter(run=world)
    first = queued.order_by("id").first()
    assert first is not None
    counted = {
        "all": queued,
        "first": queued.filter(pk=first.pk),
        "none": queued.filter(pk=-1),
        "with a join": queued.filter(spec__slug=first.spec.slug),
    }
    with django_assert_num_queries(1):
        counts = capped_counts(counted, cap=2)
    assert counts == {"all": 3, "first": 1, "none": 0, "with a join": 3}
    assert counts == {name: capped_count(q, cap=2) for name, q in counted.items()}
    project = world.project
    with django_assert_num_queries(1):
        selectors.review_counts(project, selectors.ReviewFilters())
