"""Issue 16 (and issue 20, item 2): a CI job that retries `POST .../runs` with the same
`Idempotency-Key` gets the run the first request made, never a duplicate; the same key with
another body is a 409 that says so."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import Membership, Project, Role, Run

pytestmark = pytest.mark.django_db

SPEC = """\
version: 1
id: once
task: {prompt: "p"}
agent: {type: command, command: "echo hi"}
invariants:
  hi: {description: hi, check: {type: contains, value: hi}}
"""


@pytest.fixture
def client(project: Project, django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user(username="ci", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.EDITOR)
    _, raw = services.token_issue(project=project, user=user, name="ci")
    services.spec_version_create(project=project, source_yaml=SPEC)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def _start(client: Client, project: Project, body: dict[str, Any], key: str | None) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(
        f"/api/projects/{project.slug}/specs/once/runs",
        json.dumps(body),
        content_type="application/json",
        **headers,
    )


def test_the_same_key_twice_makes_one_run(client: Client, project: Project) -> None:
    first = _start(client, project, {"labels": {"branch": "main"}}, "ci-42-attempt")
    again = _start(client, project, {"labels": {"branch": "main"}}, "ci-42-attempt")
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    assert Run.objects.count() == 1


def test_the_same_key_with_another_body_is_a_409(client: Client, project: Project) -> None:
    assert _start(client, project, {"replicas": 1}, "k").status_code == 202
    conflict = _start(client, project, {"replicas": 2}, "k")
    assert conflict.status_code == 409
    assert "Idempotency-Key 'k' already made run" in conflict.json()["error"]["message"]
    assert Run.objects.count() == 1


def test_without_a_key_every_request_is_a_new_run(client: Client, project: Project) -> None:
    _start(client, project, {}, None)
    _start(client, project, {}, None)
    assert Run.objects.count() == 2


def test_a_key_longer_than_what_is_stored_is_a_422_not_another_keys_run(
    client: Client, project: Project
) -> None:
    """Keys were cut to their first 200 characters: two CI jobs whose long keys share those
    got one run between them (or a 409 about the other's body)."""
    first, second = "job-" + "a" * 200 + "-1", "job-" + "a" * 200 + "-2"
    for key in (first, second):
        refused = _start(client, project, {"labels": {"branch": "main"}}, key)
        assert refused.status_code == 422, refused.content
        error = refused.json()["error"]
        assert error["field"] == "Idempotency-Key" and "at most 200" in error["message"]
    assert Run.objects.count() == 0
    fits = _start(client, project, {}, "k" * 200)
    assert fits.status_code == 202 and Run.objects.count() == 1


def test_a_run_of_no_replicas_is_refused_and_none_other_is_handed_back(project: Project) -> None:
    """`keystone run --replicas -1` reached the database, whose refusal was taken for the
    race of two requests with one Idempotency-Key: the run handed back was an earlier one
    of the project's, unrelated (any run without a key)."""
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    earlier = services.run_create(spec_version=version, enqueue=False)
    for replicas in (0, -1):
        with pytest.raises(ValueError, match="replicas: expected a whole number of at least 1"):
            services.run_create(spec_version=version, replicas=replicas, enqueue=False)
    assert list(Run.objects.values_list("pk", flat=True)) == [earlier.pk]


@pytest.mark.django_db(transaction=True)
def test_a_row_the_database_refuses_is_an_error_without_an_idempotency_key(
    project: Project, django_user_model: Any
) -> None:
    from django.db import IntegrityError

    version = services.spec_version_create(project=project, source_yaml=SPEC)
    earlier = services.run_create(spec_version=version, enqueue=False)
    with pytest.raises(IntegrityError):
        # A user who does not exist: the foreign key refuses the row when it is committed.
        services.run_create(
            spec_version=version, created_by=django_user_model(pk=10**9), enqueue=False
        )
    assert list(Run.objects.values_list("pk", flat=True)) == [earlier.pk]
