"""Issue 16, item 3: reviews through the API for labelling tools: the queue, claiming the
next item or a given one, a verdict, releasing, with the browser's rules (the reviewer role,
live claims, reviewers per item, one grade per person, blind mode)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import CheckResult, Membership, Project, ReviewItem, ReviewStatus, Role
from tests.evaluations.review_world import add_execution, add_judge, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(project: Project) -> list[ReviewItem]:
    """Two judge results queued for two blind reviewers each."""
    run = make_run(project, review={"all": True, "reviewers_per_item": 2, "blind": True})
    for replica in (0, 1):
        add_judge(add_execution(run, replica), score=0.9)
    items = services.review_items_select(run_id=run.pk)
    assert len(items) == 2
    return sorted(items, key=lambda item: item.pk)


@pytest.fixture
def person(project: Project, django_user_model: Any) -> Any:
    def make(role: str) -> Client:
        user = django_user_model.objects.create_user(
            username=f"{role}-{django_user_model.objects.count()}", password="pw-123456"
        )
        Membership.objects.create(project=project, user=user, role=Role(role))
        _, raw = services.token_issue(project=project, user=user, name="labeller")
        return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")

    return make


def _post(client: Client, path: str, body: Any = None) -> Any:
    return client.post(
        f"/api/projects/demo/reviews{path}", json.dumps(body or {}), content_type="application/json"
    )


def test_claims_verdicts_and_blind_mode_follow_the_browsers_rules(
    queue: list[ReviewItem], person: Any
) -> None:
    ann, bob = person("reviewer"), person("reviewer")
    first, second = queue

    mine = _post(ann, "/next")
    assert mine.status_code == 200
    item = mine.json()
    assert item["id"] == first.pk and item["held_by_me"] and item["blind"]
    assert item["judge"] is None  # blind: hidden until Ann has graded
    assert item["judged_input"] == "Your refund for order 1042 is on its way."

    taken = _post(bob, f"/{first.pk}/claim")
    assert taken.status_code == 409 and "being graded by" in taken.json()["error"]["message"]
    refused = _post(bob, f"/{first.pk}/verdict", {"passed": False})
    assert refused.status_code == 409
    assert _post(bob, "/next").json()["id"] == second.pk  # the next one nobody holds

    bad = _post(ann, f"/{first.pk}/verdict", {"passed": True, "score": 1.5})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "score"
    graded = _post(ann, f"/{first.pk}/verdict", {"passed": True, "note": "fine"})
    assert graded.status_code == 201, graded.content
    body = graded.json()
    assert body["completed"] is False and body["item"]["verdict_count"] == 1
    assert body["item"]["judge"]["score"] == 0.9  # revealed once Ann answered
    assert body["item"]["verdicts"] is None  # others' grades stay hidden while open
    again = _post(ann, f"/{first.pk}/verdict", {"passed": True})
    assert again.status_code == 409 and "already" in again.json()["error"]["message"]

    # Bob releases the second item and grades the first: the second grade closes it.
    assert _post(bob, f"/{second.pk}/release").status_code == 204
    assert ReviewItem.objects.get(pk=second.pk).claimed_by is None
    closing = _post(bob, f"/{first.pk}/verdict", {"passed": True})
    assert closing.status_code == 201 and closing.json()["completed"] is True
    closed = closing.json()["item"]
    assert closed["status"] == ReviewStatus.COMPLETE and len(closed["verdicts"]) == 2
    human = CheckResult.objects.get(execution_id=first.execution_id, source="human")
    assert human.passed is True
    late = _post(person("reviewer"), f"/{first.pk}/verdict", {"passed": False})
    assert late.status_code == 409


def test_queue_lists_counts_and_filters(queue: list[ReviewItem], person: Any) -> None:
    viewer = person("viewer")
    answer = viewer.get("/api/projects/demo/reviews").json()
    assert answer["counts"]["open"] == 2
    assert [item["id"] for item in answer["items"]] == [item.pk for item in queue]
    assert viewer.get("/api/projects/demo/reviews", {"run": 999999}).json()["items"] == []
    assert viewer.get("/api/projects/demo/reviews", {"status": "complete"}).json()["items"] == []
    refused = viewer.get("/api/projects/demo/reviews", {"status": "sideways"})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "status"
    detail = viewer.get(f"/api/projects/demo/reviews/{queue[0].pk}").json()
    assert detail["judge"] is None and detail["criteria"]


def test_viewers_cannot_claim_or_grade_and_outsiders_see_nothing(
    queue: list[ReviewItem], person: Any, django_user_model: Any
) -> None:
    viewer = person("viewer")
    assert _post(viewer, "/next").status_code == 403
    assert _post(viewer, f"/{queue[0].pk}/claim").status_code == 403
    assert _post(viewer, f"/{queue[0].pk}/verdict", {"passed": True}).status_code == 403
    assert _post(viewer, f"/{queue[0].pk}/release").status_code == 403
    assert not ReviewItem.objects.filter(claimed_by__isnull=False).exists()

    other = Project.objects.create(name="Other", slug="other")
    stranger = django_user_model.objects.create_user(username="stranger", password="pw-123456")
    Membership.objects.create(project=other, user=stranger, role=Role.ADMIN)
    _, raw = services.token_issue(project=other, user=stranger, name="x")
    outsider = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert outsider.get(f"/api/projects/demo/reviews/{queue[0].pk}").status_code == 404
    assert outsider.get(f"/api/projects/other/reviews/{queue[0].pk}").status_code == 404


def test_next_is_204_when_nothing_is_left(project: Project, person: Any) -> None:
    assert _post(person("reviewer"), "/next").status_code == 204
