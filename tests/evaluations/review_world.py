"""Builders for review tests: a real spec version (through the service), a completed run,
its executions, and the results the engine and the judge client store for them.

    from tests.evaluations.review_world import make_run, add_execution, add_judge, add_check

Judge rows carry the judge client's shape: `details["judge"] = {model, prompt_version,
reasoning, score, passed, spread, ...}` and `details["pass_threshold"]`.
"""

from __future__ import annotations

import json
from typing import Any

from evaluations import services
from evaluations.models import (
    CheckResult,
    Execution,
    ExecutionStatus,
    Project,
    Run,
    RunStatus,
)

JUDGE_MODEL = "judge-model-a"
PROMPT_VERSION = "pv-0001"
THRESHOLD = 0.7
CRITERIA = "Is the answer polite and does it confirm the refund?"

SPEC_TEMPLATE = """\
version: 1
id: {spec_id}
task: {{prompt: "Refund order 1042"}}
agent: {{type: command, command: "echo refunded"}}
judge: {{provider: scripted, model: {model}, rules: [{{score: 0.9, reason: ok}}]}}
invariants:
  polite:
    description: "The answer is polite"
    gate: {gate}
    dimensions: [tone]
    check:
      type: llm_as_judge
      criteria: "{criteria}"
      rubric: {{pass: "Polite and confirms the refund", fail: "Rude, or silent about the refund"}}
      pass_threshold: {threshold}
  no_insult:
    description: "No insults"
    dimensions: [tone]
    check: {{type: not_contains, value: idiot}}
"""


def spec_source(
    *,
    spec_id: str = "review-demo",
    review: dict[str, Any] | None = None,
    gates: dict[str, Any] | None = None,
    gate: bool = True,
    pass_threshold: float | None = None,
) -> str:
    text = SPEC_TEMPLATE.format(
        spec_id=spec_id,
        model=JUDGE_MODEL,
        gate="true" if gate else "false",
        criteria=CRITERIA,
        threshold=THRESHOLD,
    )
    # JSON is YAML: flow mappings keep the blocks on one line each.
    if review is not None:
        text += f"review: {json.dumps(review)}\n"
    if gates is not None:
        text += f"gates: {json.dumps(gates)}\n"
    if pass_threshold is not None:
        text += f"scoring: {{pass_threshold: {pass_threshold}}}\n"
    return text


def make_run(
    project: Project,
    *,
    spec_id: str = "review-demo",
    review: dict[str, Any] | None = None,
    gates: dict[str, Any] | None = None,
    gate: bool = True,
    seed: int = 0,
    pass_threshold: float | None = None,
) -> Run:
    """A completed run of a real spec version (its scores come from run_finalize)."""
    source = spec_source(
        spec_id=spec_id, review=review, gates=gates, gate=gate, pass_threshold=pass_threshold
    )
    version = services.spec_version_create(project=project, source_yaml=source)
    return Run.objects.create(
        project=project,
        spec_version=version,
        status=RunStatus.COMPLETED,
        options={"seed": seed, "scenarios": [], "spec_dir": ""},
    )


def add_execution(
    run: Run, replica: int, *, output: str = "Your refund for order 1042 is on its way."
) -> Execution:
    return Execution.objects.create(
        run=run,
        scenario="no-chaos",
        prompt_index=0,
        prompt="Refund order 1042",
        replica=replica,
        status=ExecutionStatus.SUCCESS,
        final_output=output,
        duration_ms=100.0,
    )


def add_judge(
    execution: Execution,
    *,
    score: float,
    passed: bool | None = None,
    gate: bool = True,
    spread: float | None = None,
    model: str = JUDGE_MODEL,
    prompt_version: str = PROMPT_VERSION,
    failure_code: str | None = None,
    reasoning: str = "The judge's reasoning: polite, confirms the refund.",
    dimensions: tuple[str, ...] = ("tone",),
) -> CheckResult:
    if passed is None:
        passed = score >= THRESHOLD
    if failure_code is None:
        failure_code = "" if passed else "JUDGE_BELOW_THRESHOLD"
    return CheckResult.objects.create(
        execution=execution,
        run_id=execution.run_id,
        invariant_id="polite",
        check_type="llm_as_judge",
        score=score,
        passed=passed,
        failure_code=failure_code,
        message=f"judge score {score:.2f}",
        details={
            "pass_threshold": THRESHOLD,
            "input_from": "agent_output",
            "judge": {
                "model": model,
                "prompt_version": prompt_version,
                "raw_reply": json.dumps({"score": score, "reasoning": reasoning}),
                "reasoning": reasoning,
                "score": score,
                "passed": passed,
                "samples": [score],
                "spread": spread,
                "dimensions": {},
                "input_tokens": 120,
                "output_tokens": 30,
                "cost_usd": 0.0001,
                "cached": False,
                "latency_ms": 12.0,
            },
        },
        severity="medium",
        weight=1.0,
        gate=gate,
        dimensions=list(dimensions),
        source="judge",
    )


def add_check(
    execution: Execution,
    *,
    passed: bool,
    invariant_id: str = "no_insult",
    dimensions: tuple[str, ...] = ("tone",),
) -> CheckResult:
    return CheckResult.objects.create(
        execution=execution,
        run_id=execution.run_id,
        invariant_id=invariant_id,
        check_type="not_contains",
        score=1.0 if passed else 0.0,
        passed=passed,
        failure_code="" if passed else "NOT_CONTAINS_FAILED",
        dimensions=list(dimensions),
        source="engine",
    )
