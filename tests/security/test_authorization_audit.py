"""Authorization defects found in an audit, each shown through the real API or pages: a
member reading what their role does not reach, or a token doing more than its scopes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import ChannelKind, FiringStatus, Membership, Project, Role
from tests.evaluations.alert_history import NOW, finished_run, spec_in
from tests.evaluations.test_alert_delivery import Receiver

pytestmark = pytest.mark.django_db


def _member(django_user_model: Any, project: Project, name: str, role: Role) -> Any:
    user = django_user_model.objects.create_user(username=name, password="pw-1234567")
    Membership.objects.create(project=project, user=user, role=role)
    return user


def _bearer(raw: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def test_a_viewer_does_not_read_a_slack_webhook_url_in_a_failed_firing(
    project: Project, django_user_model: Any, settings: Any
) -> None:
    """A Slack incoming-webhook URL is the channel's credential (whoever has it posts to the
    channel); channels are the admins' (settings page only). A delivery that failed kept
    the URL in the firing's error, which GET .../alert-firings showed to any viewer."""
    settings.KEYSTONE_ALERT_BACKOFF = 0.01
    settings.KEYSTONE_ALERT_MAX_ATTEMPTS = 1
    receiver = Receiver([404])
    try:
        base = receiver.url.removesuffix("/hook")
        hook = f"{base}/services/T0001/B0002/sl4ckS3cretT0ken?token=qs-secret"
        channel = services.alert_channel_create(
            project=project, name="team", kind=ChannelKind.SLACK, target=hook
        )
        services.alert_rule_create(
            project=project, name="low", condition="pass_rate < 0.9", channel_ids=[channel.pk]
        )
        run = finished_run(spec_in(project), finished=NOW, pass_rate=0.5, branch="main")
        (firing_id,) = services.alerts_evaluate(run_id=run.pk)
        assert services.firing_deliver(firing_id=firing_id) == FiringStatus.FAILED
    finally:
        receiver.close()

    viewer = _member(django_user_model, project, "vera", Role.VIEWER)
    _, raw = services.token_issue(project=project, user=viewer, name="ci", scopes=["read"])
    answer = Client().get(f"/api/projects/{project.slug}/alert-firings", **_bearer(raw))
    assert answer.status_code == 200
    (row,) = answer.json()
    assert row["status"] == "failed"
    # Still says what went wrong, and where (the host), without the URL's secret parts.
    assert "HTTP 404" in row["last_error"] and "127.0.0.1" in row["last_error"]
    for secret in ("sl4ckS3cretT0ken", "qs-secret", "/services/"):
        assert secret not in answer.content.decode()


def test_a_token_cannot_mint_a_project_token_with_a_scope_it_lacks(
    project: Project, django_user_model: Any
) -> None:
    """A token acts within its scopes, and a personal token "cannot grant a scope it lacks"
    (docs/api.md). POST /api/projects/<p>/tokens did not apply that rule: a token with only
    the admin scope (project or personal) minted a project token with `run`, and with it
    uploaded a spec (a command the server runs), which its own scopes refuse."""
    spec_in(project)
    boss = _member(django_user_model, project, "boss", Role.ADMIN)
    _, project_admin = services.token_issue(
        project=project, user=boss, name="ops", scopes=["admin"]
    )
    _, personal_admin = services.personal_token_issue(user=boss, name="laptop", scopes=["admin"])
    url = f"/api/projects/{project.slug}/tokens"
    upload = f"/api/projects/{project.slug}/specs"
    for raw in (project_admin, personal_admin):
        # Its own scopes refuse running...
        refused = Client().post(
            upload, {"source_yaml": "id: x\n"}, content_type="application/json", **_bearer(raw)
        )
        assert refused.status_code == 403, refused.content
        # ...so it cannot mint a token that runs, nor one that reads.
        for scopes in (["read", "run"], ["run"], ["read"]):
            minted = Client().post(
                url,
                {"name": "ci", "scopes": scopes},
                content_type="application/json",
                **_bearer(raw),
            )
            assert minted.status_code == 403, (scopes, minted.content)
            assert "lacks" in minted.json()["error"]["message"]
        # Within its scopes it still manages the project's tokens.
        made = Client().post(
            url,
            {"name": "ops-2", "scopes": ["admin"]},
            content_type="application/json",
            **_bearer(raw),
        )
        assert made.status_code == 201, made.content
    # Only the two tokens with the admin scope the tests minted, none that runs.
    assert sorted(s for t in project.api_tokens.filter(name="ops-2") for s in t.scopes) == [
        "admin",
        "admin",
    ]
    assert not project.api_tokens.filter(name="ci").exists()


def test_a_project_someone_is_not_in_is_answered_like_one_that_does_not_exist(
    project: Project, django_user_model: Any
) -> None:
    """Someone who is not a member must not learn whether a project exists (evaluations/
    access.py). Pages and the API answered "No such project." for a project that exists and
    Django's "No Project matches the given query." for one that does not, so anyone signed
    in, or holding any personal token, could tell which project slugs exist."""
    spec_in(project)
    outsider = django_user_model.objects.create_user(username="olga", password="pw-1234567")
    browser = Client()
    browser.force_login(outsider)
    _, raw = services.personal_token_issue(user=outsider, name="laptop")
    token = Client()
    pages = ("/p/{}/", "/p/{}/runs/", "/p/{}/specs/", "/p/{}/review/", "/p/{}/members/")
    for url in pages:
        existing = browser.get(url.format(project.slug))
        missing = browser.get(url.format("no-such-project"))
        assert existing.status_code == missing.status_code == 404, url
        assert existing.context["exception"] == missing.context["exception"] == "No such project."
    endpoints = ("/api/projects/{}/runs", "/api/projects/{}/specs", "/api/projects/{}/reviews")
    for url in endpoints:
        for client, headers in ((browser, {}), (token, _bearer(raw))):
            existing = client.get(url.format(project.slug), **headers)
            missing = client.get(url.format("no-such-project"), **headers)
            assert existing.status_code == missing.status_code == 404, url
            assert existing.json() == missing.json(), url
