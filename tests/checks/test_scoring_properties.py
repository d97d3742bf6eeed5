"""Properties of the scoring functions that must hold for any input (hypothesis)."""

from __future__ import annotations

import sys

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from checks.report_model import MatrixCell
from checks.results import CheckResult, FailureCode
from checks.scoring import (
    ExecutionRecord,
    execution_composite,
    overall_score,
    pass_at_k,
    pass_hat_k,
    resilience_score,
    score_run,
)
from checks.spec.model import SEVERITY_WEIGHTS, Spec

unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
weights = st.floats(min_value=0.0, max_value=1000.0, allow_nan=False)
severities = st.sampled_from(sorted(SEVERITY_WEIGHTS))


@st.composite
def check_results(draw: st.DrawFn) -> CheckResult:
    passed = draw(st.booleans())
    return CheckResult(
        invariant_id=draw(st.sampled_from(["a", "b", "c", "d"])),
        check_type=draw(st.sampled_from(["contains", "llm_as_judge", "drift", "pii"])),
        passed=passed,
        score=draw(unit),
        failure_code=None if passed else draw(st.sampled_from(list(FailureCode))),
        severity=draw(severities),
        weight=draw(weights),
        gate=draw(st.booleans()),
    )


@given(st.lists(check_results(), max_size=12), st.integers(min_value=0, max_value=3))
def test_composite_is_always_in_unit_interval(results: list[CheckResult], violations: int) -> None:
    composite = execution_composite(results, forbidden_violations=violations)
    assert 0.0 <= composite <= 1.0
    if violations:
        assert composite == 0.0


@given(
    st.lists(check_results(), min_size=1, max_size=12),
    st.floats(min_value=1e-3, max_value=1e3, allow_nan=False),
)
def test_scaling_every_weight_leaves_the_composite_unchanged(
    results: list[CheckResult], factor: float
) -> None:
    scaled = [
        CheckResult(**{**r.to_dict(), "failure_code": r.failure_code, "weight": r.weight * factor})
        for r in results
    ]
    # Scaling must not change the weights themselves beyond rounding: a subnormal weight
    # (5e-324) halved is 0, and that is another input, not the same one scaled.
    normal = sys.float_info.min
    pairs = zip(results, scaled, strict=True)
    assume(all(r.weight == 0 or min(r.weight, s.weight) >= normal for r, s in pairs))
    before, after = execution_composite(results), execution_composite(scaled)
    assert abs(before - after) <= 1e-9


@given(st.lists(check_results(), min_size=1, max_size=8))
def test_a_failing_gate_always_zeroes_the_composite(results: list[CheckResult]) -> None:
    results[0].gate, results[0].passed, results[0].score = True, False, 0.0
    assert execution_composite(results) == 0.0


@st.composite
def cells(draw: st.DrawFn) -> MatrixCell:
    severity = draw(severities)
    passed = draw(st.booleans())
    return MatrixCell(
        invariant_id=draw(st.text(min_size=1, max_size=5)),
        scenario=draw(st.sampled_from(["no-chaos", "tool-down"])),
        severity=severity,
        severity_weight=SEVERITY_WEIGHTS[severity],
        passed=passed,
        status="pass" if passed else "fail",
        groups_passed=1 if passed else 0,
        groups_total=1,
        results_passed=1 if passed else 0,
        results_total=1,
    )


@given(st.lists(cells(), max_size=30))
def test_resilience_is_in_0_100_and_critical_failure_is_detected(matrix: list[MatrixCell]) -> None:
    res = resilience_score(matrix)
    if not matrix:
        assert res.score is None
        return
    assert res.score is not None and 0.0 <= res.score <= 100.0
    assert res.critical_failed == any(c.severity == "critical" and not c.passed for c in matrix)
    if all(c.passed for c in matrix):
        assert res.score == 100.0


@given(
    st.integers(min_value=1, max_value=30).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_and_pass_hat_k_are_probabilities_ordered_and_monotone(
    nck: tuple[int, int, int],
) -> None:
    n, c, k = nck
    at, hat = pass_at_k(n, c, k), pass_hat_k(n, c, k)
    assert 0.0 <= hat <= at <= 1.0 + 1e-12
    if k < n:
        assert pass_at_k(n, c, k + 1) >= at - 1e-12
        assert pass_hat_k(n, c, k + 1) <= hat + 1e-12


pillar_values = st.one_of(st.none(), unit)


@given(
    st.fixed_dictionaries({p: pillar_values for p in ("mutation", "chaos", "contract", "replay")}),
    st.fixed_dictionaries(
        {
            p: st.floats(min_value=0.01, max_value=1.0)
            for p in ("mutation", "chaos", "contract", "replay")
        }
    ),
)
def test_overall_is_in_unit_interval_or_none_when_nothing_ran(
    scores: dict[str, float | None], pillar_weights: dict[str, float]
) -> None:
    overall = overall_score(scores, pillar_weights)
    if all(v is None for v in scores.values()):
        assert overall is None
    else:
        assert overall is not None and 0.0 <= overall <= 1.0
        ran = [v for v in scores.values() if v is not None]
        assert min(ran) - 1e-9 <= overall <= max(ran) + 1e-9


SPEC = Spec.from_dict(
    {
        "version": 1,
        "id": "prop",
        "task": {"prompts": ["a", "b"]},
        "agent": {"type": "command", "command": "true"},
        "invariants": {
            k: {"description": k, "check": {"type": "contains", "value": k}} for k in "abcd"
        },
        "chaos_matrix": [
            {"name": "no-chaos"},
            {"name": "tool-down", "tool_faults": [{"tool": "*", "mode": "error"}]},
        ],
        "replicas": 3,
    }
)


@st.composite
def execution_records(draw: st.DrawFn) -> ExecutionRecord:
    return ExecutionRecord(
        id=draw(st.uuids()).hex,
        scenario=draw(st.sampled_from(["no-chaos", "tool-down"])),
        prompt_index=draw(st.integers(0, 1)),
        replica=draw(st.integers(0, 2)),
        status=draw(st.sampled_from(["success", "success", "failed", "error", "provider_error"])),
        duration_ms=draw(st.floats(0, 1e5)),
        cost_usd=draw(st.floats(0, 1)),
        results=draw(st.lists(check_results(), max_size=5)),
        pillar=draw(st.sampled_from(["contract", "chaos", "mutation", "replay"])),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(execution_records(), max_size=15))
def test_score_run_keeps_every_score_in_range(records: list[ExecutionRecord]) -> None:
    summary = score_run(SPEC, records)
    assert summary.exit_code in (0, 1, 3, 4)
    for value in [summary.overall, summary.pass_rate, *summary.pillar_scores.values()]:
        assert value is None or 0.0 <= value <= 1.0
    assert summary.resilience.score is None or 0.0 <= summary.resilience.score <= 100.0
    for group in summary.groups:
        assert 0 <= group.c <= group.n
        assert group.min_composite <= group.mean_composite + 1e-12 <= group.max_composite + 2e-12
    assert sum(g.n for g in summary.groups) == len(records)
