"""A NUL character in a query parameter, a form field or a JSON string is a 400 naming where,
on every page and endpoint, on both databases (PostgreSQL cannot store one: it was a 500)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import Membership, Project, Role

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


@pytest.fixture
def member(django_user_model: Any) -> tuple[Client, str, Project]:
    project = Project.objects.create(name="Nul", slug="nul")
    user = django_user_model.objects.create_user(username="nul", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    _, raw = services.token_issue(project=project, user=user, name="nul")
    client = Client()
    client.force_login(user)
    return client, raw, project


def test_nul_in_a_query_parameter_is_a_400_naming_it(member: tuple[Client, str, Project]) -> None:
    client, raw, _ = member
    api = client.get("/api/projects/nul/runs", {"spec": "a\0b"}, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.status_code == 400
    assert api.json()["error"]["field"] == "query parameter 'spec'"
    page = client.get("/p/nul/runs/", {"label": "\0"})
    assert page.status_code == 400 and b"query parameter 'label'" in page.content


def test_nul_in_a_json_string_is_a_400_naming_its_path(member: tuple[Client, str, Project]) -> None:
    client, raw, _ = member
    services.spec_version_create(
        project=member[2],
        source_yaml='version: 1\nid: s\ntask: {prompt: "p"}\nagent: {type: command, command: "echo hi"}\n'
        "invariants:\n  hi: {description: hi, check: {type: contains, value: hi}}\n",
    )
    response = client.post(
        "/api/projects/nul/specs/s/runs",
        json.dumps({"labels": {"branch": "main\0"}}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 400
    assert "body.labels.branch" in response.json()["error"]["message"]


def test_a_nul_in_the_spec_text_is_still_reported_at_its_line(
    member: tuple[Client, str, Project],
) -> None:
    client, raw, _ = member
    response = client.post(
        "/api/projects/nul/specs",
        json.dumps({"source_yaml": "version: 1\nid: x\0y\n"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert response.status_code == 422, response.content
    assert "line 2" in response.content.decode() or '"line": 2' in response.content.decode()
