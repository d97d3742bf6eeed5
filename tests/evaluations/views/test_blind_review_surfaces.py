"""Blind review holds everywhere, not only on the review pages: while a person has not graded
an open blind item, the judge's score, pass/fail, failure code, message and reasoning of its
result stay out of the execution page, the cell drawer, the run page, the API's execution
detail and report, and the run exports (CSV, JSON, JUnit, Markdown). Once they have graded
it, or the item is closed, or the review is not blind, they are shown again."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from evaluations import services
from evaluations.models import Execution, ReviewItem, ReviewStatus, Run
from evaluations.selectors import exports
from tests.evaluations.review_world import add_check, add_execution, add_judge, make_run

pytestmark = pytest.mark.django_db

SCORE = 0.4321
REASONING = "SECRET-REASONING-7f3a: curt, and silent about the refund."
# What would tell the judge's verdict on any surface: its score (as the pages and reports
# write it), its message, its reasoning, its failure code.
TELLS = ("0.432", "judge score 0.43", "SECRET-REASONING-7f3a", "JUDGE_BELOW_THRESHOLD")
HIDDEN = "hidden: under blind review until you grade it"


def make_world(project: Any, *, blind: bool = True) -> tuple[Run, Execution, ReviewItem]:
    """A completed run of two executions, each with a judge result (a gate) queued for two
    reviewers and a passing engine result; the first's judge fails, and is the one looked
    for. (Two, so that the run's judge mean, an aggregate, is not that score.)"""
    run = make_run(project, review={"all": True, "blind": blind, "reviewers_per_item": 2})
    execution = add_execution(run, 0)
    add_judge(execution, score=SCORE, reasoning=REASONING)
    add_check(execution, passed=True)
    second = add_execution(run, 1)
    add_judge(second, score=0.9)
    add_check(second, passed=True)
    run = services.run_finalize(run_id=run.pk)
    item = ReviewItem.objects.get(run=run, execution=execution)
    assert item.blind is blind and item.status == ReviewStatus.OPEN
    return run, execution, item


def grade(item: ReviewItem, user: Any, passed: bool = True) -> None:
    services.review_claim(item_id=item.pk, user=user)
    services.review_submit(item_id=item.pk, user=user, passed=passed)


def login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_client(project: Any, user: Any) -> Client:
    _, raw = services.token_issue(project=project, user=user, name="blind")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def web_surfaces(run: Run, execution: Execution) -> dict[str, str]:
    cell = reverse("run_cell", args=["mine", run.pk]) + "?scenario=no-chaos&invariant=polite"
    export = "run_export"
    return {
        "execution page": reverse("execution_detail", args=["mine", execution.pk]),
        "cell drawer": cell,
        "run page": reverse("run_detail", args=["mine", run.pk]),
        "csv export": reverse(export, args=["mine", run.pk, "csv"]),
        "json export": reverse(export, args=["mine", run.pk, "json"]),
        "junit export": reverse(export, args=["mine", run.pk, "junit"]),
        "markdown export": reverse(export, args=["mine", run.pk, "md"]),
    }


def api_surfaces(run: Run, execution: Execution) -> dict[str, str]:
    base = f"/api/projects/mine/runs/{run.pk}/report"
    return {
        "api execution": f"/api/projects/mine/executions/{execution.pk}",
        "api json report": f"{base}?format=json",
        "api junit report": f"{base}?format=junit",
        "api markdown report": f"{base}?format=md",
    }


def bodies(client: Client, urls: dict[str, str]) -> dict[str, str]:
    out = {}
    for name, address in urls.items():
        response = client.get(address)
        assert response.status_code == 200, (name, response.status_code)
        content = b"".join(response.streaming_content) if response.streaming else response.content
        out[name] = content.decode()
    return out


def everything(project: Any, user: Any, run: Run, execution: Execution) -> dict[str, str]:
    return {
        **bodies(login(user), web_surfaces(run, execution)),
        **bodies(api_client(project, user), api_surfaces(run, execution)),
    }


def tells_in(body: str) -> list[str]:
    return [tell for tell in TELLS if tell in body]


SURFACES = (
    "execution page",
    "cell drawer",
    "run page",
    "csv export",
    "json export",
    "junit export",
    "markdown export",
    "api execution",
    "api json report",
    "api junit report",
    "api markdown report",
)


def surface_body(project: Any, user: Any, run: Run, execution: Execution, surface: str) -> str:
    web, api = web_surfaces(run, execution), api_surfaces(run, execution)
    if surface in web:
        return bodies(login(user), {surface: web[surface]})[surface]
    return bodies(api_client(project, user), {surface: api[surface]})[surface]


@pytest.mark.parametrize("surface", SURFACES)
def test_a_reviewer_who_has_not_graded_sees_no_verdict(
    two_projects: Any, member: Callable[..., Any], surface: str
) -> None:
    run, execution, item = make_world(two_projects.mine)
    body = surface_body(two_projects.mine, member("reviewer"), run, execution, surface)
    assert tells_in(body) == []
    # Each surface that lists the result says why it shows no verdict.
    if surface in ("execution page", "cell drawer"):
        assert HIDDEN in body and reverse("review_item", args=["mine", item.pk]) in body
    if surface == "csv export":
        assert HIDDEN in body and f"review item {item.pk}" in body
    if surface in ("json export", "markdown export", "api json report", "api markdown report"):
        assert HIDDEN in body


def test_the_csv_blanks_the_verdict_columns_by_name_wherever_they_are(
    two_projects: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column added to the CSV, or its columns reordered, cannot move what is hidden onto
    another column: passed, score, failure_code and message are found by name."""
    run, execution, item = make_world(two_projects.mine)
    judge = execution.check_results.get(check_type="llm_as_judge")
    reordered = dict(reversed(list(exports.RESULT_CSV_FIELDS.items())))
    fields = {"attempt": "execution__attempt", **reordered}  # a new column, in front
    monkeypatch.setattr(exports, "RESULT_CSV_FIELDS", fields)
    rows = [
        dict(zip(fields, row, strict=True))
        for row in exports.run_result_rows(run.pk, {judge.pk: item.pk})
    ]
    (hidden,) = [r for r in rows if r["message"].startswith(HIDDEN)]
    assert hidden == {
        **hidden,
        "passed": "",
        "score": "",
        "failure_code": "",
        "message": f"{HIDDEN} (review item {item.pk})",
    }
    assert (hidden["execution_id"], hidden["invariant"], hidden["attempt"]) == (
        execution.pk,
        "polite",
        1,
    )
    assert hidden["check_type"] == "llm_as_judge" and hidden["source"] == "judge"
    shown = [r for r in rows if r["check_type"] == "llm_as_judge" and r is not hidden]
    assert [r["score"] for r in shown] == [0.9]


def test_a_viewer_who_cannot_grade_sees_no_verdict_either(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run, execution, _ = make_world(two_projects.mine)
    seen = everything(two_projects.mine, member("viewer"), run, execution)
    assert {name: tells_in(body) for name, body in seen.items() if tells_in(body)} == {}


def test_the_api_execution_says_the_result_is_hidden_with_a_null_score(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run, execution, item = make_world(two_projects.mine)
    ann, bob = member("reviewer"), member("reviewer")
    path = f"/api/projects/mine/executions/{execution.pk}"
    results = {
        r["invariant_id"]: r
        for r in api_client(two_projects.mine, ann).get(path).json()["check_results"]
    }
    judge = results["polite"]
    assert judge["score"] is None and judge["passed"] is None
    assert judge["hidden_for_blind_review"] is True and judge["review_item_id"] == item.pk
    assert judge["details"] == {} and judge["failure_code"] == "" and judge["message"] == HIDDEN
    # The engine's result is not under review: shown.
    engine = results["no_insult"]
    assert engine["score"] == 1.0 and engine["hidden_for_blind_review"] is False

    grade(item, ann)
    shown = api_client(two_projects.mine, ann).get(path).json()["check_results"]
    judge = next(r for r in shown if r["invariant_id"] == "polite")
    assert judge["score"] == SCORE and judge["passed"] is False
    assert judge["hidden_for_blind_review"] is False
    assert judge["details"]["judge"]["reasoning"] == REASONING
    # Bob has not graded: still hidden from him.
    other = api_client(two_projects.mine, bob).get(path).json()["check_results"]
    assert next(r for r in other if r["invariant_id"] == "polite")["score"] is None


def test_after_grading_the_verdict_is_shown_to_that_reviewer_only(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run, execution, item = make_world(two_projects.mine)
    ann, bob = member("reviewer"), member("reviewer")
    grade(item, ann)
    item.refresh_from_db()
    assert item.status == ReviewStatus.OPEN  # one grade of two
    seen = everything(two_projects.mine, ann, run, execution)
    for name in ("execution page", "cell drawer", "api execution"):
        assert "0.432" in seen[name], name
    assert "SECRET-REASONING-7f3a" in seen["execution page"]
    assert "judge score 0.43" in seen["csv export"]
    for name in ("json export", "api json report"):
        assert "SECRET-REASONING-7f3a" in seen[name], name
    assert "JUDGE_BELOW_THRESHOLD" in seen["junit export"]
    assert "gate `polite` scored 0.432" in seen["run page"]
    # Bob, who has not graded, still sees nothing.
    hidden = everything(two_projects.mine, bob, run, execution)
    assert {name: tells_in(body) for name, body in hidden.items() if tells_in(body)} == {}


def test_a_closed_item_shows_the_verdict_to_everyone(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run, execution, item = make_world(two_projects.mine)
    grade(item, member("reviewer"))
    grade(item, member("reviewer"))
    item.refresh_from_db()
    assert item.status == ReviewStatus.COMPLETE
    seen = everything(two_projects.mine, member("viewer"), run, execution)
    assert "0.432" in seen["execution page"] and "SECRET-REASONING-7f3a" in seen["execution page"]
    assert "judge score 0.43" in seen["csv export"]
    assert "SECRET-REASONING-7f3a" in seen["api execution"]
    assert HIDDEN not in seen["execution page"]
    # The report counts the people's verdict now (it overrides the judge's), shown.
    report = json.loads(seen["json export"])
    record = next(e for e in report["executions"] if e["id"] == str(execution.pk))
    assert [r["source"] for r in record["results"] if r["invariant_id"] == "polite"] == ["human"]


def test_a_review_that_is_not_blind_hides_nothing(
    two_projects: Any, member: Callable[..., Any]
) -> None:
    run, execution, _ = make_world(two_projects.mine, blind=False)
    seen = everything(two_projects.mine, member("reviewer"), run, execution)
    for name in ("execution page", "cell drawer", "api execution", "run page"):
        assert "0.432" in seen[name], name
    for name in ("csv export", "markdown export", "api markdown report"):
        assert "judge score 0.43" in seen[name], name
    for name in ("json export", "api json report"):
        assert "SECRET-REASONING-7f3a" in seen[name], name
    assert "JUDGE_BELOW_THRESHOLD" in seen["junit export"]
    assert not any(HIDDEN in body for body in seen.values())
    body = json.loads(seen["api execution"])
    assert all(r["hidden_for_blind_review"] is False for r in body["check_results"])
