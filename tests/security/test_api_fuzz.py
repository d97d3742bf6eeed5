"""Issue 13, proof: bounded fuzzing of the API's bodies and query strings. Whatever a client
sends (any JSON value, the right keys with the wrong kinds of values, bytes that are not JSON,
odd query parameters), the answer is a 4xx or a success, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluations import services
from evaluations.models import Membership, Project, Role

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

SPEC = """\
version: 1
id: fuzzed
task: {prompt: "Say hello"}
agent: {type: command, command: "echo hello"}
invariants:
  greets: {description: "greets", check: {type: contains, value: hello}}
"""

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
# The keys the endpoints know, each with any kind of value: past the "not an object" check.
KEYS = ["source_yaml", "version", "replicas", "scenarios", "labels", "name", "condition",
        "window", "specs", "branches", "channel", "enabled", "cooldown_minutes"]  # fmt: skip
known_shape = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6)
bodies = (
    json_values.map(json.dumps)
    | known_shape.map(json.dumps)
    | st.binary(max_size=80).map(lambda raw: raw.decode("latin-1"))
)

FUZZ = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def editor_token(django_user_model: Any) -> tuple[str, Project]:
    project = Project.objects.create(name="Fuzz", slug="fuzz")
    user = django_user_model.objects.create_user(username="fuzzer", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    services.spec_version_create(project=project, source_yaml=SPEC)
    _, raw = services.token_issue(project=project, user=user, name="fuzz")
    return raw, project


def _post(raw: str, url: str, body: str) -> int:
    response = Client().post(
        url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}"
    )
    return int(response.status_code)


@pytest.mark.parametrize(
    "path",
    ["/specs", "/specs/fuzzed/runs", "/alert-rules"],
)
def test_any_body_gets_an_answer_never_a_500(editor_token: tuple[str, Project], path: str) -> None:
    raw, project = editor_token
    url = f"/api/projects/{project.slug}{path}"

    @FUZZ
    @given(bodies)
    def check(body: str) -> None:
        status = _post(raw, url, body)
        assert status < 500, (url, body, status)

    check()


def test_any_query_string_gets_an_answer_never_a_500(editor_token: tuple[str, Project]) -> None:
    raw, project = editor_token
    params = st.dictionaries(
        st.sampled_from(
            ["cursor", "status", "label", "spec", "limit", "branch", "since", "trigger"]
        ),
        st.text(max_size=30),
        max_size=4,
    )

    @FUZZ
    @given(params, st.sampled_from(["/runs", "/regressions", "/runs/1", "/runs/99999/report"]))
    def check(query: dict[str, str], path: str) -> None:
        url = f"/api/projects/{project.slug}{path}"
        response = Client().get(url, query, HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert response.status_code < 500, (url, query, response.status_code)

    check()


def test_pages_answer_any_query_string_never_a_500(
    editor_token: tuple[str, Project], django_user_model: Any
) -> None:
    _, project = editor_token
    client = Client()
    client.force_login(django_user_model.objects.get(username="fuzzer"))
    params = st.dictionaries(
        st.sampled_from(
            ["status", "label", "spec", "branch", "page", "since", "q", "run", "against"]
        ),
        st.text(max_size=30),
        max_size=3,
    )
    pages = ["/", "/runs/", "/specs/", "/regressions/", "/review/", "/specs/fuzzed/"]

    @FUZZ
    @given(params, st.sampled_from(pages))
    def check(query: dict[str, str], page: str) -> None:
        url = f"/p/{project.slug}{page}"
        response = client.get(url, query)
        assert response.status_code < 500, (url, query, response.status_code)

    check()
