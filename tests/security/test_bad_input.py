"""Issue 13, item 9: bad input gets a 4xx that names the problem, never a 500; a revoked
token on a POST is a 401, not a CSRF 403 from the session fallback."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import ApiToken, Membership, Project, Role

pytestmark = pytest.mark.django_db

SPEC = """\
version: 1
id: weights
task: {prompt: "p"}
agent: {type: command, command: "echo hi"}
invariants:
  a: {description: d, weight: WEIGHT, check: {type: contains, value: hi}}
"""


@pytest.fixture
def editor(project: Project, django_user_model: Any) -> tuple[Client, str]:
    user = django_user_model.objects.create_user(username="ci", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.EDITOR)
    _, raw = services.token_issue(project=project, user=user, name="ci")
    # CSRF is enforced, as for a real client: a token request must not depend on it.
    return Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {raw}"), raw


def _upload(client: Client, project: Project, body: Any) -> Any:
    return client.post(
        f"/api/projects/{project.slug}/specs", json.dumps(body), content_type="application/json"
    )


@pytest.mark.parametrize("weight", [".nan", ".inf", "-.inf"])
def test_a_weight_that_is_not_a_finite_number_is_422_at_its_line(
    project: Project, editor: tuple[Client, str], weight: str
) -> None:
    response = _upload(editor[0], project, {"source_yaml": SPEC.replace("WEIGHT", weight)})
    assert response.status_code == 422
    first = response.json()["error"]["details"][0]
    assert first["path"] == "invariants.a.weight" and first["line"] == 6
    assert first["message"] == f"{weight} is not a finite number"


def test_a_nul_byte_in_the_spec_is_422_at_its_position(
    project: Project, editor: tuple[Client, str]
) -> None:
    response = _upload(editor[0], project, {"source_yaml": SPEC.replace("echo", "ec\x00ho")})
    assert response.status_code == 422
    assert "x00" in response.json()["error"]["details"][0]["message"]


@pytest.mark.parametrize("body", [[], "a string", 42, None])
def test_a_body_that_is_not_an_object_is_4xx(
    project: Project, editor: tuple[Client, str], body: Any
) -> None:
    response = _upload(editor[0], project, body)
    assert 400 <= response.status_code < 500
    assert response.status_code != 403


def test_a_revoked_token_on_a_post_is_401_not_a_csrf_403(
    project: Project, editor: tuple[Client, str]
) -> None:
    client, raw = editor
    row = ApiToken.objects.get(token_hash=ApiToken.hash_token(raw))
    services.token_revoke(project=project, token_id=row.pk)
    response = _upload(client, project, {"source_yaml": SPEC.replace("WEIGHT", "1")})
    assert response.status_code == 401
