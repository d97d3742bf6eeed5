"""Scoring: composite, replica aggregation, resilience, overall, gates and exit codes.

Every worked example of the reference documents (000, 001/002, 004) is checked here with
values computed by hand in the comments.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from checks.results import CheckResult, FailureCode
from checks.scoring import (
    ExecutionRecord,
    ExecutionScore,
    aggregate_replicas,
    evaluate_gates,
    execution_composite,
    execution_verdict,
    exit_code_for,
    overall_score,
    pass_at_k,
    pass_hat_k,
    percentile,
    resilience_score,
    score_execution,
    score_run,
)
from checks.spec.model import Spec

# ---------------------------------------------------------------- builders


def result(
    invariant_id: str,
    passed: bool,
    *,
    score: float | None = None,
    weight: float = 1.0,
    gate: bool = False,
    severity: str = "medium",
    code: FailureCode | None = None,
    check_type: str = "contains",
) -> CheckResult:
    if code is None and not passed:
        code = FailureCode.CONTAINS_FAILED
    return CheckResult(
        invariant_id=invariant_id,
        check_type=check_type,
        passed=passed,
        score=(1.0 if passed else 0.0) if score is None else score,
        failure_code=code,
        severity=severity,
        weight=weight,
        gate=gate,
    )


def make_spec(**overrides: Any) -> Spec:
    data: dict[str, Any] = {
        "version": 1,
        "id": "refund-agent",
        "task": {"prompt": "Refund order 1042"},
        "agent": {"type": "command", "command": "echo hi"},
        "invariants": {
            "says_refund": {"description": "d", "check": {"type": "contains", "value": "refund"}}
        },
    }
    data.update(overrides)
    return Spec.from_dict(data)


def record(
    scenario: str = "no-chaos",
    results: list[CheckResult] | None = None,
    *,
    prompt_index: int = 0,
    replica: int = 0,
    status: str = "success",
    pillar: str = "contract",
    **extra: Any,
) -> ExecutionRecord:
    return ExecutionRecord(
        id=f"{pillar}-{scenario}-{prompt_index}-{replica}-{extra.get('mutation_type') or ''}",
        scenario=scenario,
        prompt_index=prompt_index,
        prompt=f"prompt {prompt_index}",
        replica=replica,
        status=status,
        pillar=pillar,
        results=list(results or []),
        **extra,
    )


def exec_score(
    passed: bool,
    composite: float | None = None,
    *,
    status: str | None = None,
    codes: list[str] | None = None,
    replica: int = 0,
) -> ExecutionScore:
    return ExecutionScore(
        execution_id=f"e{replica}",
        scenario="no-chaos",
        prompt_index=0,
        replica=replica,
        pillar="contract",
        mutation_type=None,
        composite=(1.0 if passed else 0.0) if composite is None else composite,
        passed=passed,
        status=status or ("pass" if passed else "fail"),
        failure_codes=list(codes or []),
    )


# ---------------------------------------------------------------- composite (doc 000)


def test_nice_to_have_failing_gives_077_which_fails_threshold_085() -> None:
    # doc 000: must_pass (w 1.0, gate) passes, nice_to_have (w 0.3) fails:
    # (1.0 x 1) / (1.0 + 0.3) = 0.769...
    results = [
        result("must_pass", True, weight=1.0, gate=True),
        result("nice_to_have", False, weight=0.3),
    ]
    composite = execution_composite(results)
    assert composite == pytest.approx(1.0 / 1.3)
    assert round(composite, 2) == 0.77
    assert execution_verdict(composite, 0.85) is False


def test_gate_failure_forces_composite_zero() -> None:
    results = [
        result("must_pass", False, weight=1.0, gate=True),
        result("nice_to_have", True, weight=0.3),
    ]
    assert execution_composite(results) == 0.0


def test_gate_scoring_below_one_forces_zero_even_when_it_passed() -> None:
    # A judge gate scoring 0.9 passes its own threshold but "any gate below 1.0" forces 0.
    results = [
        result("tone", True, score=0.9, gate=True, check_type="llm_as_judge"),
        result("other", True),
    ]
    assert execution_composite(results) == 0.0


def test_forbidden_violation_forces_composite_zero() -> None:
    assert execution_composite([result("a", True)], forbidden_violations=1) == 0.0


def test_tests_pass_pattern_from_doc_000() -> None:
    # tests_pass (gate, 1.0), no_console_log (0.3), small_diff (0.2), threshold 0.85.
    def run(tests: bool, console: bool, diff: bool) -> float:
        return execution_composite(
            [
                result("tests_pass", tests, weight=1.0, gate=True),
                result("no_console_log", console, weight=0.3),
                result("small_diff", diff, weight=0.2),
            ]
        )

    assert run(False, True, True) == 0.0  # tests fail -> 0
    assert run(True, True, True) == 1.0  # everything perfect -> 1.0, passes
    assert execution_verdict(run(True, True, True), 0.85)
    # "one nice-to-have fails -> around 0.83, fail": no_console_log failing gives
    # (1.0 + 0.2) / 1.5 = 0.80, which fails; small_diff failing gives 1.3 / 1.5 = 0.867.
    assert run(True, False, True) == pytest.approx(0.8)
    assert execution_verdict(run(True, False, True), 0.85) is False
    assert run(True, True, False) == pytest.approx(1.3 / 1.5)


def test_weighted_mean_uses_continuous_scores() -> None:
    # sql 0.5 gate passes, http 0.3 fails, judge 0.2 scores 0.6: (0.5 + 0 + 0.12) / 1.0
    results = [
        result("reconciliation_clean", True, weight=0.5, gate=True),
        result("email_sent_once", False, weight=0.3),
        result(
            "email_quality",
            False,
            score=0.6,
            weight=0.2,
            check_type="llm_as_judge",
            code=FailureCode.JUDGE_BELOW_THRESHOLD,
        ),
    ]
    assert execution_composite(results) == pytest.approx(0.62)


def test_no_active_invariant_is_a_vacuous_pass_and_flagged() -> None:
    assert execution_composite([]) == 1.0
    score = score_execution(record(results=[]), pass_threshold=1.0)
    assert score.passed and score.vacuous and score.composite == 1.0
    summary = score_run(make_spec(), [record(results=[])])
    assert any("no active invariant" in w for w in summary.warnings)


def test_all_zero_weights_fall_back_to_plain_mean() -> None:
    results = [result("a", True, weight=0.0), result("b", False, weight=0.0)]
    assert execution_composite(results) == 0.5


def test_threshold_met_on_paper_is_not_lost_to_float_rounding() -> None:
    # 0.7 + 0.15 = 0.8499999999999999 in binary floating point.
    assert execution_verdict(0.7 + 0.15, 0.85)
    assert not execution_verdict(0.849, 0.85)


def test_check_error_makes_execution_status_error_and_not_passed() -> None:
    errored = record(results=[result("a", True), result("b", False, code=FailureCode.CHECK_ERROR)])
    score = score_execution(errored, pass_threshold=0.0)
    assert score.status == "error"
    assert score.passed is False
    assert score.failure_codes == ["CHECK_ERROR"]


def test_execution_score_lists_failed_gates_and_forbidden_code() -> None:
    rec = record(
        results=[result("tests", False, gate=True, code=FailureCode.EXIT_CODE_MISMATCH)],
        forbidden_violations=[{"rule": "db_writes_outside", "table": "users"}],
    )
    score = score_execution(rec)
    assert score.gate_failed == ["tests"]
    assert score.forbidden == 1
    assert score.failure_codes == ["EXIT_CODE_MISMATCH", "FORBIDDEN_VIOLATION"]
    assert score.status == "fail"


# ---------------------------------------------------------------- pass@k, pass^k


def test_pass_at_k_and_pass_hat_k_hand_values() -> None:
    # n=5, c=2: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass^2 = C(2,2)/C(5,2) = 1/10
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_hat_k(5, 2, 2) == pytest.approx(0.1)
    # n=5, c=2, k=3: pass@3 = 1 - C(3,3)/C(5,3) = 0.9; pass^3 = 0 (only two passes)
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_hat_k(5, 2, 3) == 0.0
    # k = n: pass@n is "any passed", pass^n is "all passed"
    assert pass_at_k(5, 2, 5) == 1.0 and pass_hat_k(5, 2, 5) == 0.0
    assert pass_at_k(4, 0, 4) == 0.0 and pass_hat_k(4, 4, 4) == 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, 1, 0), (3, 1, 4), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


# ---------------------------------------------------------------- replica aggregation


def _two_of_three() -> list[ExecutionScore]:
    return [
        exec_score(True, 1.0, replica=0),
        exec_score(True, 1.0, replica=1),
        exec_score(False, 0.4, replica=2, codes=["CONTAINS_FAILED"]),
    ]


def test_aggregation_all_fails_a_disagreeing_group_and_labels_it_flaky() -> None:
    group = aggregate_replicas(_two_of_three(), "all")
    assert (group.passed, group.status, group.n, group.c) == (False, "flaky", 3, 2)
    assert group.pass_at_k == 1.0  # pass@3 with a pass among 3
    assert group.pass_hat_k == 0.0  # pass^3: not all passed
    assert group.pass_at_1 == pytest.approx(2 / 3)
    assert group.mean_composite == pytest.approx(0.8)
    assert (group.min_composite, group.max_composite) == (0.4, 1.0)
    assert group.failure_codes == ["CONTAINS_FAILED"]


def test_aggregation_majority_and_any_pass_the_same_flaky_group() -> None:
    assert aggregate_replicas(_two_of_three(), "majority").passed is True
    group = aggregate_replicas(_two_of_three(), "any")
    assert group.passed is True and group.status == "flaky"


def test_aggregation_majority_needs_strictly_more_than_half() -> None:
    scores = [
        exec_score(True, replica=0),
        exec_score(True, replica=1),
        exec_score(False, replica=2),
        exec_score(False, replica=3),
    ]
    assert aggregate_replicas(scores, "majority").passed is False
    assert aggregate_replicas(scores, "any").passed is True


def test_aggregation_mean_compares_mean_composite_with_threshold() -> None:
    # mean of 1.0, 1.0, 0.4 = 0.8
    assert aggregate_replicas(_two_of_three(), "mean", pass_threshold=0.8).passed is True
    assert aggregate_replicas(_two_of_three(), "mean", pass_threshold=0.85).passed is False


def test_mean_aggregation_never_passes_a_group_where_no_replica_passed() -> None:
    # pass_threshold 0 with `mean`: every replica violated a forbidden rule (composite 0,
    # each execution fails) or could not be scored (error, composite 0). The mean 0 >= 0
    # passed the group, so pass_rate_min and the exit code said PASS.
    spec = make_spec(scoring={"pass_threshold": 0.0, "replica_aggregation": "mean"}, replicas=2)
    violated = [
        record(
            results=[result("says_refund", True)],
            replica=i,
            forbidden_violations=[{"rule": "http_except"}],
        )
        for i in range(2)
    ]
    errored = [
        record(results=[result("says_refund", False, code=FailureCode.CHECK_ERROR)], replica=i)
        for i in range(2)
    ]
    for records in (violated, errored):
        summary = score_run(spec, records)
        assert [e.passed for e in summary.executions] == [False, False]
        (group,) = summary.groups
        assert group.passed is False
        assert summary.pass_rate == 0.0
        assert summary.exit_code == 1


def test_agreeing_replicas_are_pass_or_fail_not_flaky() -> None:
    assert (
        aggregate_replicas([exec_score(True), exec_score(True, replica=1)], "all").status == "pass"
    )
    group = aggregate_replicas([exec_score(False), exec_score(False, replica=1)], "any")
    assert (group.status, group.passed, group.pass_at_k) == ("fail", False, 0.0)


def test_a_replica_error_makes_the_group_status_error() -> None:
    scores = [exec_score(True), exec_score(False, status="error", replica=1)]
    group = aggregate_replicas(scores, "any")
    assert group.status == "error"
    assert group.passed is True  # the verdict still follows the method; the label warns


def test_aggregation_rejects_unknown_method_and_empty_groups() -> None:
    with pytest.raises(ValueError):
        aggregate_replicas(_two_of_three(), "median")
    with pytest.raises(ValueError):
        aggregate_replicas([], "all")


def test_score_run_groups_replicas_per_scenario_and_prompt() -> None:
    spec = make_spec(task={"prompts": ["a", "b"]}, replicas=2)
    records = [
        record(results=[result("says_refund", True)], prompt_index=0, replica=0),
        record(results=[result("says_refund", False)], prompt_index=0, replica=1),
        record(results=[result("says_refund", True)], prompt_index=1, replica=0),
        record(results=[result("says_refund", True)], prompt_index=1, replica=1),
    ]
    summary = score_run(spec, records)
    assert [(g.prompt_index, g.status, g.c, g.n) for g in summary.groups] == [
        (0, "flaky", 1, 2),
        (1, "pass", 2, 2),
    ]
    assert summary.pass_rate == 0.5
    assert summary.exit_code == 1  # default gate pass_rate_min 1.0


# ---------------------------------------------------------------- resilience (docs 001/002)

CHAOS_MATRIX = [
    {"name": "no-chaos"},
    {
        "name": "tool-down",
        "tool_faults": [{"tool": "market_data_api", "mode": "error", "error_code": 503}],
    },
    {"name": "llm-degraded", "llm_faults": [{"mode": "truncated_response", "max_tokens": 20}]},
]
CONTRACT_INVARIANTS = {
    "cite": {
        "description": "cites a source",
        "severity": "critical",
        "check": {"type": "regex", "pattern": "source"},
    },
    "no_fabricate": {
        "description": "no dollar figures when tools fail",
        "severity": "high",
        "when": "tool_faults_active",
        "negate": True,
        "check": {"type": "regex", "pattern": "\\$"},
    },
    "latency": {
        "description": "fast",
        "severity": "medium",
        "check": {"type": "latency", "max_ms": 60000},
    },
}


def _contract_records(failing: set[tuple[str, str]]) -> list[ExecutionRecord]:
    spec = make_spec(invariants=CONTRACT_INVARIANTS, chaos_matrix=CHAOS_MATRIX)
    out = []
    for scenario in spec.scenarios:
        results = [
            result(inv.id, (inv.id, scenario.name) not in failing, severity=inv.severity)
            for inv in spec.invariants.values()
            if scenario.activates(inv.when)
        ]
        out.append(
            record(
                scenario.name,
                results,
                pillar="contract" if scenario.name == "no-chaos" else "chaos",
            )
        )
    return out


def test_resilience_formula_on_a_hand_computed_matrix() -> None:
    # Cells: cite x 3 scenarios (w 3), latency x 3 (w 1), no_fabricate only in tool-down (w 2):
    # total = 9 + 3 + 2 = 14. no_fabricate fails in tool-down and latency in llm-degraded:
    # passed = 9 + 2 + 0 = 11 -> 11 / 14 x 100 = 78.57
    spec = make_spec(
        invariants=CONTRACT_INVARIANTS, chaos_matrix=CHAOS_MATRIX, gates={"resilience_min": 80}
    )
    summary = score_run(
        spec, _contract_records({("no_fabricate", "tool-down"), ("latency", "llm-degraded")})
    )
    assert len(summary.matrix) == 7
    assert summary.resilience.score == pytest.approx(11 / 14 * 100)
    assert summary.resilience.critical_failed is False
    assert summary.pillar_scores["contract"] == pytest.approx(11 / 14)
    gate = next(g for g in summary.gates if g.name == "resilience_min")
    assert gate.passed is False and gate.actual == pytest.approx(78.571, abs=1e-3)
    assert summary.exit_code == 1


def test_any_critical_failure_fails_the_run_whatever_the_score() -> None:
    # Only cite fails, in one scenario: 11/14 would still be a decent number.
    spec = make_spec(
        invariants=CONTRACT_INVARIANTS, chaos_matrix=CHAOS_MATRIX, gates={"resilience_min": 50}
    )
    summary = score_run(spec, _contract_records({("cite", "llm-degraded")}))
    assert summary.resilience.score == pytest.approx(11 / 14 * 100)
    assert summary.resilience.critical_failed is True
    critical = next(g for g in summary.gates if g.name == "critical_failures")
    assert (critical.passed, critical.actual) == (False, 1.0)
    assert next(g for g in summary.gates if g.name == "resilience_min").passed is True
    assert summary.verdict == "fail" and summary.exit_code == 1


def test_critical_gate_is_empty_without_critical_invariants() -> None:
    summary = score_run(make_spec(), [record(results=[result("says_refund", True)])])
    critical = next(g for g in summary.gates if g.name == "critical_failures")
    assert critical.empty and critical.passed and critical.actual is None


def test_a_cell_fails_when_any_prompt_group_of_its_scenario_fails() -> None:
    spec = make_spec(task={"prompts": ["a", "b"]})
    records = [
        record(results=[result("says_refund", True)], prompt_index=0),
        record(results=[result("says_refund", False)], prompt_index=1),
    ]
    (cell,) = score_run(spec, records).matrix
    assert (cell.passed, cell.groups_passed, cell.groups_total, cell.status) == (
        False,
        1,
        2,
        "fail",
    )
    assert cell.failure_codes == ["CONTAINS_FAILED"]


def test_matrix_cell_follows_replica_aggregation() -> None:
    spec = make_spec(scoring={"replica_aggregation": "majority"}, replicas=3)
    records = [
        record(results=[result("says_refund", p)], replica=i)
        for i, p in enumerate([True, True, False])
    ]
    (cell,) = score_run(spec, records).matrix
    assert cell.passed and (cell.results_passed, cell.results_total) == (2, 3)


def test_execution_that_died_before_checks_fails_every_cell_as_error() -> None:
    summary = score_run(make_spec(), [record(results=[], status="error", error="sandbox crashed")])
    (cell,) = summary.matrix
    assert cell.status == "error" and not cell.passed


def test_provider_error_execution_is_no_pass_in_the_matrix_even_when_its_checks_passed() -> None:
    # The agent's model failed it (status provider_error); the checks still ran on whatever
    # it left, and a not_contains-style invariant passed on that. The execution is `error`,
    # so the cell and the resilience score must not count it as a pass (SPEC_FORMAT: never
    # counted as a pass in any aggregate).
    spec = make_spec(invariants=CONTRACT_INVARIANTS, chaos_matrix=CHAOS_MATRIX)
    broken = record(
        "no-chaos",
        [result("cite", True, severity="critical"), result("latency", True)],
        status="provider_error",
        error="model endpoint answered 503",
    )
    summary = score_run(spec, [broken])
    assert summary.executions[0].status == "error"
    cells = {c.invariant_id: c for c in summary.matrix}
    assert set(cells) == {"cite", "latency"}
    for cell in cells.values():
        assert not cell.passed and cell.status == "error"
        assert (cell.results_passed, cell.results_total) == (0, 1)
    assert summary.resilience.score == 0.0
    assert summary.resilience.critical_failed is True
    assert summary.pillar_scores["contract"] == 0.0


def test_resilience_of_no_cells_is_none() -> None:
    res = resilience_score([])
    assert res.score is None and not res.critical_failed


# ---------------------------------------------------------------- overall (doc 002)


def test_overall_renormalises_default_weights_over_pillars_that_ran() -> None:
    weights = {"mutation": 0.20, "chaos": 0.35, "contract": 0.35, "replay": 0.10}
    # contract 0.8, chaos 0.5: (0.35 x 0.8 + 0.35 x 0.5) / 0.70 = 0.65
    assert overall_score(
        {"contract": 0.8, "chaos": 0.5, "mutation": None, "replay": None}, weights
    ) == pytest.approx(0.65)
    # + mutation 1.0: (0.2 + 0.28 + 0.175) / 0.90 = 0.7278
    assert overall_score(
        {"contract": 0.8, "chaos": 0.5, "mutation": 1.0, "replay": None}, weights
    ) == pytest.approx(0.655 / 0.9)
    # all four: plain weighted sum
    assert overall_score(
        {"contract": 1.0, "chaos": 0.0, "mutation": 0.5, "replay": 1.0}, weights
    ) == pytest.approx(0.35 + 0.1 + 0.1)
    assert overall_score({"contract": None, "chaos": None}, weights) is None


def test_pillar_scores_from_a_run() -> None:
    spec = make_spec(chaos_matrix=CHAOS_MATRIX[:2])
    records = [
        record("no-chaos", [result("says_refund", True)]),
        record("tool-down", [result("says_refund", False)], pillar="chaos"),
        record(
            "no-chaos", [result("says_refund", True)], pillar="mutation", mutation_type="paraphrase"
        ),
        record(
            "no-chaos", [result("says_refund", False)], pillar="mutation", mutation_type="noise"
        ),
    ]
    summary = score_run(spec, records)
    # contract = resilience: 1 of 2 medium cells = 0.5; chaos: the one faulted group failed;
    # mutation: weighted by type (paraphrase 1.0 passed, noise 0.8 failed) = 1.0 / 1.8;
    # replay did not run.
    mutation = 1.0 / (1.0 + 0.8)
    assert summary.pillar_scores == {
        "contract": 0.5,
        "chaos": 0.0,
        "mutation": pytest.approx(mutation),
        "replay": None,
    }
    # (0.35 x 0.5 + 0.35 x 0 + 0.2 x 0.5556) / 0.9
    assert summary.overall == pytest.approx((0.35 * 0.5 + 0.2 * mutation) / 0.9)
    # mutations do not count in the scenario x prompt pass rate
    assert summary.pass_rate == 0.5


def test_mutation_pillar_takes_the_spec_weights_over_the_defaults() -> None:
    spec = make_spec(mutations={"types": ["noise", "prompt_injection"], "weights": {"noise": 3.0}})
    records = [
        record("no-chaos", [result("says_refund", True)]),
        record("no-chaos", [result("says_refund", True)], pillar="mutation", mutation_type="noise"),
        record(
            "no-chaos",
            [result("says_refund", False)],
            pillar="mutation",
            mutation_type="prompt_injection",
            replica=1,
        ),
    ]
    # noise 3.0 (the spec's) passed, prompt_injection 1.5 (the default) failed: 3 / 4.5
    assert score_run(spec, records).pillar_scores["mutation"] == pytest.approx(3.0 / 4.5)


# ---------------------------------------------------------------- gates (doc 004)


def test_without_gates_block_only_pass_rate_min_one_applies() -> None:
    summary = score_run(make_spec(), [record(results=[result("says_refund", True)])])
    assert [g.name for g in summary.gates] == ["pass_rate_min", "critical_failures"]
    assert summary.gates[0].threshold == 1.0 and summary.gates[0].passed
    assert summary.exit_code == 0 and summary.verdict == "pass"


def test_every_gate_measures_what_its_name_says() -> None:
    gates = {
        "pass_rate_min": 0.5,
        "schema_failures_max": 0,
        "pii_failures_max": 1,
        "keyword_failures_max": 1,
        "judge_avg_min": 0.7,
        "drift_score_max": 0.15,
        "resilience_min": 40,
        "cost_max_usd": 0.05,
        "latency_max_ms": 1500,
        "judge_human_kappa_min": 0.6,
    }
    spec = make_spec(gates=gates, task={"prompts": ["a", "b"]})
    records = [
        record(
            results=[
                result("says_refund", True),
                result("json", False, check_type="valid_json", code=FailureCode.SCHEMA_PARSE_ERROR),
                result("pii", False, check_type="pii", code=FailureCode.PII_DETECTED),
                result("kw", False, check_type="keywords", code=FailureCode.KEYWORD_DENIED),
                result("tone", True, score=0.9, check_type="llm_as_judge"),
                result("drift", True, score=0.95, check_type="drift"),
            ],
            prompt_index=0,
            duration_ms=1000,
            cost_usd=0.02,
        ),
        record(
            results=[
                result("says_refund", False),
                result(
                    "tone",
                    False,
                    score=0.4,
                    check_type="llm_as_judge",
                    code=FailureCode.JUDGE_BELOW_THRESHOLD,
                ),
                result(
                    "drift", False, score=0.7, check_type="drift", code=FailureCode.DRIFT_EXCEEDED
                ),
            ],
            prompt_index=1,
            duration_ms=2000,
            cost_usd=0.04,
        ),
    ]
    summary = score_run(spec, records, kappa=0.55)
    by_name = {g.name: g for g in summary.gates}
    assert (by_name["pass_rate_min"].actual, by_name["pass_rate_min"].passed) == (0.0, False)
    assert (by_name["schema_failures_max"].actual, by_name["schema_failures_max"].passed) == (
        1.0,
        False,
    )
    assert (by_name["pii_failures_max"].actual, by_name["pii_failures_max"].passed) == (1.0, True)
    assert (by_name["keyword_failures_max"].actual, by_name["keyword_failures_max"].passed) == (
        1.0,
        True,
    )
    # judge mean (0.9 + 0.4) / 2 = 0.65 < 0.7
    assert (
        by_name["judge_avg_min"].actual == pytest.approx(0.65)
        and not by_name["judge_avg_min"].passed
    )
    # drift = 1 - score; max(0.05, 0.30) = 0.30 > 0.15
    assert (
        by_name["drift_score_max"].actual == pytest.approx(0.3)
        and not by_name["drift_score_max"].passed
    )
    # resilience: says_refund 1 cell failed -> 0
    assert by_name["resilience_min"].actual == 0.0 and not by_name["resilience_min"].passed
    assert (
        by_name["cost_max_usd"].actual == pytest.approx(0.06) and not by_name["cost_max_usd"].passed
    )
    # p95 (nearest rank) of [1000, 2000] = 2000
    assert by_name["latency_max_ms"].actual == 2000 and not by_name["latency_max_ms"].passed
    assert (
        by_name["judge_human_kappa_min"].actual == 0.55
        and not by_name["judge_human_kappa_min"].passed
    )
    assert not any(g.empty for g in summary.gates if g.name != "critical_failures")
    assert summary.exit_code == 1


def test_gates_with_no_data_pass_and_are_flagged_empty() -> None:
    spec = make_spec(
        gates={
            "schema_failures_max": 0,
            "judge_avg_min": 0.9,
            "drift_score_max": 0.1,
            "judge_human_kappa_min": 0.6,
        }
    )
    summary = score_run(spec, [record(results=[result("says_refund", True)])], kappa=None)
    for gate in summary.gates:
        if gate.name == "pass_rate_min":  # always evaluated, and here it has data
            continue
        assert gate.empty and gate.passed and gate.actual is None, gate
    assert summary.exit_code == 0
    assert any("judge_avg_min had no data" in w for w in summary.warnings)


def test_count_gate_with_checks_that_ran_clean_is_zero_not_empty() -> None:
    spec = make_spec(gates={"pii_failures_max": 0})
    summary = score_run(spec, [record(results=[result("pii", True, check_type="excludes_pii")])])
    (_pass_rate, gate, _critical) = summary.gates
    assert (gate.actual, gate.empty, gate.passed) == (0.0, False, True)


def test_judge_avg_ignores_judge_errors() -> None:
    records = [
        record(
            results=[
                result("tone", True, score=0.8, check_type="judge"),
                result("tone2", False, check_type="judge", code=FailureCode.JUDGE_PARSE_ERROR),
            ]
        ),
    ]
    gates = evaluate_gates(
        {"judge_avg_min": 0.7}, groups=[], records=records, resilience=resilience_score([])
    )
    assert gates[0].actual == pytest.approx(0.8)


def test_p95_is_nearest_rank() -> None:
    assert percentile([float(v) for v in range(1, 21)], 95) == 19.0
    assert percentile([5.0], 95) == 5.0
    assert percentile([], 95) is None


# ---------------------------------------------------------------- exit codes


def _passing_gate() -> list[Any]:
    return evaluate_gates({}, groups=[], records=[], resilience=resilience_score([]))


def test_exit_code_zero_when_every_gate_passes_and_one_when_one_fails() -> None:
    ok = [record(results=[result("a", True)])]
    assert exit_code_for(_passing_gate(), ok) == 0
    failing = evaluate_gates(
        {"cost_max_usd": 0.0},
        groups=[],
        records=[record(cost_usd=1.0)],
        resilience=resilience_score([]),
    )
    assert exit_code_for(failing, ok) == 1


def test_a_cost_gate_fails_on_a_total_that_leaves_unpriced_calls_out() -> None:
    """$0.02 priced and calls to a model with no price: the total is no cost, under the limit
    or not."""
    records = [record(cost_usd=0.02), record(cost_usd=0.0, unpriced_models=["acme-9", "b"])]
    (gate, _critical) = evaluate_gates(
        {"cost_max_usd": 5.0}, groups=[], records=records, resilience=resilience_score([])
    )
    assert (gate.name, gate.passed, gate.actual, gate.empty) == ("cost_max_usd", False, None, False)
    assert gate.message.startswith("total cost (USD): unknown, no price for the model(s) 'acme-9'")
    assert exit_code_for([gate], [record()]) == 1
    priced = evaluate_gates(
        {"cost_max_usd": 5.0}, groups=[], records=records[:1], resilience=resilience_score([])
    )
    assert priced[0].passed and priced[0].actual == pytest.approx(0.02)


def test_provider_errors_exit_three() -> None:
    assert exit_code_for(_passing_gate(), [record(status="provider_error")]) == 3
    judge_down = record(
        results=[
            result("tone", False, check_type="llm_as_judge", code=FailureCode.PROVIDER_AUTH_FAILED)
        ]
    )
    assert exit_code_for(_passing_gate(), [judge_down]) == 3


def test_internal_errors_exit_four_and_win_over_provider_errors() -> None:
    crashed = record(status="error", error="Keystone internal error: RuntimeError: harness crashed")
    assert exit_code_for(_passing_gate(), [crashed]) == 4
    engine_bug = record(results=[result("a", False, code=FailureCode.INTERNAL_ERROR)])
    assert exit_code_for(_passing_gate(), [engine_bug, record(status="provider_error")]) == 4


def test_a_broken_check_is_the_specs_problem_and_fails_gates_not_exit_four() -> None:
    broken = record(
        results=[result("says_refund", False, code=FailureCode.CHECK_ERROR)], status="error"
    )
    summary = score_run(make_spec(), [broken])
    assert summary.groups[0].status == "error"
    assert summary.exit_code == 1 and summary.verdict == "fail"


def test_score_run_reports_error_verdict_for_provider_errors() -> None:
    summary = score_run(make_spec(), [record(status="provider_error")])
    assert (summary.exit_code, summary.verdict) == (3, "error")


# ---------------------------------------------------------------- metrics and warnings


def test_run_metrics() -> None:
    records = [
        record(
            results=[result("says_refund", True)],
            replica=0,
            duration_ms=100,
            cost_usd=0.01,
            input_tokens=10,
            output_tokens=5,
            tool_calls=4,
            tool_errors=1,
        ),
        record(
            results=[result("says_refund", True)],
            replica=1,
            duration_ms=300,
            cost_usd=0.03,
            input_tokens=20,
            output_tokens=5,
            tool_calls=0,
        ),
    ]
    m = score_run(make_spec(replicas=2), records).metrics
    assert m.executions == 2
    assert m.pass_rate == 1.0
    assert m.mean_duration_ms == 200 and m.p95_duration_ms == 300
    assert m.mean_tokens == 20 and m.mean_tool_calls == 2
    assert m.total_cost_usd == pytest.approx(0.04) and m.cost_per_execution_usd == pytest.approx(
        0.02
    )
    assert m.tool_success_rate == 0.75


def test_stateful_agent_without_reset_gets_the_contamination_warning() -> None:
    spec = make_spec(agent={"type": "http", "endpoint": "http://127.0.0.1:9/"}, replicas=2)
    records = [
        record(results=[result("says_refund", True)], replica=0, output="refund 1"),
        record(
            results=[result("says_refund", True)], replica=1, output="refund 2 (I remember you)"
        ),
    ]
    warnings = score_run(spec, records).warnings
    assert (
        "Warning: No reset_endpoint configured. Contract matrix cells may share state. "
        "Results may be contaminated. Add reset_endpoint to your config for accurate isolation."
    ) in warnings
    python = make_spec(agent={"type": "python", "callable": "a:run"}, replicas=2)
    assert any(
        w.startswith("Warning: No reset_function configured.") and "Add reset_function" in w
        for w in score_run(python, records).warnings
    )
    with_reset = make_spec(
        agent={"type": "http", "endpoint": "http://x/", "reset_endpoint": "http://x/reset"},
        replicas=2,
    )
    assert not any("No reset_endpoint" in w for w in score_run(with_reset, records).warnings)


def test_a_faulted_scenario_whose_executions_never_met_its_faults_is_a_warning_only() -> None:
    spec = make_spec(
        chaos_matrix=[
            {"name": "calm"},
            {"name": "llm-down", "llm_faults": [{"mode": "error"}]},
            {"name": "tools-down", "tool_faults": [{"tool": "*", "mode": "error"}]},
            {"name": "slow", "profile": "high_latency"},
            {
                "name": "injected",
                "context_attacks": [{"type": "indirect_injection"}, {"type": "overflow"}],
            },
        ],
        replicas=2,
    )

    def run(scenario: str, *, gateway: int | None, proxy: int | None, **extra: Any) -> list[Any]:
        pillar = "contract" if scenario == "calm" else "chaos"
        return [
            record(
                scenario,
                [result("says_refund", True)],
                replica=replica,
                pillar=pillar,
                gateway_calls=gateway,
                proxy_calls=proxy,
                **extra,
            )
            for replica in (0, 1)
        ]

    quiet = [
        *run("calm", gateway=0, proxy=0),
        *run("llm-down", gateway=0, proxy=3),
        *run("tools-down", gateway=2, proxy=0),
        *run("slow", gateway=0, proxy=0),
        *run("injected", gateway=0, proxy=0),
    ]
    summary = score_run(spec, quiet)
    unreached = [w for w in summary.warnings if "never fired" in w]
    assert unreached == [
        "scenario 'llm-down' injects llm_faults, but none of its 2 executions called the model"
        " through the gateway: its faults never fired, so it measured nothing about resilience",
        "scenario 'tools-down' injects tool_faults, but none of its 2 executions called a tool"
        " through the tool proxy: its faults never fired, so it measured nothing about resilience",
        "scenario 'slow' (profile high_latency) injects tool_faults and llm_faults, but none of"
        " its 2 executions called a tool through the tool proxy or the model through the"
        " gateway: its faults never fired, so it measured nothing about resilience",
        "scenario 'injected' injects context_attacks (indirect_injection) and context_attacks"
        " (overflow), but none of its 2 executions called a tool through the tool proxy or the"
        " model through the gateway: its faults never fired, so it measured nothing about"
        " resilience",
    ]
    # A warning only: every score is what the same results give without it.
    unwarned = score_run(
        spec, [replace(r, gateway_calls=None, proxy_calls=None) for r in quiet]
    )  # not counted (a report from before the counts): no warning
    assert not [w for w in unwarned.warnings if "never fired" in w]
    assert summary.resilience == unwarned.resilience
    assert summary.pillar_scores == unwarned.pillar_scores
    assert (summary.overall, summary.exit_code) == (unwarned.overall, unwarned.exit_code)

    # One call on either channel of a two-channel scenario: the agent met chaos.
    partly = [*run("slow", gateway=1, proxy=0), *run("llm-down", gateway=0, proxy=0)]
    partly[-1].gateway_calls = 1  # one replica of two reached the gateway
    assert not [w for w in score_run(spec, partly).warnings if "never fired" in w]
    # Executions whose agent never ran (status error) say nothing about its calls.
    never_ran = run("llm-down", gateway=None, proxy=None, status="error")
    assert not [w for w in score_run(spec, never_ran).warnings if "never fired" in w]
    one_ran = [*never_ran[:1], *run("llm-down", gateway=0, proxy=0)[1:]]
    assert [w for w in score_run(spec, one_ran).warnings if "never fired" in w] == [
        "scenario 'llm-down' injects llm_faults, but none of its 2 executions called the model"
        " through the gateway: its faults never fired, so it measured nothing about resilience"
    ]
    # The counts travel in the JSON report's records, for `keystone score`.
    assert ExecutionRecord.from_dict(quiet[2].to_dict()).gateway_calls == 0


def test_human_override_of_a_judge_score_changes_the_recomputed_verdict() -> None:
    spec = make_spec(scoring={"pass_threshold": 0.8})
    judged = result(
        "tone", False, score=0.4, check_type="llm_as_judge", code=FailureCode.JUDGE_BELOW_THRESHOLD
    )
    records = [record(results=[result("says_refund", True), judged])]
    assert score_run(spec, records).exit_code == 1  # (1 + 0.4) / 2 = 0.7 < 0.8
    judged.score, judged.passed, judged.failure_code, judged.source = 1.0, True, None, "human"
    assert score_run(spec, records).exit_code == 0


def test_drift_without_a_baseline_is_no_data_for_the_drift_gate() -> None:
    unmeasured = result("drift", True, check_type="drift")
    unmeasured.details = {"flag": "no_baseline"}
    gates = evaluate_gates(
        {"drift_score_max": 0.1},
        groups=[],
        records=[record(results=[unmeasured])],
        resilience=resilience_score([]),
    )
    assert gates[0].empty and gates[0].passed


# ---------------------------------------------------------------- verdicts and their reasons
# (issue 12, items 7 and 8)


def test_a_gates_block_naming_other_gates_keeps_pass_rate_min() -> None:
    # A failing high-severity invariant under a gates block that names only the cost gate:
    # pass_rate_min is still evaluated, so the run fails (it exited 0 before).
    spec = make_spec(gates={"cost_max_usd": 10})
    failing = record(results=[result("says_refund", False, severity="high")])
    summary = score_run(spec, [failing])
    assert [g.name for g in summary.gates] == ["pass_rate_min", "cost_max_usd", "critical_failures"]
    assert summary.exit_code == 1


def test_a_spec_may_still_lower_pass_rate_min_itself() -> None:
    spec = make_spec(gates={"pass_rate_min": 0.5})
    records = [
        record(results=[result("says_refund", True)], prompt_index=0),
        record(results=[result("says_refund", False)], prompt_index=1),
    ]
    assert score_run(spec, records).exit_code == 0


def test_without_pass_threshold_every_invariant_passing_is_a_pass() -> None:
    # A judge scoring 0.9 against its own 0.7 threshold passed: the execution passes, even
    # though its composite is 0.9 (it failed "0.9 < 1.0" before).
    judged = record(
        results=[
            result("says_refund", True),
            result("tone", True, score=0.9, check_type="llm_as_judge"),
        ]
    )
    score = score_execution(judged)
    assert (score.composite, score.passed, score.reason) == (pytest.approx(0.95), True, "")
    assert score_run(make_spec(), [judged]).exit_code == 0


def test_without_pass_threshold_a_failed_invariant_is_named() -> None:
    failed = record(results=[result("says_refund", True), result("tone", False, score=0.4)])
    score = score_execution(failed)
    assert not score.passed
    assert score.reason == "invariant `tone` failed"


def test_with_pass_threshold_the_composite_decides_and_says_so() -> None:
    # Reference 000's worked example: 1.0 / 1.3 = 0.77 < 0.85.
    nice_failed = record(
        results=[result("must_pass", True, gate=True), result("nice_to_have", False, weight=0.3)]
    )
    score = score_execution(nice_failed, pass_threshold=0.85)
    assert not score.passed
    assert score.reason == "composite 0.769 < pass_threshold 0.85"
    assert score_execution(nice_failed, pass_threshold=0.75).passed


def test_a_gate_below_one_is_named_with_its_score() -> None:
    gated = record(results=[result("tests_pass", True, score=0.9, gate=True)])
    score = score_execution(gated, pass_threshold=0.5)
    assert (score.composite, score.passed) == (0.0, False)
    assert score.reason == "gate `tests_pass` scored 0.9 < 1.0"


def test_a_forbidden_violation_is_named() -> None:
    violated = record(
        results=[result("says_refund", True)],
        forbidden_violations=[{"rule": "db_writes_outside", "message": "wrote users"}],
    )
    score = score_execution(violated)
    assert not score.passed
    assert score.reason == "forbidden rule `db_writes_outside` violated"


def test_an_errored_execution_says_what_went_wrong() -> None:
    broken = record(results=[], status="error", error="agent command exited with code 2\nmore")
    assert score_execution(broken).reason == "execution error: agent command exited with code 2"


def test_an_execution_marked_error_by_its_check_names_the_check() -> None:
    """Stored, an execution whose check could not finish is `error` with no error of its
    own (execution_record): its reason was the bare "execution error"."""
    crashed = result("tests_pass", False, code=FailureCode.CHECK_ERROR, check_type="custom")
    crashed.message = "script crash.sh exited with code 1"
    stored = record(results=[result("says_refund", True), crashed], status="error", error="")
    assert score_execution(stored).reason == (
        "`tests_pass` could not be checked (CHECK_ERROR): script crash.sh exited with code 1"
    )


def test_an_agent_that_cannot_be_imported_is_the_agents_error_not_exit_four() -> None:
    # issue 12, item 9: it fails its gates (exit 1) with the ModuleNotFoundError as the reason.
    unimportable = record(
        status="error",
        error="python agent callable raised ModuleNotFoundError: No module named 'myagent'",
    )
    summary = score_run(make_spec(), [unimportable])
    assert summary.exit_code == 1
    assert "ModuleNotFoundError" in summary.executions[0].reason


def test_a_run_whose_executions_all_errored_does_not_look_like_a_pass() -> None:
    # issue 12, item 10: it showed composite 1.000 and p95 0 ms.
    records = [
        record(status="error", error="agent command exited with code 127", prompt_index=i)
        for i in range(3)
    ]
    summary = score_run(make_spec(), records)
    assert [e.composite for e in summary.executions] == [0.0, 0.0, 0.0]
    assert summary.metrics.p95_duration_ms is None and summary.metrics.mean_duration_ms is None
    assert summary.exit_code == 1


def test_a_calm_execution_that_passed_without_its_agent_finishing_is_warned_about() -> None:
    """Every invariant a "must not" rule: an agent that fails every prompt would pass them
    all on its empty output. The verdict stays the invariants' (SPEC_FORMAT), with a warning
    that names why; under chaos, failing without breaking a rule is what resilience is."""
    spec = make_spec(
        chaos_matrix=[
            {"name": "no-chaos"},
            {"name": "tools-down", "tool_faults": [{"tool": "*", "mode": "error"}]},
        ],
        tools=[{"name": "quotes", "url": "http://127.0.0.1:9/"}],
    )
    crashed = record(
        results=[result("says_refund", True)],
        status="failed",
        error="agent command exited with code 2\nTraceback ...",
    )
    summary = score_run(spec, [crashed])
    assert summary.verdict == "pass"
    assert [w for w in summary.warnings if "did not finish" in w] == [
        "1 execution(s) without chaos passed although their agent did not finish (agent"
        " command exited with code 2): every invariant held on what it left; add a"
        " `completes` invariant to make finishing part of the verdict"
    ]
    # Under chaos, or when the execution failed anyway, or the agent finished: no warning.
    quiet = [
        record("tools-down", [result("says_refund", True)], status="failed", pillar="chaos"),
        record(results=[result("says_refund", False)], status="failed", replica=1),
        record(results=[result("says_refund", True)], prompt_index=1),
    ]
    assert not [w for w in score_run(spec, quiet).warnings if "did not finish" in w]


def test_a_check_that_errored_leaves_the_other_invariants_of_its_execution_their_verdict() -> None:
    """Stored, an execution whose check could not finish is `error` (execution_record); its
    other invariants' cells read `error` too, though their checks gave a verdict."""
    crashed = result("tests_pass", False, code=FailureCode.CHECK_ERROR, check_type="custom")
    stored = record(results=[result("says_refund", True), crashed], status="error", error="")
    spec = make_spec(
        invariants={
            "says_refund": {"description": "d", "check": {"type": "contains", "value": "r"}},
            "tests_pass": {"description": "t", "check": {"type": "custom", "script": "t.sh"}},
        }
    )
    cells = {c.invariant_id: c for c in score_run(spec, [stored]).matrix}
    assert (cells["says_refund"].passed, cells["says_refund"].status) == (True, "pass")
    assert (cells["tests_pass"].passed, cells["tests_pass"].status) == (False, "error")
    # An execution that could not run gives no verdict in any cell, whatever its results.
    provider = record(results=[result("says_refund", True)], status="provider_error", error="503")
    [cell] = score_run(make_spec(), [provider]).matrix
    assert (cell.passed, cell.status) == (False, "error")
