"""Chaos that reached nothing: validation refuses faults with no way in (no `llm`, no
`tools`), but it cannot see an agent that declares `llm` and never calls it. Its faulted
scenario then runs exactly as with no chaos and still counts in the resilience score, so the
run says so in a warning, wherever its other warnings show (terminal, JSON and Markdown
reports, run page, API). The scores do not change. Real runs of a command agent on the
scripted model: one that never calls the gateway, one that does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import Membership, Project, Role
from tests.cli_helpers import embedded_env, run_keystone
from tests.evaluations.execution_helpers import agent_asking_the_model, run_spec, script_agent

# Asks the scripted model once, through the gateway; under an injected fault it says so.
CALLS_THE_MODEL = agent_asking_the_model("The model is away; done anyway.")

# Declares no use of the model at all: answers from its own code.
NEVER_CALLS = 'print("done without asking the model")\n'

WARNING = (
    "scenario 'api-outage' injects llm_faults, but none of its 2 executions called the model"
    " through the gateway: its faults never fired, so it measured nothing about resilience"
)


def _spec(agent: str) -> str:
    return f"""\
version: 1
id: quiet-agent
task: {{prompt: "hi"}}
replicas: 2
{script_agent(agent)}\
llm:
  provider: scripted
  model: m
  rules:
    - reply: {{content: "hello from the model"}}
chaos_matrix:
  - name: no-chaos
  - name: api-outage
    llm_faults: [{{mode: error, error_code: 503}}]
invariants:
  answers:
    description: "says something"
    check: {{type: output_not_empty}}
"""


@pytest.mark.slow
def test_llm_faults_an_agent_never_met_are_a_warning_in_the_cli_output_and_reports(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "quiet-agent.yaml"
    spec.write_text(_spec(NEVER_CALLS))
    report, summary = tmp_path / "report.json", tmp_path / "summary.md"
    done = run_keystone(
        "run",
        str(spec),
        "--json",
        str(report),
        "--markdown",
        str(summary),
        env=embedded_env(tmp_path / "home", NO_COLOR="1"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"warning: {WARNING}" in done.stdout
    stored = json.loads(report.read_text())
    assert WARNING in stored["summary"]["warnings"]
    assert f"- {WARNING}" in summary.read_text()
    # A warning only: the scenario still counts (its cells passed) in the resilience score.
    assert stored["summary"]["resilience"]["score"] == 100.0
    # `keystone score` recomputes the same warning from the stored report.
    rescored = run_keystone("score", str(report), env=embedded_env(tmp_path / "home"))
    assert WARNING in rescored.stdout, rescored.stdout + rescored.stderr


@pytest.mark.slow
@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("agent", "warned"), [(NEVER_CALLS, True), (CALLS_THE_MODEL, False)], ids=["never", "calls"]
)
def test_the_warning_shows_on_the_run_only_when_no_execution_reached_the_gateway(
    project: Project, tmp_path: Path, django_user_model: Any, agent: str, warned: bool
) -> None:
    run = run_spec(project, _spec(agent), spec_dir=tmp_path)
    assert run.exit_code == 0
    assert (WARNING in run.warnings) is warned, run.warnings
    assert not any("none of its" in w for w in run.warnings if w != WARNING), run.warnings
    assert run.resilience == 100.0  # the warning changes no score

    user = django_user_model.objects.create_user(username="viewer", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.VIEWER)
    _, token = services.token_issue(project=project, user=user, name="ci")
    detail = Client().get(
        f"/api/projects/{project.slug}/runs/{run.pk}", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert detail.status_code == 200, detail.content
    assert (WARNING in detail.json()["warnings"]) is warned
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/p/{project.slug}/runs/{run.pk}/")
    assert page.status_code == 200
    assert (WARNING.replace("'", "&#x27;") in page.content.decode()) is warned
