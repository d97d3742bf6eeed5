"""Issue 12, item 2 and issue 14: no drift result depends on the order executions finish in,
and the top-level `baseline: {drift: ...}` block does something (it gives drift checks their
defaults). Drift is checked at finalisation against the matching cell of the active baseline
for the run's branch, even when the check names no baseline (SPEC_FORMAT); with none, it
passes flagged no_baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.spec.model import Spec
from evaluations import services
from evaluations.models import CheckResult, Execution, Project

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The agent answers differently under chaos, and differently again once it is "released"
# (RELEASE set in the command): the drift against the baseline is real and measurable.
SPEC = """\
version: 1
id: drifty
task: {prompt: "p"}
agent:
  type: command
  command: 'if [ "$KEYSTONE_SCENARIO" = no-chaos ]; then echo "the usual answer"; else echo "totally different words{release}"; fi'
  timeout: 30
sandbox: {backend: local}
# The faulted scenario needs a gateway to be valid; the agent tells scenarios apart itself.
llm: {provider: scripted, rules: [{reply: {content: hi}}]}
chaos_matrix:
  - name: no-chaos
  - name: llm-down
    llm_faults: [{mode: empty}]
baseline:
  drift: {method: lexical, max_score: 0.2}
invariants:
  stable: {description: "answers as the baseline did", check: {type: drift}}
"""


def _run(
    project: Project, tmp_path: Path, *, release: str, chaos_first: bool
) -> tuple[int, dict[str, CheckResult]]:
    version = services.spec_version_create(
        project=project, source_yaml=SPEC.replace("{release}", release)
    )
    run = services.run_create(
        spec_version=version, spec_dir=str(tmp_path), enqueue=False, labels={"branch": "main"}
    )
    ids = services.run_plan(run_id=run.pk)
    scenario_of = dict(Execution.objects.filter(pk__in=ids).values_list("pk", "scenario"))
    ids.sort(key=lambda i: (scenario_of[i] == "no-chaos") == chaos_first)
    for execution_id in ids:
        services.execution_execute(execution_id=execution_id, worker="test:1")
    services.run_finalize_if_done(run_id=run.pk)
    return run.pk, {
        r.execution.scenario: r
        for r in CheckResult.objects.filter(run=run, invariant_id="stable").select_related(
            "execution"
        )
    }


def test_drift_without_a_baseline_passes_flagged(project: Project, tmp_path: Path) -> None:
    _, results = _run(project, tmp_path, release="", chaos_first=False)
    for result in results.values():
        assert result.passed and result.details.get("flag") == "no_baseline"


def test_drift_compares_with_the_branch_baseline_whatever_the_order(
    project: Project, tmp_path: Path
) -> None:
    first, _ = _run(project, tmp_path, release="", chaos_first=False)
    services.baseline_promote(run_id=first, user=None)
    _, chaos_first = _run(project, tmp_path, release=" in the new release", chaos_first=True)
    _, calm_first = _run(project, tmp_path, release=" in the new release", chaos_first=False)
    for results in (chaos_first, calm_first):
        # The no-chaos cell answers as in the baseline; the faulted one has drifted from the
        # baseline's faulted cell (no longer from this run's no-chaos output).
        calm, faulted = results["no-chaos"], results["llm-down"]
        assert calm.passed and calm.details.get("drift") == 0.0
        assert calm.details.get("baseline") and faulted.details.get("flag") != "no_baseline"
        assert 0.0 < faulted.details["drift"] < 0.6
    assert chaos_first["llm-down"].details["drift"] == calm_first["llm-down"].details["drift"]


def test_the_baseline_block_gives_drift_checks_their_defaults() -> None:
    spec = Spec.from_dict(
        {
            "version": 1,
            "id": "x",
            "task": {"prompt": "p"},
            "agent": {"type": "command", "command": "echo"},
            "baseline": {"drift": {"method": "field-diff", "max_score": 0.3, "fields": ["a"]}},
            "invariants": {
                "own": {"description": "d", "check": {"type": "drift", "max_score": 0.05}},
                "inherits": {"description": "d", "check": {"type": "drift"}},
            },
        }
    )
    assert spec.invariants["inherits"].check == {
        "type": "drift",
        "method": "field-diff",
        "max_score": 0.3,
        "fields": ["a"],
    }
    assert spec.invariants["own"].check["max_score"] == 0.05
