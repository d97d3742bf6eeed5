"""Ids and numbers typed into forms, query strings, labels and cursors: a value str.isdigit()
accepts but int() refuses ('²'; more than 4300 digits) or one too large for the database's
integers (25 digits) was a 500 on a dozen pages and forms. Each is now refused or ignored as
the field's other bad values are, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import Membership, Project, Role, Run, Trigger
from evaluations.numbers import whole_number

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

SPEC = """\
version: 1
id: numbered
task: {prompt: "Say hello"}
agent: {type: command, command: "echo hello"}
invariants:
  greets: {description: d, check: {type: contains, value: hello}}
"""
BAD = ["²", "٣", "9" * 25, "9" * 5000, "-1", "1.5", ""]


def test_whole_number_reads_ascii_digits_that_fit_a_database_integer() -> None:
    assert whole_number("42") == 42 and whole_number(" 7 ") == 7 and whole_number(0) == 0
    assert whole_number("9" * 18) == 10**18 - 1
    for bad in [*BAD, None, "9" * 19, "1e3", "+3"]:
        assert whole_number(bad) is None, bad


@pytest.fixture
def world(project: Project, django_user_model: Any) -> tuple[Client, Run, dict[str, str]]:
    user = django_user_model.objects.create_user(username="admin", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(spec_version=version, trigger=Trigger.WEB, enqueue=False)
    _, raw = services.token_issue(project=project, user=user, name="ci")
    client = Client()
    client.force_login(user)
    return client, run, {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def _requests(run_id: int, bad: str) -> list[tuple[str, str, dict[str, Any]]]:
    p = "/p/demo"
    return [
        ("get", f"{p}/specs/numbered/diff/", {"a": bad}),
        ("get", f"{p}/runs/compare/", {"run": [bad, str(run_id)]}),
        ("get", f"{p}/runs/{run_id}/compare/", {"against": bad}),
        ("get", f"{p}/runs/{run_id}/compare/", {"against": str(run_id), "cursor": f"{bad}-1"}),
        ("get", f"{p}/runs/{run_id}/cell/", {"scenario": "no-chaos", "invariant": "greets", "after": bad}),
        ("get", f"{p}/review/", {"run": bad}),
        ("post", f"{p}/specs/numbered/run/", {"version": bad}),
        ("post", f"{p}/specs/numbered/run/", {"replicas": bad}),
        ("post", f"{p}/specs/numbered/edit/", {"source": SPEC, "base": bad}),
        ("post", f"{p}/settings/tokens/", {"action": "revoke", "token": bad}),
        ("post", f"{p}/members/", {"action": "set_role", "membership": bad, "role": "viewer"}),
        ("post", f"{p}/settings/alerts/", {"action": "rule_delete", "id": bad}),
        ("post", f"{p}/settings/alerts/", {"action": "resend", "id": bad}),
        ("post", f"{p}/settings/alerts/", {"action": "rule_add", "name": "r", "condition": "pass_rate < 1", "window": "last_run", "channels": [bad]}),
    ]  # fmt: skip


@pytest.mark.parametrize("bad", BAD, ids=["superscript", "arabic-indic", "25-digits", "5000-digits", "negative", "decimal", "empty"])  # fmt: skip
def test_pages_and_forms_never_answer_a_bad_number_with_a_500(
    world: tuple[Client, Run, dict[str, str]], bad: str
) -> None:
    client, run, _ = world
    for method, url, data in _requests(run.pk, bad):
        response = getattr(client, method)(url, data)
        assert response.status_code < 500, (method, url, data, response.status_code)


def test_a_bad_number_is_named_where_the_page_names_bad_input(
    world: tuple[Client, Run, dict[str, str]],
) -> None:
    client, run, token = world
    page = client.post("/p/demo/specs/numbered/run/", {"replicas": "²"})
    assert page.status_code == 400
    assert "replicas: expected a whole number from 1 to" in page.content.decode()
    page = client.post("/p/demo/settings/alerts/", {"action": "rule_delete", "id": "²"})
    assert (
        "Not saved: unknown action &#x27;rule_delete&#x27; or no row chosen"
        in page.content.decode()
    )
    page = client.get(f"/p/demo/runs/{run.pk}/compare/", {"against": "9" * 25})
    assert f"compare against &#x27;baseline&#x27; or a run id, not &#x27;{'9' * 25}&#x27;" in (
        page.content.decode()
    )
    api = Client().get(f"/api/projects/demo/runs/{run.pk}/executions", {"cursor": "²"}, **token)
    assert api.status_code == 422 and api.json()["error"]["field"] == "cursor"
    assert not run.project.alert_rules.exists() and Run.objects.count() == 1


def test_a_run_labelled_rerun_of_a_non_number_shows(
    world: tuple[Client, Run, dict[str, str]],
) -> None:
    """Anyone can set the label (--label rerun_of=...): it is linked only when it is a run id."""
    client, run, _ = world
    for label in ("²", "9" * 25):
        run.labels = {"rerun_of": label}
        run.save(update_fields=["labels"])
        response = client.get(f"/p/demo/runs/{run.pk}/")
        assert response.status_code == 200, label
