"""The REST API for machines: token and session auth, project scoping (404 outside, 403 for
a role too low), spec upload with every error's line, queuing / listing / reading /
reporting / cancelling runs, and issuing and revoking tokens on the settings page."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from evaluations import services
from evaluations.models import ApiToken, Membership, Project, Role, Run, RunStatus, Trigger
from tests.evaluations.views.run_data import synthetic_run, synthetic_version

pytestmark = pytest.mark.django_db

SPEC = """\
version: 1
id: ci-agent
task: {prompt: "Say hello"}
agent: {type: command, command: "echo hello"}
llm: {provider: scripted, rules: [{reply: {content: hello}}]}
chaos_matrix:
  - name: no-chaos
  - name: slow-llm
    llm_faults:
      - {mode: truncated_response, max_tokens: 20}
invariants:
  greets:
    description: "The answer greets"
    check: {type: contains, value: hello}
"""

# Two errors: an unknown check type on line 7 and a missing `task` (reported at the root).
INVALID_SPEC = """\
version: 1
id: broken-agent
agent: {type: command, command: "echo hello"}
invariants:
  greets:
    description: "x"
    check: {type: no_such_check}
"""


@pytest.fixture
def projects() -> tuple[Project, Project]:
    return (
        Project.objects.create(name="Mine", slug="mine"),
        Project.objects.create(name="Other", slug="other"),
    )


@pytest.fixture
def person(projects: tuple[Project, Project], django_user_model: Any) -> Any:
    def make(role: str, project: Project | None = None) -> Any:
        user = django_user_model.objects.create_user(
            username=f"{role}-{django_user_model.objects.count()}", password="pw-123456"
        )
        Membership.objects.create(project=project or projects[0], user=user, role=Role(role))
        return user

    return make


@pytest.fixture
def token(person: Any, projects: tuple[Project, Project]) -> Any:
    """The raw token of a new member with `role` in `project` (default: mine)."""

    def make(role: str = "editor", project: Project | None = None) -> str:
        project = project or projects[0]
        _, raw = services.token_issue(project=project, user=person(role, project), name="ci")
        return raw

    return make


def call(method: str, url: str, raw: str | None = None, body: Any = None, **extra: Any) -> Any:
    client = Client()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"} if raw else {}
    if method == "get":
        return client.get(url, body or {}, **headers, **extra)
    return client.post(url, json.dumps(body or {}), content_type="application/json", **headers)


def spec_in(project: Project, source: str = SPEC) -> Any:
    return services.spec_version_create(project=project, source_yaml=source)


# --- Authentication and project scoping ---------------------------------------------------


def test_health_needs_no_token() -> None:
    response = Client().get("/api/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


@pytest.mark.parametrize("header", [None, "Bearer ks_not-a-real-token", "Basic dXNlcjpwdw=="])
def test_missing_or_unknown_token_is_401(header: str | None) -> None:
    headers = {"HTTP_AUTHORIZATION": header} if header else {}
    response = Client().get("/api/projects/mine/runs", **headers)
    assert response.status_code == 401


def test_revoked_token_is_401(token: Any, projects: tuple[Project, Project]) -> None:
    raw = token("viewer")
    assert call("get", "/api/projects/mine/runs", raw).status_code == 200
    row = ApiToken.objects.get(token_hash=ApiToken.hash_token(raw))
    services.token_revoke(project=projects[0], token_id=row.pk)
    assert call("get", "/api/projects/mine/runs", raw).status_code == 401


def test_token_of_one_project_is_404_on_another_even_for_a_member_there(
    person: Any, projects: tuple[Project, Project]
) -> None:
    mine, other = projects
    user = person("admin", mine)
    Membership.objects.create(project=other, user=user, role=Role.ADMIN)
    _, raw = services.token_issue(project=mine, user=user, name="ci")
    spec_in(other)

    assert call("get", "/api/projects/other/runs", raw).status_code == 404
    response = call("post", "/api/projects/other/specs", raw, {"source_yaml": SPEC})
    assert response.status_code == 404
    assert call("get", "/api/projects/mine/runs", raw).status_code == 200


def test_viewer_token_reads_but_cannot_write(token: Any, projects: tuple[Project, Project]) -> None:
    raw = token("viewer")
    spec_in(projects[0])
    assert call("get", "/api/projects/mine/runs", raw).status_code == 200
    upload = call("post", "/api/projects/mine/specs", raw, {"source_yaml": SPEC})
    assert upload.status_code == 403
    assert "editor" in upload.json()["error"]["message"]
    start = call("post", "/api/projects/mine/specs/ci-agent/runs", raw, {})
    assert start.status_code == 403
    assert not Run.objects.exists()


def test_token_acts_with_its_users_current_role(
    token: Any, projects: tuple[Project, Project]
) -> None:
    raw = token("editor")
    row = ApiToken.objects.get(token_hash=ApiToken.hash_token(raw))
    Membership.objects.filter(user=row.user).update(role=Role.VIEWER)
    assert call("post", "/api/projects/mine/specs", raw, {"source_yaml": SPEC}).status_code == 403
    Membership.objects.filter(user=row.user).delete()  # removed from the project
    assert call("get", "/api/projects/mine/runs", raw).status_code == 404


def test_using_a_token_marks_it_used_at_most_once_a_minute(token: Any) -> None:
    raw = token("viewer")
    row = ApiToken.objects.get(token_hash=ApiToken.hash_token(raw))
    assert row.last_used is None
    call("get", "/api/projects/mine/runs", raw)
    row.refresh_from_db()
    first = row.last_used
    assert first is not None
    call("get", "/api/projects/mine/runs", raw)
    row.refresh_from_db()
    assert row.last_used == first
    ApiToken.objects.filter(pk=row.pk).update(last_used=first - timedelta(minutes=2))
    call("get", "/api/projects/mine/runs", raw)
    row.refresh_from_db()
    assert row.last_used is not None and row.last_used > first - timedelta(minutes=1)


def test_session_auth_for_members_404_for_others_and_csrf_on_writes(
    person: Any, projects: tuple[Project, Project]
) -> None:
    spec_in(projects[0])
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(person("editor"))
    assert browser.get("/api/projects/mine/runs").status_code == 200
    # A session without the CSRF token may not write (a page of another site could).
    refused = browser.post(
        "/api/projects/mine/specs/ci-agent/runs", "{}", content_type="application/json"
    )
    assert refused.status_code == 403
    assert not Run.objects.exists()

    outsider = Client()
    outsider.force_login(person("admin", projects[1]))
    assert outsider.get("/api/projects/mine/runs").status_code == 404
    assert outsider.get("/api/projects/nowhere/runs").status_code == 404


# --- Specs --------------------------------------------------------------------------------


def test_spec_upload_creates_versions_and_same_text_is_not_a_new_one(token: Any) -> None:
    raw = token("editor")
    first = call("post", "/api/projects/mine/specs", raw, {"source_yaml": SPEC})
    assert first.status_code == 201
    assert first.json() == {"spec": "ci-agent", "version": 1, "created": True}

    again = call("post", "/api/projects/mine/specs", raw, {"source_yaml": SPEC})
    assert again.status_code == 200
    assert again.json() == {"spec": "ci-agent", "version": 1, "created": False}

    changed = SPEC.replace("Say hello", "Say hello twice")
    second = call("post", "/api/projects/mine/specs", raw, {"source_yaml": changed})
    assert second.status_code == 201
    assert second.json()["version"] == 2


def test_invalid_spec_is_422_with_every_error_and_its_line(token: Any) -> None:
    raw = token("editor")
    response = call("post", "/api/projects/mine/specs", raw, {"source_yaml": INVALID_SPEC})

    assert response.status_code == 422
    errors = response.json()["error"]["details"]
    assert len(errors) >= 2
    assert all(set(e) == {"message", "path", "line", "column"} for e in errors)
    by_path = {e["path"]: e for e in errors}
    assert by_path["invariants.greets.check.type"]["line"] == 7
    assert any("task" in e["message"] for e in errors)
    assert not Project.objects.get(slug="mine").specs.exists()


def test_spec_upload_without_source_is_422(token: Any) -> None:
    response = call("post", "/api/projects/mine/specs", token("editor"), {})
    assert response.status_code == 422


# --- Runs ---------------------------------------------------------------------------------


def test_run_start_queues_a_run_with_the_requests_overrides(
    token: Any, projects: tuple[Project, Project]
) -> None:
    raw = token("editor")
    version = spec_in(projects[0])
    body = {
        "replicas": 3,
        "scenarios": ["slow-llm"],
        "labels": {"branch": "main", "git_sha": "abc123"},
    }
    response = call("post", "/api/projects/mine/specs/ci-agent/runs", raw, body)

    assert response.status_code == 202
    data = response.json()
    run = Run.objects.get(pk=data["id"])
    assert data["status"] == "queued" == run.status
    assert data["url"].endswith(f"/api/projects/mine/runs/{run.pk}")
    assert data["web_url"].endswith(reverse("run_detail", args=["mine", run.pk]))
    assert run.spec_version == version
    assert run.trigger == Trigger.API
    assert run.replicas_override == 3
    assert run.options["scenarios"] == ["slow-llm"]
    assert (run.branch, run.git_sha) == ("main", "abc123")
    assert run.created_by == ApiToken.objects.get().user


def test_run_start_of_a_chosen_version_and_refusals(
    token: Any, projects: tuple[Project, Project]
) -> None:
    raw = token("editor")
    first = spec_in(projects[0])
    spec_in(projects[0], SPEC.replace("Say hello", "Say hi"))
    url = "/api/projects/mine/specs/ci-agent/runs"

    response = call("post", url, raw, {"version": 1})
    assert response.status_code == 202
    assert Run.objects.get(pk=response.json()["id"]).spec_version == first

    missing = call("post", url, raw, {"version": 9})
    assert missing.status_code == 422
    assert missing.json()["error"]["field"] == "version"
    unknown = call("post", url, raw, {"scenarios": ["nope"]})
    assert unknown.status_code == 422
    assert "nope" in unknown.json()["error"]["message"]
    assert call("post", url, raw, {"replicas": 0}).status_code == 422
    assert call("post", "/api/projects/mine/specs/no-spec/runs", raw, {}).status_code == 404
    assert Run.objects.count() == 1


def test_run_list_pages_with_a_cursor_and_filters(
    token: Any, projects: tuple[Project, Project]
) -> None:
    raw = token("viewer")
    version = spec_in(projects[0])
    now = timezone.now()
    runs = [
        Run.objects.create(
            project=projects[0],
            spec_version=version,
            created=now - timedelta(minutes=i),
            status=RunStatus.COMPLETED if i % 2 else RunStatus.QUEUED,
        )
        for i in range(5)
    ]
    Run.objects.create(project=projects[1], spec_version=spec_in(projects[1]))  # invisible

    seen: list[int] = []
    cursor = ""
    pages = 0
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = call("get", "/api/projects/mine/runs", raw, params).json()
        pages += 1
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert pages == 3
    assert seen == [run.pk for run in runs]  # newest first, each run once

    item = call("get", "/api/projects/mine/runs", raw).json()["items"][0]
    assert set(item) == {
        "id", "spec", "version", "status", "composite", "pass_rate", "resilience",
        "overall", "gate_passed", "exit_code", "cost_usd", "created",
    }  # fmt: skip
    assert (item["spec"], item["version"]) == ("ci-agent", 1)

    completed = call("get", "/api/projects/mine/runs", raw, {"status": "completed"}).json()
    assert [i["id"] for i in completed["items"]] == [runs[1].pk, runs[3].pk]
    assert call("get", "/api/projects/mine/runs", raw, {"spec": "other"}).json()["items"] == []
    assert call("get", "/api/projects/mine/runs", raw, {"status": "bogus"}).status_code == 422
    assert call("get", "/api/projects/mine/runs", raw, {"cursor": "!!"}).status_code == 422


def test_run_detail_has_scores_gates_pillars_and_progress(
    token: Any, projects: tuple[Project, Project]
) -> None:
    raw = token("viewer")
    run = synthetic_run(synthetic_version(projects[0], replicas=2))

    response = call("get", f"/api/projects/mine/runs/{run.pk}", raw)

    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "completed"
    assert data["exit_code"] == run.exit_code
    assert data["pass_rate"] == run.pass_rate
    assert data["progress"] == {
        "executions_done": run.execution_count,
        "execution_count": run.execution_count,
    }
    assert data["progress"]["execution_count"] > 0
    assert data["gates"] == run.summary["gates"]
    assert data["pillar_scores"] == run.summary["pillar_scores"]
    assert data["verdict"] == run.summary["verdict"]
    other = synthetic_run(synthetic_version(projects[1]))
    assert call("get", f"/api/projects/mine/runs/{other.pk}", raw).status_code == 404


def test_reports_in_every_format_parse(token: Any, projects: tuple[Project, Project]) -> None:
    raw = token("viewer")
    run = synthetic_run(synthetic_version(projects[0], replicas=2))
    url = f"/api/projects/mine/runs/{run.pk}/report"

    as_json = call("get", url, raw, {"format": "json"})
    assert as_json["Content-Type"] == "application/json"
    report = json.loads(as_json.content)
    assert report["summary"]["exit_code"] == run.exit_code
    assert len(report["executions"]) == run.execution_count

    junit = call("get", url, raw, {"format": "junit"})
    assert junit["Content-Type"] == "application/xml"
    root = ET.fromstring(junit.content)
    cases = root.findall(".//testcase")
    assert cases
    assert root.findall(".//failure")  # `cites` fails in the synthetic run

    markdown = call("get", url, raw, {"format": "md"})
    assert markdown["Content-Type"].startswith("text/markdown")
    assert run.spec.slug in markdown.content.decode()

    assert call("get", url, raw, {"format": "pdf"}).status_code == 422


def test_cancel_stops_a_queued_run_and_needs_an_editor(
    token: Any, projects: tuple[Project, Project]
) -> None:
    version = spec_in(projects[0])
    run = Run.objects.create(project=projects[0], spec_version=version)
    url = f"/api/projects/mine/runs/{run.pk}/cancel"

    assert call("post", url, token("viewer")).status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED

    response = call("post", url, token("editor"))
    assert response.status_code == 202
    assert response.json() == {"id": run.pk, "status": "cancelled"}
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


# --- Tokens on the settings page -----------------------------------------------------------


def test_admin_issues_a_token_shown_once_and_only_its_hash_is_stored(
    person: Any, projects: tuple[Project, Project]
) -> None:
    admin, viewer = person("admin"), person("viewer")
    browser = Client()
    browser.force_login(admin)
    tokens_url = reverse("project_tokens", args=["mine"])

    issued = browser.post(tokens_url, {"action": "issue", "name": "github", "user": viewer.pk})

    assert issued.status_code == 200
    page = issued.content.decode()
    row = ApiToken.objects.get()
    raw = page.split('id="new-token">')[1].split("<")[0]
    assert raw.startswith("ks_") and raw.startswith(row.prefix)
    assert row.token_hash == ApiToken.hash_token(raw)
    assert (row.user, row.name, row.project) == (viewer, "github", projects[0])
    stored = [str(value) for value in ApiToken.objects.values_list().get()]
    assert not any(raw in value for value in stored)
    assert issued["Cache-Control"] == "no-store"

    # Shown once: the settings page lists the token by prefix, never the raw value.
    later = browser.get(reverse("project_settings", args=["mine"])).content.decode()
    assert row.prefix in later and "github" in later
    assert raw not in later

    # It acts as the viewer it was issued for.
    assert call("get", "/api/projects/mine/runs", raw).status_code == 200
    assert call("post", "/api/projects/mine/specs", raw, {"source_yaml": SPEC}).status_code == 403

    revoked = browser.post(tokens_url, {"action": "revoke", "token": row.pk})
    assert revoked.status_code == 200
    assert "revoked" in revoked.content.decode()
    assert ApiToken.objects.get().revoked
    assert call("get", "/api/projects/mine/runs", raw).status_code == 401


def test_token_page_refusals(person: Any, projects: tuple[Project, Project]) -> None:
    tokens_url = reverse("project_tokens", args=["mine"])
    editor = Client()
    editor.force_login(person("editor"))
    assert editor.post(tokens_url, {"action": "issue", "name": "x"}).status_code == 403

    admin = Client()
    admin.force_login(person("admin"))
    nameless = admin.post(tokens_url, {"action": "issue", "name": "  "})
    assert nameless.status_code == 400
    assert "name" in nameless.content.decode()
    stranger = person("admin", projects[1])
    foreign = admin.post(tokens_url, {"action": "issue", "name": "x", "user": stranger.pk})
    assert foreign.status_code == 400
    other_token, _ = services.token_issue(project=projects[1], user=stranger, name="theirs")
    assert admin.post(tokens_url, {"action": "revoke", "token": other_token.pk}).status_code == 400
    other_token.refresh_from_db()
    assert not other_token.revoked
    assert not ApiToken.objects.filter(project=projects[0]).exists()
