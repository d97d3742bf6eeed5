"""`keystone compare` (issue 14): a run against another run of its spec or its baseline,
exit 1 when something regressed, and a clear message for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from evaluations import services
from evaluations.cli import main
from evaluations.models import Baseline, Membership, Project, Role
from tests.evaluations.execution_helpers import run_spec

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _spec(answer: str) -> str:
    return f"""\
version: 1
id: steady
task: {{prompts: ["a", "b"]}}
agent: {{type: command, command: "echo {answer}", timeout: 30}}
sandbox: {{backend: local}}
invariants:
  ok: {{description: says ok, check: {{type: contains, value: ok}}}}
replicas: 5
"""


def test_a_changed_agent_regresses_against_the_baseline(
    project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = run_spec(project, _spec("ok"), spec_dir=tmp_path)
    Baseline.objects.create(
        project=project, spec=good.spec, run=good, name="main", active=True, data={}
    )
    worse = run_spec(project, _spec("nope"), spec_dir=tmp_path)
    report = tmp_path / "compare.json"
    assert main(["compare", str(worse.pk), "--json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out and "ok @ no-chaos  10/10 -> 0/10" in out
    verdicts = json.loads(report.read_text())
    assert verdicts["regressed"] is True and verdicts["before"] == good.pk
    # The same agent again: nothing regressed, exit 0.
    again = run_spec(project, _spec("ok"), spec_dir=tmp_path)
    assert main(["compare", str(again.pk), "--against", str(good.pk)]) == 0


def test_bad_references_are_named(
    project: Project, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_spec(project, _spec("ok"), spec_dir=tmp_path)
    assert main(["compare", str(run.pk)]) == 2
    assert "has no active baseline" in capsys.readouterr().err
    assert main(["compare", "999999"]) == 2
    assert "no run 999999" in capsys.readouterr().err
    other_spec = _spec("ok").replace("id: steady", "id: other")
    other = run_spec(project, other_spec, spec_dir=tmp_path)
    assert main(["compare", str(run.pk), "--against", str(other.pk)]) == 2
    assert "only runs of one spec compare" in capsys.readouterr().err
    services.run_cancel(run_id=run.pk)


def test_the_compare_page_shows_the_regression_and_the_figures(
    project: Project, tmp_path: Path, django_user_model: Any
) -> None:
    good = run_spec(project, _spec("ok"), spec_dir=tmp_path)
    worse = run_spec(project, _spec("nope"), spec_dir=tmp_path)
    viewer = django_user_model.objects.create_user(username="v", password="pw-123456")
    Membership.objects.create(project=project, user=viewer, role=Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    url = reverse("run_compare", args=[project.slug, worse.pk])
    html = client.get(url, {"against": good.pk}).content.decode()
    assert "<strong>Regressed</strong>" in html
    assert 'class="verdict-regressed"' in html and "ok @ no-chaos" in html
    assert "10/10 → 0/10" in html
    # The invariant x scenario grid: the one cell, marked as regressed.
    matrix = html[
        html.index('id="compare-matrix"') : html.index(
            "</table>", html.index('id="compare-matrix"')
        )
    ]
    assert (
        '<th scope="col">no-chaos</th>' in matrix
        and '<th scope="row" class="mono">ok</th>' in matrix
    )
    assert 'class="num verdict-regressed"' in matrix and "10/10 → 0/10" in matrix
    assert "pass rate" in html and "-1.000" in html
    # No baseline yet: said on the page, not a 500.
    html = client.get(url).content.decode()
    assert "Cannot compare: spec steady has no active baseline" in html
    # A run of another project is a 404.
    assert client.get(reverse("run_compare", args=[project.slug, 999999])).status_code == 404
