"""A refused alert channel or rule comes back as it was typed, with the reason: the settings
page used to answer with empty forms, so one typo in a condition cost everything else typed
and chosen (name, window, specs, branches, channels)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import AlertChannel, Membership, Project, Role

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


class _Form(HTMLParser):
    """Each control's state in the page: inputs by id (value / checked), selects by id (the
    selected option), checkboxes named `channels` by value."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str | None] = {}
        self.checked: dict[str, bool] = {}
        self.selected: dict[str, str] = {}
        self.channels: dict[str, bool] = {}
        self._select = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "select":
            self._select = a.get("id") or ""
        elif tag == "option" and "selected" in a:
            self.selected[self._select] = a.get("value") or ""
        elif tag == "input" and a.get("name") == "channels":
            self.channels[a.get("value") or ""] = "checked" in a
        elif tag == "input" and a.get("type") == "checkbox":
            self.checked[a.get("name") or ""] = "checked" in a
        elif tag == "input" and a.get("id"):
            self.values[a["id"] or ""] = a.get("value")


def _form(response: Any) -> _Form:
    parsed = _Form()
    parsed.feed(response.content.decode())
    return parsed


@pytest.fixture
def admin(project: Project, django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user(username="root", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    client = Client()
    client.force_login(user)
    return client


URL = "/p/demo/settings/alerts/"


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_a_refused_rule_keeps_everything_typed_and_chosen(
    project: Project, admin: Client, htmx: bool
) -> None:
    ops = services.alert_channel_create(project=project, name="ops", kind="email", target="o@x.io")
    services.alert_channel_create(project=project, name="team", kind="email", target="t@x.io")
    form = {
        "action": "rule_add",
        "name": "pass rate <b>drop</b>",
        "condition": "pass_rte < 0.9",  # the typo
        "window": "last_5_runs",
        "specs": "refund-agent, shell-agent",
        "branches": "main",
        "channels": [str(ops.pk)],
    }
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = admin.post(URL, form, **headers)
    assert response.status_code == (200 if htmx else 400)
    assert "Not saved: condition: unknown metric &#x27;pass_rte&#x27;" in response.content.decode()
    page = _form(response)
    assert page.values["rule-name"] == "pass rate <b>drop</b>"
    assert page.values["rule-condition"] == "pass_rte < 0.9"
    assert page.selected["rule-window"] == "last_5_runs"
    assert page.values["rule-specs"] == "refund-agent, shell-agent"
    assert page.values["rule-branches"] == "main"
    team = AlertChannel.objects.get(name="team")
    assert page.channels == {str(ops.pk): True, str(team.pk): False}
    # The channel form beside it is still empty, with its defaults.
    assert page.values["channel-name"] == "" and page.checked["digest"] is True
    assert not project.alert_rules.exists()


def test_a_refused_channel_keeps_what_was_typed_but_not_the_secret(
    project: Project, admin: Client
) -> None:
    form = {
        "action": "channel_add",
        "name": "builds",
        "kind": "slack",
        "target": "hooks.slack.com/services/T000",  # no https://
        "secret": "s3cret-value",
    }  # digest unticked
    response = admin.post(URL, form)
    assert response.status_code == 400
    assert "needs an http(s):// URL" in response.content.decode()
    page = _form(response)
    assert page.values["channel-name"] == "builds"
    assert page.selected["channel-kind"] == "slack"
    assert page.values["channel-target"] == "hooks.slack.com/services/T000"
    assert page.checked["digest"] is False
    assert page.values["channel-secret"] is None
    assert "s3cret-value" not in response.content.decode()
    # After a saved one the forms are empty again.
    form["target"] = "https://hooks.slack.com/services/T000"
    response = admin.post(URL, form)
    assert response.status_code == 200
    page = _form(response)
    assert page.values["channel-name"] == "" and page.checked["digest"] is True
    assert "channel-kind" not in page.selected
