"""Text longer than the database column that stores it is refused where it is given, with
the field (and, in a spec, the line) named, before anything is written: PostgreSQL refused
it in the middle of the write (a 500), or later, in a worker (a run queued or running for
ever). SQLite stores any length, so these tests also hold there."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from checks.exit_codes import EXIT_SPEC_INVALID
from checks.spec import SpecValidationError
from evaluations import services
from evaluations.models import Membership, Project, Role, Run, Spec, SpecVersion
from tests.cli_helpers import embedded_env, run_keystone

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

SPEC = """\
version: 1
id: {id}
task: {{prompt: "Say hello"}}
agent: {{type: command, command: "echo hello"}}
chaos_matrix:
  - name: {scenario}
invariants:
  {invariant}: {{description: d, check: {{type: contains, value: hello}}}}
"""


@pytest.fixture
def editor(project: Project, django_user_model: Any) -> dict[str, str]:
    user = django_user_model.objects.create_user(username="ed", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    _, raw = services.token_issue(project=project, user=user, name="ci")
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def _post(url: str, body: Any, headers: dict[str, str]) -> Any:
    return Client().post(url, json.dumps(body), content_type="application/json", **headers)


def _refusal_details(text: str, path: str, headers: dict[str, str]) -> list[Any]:
    """The one detail each of the spec and run endpoints answers `text` with: a 422 that
    names `path` as its field."""
    details = []
    for url in ("/api/projects/demo/specs", "/api/projects/demo/runs"):
        response = _post(url, {"source_yaml": text}, headers)
        assert response.status_code == 422, response.content
        error = response.json()["error"]
        assert error["code"] == "spec_invalid" and error["field"] == path
        (detail,) = error["details"]
        details.append(detail)
    return details


@pytest.mark.parametrize(
    ("names", "path", "line", "message"),
    [
        (
            {"id": "a" * 101},
            "id",
            2,
            "the spec id is too long: at most 100 characters, got 101",
        ),
        (
            {"scenario": "s" * 201},
            "chaos_matrix[0].name",
            6,
            "the scenario name is too long: at most 200 characters, got 201",
        ),
        (
            {"invariant": "i" * 201},
            "invariants." + "i" * 201,
            8,
            "the invariant id is too long: at most 200 characters, got 201",
        ),
    ],
    ids=["spec-id", "scenario-name", "invariant-id"],
)
def test_a_spec_name_too_long_for_its_column_is_a_422_at_its_line(
    project: Project,
    editor: dict[str, str],
    names: dict[str, str],
    path: str,
    line: int,
    message: str,
) -> None:
    text = SPEC.format(**{"id": "long-names", "scenario": "calm", "invariant": "greets", **names})
    for detail in _refusal_details(text, path, editor):
        assert (detail["path"], detail["line"], detail["message"]) == (path, line, message)
    assert not Spec.objects.exists()  # nothing half-stored


def test_names_at_the_limit_are_stored_and_run(project: Project, editor: dict[str, str]) -> None:
    text = SPEC.format(id="a" * 100, scenario="s" * 200, invariant="i" * 200)
    response = _post("/api/projects/demo/runs", {"source_yaml": text}, editor)
    assert response.status_code == 202, response.content
    from evaluations.services.projects import _demo_run_now

    _demo_run_now(response.json()["id"])
    run = Spec.objects.get().runs.get()
    assert run.status == "completed", (run.status, run.summary)
    (execution,) = run.executions.all()
    assert execution.scenario == "s" * 200
    assert execution.check_results.get().invariant_id == "i" * 200


JUDGED = """\
version: 1
id: judged
task: {{prompt: "Say hello"}}
agent: {{type: command, command: "echo hello"}}
judge:
  provider: scripted
  model: {judge_model}
  rules: [{{score: 0.9, reason: polite}}]
invariants:
  polite:
    description: d
    check: {{type: llm_as_judge, criteria: "is polite", model: {check_model}}}
"""


@pytest.mark.parametrize(
    ("models", "path", "line"),
    [
        ({"judge_model": "m" * 201}, "judge.model", 7),
        ({"check_model": "m" * 201}, "invariants.polite.check.model", 12),
    ],
    ids=["judge-block", "check"],
)
def test_a_judge_model_name_too_long_for_its_column_is_a_422_at_its_line(
    project: Project, editor: dict[str, str], models: dict[str, str], path: str, line: int
) -> None:
    """The model name is stored with each review item the judge sends people: a longer one
    was accepted here, then broke finalising the run (PostgreSQL refused the review item)."""
    text = JUDGED.format(**{"judge_model": "scripted-judge", "check_model": "judge-1", **models})
    message = "the judge model name is too long: at most 200 characters, got 201"
    for detail in _refusal_details(text, path, editor):
        assert (detail["path"], detail["line"], detail["message"]) == (path, line, message)
    assert not Spec.objects.exists()


def test_judge_model_names_at_the_limit_are_stored_with_the_review_item(
    project: Project, editor: dict[str, str]
) -> None:
    text = JUDGED.format(judge_model="j" * 200, check_model="m" * 200)
    response = _post("/api/projects/demo/runs", {"source_yaml": text}, editor)
    assert response.status_code == 202, response.content
    from evaluations.services.projects import _demo_run_now
    from evaluations.services.reviews import review_send

    _demo_run_now(response.json()["id"])
    run = Spec.objects.get().runs.get()
    assert run.status == "completed", (run.status, run.summary)
    result = run.check_results.get()
    item = review_send(result_id=result.pk, user=project.memberships.get().user)
    assert item.judge_model == "m" * 200  # the check's model, which the judge answered with


def test_a_nul_character_in_a_spec_is_a_422_at_its_line(
    project: Project, editor: dict[str, str]
) -> None:
    """YAML's "\\0" escape makes a NUL character, which PostgreSQL stores in no text or
    JSON column: the spec was accepted, then refused while being stored (a 500)."""
    text = SPEC.format(id="nul", scenario="calm", invariant="greets").replace(
        '"Say hello"', '"Say\\0 hello"'
    )
    assert "\x00" not in text  # the escape, not the character (the API refuses that one)
    for url in ("/api/projects/demo/specs", "/api/projects/demo/runs"):
        response = _post(url, {"source_yaml": text}, editor)
        assert response.status_code == 422, response.content[:300]
        error = response.json()["error"]
        assert error["code"] == "spec_invalid" and error["field"] == "task.prompt"
        (detail,) = error["details"]
        assert (detail["path"], detail["line"], detail["message"]) == (
            "task.prompt",
            3,
            "contains a NUL character (\\0), which cannot be stored",
        )
    assert not Spec.objects.exists()


VALID = SPEC.format(id="labelled", scenario="calm", invariant="greets")


def _deep_directory(root: Path, length: int) -> Path:
    """A directory under `root` whose absolute path is `length` characters long (components
    of at most 200: a file name is at most 255 bytes)."""
    path = root.resolve()
    while len(str(path)) < length:
        path /= "d" * min(200, length - len(str(path)) - 1)
    assert len(str(path)) == length
    path.mkdir(parents=True)
    return path


def test_a_spec_directory_too_long_for_its_column_is_refused_naming_it(
    project: Project, tmp_path: Path
) -> None:
    """The directory a spec was read from (`keystone run`, the demo) is stored with its
    version, for its relative paths: a longer one than the column was refused by PostgreSQL in
    the middle of the write, and stored whole by SQLite."""
    limit = SpecVersion._meta.get_field("base_dir").max_length
    assert limit == 1000
    with pytest.raises(SpecValidationError) as refused:
        services.spec_version_create(
            project=project,
            source_yaml=VALID,
            base_dir=str(_deep_directory(tmp_path / "long", limit + 1)),
            read_from_files=True,
        )
    (error,) = refused.value.errors
    assert (error.path, error.message) == (
        "base_dir",
        "the directory the spec was read from is too long to store: at most 1000 characters,"
        " got 1001",
    )
    assert not Spec.objects.exists()  # nothing half-stored
    fits = str(_deep_directory(tmp_path / "fits", limit))
    version = services.spec_version_create(
        project=project, source_yaml=VALID, base_dir=fits, read_from_files=True
    )
    version.refresh_from_db()
    assert version.base_dir == fits


def test_keystone_run_from_a_directory_too_long_to_store_says_so_and_runs_nothing(
    tmp_path: Path,
) -> None:
    spec = _deep_directory(tmp_path / "specs", 1100) / "labelled.yaml"
    spec.write_text(VALID)
    home = tmp_path / "home"
    done = run_keystone("run", str(spec), env=embedded_env(home))
    assert done.returncode == EXIT_SPEC_INVALID, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert (
        "base_dir: the directory the spec was read from is too long to store: at most 1000"
        " characters, got 1100" in done.stderr
    )
    assert f"{spec}: refused; nothing was run" in done.stderr
    with sqlite3.connect(home / "keystone.sqlite3") as stored:
        assert stored.execute("SELECT count(*) FROM evaluations_specversion").fetchone() == (0,)


@pytest.mark.parametrize(("label", "limit"), [("git_sha", 64), ("branch", 255)])
def test_a_label_too_long_for_its_column_is_a_422_naming_it(
    project: Project, editor: dict[str, str], label: str, limit: int
) -> None:
    body = {"source_yaml": VALID, "labels": {label: "x" * (limit + 1)}}
    response = _post("/api/projects/demo/runs", body, editor)
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["field"] == f"labels.{label}"
    assert error["message"] == f"at most {limit} characters, got {limit + 1}"
    assert not Run.objects.exists()
    body["labels"] = {label: "x" * limit}
    assert _post("/api/projects/demo/runs", body, editor).status_code == 202
    assert Run.objects.get().labels[label] == "x" * limit


def test_the_run_form_names_a_label_too_long_and_keeps_the_labels(
    project: Project, django_user_model: Any
) -> None:
    services.spec_version_create(project=project, source_yaml=VALID)
    user = django_user_model.objects.create_user(username="web", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.EDITOR)
    client = Client()
    client.force_login(user)
    labels = "env=staging\nbranch=" + "b" * 256
    response = client.post("/p/demo/specs/labelled/run/", {"labels": labels})
    assert response.status_code == 400
    page = response.content.decode()
    assert "labels.branch: at most 255 characters, got 256" in page
    assert "b" * 256 in page  # the text typed is still in the form
    assert not Run.objects.exists()


def test_an_alert_rule_name_too_long_is_a_422_naming_it(
    project: Project, editor: dict[str, str]
) -> None:
    body = {"name": "r" * 101, "condition": "pass_rate < 0.9"}
    response = _post("/api/projects/demo/alert-rules", body, editor)
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert (error["field"], error["message"]) == ("name", "at most 100 characters, got 101")
    assert not project.alert_rules.exists()


@pytest.fixture
def admin_client(project: Project, django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user(
        username="root", password="pw-123456", is_superuser=True
    )
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("form", "message"),
    [
        (
            {"action": "channel_add", "name": "c" * 101, "kind": "email", "target": "a@b.co"},
            "name: at most 100 characters, got 101",
        ),
        (
            {"action": "channel_add", "name": "ops", "kind": "slack", "target": "https://h/" + "p" * 991},
            "target: at most 1000 characters, got 1001",
        ),
        (
            # 91 addresses of 10 characters fit typed with bare commas (1000), not stored
            # with ", " between them (1090).
            {"action": "channel_add", "name": "ops", "kind": "email", "target": ",".join(["a@bb.co.uk"] * 91)},
            "target: at most 1000 characters, got 1090",
        ),
        (
            {"action": "rule_add", "name": "r" * 101, "condition": "pass_rate < 0.9", "window": "last_run"},
            "name: at most 100 characters, got 101",
        ),
    ],
    ids=["channel-name", "channel-url", "channel-addresses", "rule-name"],
)  # fmt: skip
def test_the_alerts_form_names_a_value_too_long(
    project: Project, admin_client: Client, form: dict[str, str], message: str
) -> None:
    response = admin_client.post("/p/demo/settings/alerts/", form)
    assert response.status_code == 400
    assert f"Not saved: {message}" in response.content.decode()
    assert not project.alert_channels.exists() and not project.alert_rules.exists()


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"name": "n" * 201, "slug": "long"}, "name: at most 200 characters, got 201"),
        ({"name": "Long", "slug": "s" * 101}, "slug: at most 100 characters, got 101"),
        (
            {"name": "Spaced", "slug": "has space"},
            "slug: &#x27;has space&#x27; may contain only letters, digits, dashes and underscores",
        ),
    ],
    ids=["name", "slug-length", "slug-space"],
)
def test_a_new_project_name_or_slug_that_cannot_be_stored_is_named(
    admin_client: Client, form: dict[str, str], message: str
) -> None:
    response = admin_client.post("/p/", form)
    assert response.status_code == 400
    page = response.content.decode()
    assert message in page
    assert form["name"] in page  # what was typed is still in the form
    assert list(Project.objects.values_list("slug", flat=True)) == ["demo"]
