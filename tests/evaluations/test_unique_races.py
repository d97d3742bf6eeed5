"""A name taken by a concurrent request gets the same refusal as a name taken before: two
requests creating one alert channel, alert rule, project slug or membership at the same
moment both found the name free, and the second insert's IntegrityError was a 500 naming no
field (evaluations.services.unique). Each test makes that race happen (tests/evaluations/
races.py), then asks again once the row is there, and compares the two answers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from evaluations import services
from evaluations.models import AlertChannel, AlertRule, Membership, Project, Role
from tests.evaluations.races import inserted_by_a_concurrent_request, postgres_only

pytestmark = [pytest.mark.django_db(transaction=True), postgres_only]


@pytest.fixture
def admin(project: Project, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user(
        username="root", password="pw-123456", is_superuser=True
    )
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    return user


@pytest.fixture
def browser(admin: Any) -> Client:
    client = Client(raise_request_exception=False)  # a 500 is an answer to compare
    client.force_login(admin)
    return client


def _page_error(response: Any) -> tuple[int, str]:
    """The status and the refusal shown on the page ("Not saved: ..." or the form error)."""
    page = response.content.decode()
    marker = "already"
    at = page.find(marker)
    line = page[page.rfind(">", 0, at) + 1 : page.find("<", at)].strip() if at >= 0 else page
    return response.status_code, line


@pytest.mark.parametrize(
    ("form", "theirs", "message"),
    [
        (
            {"action": "channel_add", "name": "ops", "kind": "email", "target": "a@b.co"},
            lambda project: AlertChannel.objects.create(
                project=project, name="ops", kind="email", target="them@b.co"
            ),
            "Not saved: name: a channel named &#x27;ops&#x27; already exists in this project",
        ),
        (
            {"action": "rule_add", "name": "drop", "condition": "pass_rate < 0.9", "window": "last_run"},
            lambda project: AlertRule.objects.create(
                project=project, name="drop", condition="pass_rate < 0.5"
            ),
            "Not saved: name: a rule named &#x27;drop&#x27; already exists in this project",
        ),
    ],
    ids=["channel", "rule"],
)  # fmt: skip
def test_the_alerts_form_refuses_a_name_taken_a_moment_earlier_like_any_taken_name(
    project: Project, browser: Client, form: dict[str, str], theirs: Any, message: str
) -> None:
    url = reverse("project_alerts", args=[project.slug])
    with inserted_by_a_concurrent_request(lambda: theirs(project)):
        raced = browser.post(url, form)
    assert raced.status_code == 400, raced.content[:300]
    assert message in raced.content.decode()
    later = browser.post(url, form)
    assert _page_error(raced) == _page_error(later) == (400, message)
    # Theirs was kept, ours not stored.
    assert AlertChannel.objects.count() + AlertRule.objects.count() == 1
    assert not AlertChannel.objects.filter(target="a@b.co").exists()
    assert not AlertRule.objects.filter(condition="pass_rate < 0.9").exists()


def test_the_api_refuses_a_rule_name_taken_a_moment_earlier_like_any_taken_name(
    project: Project, admin: Any
) -> None:
    _, raw = services.token_issue(project=project, user=admin, name="ci")
    client = Client(raise_request_exception=False)
    body = json.dumps({"name": "drop", "condition": "pass_rate < 0.9"})

    def post() -> Any:
        return client.post(
            f"/api/projects/{project.slug}/alert-rules",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {raw}",
        )

    with inserted_by_a_concurrent_request(
        lambda: AlertRule.objects.create(project=project, name="drop", condition="pass_rate < 0.5")
    ):
        raced = post()
    assert raced.status_code == 422, raced.content[:300]
    error = raced.json()["error"]
    assert (error["field"], error["message"]) == (
        "name",
        "a rule named 'drop' already exists in this project",
    )
    later = post()
    assert (later.status_code, later.json()) == (raced.status_code, raced.json())
    assert AlertRule.objects.get().condition == "pass_rate < 0.5"


def test_a_project_slug_taken_a_moment_earlier_is_refused_like_any_taken_slug(
    project: Project, browser: Client
) -> None:
    form = {"name": "Mine", "slug": "mine"}
    with inserted_by_a_concurrent_request(
        lambda: Project.objects.create(name="Theirs", slug="mine")
    ):
        raced = browser.post(reverse("project_list"), form)
    message = "A project with the slug &#x27;mine&#x27; already exists."
    assert raced.status_code == 400, raced.content[:300]
    assert message in raced.content.decode()
    assert 'value="Mine"' in raced.content.decode()  # the form keeps what was typed
    later = browser.post(reverse("project_list"), form)
    assert _page_error(raced) == _page_error(later) == (400, message)
    theirs = Project.objects.get(slug="mine")
    assert theirs.name == "Theirs" and not theirs.memberships.exists()


def test_a_member_added_a_moment_earlier_is_refused_like_any_member(
    project: Project, browser: Client, django_user_model: Any
) -> None:
    carol = django_user_model.objects.create_user("carol", password="pw-123456")
    form = {"action": "add", "username": "carol", "role": "viewer"}
    url = reverse("members", args=[project.slug])
    with inserted_by_a_concurrent_request(
        lambda: Membership.objects.create(project=project, user=carol, role=Role.REVIEWER)
    ):
        raced = browser.post(url, form)
    message = "carol is already a member (reviewer); change the role instead."
    assert raced.status_code == 400, raced.content[:300]
    assert message in raced.content.decode()
    later = browser.post(url, form)
    assert _page_error(raced) == _page_error(later) == (400, message)
    assert Membership.objects.get(user=carol).role == Role.REVIEWER
