"""Issue 12, item 2: no drift result depends on the order executions finish in, and the
top-level `baseline: {drift: ...}` block does something (it gives drift checks their
defaults). Drift is checked at finalisation against the lowest no-chaos replica that
succeeded, like behavior_unchanged with `baseline: auto`."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.spec.model import Spec
from evaluations import services
from evaluations.models import CheckResult, Execution, Project

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The agent answers differently under chaos: the drift is real and measurable.
SPEC = """\
version: 1
id: drifty
task: {prompt: "p"}
agent:
  type: command
  command: 'if [ "$KEYSTONE_SCENARIO" = no-chaos ]; then echo "the usual answer"; else echo "totally different words"; fi'
  timeout: 30
sandbox: {backend: local}
chaos_matrix:
  - name: no-chaos
  - name: llm-down
    llm_faults: [{mode: empty}]
baseline:
  drift: {method: lexical, max_score: 0.2}
invariants:
  stable: {description: "answers as without chaos", check: {type: drift}}
"""


def _run(project: Project, tmp_path: Path, *, chaos_first: bool) -> dict[str, CheckResult]:
    source = SPEC.replace("drifty", f"drifty-{int(chaos_first)}")
    version = services.spec_version_create(project=project, source_yaml=source)
    run = services.run_create(spec_version=version, spec_dir=str(tmp_path), enqueue=False)
    ids = services.run_plan(run_id=run.pk)
    scenario_of = dict(Execution.objects.filter(pk__in=ids).values_list("pk", "scenario"))
    ids.sort(key=lambda i: (scenario_of[i] == "no-chaos") == chaos_first)
    for execution_id in ids:
        services.execution_execute(execution_id=execution_id, worker="test:1")
    services.run_finalize_if_done(run_id=run.pk)
    return {
        r.execution.scenario: r
        for r in CheckResult.objects.filter(run=run, invariant_id="stable").select_related(
            "execution"
        )
    }


def test_drift_is_the_same_whichever_execution_finishes_first(
    project: Project, tmp_path: Path
) -> None:
    chaos_first = _run(project, tmp_path, chaos_first=True)
    calm_first = _run(project, tmp_path, chaos_first=False)
    for results in (chaos_first, calm_first):
        assert results["no-chaos"].passed and results["no-chaos"].details.get("drift") == 0.0
        faulted = results["llm-down"]
        assert faulted.details.get("flag") != "no_baseline"
        assert not faulted.passed and faulted.details["drift"] > 0.2
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
