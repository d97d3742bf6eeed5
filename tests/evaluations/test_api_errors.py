"""Issue 16: one JSON error shape, `{"error": {"code", "message", "field"}}`, for every error
the API answers (schema validation, bad JSON, 401, 403, 404, 409, spec errors), and bad
input is never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import Membership, Project, Role

pytestmark = pytest.mark.django_db

SPEC = """\
version: 1
id: shape-agent
task: {prompt: "Say hello"}
agent: {type: command, command: "echo hello"}
invariants:
  greets: {description: d, check: {type: contains, value: hello}}
"""


@pytest.fixture
def bearer(project: Project, django_user_model: Any) -> Any:
    def make(role: str) -> dict[str, str]:
        user = django_user_model.objects.create_user(username=f"u-{role}", password="pw-123456")
        Membership.objects.create(project=project, user=user, role=Role(role))
        _, raw = services.token_issue(project=project, user=user, name="ci")
        return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}

    return make


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"code", "message", "field"} <= set(error), error
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


def _post(url: str, body: Any, headers: dict[str, str], raw: bool = False) -> Any:
    data = body if raw else json.dumps(body)
    return Client().post(url, data, content_type="application/json", **headers)


def test_401_without_a_token(project: Project) -> None:
    _error(Client().get("/api/projects/demo/runs"), 401, "unauthorized")
    bad = {"HTTP_AUTHORIZATION": "Bearer ks_nope"}
    _error(Client().get("/api/projects/demo/runs", **bad), 401, "unauthorized")


def test_403_names_the_role_needed(project: Project, bearer: Any) -> None:
    error = _error(
        _post("/api/projects/demo/specs", {"source_yaml": SPEC}, bearer("viewer")),
        403,
        "forbidden",
    )
    assert "editor" in error["message"]


def test_404_for_unknown_project_run_and_spec(project: Project, bearer: Any) -> None:
    headers = bearer("editor")
    _error(Client().get("/api/projects/elsewhere/runs", **headers), 404, "not_found")
    _error(Client().get("/api/projects/demo/runs/424242", **headers), 404, "not_found")
    missing_spec = _error(
        _post("/api/projects/demo/specs/nope/runs", {}, headers), 404, "not_found"
    )
    # Names what is missing (it was Django's "No Spec matches the given query.").
    assert missing_spec["message"] == "No spec 'nope' in this project."
    for url in ("specs/nope/versions", "specs/nope/baselines", "specs/nope/diff?a=1&b=2"):
        error = _error(Client().get(f"/api/projects/demo/{url}", **headers), 404, "not_found")
        assert error["message"] == "No spec 'nope' in this project.", url


def test_422_schema_errors_name_the_field(project: Project, bearer: Any) -> None:
    headers = bearer("editor")
    services.spec_version_create(project=project, source_yaml=SPEC)
    error = _error(
        _post("/api/projects/demo/specs/shape-agent/runs", {"replicas": "many"}, headers),
        422,
        "invalid",
    )
    assert error["field"] == "replicas"
    error = _error(_post("/api/projects/demo/specs", {}, headers), 422, "invalid")
    assert error["field"] == "source_yaml"
    error = _error(
        Client().get("/api/projects/demo/runs", {"limit": "lots"}, **headers), 422, "invalid"
    )
    assert error["field"] == "limit"
    error = _error(
        Client().get("/api/projects/demo/runs", {"status": "sideways"}, **headers),
        422,
        "invalid",
    )
    assert error["field"] == "status"


def test_400_for_a_body_that_is_not_json(project: Project, bearer: Any) -> None:
    response = _post("/api/projects/demo/specs", "{not json", bearer("editor"), raw=True)
    _error(response, 400, "bad_request")


def test_spec_errors_list_every_error_with_its_line(project: Project, bearer: Any) -> None:
    broken = SPEC.replace("type: contains", "type: no_such_check")
    error = _error(
        _post("/api/projects/demo/specs", {"source_yaml": broken}, bearer("editor")),
        422,
        "spec_invalid",
    )
    assert error["field"] == "invariants.greets.check.type"
    (detail,) = error["details"]
    assert detail["line"] == 6 and detail["path"] == "invariants.greets.check.type"


def test_409_for_the_same_idempotency_key_with_another_body(project: Project, bearer: Any) -> None:
    headers = {**bearer("editor"), "HTTP_IDEMPOTENCY_KEY": "k-1"}
    services.spec_version_create(project=project, source_yaml=SPEC)
    url = "/api/projects/demo/specs/shape-agent/runs"
    assert _post(url, {"replicas": 1}, headers).status_code == 202
    error = _error(_post(url, {"replicas": 2}, headers), 409, "conflict")
    assert error["field"] == "Idempotency-Key"


BAD_READS = [
    "/api/projects/demo/runs/abc",
    "/api/projects/demo/runs/99999999999999999999999",
    "/api/projects/demo/runs/-1/report",
    "/api/projects/demo/runs?cursor=%00%ff",
    "/api/projects/demo/runs?limit=-5",
    "/api/projects/demo/runs/1/report?format=pdf",
    "/api/projects/demo/regressions?since=yesterday-ish",
]


@pytest.mark.parametrize("url", BAD_READS)
def test_bad_input_is_a_4xx_in_the_error_shape_never_a_500(
    project: Project, bearer: Any, url: str
) -> None:
    response = Client().get(url, **bearer("admin"))
    assert 400 <= response.status_code < 500, (url, response.status_code, response.content)
    assert set(response.json()["error"]) >= {"code", "message", "field"}
