"""Issue 16, item 4: personal tokens besides project tokens, with scopes, expiry, last-used
time, shown once, stored hashed, revocable; and a rate limit per token (429, Retry-After)."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from evaluations import services
from evaluations.models import ApiToken, Membership, Project, Role, Run

pytestmark = pytest.mark.django_db

SPEC = """\
version: 1
id: token-agent
task: {prompt: "Say hello"}
agent: {type: command, command: "echo hello"}
invariants:
  greets: {description: d, check: {type: contains, value: hello}}
"""


@pytest.fixture(autouse=True)
def _fresh_counters() -> None:
    cache.clear()  # the rate counters live in the cache, keyed by token id


@pytest.fixture
def two_projects(django_user_model: Any) -> tuple[Any, Project, Project]:
    """Dana: editor in `alpha`, viewer in `beta`; not in `gamma`."""
    dana = django_user_model.objects.create_user(username="dana", password="pw-1234567")
    alpha = Project.objects.create(name="Alpha", slug="alpha")
    beta = Project.objects.create(name="Beta", slug="beta")
    Project.objects.create(name="Gamma", slug="gamma")
    Membership.objects.create(project=alpha, user=dana, role=Role.EDITOR)
    Membership.objects.create(project=beta, user=dana, role=Role.VIEWER)
    for project in (alpha, beta):
        services.spec_version_create(project=project, source_yaml=SPEC)
    return dana, alpha, beta


def _json(client: Client, method: str, url: str, body: Any = None, **headers: Any) -> Any:
    return getattr(client, method)(
        url, json.dumps(body or {}), content_type="application/json", **headers
    )


def _bearer(raw: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def test_a_personal_token_is_shown_once_stored_hashed_and_acts_with_each_role(
    two_projects: tuple[Any, Project, Project],
) -> None:
    dana = two_projects[0]
    browser = Client()
    browser.force_login(dana)
    created = _json(browser, "post", "/api/tokens", {"name": "laptop", "scopes": ["read", "run"]})
    assert created.status_code == 201, created.content
    body = created.json()
    raw = body["token"]
    assert raw.startswith("ks_") and body["scopes"] == ["read", "run"] and body["project"] is None
    row = ApiToken.objects.get(pk=body["id"])
    assert row.token_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in json.dumps([getattr(row, f.attname) for f in row._meta.fields], default=str)
    listed = browser.get("/api/tokens").json()
    assert [t["id"] for t in listed] == [row.pk] and "token" not in listed[0]

    headers = _bearer(raw)
    start = "/api/projects/{}/specs/token-agent/runs"
    assert _json(Client(), "post", start.format("alpha"), {}, **headers).status_code == 202
    refused = _json(Client(), "post", start.format("beta"), {}, **headers)
    assert refused.status_code == 403 and "editor" in refused.json()["error"]["message"]
    assert Client().get("/api/projects/beta/runs", **headers).status_code == 200
    assert Client().get("/api/projects/gamma/runs", **headers).status_code == 404
    row.refresh_from_db()
    assert row.last_used is not None
    assert Run.objects.count() == 1


def test_scopes_limit_a_token_below_its_users_role(
    two_projects: tuple[Any, Project, Project],
) -> None:
    dana, alpha, _ = two_projects
    _, raw = services.token_issue(project=alpha, user=dana, name="reader", scopes=["read"])
    assert Client().get("/api/projects/alpha/runs", **_bearer(raw)).status_code == 200
    refused = _json(Client(), "post", "/api/projects/alpha/specs/token-agent/runs", **_bearer(raw))
    assert refused.status_code == 403 and "'run' scope" in refused.json()["error"]["message"]
    assert not Run.objects.exists()


def test_expired_and_revoked_tokens_are_401(two_projects: tuple[Any, Project, Project]) -> None:
    dana = two_projects[0]
    token, raw = services.personal_token_issue(user=dana, name="short", expires_in_days=1)
    assert token.expires is not None and token.expires > timezone.now() + timedelta(hours=23)
    assert Client().get("/api/projects/alpha/runs", **_bearer(raw)).status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(expires=timezone.now() - timedelta(seconds=1))
    expired = Client().get("/api/projects/alpha/runs", **_bearer(raw))
    assert expired.status_code == 401 and expired.json()["error"]["code"] == "unauthorized"

    other, other_raw = services.personal_token_issue(user=dana, name="admin", scopes=["admin"])
    browser = Client()
    browser.force_login(dana)
    assert browser.delete(f"/api/tokens/{other.pk}").status_code == 204
    assert Client().get("/api/tokens", **_bearer(other_raw)).status_code == 401
    assert browser.delete("/api/tokens/999999").status_code == 404


def test_bad_token_requests_name_the_field(two_projects: tuple[Any, Project, Project]) -> None:
    browser = Client()
    browser.force_login(two_projects[0])
    for body, named in (
        ({"name": "x", "scopes": ["root"]}, "scopes"),
        ({"name": "x", "scopes": []}, "scopes"),
        ({"name": " ", "scopes": ["read"]}, "name"),
        ({"name": "x", "expires_in_days": 0}, "expires_in_days"),
    ):
        answer = _json(browser, "post", "/api/tokens", body)
        assert answer.status_code == 422, body
        assert answer.json()["error"]["field"] == named, answer.json()
    assert not ApiToken.objects.exists()


def test_project_tokens_through_the_api(
    two_projects: tuple[Any, Project, Project], django_user_model: Any
) -> None:
    dana, alpha, _ = two_projects
    boss = django_user_model.objects.create_user(username="boss", password="pw-1234567")
    Membership.objects.create(project=alpha, user=boss, role=Role.ADMIN)
    # A token grants no scope it lacks: this one has those of the token it makes below.
    _, admin_raw = services.token_issue(
        project=alpha, user=boss, name="admin", scopes=["read", "run", "admin"]
    )
    made = _json(
        Client(),
        "post",
        "/api/projects/alpha/tokens",
        {"name": "ci", "user": "dana", "scopes": ["read", "run"], "expires_in_days": 30},
        **_bearer(admin_raw),
    )
    assert made.status_code == 201, made.content
    assert made.json()["user"] == "dana" and made.json()["project"] == "alpha"
    ci_raw = made.json()["token"]
    assert Client().get("/api/projects/alpha/runs", **_bearer(ci_raw)).status_code == 200
    # The project token is for alpha only, though dana is a member of beta too.
    assert Client().get("/api/projects/beta/runs", **_bearer(ci_raw)).status_code == 404
    listed = Client().get("/api/projects/alpha/tokens", **_bearer(admin_raw)).json()
    assert {t["name"] for t in listed} == {"admin", "ci"}
    stranger = _json(
        Client(),
        "post",
        "/api/projects/alpha/tokens",
        {"name": "x", "user": "nobody"},
        **_bearer(admin_raw),
    )
    assert stranger.status_code == 422 and stranger.json()["error"]["field"] == "user"
    revoked = Client().delete(
        f"/api/projects/alpha/tokens/{made.json()['id']}", **_bearer(admin_raw)
    )
    assert revoked.status_code == 204
    assert Client().get("/api/projects/alpha/runs", **_bearer(ci_raw)).status_code == 401


def test_a_token_over_its_rate_gets_429_with_retry_after(
    two_projects: tuple[Any, Project, Project], settings: Any
) -> None:
    settings.KEYSTONE_API_TOKEN_RATE_PER_MINUTE = 3
    dana, alpha, _ = two_projects
    _, busy = services.token_issue(project=alpha, user=dana, name="busy")
    _, calm = services.token_issue(project=alpha, user=dana, name="calm")
    # The limit counts per clock minute: start well inside one, so the four calls share it.
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)
    answers = [Client().get("/api/projects/alpha/runs", **_bearer(busy)) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    limited = answers[-1]
    assert limited.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(limited["Retry-After"]) <= 60
    assert Client().get("/api/projects/alpha/runs", **_bearer(calm)).status_code == 200
    browser = Client()
    browser.force_login(dana)
    assert all(browser.get("/api/projects/alpha/runs").status_code == 200 for _ in range(5))
