"""Baselines per spec and branch (issue 14): every promotion recorded and undoable, each
execution frozen as a cell in the database, and drift / behavior_unchanged with
`baseline: active` compared with the matching cell at finalize time. Runs are real: a
command agent in the local sandbox, through the services `keystone run` uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from evaluations import selectors, services
from evaluations.cli import main
from evaluations.models import (
    Artifact,
    Baseline,
    BaselineCell,
    CheckResult,
    Execution,
    Membership,
    Project,
    Role,
    Run,
)
from tests.evaluations.execution_helpers import run_spec

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def spec(answer: str) -> str:
    return f"""\
version: 1
id: refunds
task: {{prompts: ["refund 1042", "refund 7"]}}
agent: {{type: command, command: "echo {answer}", timeout: 30}}
sandbox: {{backend: local}}
invariants:
  says_refunded: {{description: says refunded, check: {{type: contains, value: refunded}}}}
  same_answer:
    description: the answer did not drift from the baseline
    check: {{type: drift, baseline: active, method: lexical, max_score: 0.2}}
  same_behaviour:
    description: behaves as the baseline did
    check: {{type: behavior_unchanged, baseline: active, similarity_threshold: 0.8}}
replicas: 2
gates: {{drift_score_max: 0.2}}
"""


GOOD = "Your order was refunded to your card today"
WORSE = "Sorry we could not process this request"


@pytest.fixture
def people(project: Project, django_user_model: Any) -> dict[str, Any]:
    made = {}
    for role in ("viewer", "editor"):
        user = django_user_model.objects.create_user(username=role, password="pw-123456")
        Membership.objects.create(project=project, user=user, role=Role(role))
        made[role] = user
    return made


def results(run: Run, invariant_id: str) -> list[CheckResult]:
    return list(CheckResult.objects.filter(run=run, invariant_id=invariant_id).order_by("id"))


def test_promotions_are_scoped_by_branch_recorded_and_rolled_back(
    project: Project, tmp_path: Path, people: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    first = run_spec(project, spec(GOOD), spec_dir=tmp_path)
    feature = run_spec(project, spec(GOOD), spec_dir=tmp_path, labels={"branch": "feature-x"})
    second = run_spec(project, spec(GOOD), spec_dir=tmp_path, labels={"branch": "main"})
    spec_id = first.spec_id

    on_main = services.baseline_promote(
        run_id=first.pk, user=people["editor"], name="release-1", reason="first good run"
    )
    # A branch with no baseline of its own is compared with main's.
    assert on_main.branch == "main" and on_main.previous is None
    assert selectors.active_baseline_for(spec_id, "feature-x").pk == on_main.pk
    assert selectors.active_baseline_for(spec_id, "").pk == on_main.pk

    # The CLI promotes into the run's branch label; main keeps its own baseline.
    promote = ["baseline", "promote", str(feature.pk), "--reason", "feature work"]
    assert main([*promote, "--by", "ghost"]) == 2
    assert "--by: no active user 'ghost'" in capsys.readouterr().err
    assert main([*promote, "--by", "editor"]) == 0
    assert f"run {feature.pk} is the baseline run #{feature.pk} of refunds on feature-x" in (
        capsys.readouterr().out
    )
    on_feature = Baseline.objects.get(spec_id=spec_id, branch="feature-x")
    assert selectors.active_baseline_for(spec_id, "feature-x").pk == on_feature.pk
    assert selectors.active_baseline_for(spec_id, "main").pk == on_main.pk
    assert on_feature.reason == "feature work" and on_feature.created_by == people["editor"]

    replacing = services.baseline_promote(
        run_id=second.pk, user=people["editor"], name="release-2", reason="better prompts"
    )
    on_main.refresh_from_db()
    assert replacing.previous_id == on_main.pk and not on_main.active
    assert replacing.created_by == people["editor"] and replacing.reason == "better prompts"

    # Roll back through the API with an editor's token: release-1 is active again.
    _, raw = services.token_issue(project=project, user=people["editor"], name="ci")
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    client = Client()
    url = f"/api/projects/{project.slug}/specs/refunds/baselines/rollback"
    answer = client.post(url, {"branch": "main"}, content_type="application/json", **headers)
    assert answer.status_code == 200, answer.content
    assert answer.json()["id"] == on_main.pk and answer.json()["active"] is True
    replacing.refresh_from_db()
    assert not replacing.active and replacing.rolled_back is not None
    assert replacing.rolled_back_by == people["editor"]
    assert selectors.active_baseline_for(spec_id, "main").pk == on_main.pk
    # Nothing before release-1: a clear refusal naming the field, not a 500.
    again = client.post(url, {"branch": "main"}, content_type="application/json", **headers)
    assert again.status_code == 422
    assert again.json()["error"]["field"] == "branch"
    assert "replaced none: nothing to roll back to" in again.json()["error"]["message"]

    # The history: every promotion with who, why, what it replaced and its state.
    history = client.get(f"/api/projects/{project.slug}/specs/refunds/baselines", **headers)
    rows = {row["name"]: row for row in history.json()}
    assert set(rows) == {"release-1", "release-2", f"run #{feature.pk}"}
    assert rows["release-2"]["previous_id"] == on_main.pk
    assert rows["release-2"]["rolled_back_by"] == "editor"
    assert rows["release-1"]["active"] and rows["release-1"]["created_by"] == "editor"
    assert rows["release-1"]["cells"] == first.execution_count == 4
    assert main(["baseline", "list", "--project", project.slug, "refunds"]) == 0
    listing = capsys.readouterr().out
    assert f"release-2 (run {second.pk}, rolled back)  reason: better prompts" in listing
    assert f"feature-x    run #{feature.pk} (run {feature.pk}, active)" in listing
    assert main(["baseline", "rollback", "--project", project.slug, "nope"]) == 2
    assert "no spec nope in project demo" in capsys.readouterr().err

    # The page lists the same history; a viewer sees no rollback button.
    viewer = Client()
    viewer.force_login(people["viewer"])
    page = viewer.get(reverse("spec_baselines", args=[project.slug, "refunds"])).content.decode()
    assert page.count("<tr data-baseline-id=") == 3
    assert "better prompts" in page and "rolled back by editor" in page
    assert "Roll back to" not in page
    refused = viewer.post(
        reverse("spec_baseline_rollback", args=[project.slug, "refunds"]), {"branch": "main"}
    )
    assert refused.status_code == 403


def test_the_api_promotes_with_a_branch_and_refuses_what_cannot_be_a_baseline(
    project: Project, tmp_path: Path, people: dict[str, Any]
) -> None:
    run = run_spec(project, spec(GOOD), spec_dir=tmp_path)
    client = Client()
    url = f"/api/projects/{project.slug}/runs/{run.pk}/baseline"
    _, viewer_token = services.token_issue(project=project, user=people["viewer"], name="v")
    _, editor_token = services.token_issue(project=project, user=people["editor"], name="e")

    denied = client.post(
        url, {}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {viewer_token}"
    )
    made = client.post(
        url,
        {"branch": "staging", "reason": "nightly green"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {editor_token}",
    )
    missing = client.post(
        f"/api/projects/{project.slug}/runs/999999/baseline",
        {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {editor_token}",
    )

    assert denied.status_code == 403
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["branch"], body["reason"], body["created_by"]) == (
        "staging",
        "nightly green",
        "editor",
    )
    assert missing.status_code == 404
    services.run_cancel(run_id=run.pk)  # a completed run stays completed
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    refused = client.post(
        url, {}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {editor_token}"
    )
    assert refused.status_code == 422
    assert "only a completed, scored run can be a baseline" in refused.json()["error"]["message"]


def test_each_execution_is_frozen_as_a_cell_that_outlives_the_run(
    project: Project, tmp_path: Path, people: dict[str, Any]
) -> None:
    reference = run_spec(project, spec(GOOD), spec_dir=tmp_path)
    baseline = services.baseline_promote(run_id=reference.pk, user=people["editor"])

    cells = {c.key: c for c in BaselineCell.objects.filter(baseline=baseline)}
    executions = list(Execution.objects.filter(run=reference))
    assert set(cells) == {e.key for e in executions} and len(cells) == 4
    for execution in executions:
        cell = cells[execution.key]
        assert (cell.scenario, cell.prompt_index, cell.replica) == (
            execution.scenario,
            execution.prompt_index,
            execution.replica,
        )
        assert cell.final_output == execution.final_output == GOOD + "\n"
        assert cell.duration_ms == execution.duration_ms and cell.duration_ms > 0
        assert cell.cost_usd == execution.cost_usd and cell.passed is True
        by_invariant = {r["invariant_id"]: r for r in cell.results}
        assert by_invariant["says_refunded"]["passed"] is True
        assert by_invariant["same_answer"]["check_type"] == "drift"

    # The run's artifacts cleaned up, then the run itself deleted: the cells stay, and a
    # later run is still compared with them.
    for artifact in Artifact.objects.filter(execution__run=reference):
        artifact.file.delete(save=False)
    Run.objects.filter(pk=reference.pk).delete()
    baseline.refresh_from_db()
    assert baseline.run_id is None and baseline.cells.count() == 4

    later = run_spec(project, spec(WORSE), spec_dir=tmp_path)

    drift = results(later, "same_answer")
    assert len(drift) == 4 and not any(r.passed for r in drift)
    assert {r.details["baseline"] for r in drift} == {baseline.name}


def test_drift_against_the_active_baseline_at_finalize(
    project: Project, tmp_path: Path, people: dict[str, Any]
) -> None:
    # No baseline yet: drift and behavior_unchanged pass, flagged, and the run page says so.
    alone = run_spec(project, spec(GOOD), spec_dir=tmp_path)
    for invariant_id in ("same_answer", "same_behaviour"):
        rows = results(alone, invariant_id)
        assert len(rows) == 4
        assert all(r.passed and r.details["flag"] == "no_baseline" for r in rows)
    gates = {g["name"]: g for g in alone.summary["gates"]}
    assert gates["drift_score_max"]["passed"] and gates["drift_score_max"]["empty"]
    client = Client()
    client.force_login(people["viewer"])
    page = client.get(reverse("run_detail", args=[project.slug, alone.pk])).content.decode()
    assert "8 drift result(s) had no baseline to compare with" in page

    baseline = services.baseline_promote(run_id=alone.pk, user=people["editor"], name="rel-1")

    same = run_spec(project, spec(GOOD), spec_dir=tmp_path)
    worse = run_spec(project, spec(WORSE), spec_dir=tmp_path, labels={"branch": "feature-y"})

    # The same answers: no drift, measured against rel-1's matching cells.
    drift = results(same, "same_answer")
    assert all(r.passed and r.details["drift"] == 0.0 for r in drift)
    assert {r.details["baseline"] for r in drift} == {"rel-1"}
    assert all(r.passed for r in results(same, "same_behaviour"))
    assert same.gate_passed and same.exit_code == 0
    # A changed answer on a branch with no baseline of its own: main's rel-1 is the
    # reference; drift fails everywhere and so does the drift_score_max gate.
    drift = results(worse, "same_answer")
    assert len(drift) == 4 and all(r.failure_code == "DRIFT_EXCEEDED" for r in drift)
    assert {r.details["baseline"] for r in drift} == {baseline.name}
    assert all(
        not r.passed and r.details["baseline_name"] == "rel-1"
        for r in results(worse, "same_behaviour")
    )
    gates = {g["name"]: g for g in worse.summary["gates"]}
    assert not gates["drift_score_max"]["passed"]
    assert gates["drift_score_max"]["actual"] == pytest.approx(
        max(r.details["drift"] for r in drift)
    )
    assert worse.exit_code == 1
    assert not any("no baseline" in w for w in worse.warnings)


def test_a_named_baseline_is_the_reference_whichever_is_active(
    project: Project, tmp_path: Path, people: dict[str, Any]
) -> None:
    first = run_spec(project, spec(GOOD), spec_dir=tmp_path)
    services.baseline_promote(run_id=first.pk, user=people["editor"], name="golden")
    second = run_spec(project, spec(WORSE), spec_dir=tmp_path)
    services.baseline_promote(run_id=second.pk, user=people["editor"], name="current")
    named = spec(GOOD).replace("baseline: active, method", "baseline: golden, method")

    run = run_spec(project, named, spec_dir=tmp_path)

    assert all(r.passed and r.details["baseline"] == "golden" for r in results(run, "same_answer"))
    # behavior_unchanged still says `active`: it compares with `current` and fails.
    assert not any(r.passed for r in results(run, "same_behaviour"))
    assert json.loads(json.dumps(run.summary))["exit_code"] == 1


def test_each_branch_regresses_against_its_own_baseline_else_mains(
    project: Project, tmp_path: Path
) -> None:
    """Issue 14: the overview and the regressions report compare every branch's latest run
    with that branch's baseline (else main's), not only main's latest run with main's."""
    good_main = run_spec(project, spec(GOOD), spec_dir=tmp_path, labels={"branch": "main"})
    services.baseline_promote(run_id=good_main.pk, user=None, name="release-1")
    # feature-x has no baseline: its worse run regresses against main's.
    worse_feature = run_spec(
        project, spec(WORSE), spec_dir=tmp_path, labels={"branch": "feature-x"}
    )
    # staging's own baseline already answered WORSE, so the same answer there is no regression;
    # and main's latest run is still good, so main has none either.
    worse_staging = run_spec(project, spec(WORSE), spec_dir=tmp_path, labels={"branch": "staging"})
    services.baseline_promote(run_id=worse_staging.pk, user=None, name="staging-1")
    run_spec(project, spec(WORSE), spec_dir=tmp_path, labels={"branch": "staging"})
    run_spec(project, spec(GOOD), spec_dir=tmp_path, labels={"branch": "main"})

    regressions = selectors.project_regressions(project)
    assert regressions, "the feature branch's regression is missing"
    assert {(r.run_id, r.baseline_name) for r in regressions} == {(worse_feature.pk, "release-1")}

    report = selectors.regression_report(project)
    assert {row.branch for row in report.rows} == {"feature-x"}
    assert all(row.baseline == "release-1" for row in report.rows)
    assert selectors.regression_report(project, branch="staging").empty_reason.startswith(
        "Nothing regressed"
    )
