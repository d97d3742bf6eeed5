"""Scores, verdicts, gates and exit codes: pure functions of stored check results.

The CLI (`keystone run`, `keystone score`) and the web app's run_finalize both call
`score_run`, so a human overriding a judge score only has to call it again. The rules and
every choice the reference documents leave open are written down in docs/scoring.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from math import comb

from checks.artifact import NO_VERDICT_STATUSES
from checks.exit_codes import (
    EXIT_GATE_FAILED,
    EXIT_INTERNAL_ERROR,
    EXIT_OK,
    EXIT_PROVIDER_ERROR,
    EXIT_SPEC_INVALID,
)
from checks.mutation_scoring import mutation_score
from checks.pricing import no_price_for
from checks.report_model import (
    MATRIX_PILLARS,
    PILLARS,
    ExecutionRecord,
    ExecutionScore,
    GateResult,
    MatrixCell,
    ReplicaAggregate,
    Resilience,
    RunMetrics,
    RunSummary,
)
from checks.results import (
    INTERNAL_ERROR_PREFIX,
    JUDGE_CHECK_TYPES,
    PROVIDER_CODES,
    CheckResult,
    FailureCode,
)
from checks.spec.model import SEVERITY_WEIGHTS, Scenario, Spec
from checks.wording import counted

__all__ = [
    "AGGREGATION_METHODS",
    "EXIT_GATE_FAILED",
    "EXIT_INTERNAL_ERROR",
    "EXIT_OK",
    "EXIT_PROVIDER_ERROR",
    "EXIT_SPEC_INVALID",
    "GATE_NAMES",
    "ExecutionRecord",
    "ExecutionScore",
    "GateResult",
    "MatrixCell",
    "ReplicaAggregate",
    "Resilience",
    "RunMetrics",
    "RunSummary",
    "aggregate_replicas",
    "build_matrix",
    "evaluate_gates",
    "execution_composite",
    "execution_verdict",
    "exit_code_for",
    "overall_score",
    "pass_at_k",
    "pass_hat_k",
    "percentile",
    "resilience_score",
    "run_metrics",
    "score_execution",
    "score_run",
]

AGGREGATION_METHODS = ("all", "majority", "any", "mean")
# Float sums such as 0.7 + 0.15 must not fail a threshold they meet on paper.
EPSILON = 1e-9

# Gate name -> True when `actual` must be at least the threshold, False when at most.
GATE_NAMES: dict[str, bool] = {
    "pass_rate_min": True,
    "schema_failures_max": False,
    "pii_failures_max": False,
    "keyword_failures_max": False,
    "judge_avg_min": True,
    "drift_score_max": False,
    "resilience_min": True,
    "cost_max_usd": False,
    "latency_max_ms": False,
    "judge_human_kappa_min": True,
}
DEFAULT_GATES = {"pass_rate_min": 1.0}
# Reference 002's words; a python agent is told about its own hook, reset_function.
STATEFUL_WARNING = (
    "Warning: No reset_endpoint configured. Contract matrix cells may share state. "
    "Results may be contaminated. Add reset_endpoint to your config for accurate isolation."
)
STATEFUL_WARNING_PYTHON = STATEFUL_WARNING.replace("reset_endpoint", "reset_function")


# ---------------------------------------------------------------- one execution


def execution_composite(results: Sequence[CheckResult], *, forbidden_violations: int = 0) -> float:
    """sum(weight x score) / sum(weight); 0 when a gate invariant is below 1.0 or a forbidden
    rule was violated; 1.0 when no invariant was active (vacuous, see score_execution)."""
    if forbidden_violations > 0:
        return 0.0
    if any(_gate_failed(r) for r in results):
        return 0.0
    if not results:
        return 1.0
    scores = [_clamp(r.score) for r in results]
    top = max(r.weight for r in results)
    if top <= 0:
        # All weights zero: nothing says one invariant matters more, so take the plain mean.
        return _clamp(sum(scores) / len(scores))
    # Relative to the largest weight: only the ratios matter, and a tiny weight (5e-324)
    # cannot underflow the sum to 0.
    weights = [r.weight / top for r in results]
    return _clamp(sum(w * s for w, s in zip(weights, scores, strict=True)) / sum(weights))


def execution_verdict(composite: float, pass_threshold: float | None) -> bool:
    # With no threshold, "every invariant passed" is decided by failure_reason; a composite
    # can only say so when it is 1.0 (used by the `mean` replica aggregation).
    return composite >= (1.0 if pass_threshold is None else pass_threshold) - EPSILON


def score_execution(
    record: ExecutionRecord, *, pass_threshold: float | None = None
) -> ExecutionScore:
    composite = execution_composite(
        record.results, forbidden_violations=len(record.forbidden_violations)
    )
    codes = _failure_codes(record.results)
    if record.forbidden_violations and FailureCode.FORBIDDEN_VIOLATION.value not in codes:
        codes.append(FailureCode.FORBIDDEN_VIOLATION.value)
    errored = _execution_errored(record)
    if errored:
        composite = 0.0  # no verdict: an aggregate over it must not look like a pass
    reason = failure_reason(record, composite, pass_threshold)
    passed = not errored and not reason
    status = "error" if errored else ("pass" if passed else "fail")
    return ExecutionScore(
        execution_id=record.id,
        scenario=record.scenario,
        prompt_index=record.prompt_index,
        replica=record.replica,
        pillar=record.pillar,
        mutation_type=record.mutation_type,
        composite=composite,
        passed=passed,
        status=status,
        gate_failed=[r.invariant_id for r in record.results if _gate_failed(r)],
        forbidden=len(record.forbidden_violations),
        failure_codes=codes,
        vacuous=not record.results and not errored,
        reason=_error_reason(record) if errored else reason,
    )


def failure_reason(record: ExecutionRecord, composite: float, pass_threshold: float | None) -> str:
    """Why the execution does not pass, in words; "" when it passes.

    A forbidden rule or a gate invariant below 1.0 forces the composite to 0 and fails it.
    Then, with `scoring.pass_threshold` set, the composite decides; without one, every
    active invariant must have passed (its own threshold, e.g. a judge's, is what counts).
    """
    if record.forbidden_violations:
        rules = sorted({str(v.get("rule", "?")) for v in record.forbidden_violations})
        return "forbidden rule " + ", ".join(f"`{r}`" for r in rules) + " violated"
    gates = [r for r in record.results if _gate_failed(r)]
    if gates:
        return "; ".join(f"gate `{r.invariant_id}` scored {_short(r.score)} < 1.0" for r in gates)
    if pass_threshold is not None:
        if execution_verdict(composite, pass_threshold):
            return ""
        return f"composite {_short(composite)} < pass_threshold {_short(pass_threshold)}"
    failed = [r for r in record.results if not r.passed]
    if not failed:
        return ""
    named = ", ".join(f"`{r.invariant_id}`" for r in failed[:5])
    more = f" (+{len(failed) - 5} more)" if len(failed) > 5 else ""
    first = failed[0].message.strip().splitlines()[0][:200] if failed[0].message else ""
    return f"invariant {named}{more} failed" + (f": {first}" if first else "")


def _error_reason(record: ExecutionRecord) -> str:
    errors = [r for r in record.results if r.is_error]
    said = (record.error or "").strip().splitlines()
    # The execution's own error first; a stored execution marked `error` only because one
    # of its checks could not finish (execution_record) has none, and the check says why.
    if not errors or (record.status in NO_VERDICT_STATUSES and said):
        return f"execution {record.status}" + (f": {said[0][:200]}" if said else "")
    first = errors[0]
    return f"`{first.invariant_id}` could not be checked ({first.failure_code}): " + (
        first.message.strip().splitlines()[0][:200] if first.message else ""
    )


def _short(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.1f}"


def _gate_failed(result: CheckResult) -> bool:
    return result.gate and (result.score < 1.0 or not result.passed)


def _error_of_its_checks(record: ExecutionRecord) -> bool:
    """Stored as `error` only because some of its checks could not finish: the agent did
    its task (services.recording.execution_record marks only a successful one so), and its
    other results are verdicts. An execution whose agent never ran has no results at all."""
    return record.status == "error" and any(r.is_error for r in record.results)


def _execution_errored(record: ExecutionRecord) -> bool:
    """No trustworthy verdict: the harness, the provider or a check could not finish."""
    return record.status in NO_VERDICT_STATUSES or any(r.is_error for r in record.results)


# ---------------------------------------------------------------- replicas


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k replicas drawn from n passes (unbiased estimator)."""
    _check_nck(n, c, k)
    # (C(n,k) - C(n-c,k)) / C(n,k): integer arithmetic first, one rounding at the end.
    total = comb(n, k)
    return (total - comb(n - c, k)) / total


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: probability that all k replicas drawn from n pass."""
    _check_nck(n, c, k)
    return comb(c, k) / comb(n, k)


def _check_nck(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")


def aggregate_replicas(
    executions: Sequence[ExecutionScore],
    method: str = "all",
    *,
    pass_threshold: float | None = None,
) -> ReplicaAggregate:
    """Verdict of one (scenario x prompt) group. `passed` follows `method`; `status` says
    error (a replica could not be scored) > flaky (replicas disagree) > pass | fail."""
    if not executions:
        raise ValueError("cannot aggregate zero replicas")
    if method not in AGGREGATION_METHODS:
        raise ValueError(f"unknown replica_aggregation {method!r}")
    n = len(executions)
    c = sum(1 for e in executions if e.passed)
    composites = [e.composite for e in executions]
    mean_composite = sum(composites) / n
    passed = {
        "all": c == n,
        "majority": c * 2 > n,
        "any": c >= 1,
        # A low pass_threshold (0) must not pass a group whose replicas all failed their own
        # verdict (a forbidden rule, a gate) or errored: the mean of their zeros meets it.
        "mean": c >= 1 and execution_verdict(mean_composite, pass_threshold),
    }[method]
    if any(e.status == "error" for e in executions):
        status = "error"
    elif 0 < c < n:
        status = "flaky"
    else:
        status = "pass" if passed else "fail"
    first = executions[0]
    codes: list[str] = []
    for e in executions:
        codes.extend(code for code in e.failure_codes if code not in codes)
    return ReplicaAggregate(
        pillar=first.pillar,
        scenario=first.scenario,
        prompt_index=first.prompt_index,
        mutation_type=first.mutation_type,
        method=method,
        passed=passed,
        status=status,
        n=n,
        c=c,
        pass_at_k=pass_at_k(n, c, n),
        pass_hat_k=pass_hat_k(n, c, n),
        pass_at_1=pass_at_k(n, c, 1),
        mean_composite=mean_composite,
        min_composite=min(composites),
        max_composite=max(composites),
        failure_codes=codes,
        execution_ids=[e.execution_id for e in executions],
    )


GroupKey = tuple[str, str, int, str]


def invariant_scores(results: Iterable[CheckResult]) -> dict[str, dict[str, float]]:
    """Each invariant's scores over one group's replicas: n, passed, mean, min, max."""
    by_invariant: dict[str, list[CheckResult]] = defaultdict(list)
    for result in results:
        by_invariant[result.invariant_id].append(result)
    table: dict[str, dict[str, float]] = {}
    for invariant_id, found in by_invariant.items():
        values = [_clamp(r.score) for r in found]
        table[invariant_id] = {
            "n": len(values),
            "passed": sum(1 for r in found if r.passed),
            "mean": sum(values) / len(values),
            "min": min(values),
            "max": max(values),
        }
    return table


def _group_key(pillar: str, scenario: str, prompt_index: int, mutation: str | None) -> GroupKey:
    return (pillar, scenario, prompt_index, mutation or "")


def _group_scores(scores: Iterable[ExecutionScore]) -> dict[GroupKey, list[ExecutionScore]]:
    groups: dict[GroupKey, list[ExecutionScore]] = defaultdict(list)
    for score in scores:
        key = _group_key(score.pillar, score.scenario, score.prompt_index, score.mutation_type)
        groups[key].append(score)
    for members in groups.values():
        members.sort(key=lambda e: e.replica)
    return dict(groups)


def _invariant_verdict(passes: Sequence[bool], method: str) -> bool:
    """An invariant's verdict over replicas; `mean` (a rule about composites) becomes
    'passed in at least half of the replicas' for a single invariant."""
    n, c = len(passes), sum(passes)
    if method == "all":
        return c == n
    if method == "majority":
        return c * 2 > n
    if method == "any":
        return c >= 1
    return c * 2 >= n


# ---------------------------------------------------------------- matrix and resilience


def build_matrix(spec: Spec, records: Sequence[ExecutionRecord]) -> list[MatrixCell]:
    """Invariant x scenario cells over the contract and chaos executions. A cell passes when
    the invariant passed (by the spec's replica_aggregation) in every (scenario x prompt)
    group of that scenario where it was evaluated."""
    method = spec.scoring.replica_aggregation
    by_group: dict[GroupKey, list[ExecutionRecord]] = defaultdict(list)
    for record in records:
        if record.pillar in MATRIX_PILLARS:
            key = _group_key("matrix", record.scenario, record.prompt_index, record.mutation_type)
            by_group[key].append(record)
    scenarios = {s.name: s for s in spec.scenarios}
    scenario_names = [s.name for s in spec.scenarios]
    scenario_names += sorted({k[1] for k in by_group} - set(scenario_names))

    cells: list[MatrixCell] = []
    for scenario_name in scenario_names:
        groups = [members for key, members in by_group.items() if key[1] == scenario_name]
        known: Scenario | None = scenarios.get(scenario_name)
        for invariant in spec.invariants.values():
            if known is not None and not known.activates(invariant.when):
                continue
            cell = _cell(invariant.id, invariant.severity, scenario_name, groups, method)
            if cell is not None:
                cells.append(cell)
    return cells


def _cell(
    invariant_id: str,
    severity: str,
    scenario: str,
    groups: Sequence[Sequence[ExecutionRecord]],
    method: str,
) -> MatrixCell | None:
    groups_passed = groups_total = results_passed = results_total = gates_below_one = 0
    errored = False
    codes: list[str] = []
    for members in groups:
        passes: list[bool] = []
        for record in members:
            result = next((r for r in record.results if r.invariant_id == invariant_id), None)
            if result is None:
                # An execution that died before any check ran counts against every
                # invariant; otherwise a missing result means "not evaluated here" (probes).
                if not record.results and _execution_errored(record):
                    passes.append(False)
                    errored = True
                continue
            if record.status in NO_VERDICT_STATUSES and not _error_of_its_checks(record):
                # The execution could not run (its model failed it, Keystone broke): what a
                # check read off what it left is no verdict, and never a pass in a cell,
                # whatever that check said (SPEC_FORMAT: never counted as a pass).
                passes.append(False)
                errored = True
                continue
            passes.append(result.passed)
            errored = errored or result.is_error
            if result.passed and result.gate and result.score < 1.0:
                gates_below_one += 1
            if not result.passed and result.failure_code and result.failure_code.value not in codes:
                codes.append(result.failure_code.value)
        if not passes:
            continue
        groups_total += 1
        groups_passed += _invariant_verdict(passes, method)
        results_total += len(passes)
        results_passed += sum(passes)
    if groups_total == 0:
        return None
    passed = groups_passed == groups_total
    return MatrixCell(
        invariant_id=invariant_id,
        scenario=scenario,
        severity=severity,
        severity_weight=SEVERITY_WEIGHTS.get(severity, 1),
        passed=passed,
        status="pass" if passed else ("error" if errored else "fail"),
        groups_passed=groups_passed,
        groups_total=groups_total,
        results_passed=results_passed,
        results_total=results_total,
        failure_codes=codes,
        gates_below_one=gates_below_one,
    )


def resilience_score(cells: Sequence[MatrixCell]) -> Resilience:
    """(sum passed x w) / (sum total x w) x 100 over cells, w by severity; any failing
    critical cell fails the run whatever the number says."""
    total = sum(c.severity_weight for c in cells)
    passed = sum(c.severity_weight for c in cells if c.passed)
    critical = [c for c in cells if c.severity == "critical"]
    critical_failures = sum(1 for c in critical if not c.passed)
    return Resilience(
        score=(passed / total * 100.0) if total > 0 else None,
        critical_failed=critical_failures > 0,
        critical_failures=critical_failures,
        critical_cells=len(critical),
        passed_weight=float(passed),
        total_weight=float(total),
    )


# ---------------------------------------------------------------- pillars and overall


def overall_score(
    pillar_scores: Mapping[str, float | None], weights: Mapping[str, float]
) -> float | None:
    """Weighted mean of the pillars that ran, the weights renormalised over them."""
    ran = {p: s for p, s in pillar_scores.items() if s is not None and weights.get(p, 0) > 0}
    total = sum(weights[p] for p in ran)
    if not ran or total <= 0:
        return None
    return _clamp(sum(weights[p] * s for p, s in ran.items()) / total)


def _pass_rate(groups: Sequence[ReplicaAggregate]) -> float | None:
    return sum(1 for g in groups if g.passed) / len(groups) if groups else None


def _pillar_scores(
    spec: Spec,
    groups: Sequence[ReplicaAggregate],
    resilience: Resilience,
    scores: Sequence[ExecutionScore] = (),
) -> dict[str, float | None]:
    chaotic = {s.name for s in spec.scenarios if s.any_chaos_active}
    chaos_groups = [
        g
        for g in groups
        if g.pillar == "chaos" or (g.pillar in MATRIX_PILLARS and g.scenario in chaotic)
    ]
    return {
        "contract": None if resilience.score is None else resilience.score / 100.0,
        "chaos": _pass_rate(chaos_groups),
        "mutation": _mutation_pillar(spec, scores),
        "replay": _pass_rate([g for g in groups if g.pillar == "replay"]),
    }


def _mutation_pillar(spec: Spec, scores: Sequence[ExecutionScore]) -> float | None:
    """Every mutant counts once, weighted by its type (docs/mutations.md); None if none ran."""
    mutants = [(s.mutation_type or "", s.passed) for s in scores if s.pillar == "mutation"]
    if not mutants:
        return None
    weights = (spec.raw.get("mutations") or {}).get("weights") or {}
    return mutation_score(mutants, {str(k): float(v) for k, v in weights.items()})


# ---------------------------------------------------------------- gates


def evaluate_gates(
    gates: Mapping[str, float],
    *,
    groups: Sequence[ReplicaAggregate],
    records: Sequence[ExecutionRecord],
    resilience: Resilience,
    kappa: float | None = None,
) -> list[GateResult]:
    """Every configured gate, then `critical_failures` (always evaluated)."""
    matrix_groups = [g for g in groups if g.pillar in MATRIX_PILLARS]
    results = [r for record in records for r in record.results]
    measured: dict[str, tuple[float | None, str]] = {
        "pass_rate_min": (_pass_rate(matrix_groups), "scenario x prompt pass rate"),
        "schema_failures_max": _code_count(
            results, lambda c: c.startswith("SCHEMA_"), {"schema", "valid_json"}, "schema failures"
        ),
        "pii_failures_max": _code_count(
            results, lambda c: c == "PII_DETECTED", {"pii", "excludes_pii"}, "PII failures"
        ),
        "keyword_failures_max": _code_count(
            results, lambda c: c.startswith("KEYWORD_"), {"keywords"}, "keyword failures"
        ),
        "judge_avg_min": (judge_mean(records), "mean judge score"),
        "drift_score_max": (
            _max([1.0 - r.score for r in results if _measured_drift(r)]),
            "max drift score",
        ),
        "resilience_min": (resilience.score, "resilience score"),
        "cost_max_usd": (
            sum(r.cost_usd for r in records) if records else None,
            "total cost (USD)",
        ),
        "latency_max_ms": (
            percentile(_durations(records), 95),
            "p95 execution latency (ms)",
        ),
        "judge_human_kappa_min": (kappa, "judge-human agreement (Cohen's kappa)"),
    }
    unpriced = _unpriced_models(records)
    out: list[GateResult] = []
    for name, threshold in gates.items():
        if name not in GATE_NAMES:
            continue
        if name == "cost_max_usd" and unpriced:  # a total that leaves calls out passes no limit
            message = f"total cost (USD): unknown, {no_price_for(unpriced)}"
            out.append(GateResult(name, False, None, float(threshold), message))
            continue
        actual, label = measured[name]
        out.append(_gate(name, actual, float(threshold), label, at_least=GATE_NAMES[name]))
    out.append(
        _gate(
            "critical_failures",
            float(resilience.critical_failures) if resilience.critical_cells else None,
            0.0,
            "failing critical invariant x scenario cells",
            at_least=False,
        )
    )
    return out


def _measured_drift(result: CheckResult) -> bool:
    # A drift check with no baseline yet passes flagged (KindLM); it measured nothing.
    return (
        result.check_type == "drift"
        and not result.is_error
        and result.details.get("flag") != "no_baseline"
    )


def _unpriced_models(records: Sequence[ExecutionRecord]) -> list[str]:
    """The models of the run's calls the gateway could not price (what its cost leaves out)."""
    return sorted({model for record in records for model in record.unpriced_models})


def _gate(
    name: str, actual: float | None, threshold: float, label: str, *, at_least: bool
) -> GateResult:
    sign = ">=" if at_least else "<="
    if actual is None:
        return GateResult(name, True, None, threshold, f"{label}: no data (passes)", empty=True)
    passed = actual >= threshold - EPSILON if at_least else actual <= threshold + EPSILON
    return GateResult(
        name, passed, actual, threshold, f"{label}: {_fmt(actual)} (needs {sign} {_fmt(threshold)})"
    )


def _code_count(
    results: Sequence[CheckResult],
    matches: Callable[[str], bool],
    check_types: set[str],
    label: str,
) -> tuple[float | None, str]:
    failing = [r for r in results if r.failure_code and matches(r.failure_code.value)]
    relevant = [r for r in results if r.check_type in check_types]
    if not failing and not relevant:
        return None, label
    return float(len(failing)), label


# ---------------------------------------------------------------- exit code and metrics


def exit_code_for(gates: Sequence[GateResult], records: Sequence[ExecutionRecord]) -> int:
    """4 internal error > 3 provider error > 1 a gate failed > 0. A check's own error
    (CHECK_ERROR: a broken script, a missing service) is the spec's problem, not the
    platform's: it fails the invariant and so the gates."""
    if any(_internal_error(r) for r in records):
        return EXIT_INTERNAL_ERROR
    if any(_provider_error(r) for r in records):
        return EXIT_PROVIDER_ERROR
    if not all(g.passed for g in gates):
        return EXIT_GATE_FAILED
    return EXIT_OK


def _internal_error(record: ExecutionRecord) -> bool:
    # Keystone failed, not the agent: an agent that cannot be imported, a setup command or a
    # reset that fails are the agent's errors (the execution fails, the gates decide).
    if any(r.failure_code == FailureCode.INTERNAL_ERROR for r in record.results):
        return True
    return record.status == "error" and (record.error or "").startswith(INTERNAL_ERROR_PREFIX)


def _provider_error(record: ExecutionRecord) -> bool:
    return record.status == "provider_error" or any(
        r.failure_code in PROVIDER_CODES for r in record.results
    )


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile (a value that really occurred), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return float(ordered[rank - 1])


def judge_mean(records: Sequence[ExecutionRecord]) -> float | None:
    """Mean score of the judge's verdicts; a judge that errored gave no verdict to average."""
    return _mean(
        [
            result.score
            for record in records
            for result in record.results
            if result.check_type in JUDGE_CHECK_TYPES and not result.is_error
        ]
    )


def run_metrics(
    records: Sequence[ExecutionRecord], groups: Sequence[ReplicaAggregate]
) -> RunMetrics:
    tool_calls = sum(r.tool_calls for r in records)
    tool_errors = sum(r.tool_errors for r in records)
    total_cost = sum(r.cost_usd for r in records)
    durations = _durations(records)
    return RunMetrics(
        executions=len(records),
        pass_rate=_pass_rate([g for g in groups if g.pillar in MATRIX_PILLARS]),
        mean_duration_ms=_mean(durations),
        p95_duration_ms=percentile(durations, 95),
        mean_tool_calls=_mean([float(r.tool_calls) for r in records]),
        mean_tokens=_mean([float(r.total_tokens) for r in records]),
        total_cost_usd=total_cost,
        cost_per_execution_usd=total_cost / len(records) if records else None,
        tool_success_rate=(tool_calls - tool_errors) / tool_calls if tool_calls else None,
        judge_mean=judge_mean(records),
    )


def _durations(records: Sequence[ExecutionRecord]) -> list[float]:
    # An execution that errored before its agent ran took no time worth measuring: counted
    # as 0 ms, a run whose executions all errored would show a p95 of 0 ms.
    return [r.duration_ms for r in records if not (_execution_errored(r) and r.duration_ms <= 0)]


# ---------------------------------------------------------------- the run


def score_run(
    spec: Spec, executions: Sequence[ExecutionRecord], *, kappa: float | None = None
) -> RunSummary:
    """The one path from stored results to scores, gates, verdict and exit code."""
    records = list(executions)
    threshold = spec.scoring.pass_threshold
    method = spec.scoring.replica_aggregation
    scores = [score_execution(r, pass_threshold=threshold) for r in records]
    prompts = {
        (r.pillar, r.scenario, r.prompt_index, r.mutation_type or ""): r.prompt for r in records
    }
    results_by_group: dict[GroupKey, list[CheckResult]] = defaultdict(list)
    for r in records:
        results_by_group[_group_key(r.pillar, r.scenario, r.prompt_index, r.mutation_type)] += (
            r.results
        )
    groups = []
    for key, members in _group_scores(scores).items():
        group = aggregate_replicas(members, method, pass_threshold=threshold)
        group.prompt = prompts.get(key, "")
        group.invariant_scores = invariant_scores(results_by_group[key])
        groups.append(group)
    groups.sort(key=_group_order(spec))
    matrix = build_matrix(spec, records)
    resilience = resilience_score(matrix)
    pillars = _pillar_scores(spec, groups, resilience, scores)
    gates_config = _gates_config(spec)
    gates = evaluate_gates(
        gates_config, groups=groups, records=records, resilience=resilience, kappa=kappa
    )
    exit_code = exit_code_for(gates, records)
    return RunSummary(
        spec_id=spec.id,
        executions=scores,
        groups=groups,
        matrix=matrix,
        resilience=resilience,
        pillar_scores=pillars,
        overall=overall_score(pillars, spec.scoring.weights),
        pass_rate=_pass_rate([g for g in groups if g.pillar in MATRIX_PILLARS]),
        gates=gates,
        verdict={EXIT_OK: "pass", EXIT_GATE_FAILED: "fail"}.get(exit_code, "error"),
        exit_code=exit_code,
        metrics=run_metrics(records, groups),
        warnings=_warnings(spec, records, scores, gates),
        kappa=kappa,
        spec=spec,
        records=records,
    )


def _gates_config(spec: Spec) -> dict[str, float]:
    # pass_rate_min ("every scenario x prompt verdict passes") is always evaluated, as
    # KindLM does: a gates block that names other gates adds to it, it does not replace it.
    return {**DEFAULT_GATES, **{name: float(value) for name, value in spec.gates.items()}}


def _group_order(spec: Spec) -> Callable[[ReplicaAggregate], tuple[int, int, str, int, str]]:
    scenario_rank = {s.name: i for i, s in enumerate(spec.scenarios)}

    def order(g: ReplicaAggregate) -> tuple[int, int, str, int, str]:
        pillar = PILLARS.index(g.pillar) if g.pillar in PILLARS else len(PILLARS)
        matrix_pillar = 0 if g.pillar in MATRIX_PILLARS else pillar
        rank = scenario_rank.get(g.scenario, len(scenario_rank))
        return (matrix_pillar, rank, g.scenario, g.prompt_index, g.mutation_type or "")

    return order


def _warnings(
    spec: Spec,
    records: Sequence[ExecutionRecord],
    scores: Sequence[ExecutionScore],
    gates: Sequence[GateResult],
) -> list[str]:
    warnings: list[str] = []
    vacuous = sum(1 for s in scores if s.vacuous)
    if vacuous:
        warnings.append(
            f"{vacuous} execution(s) had no active invariant; their composite is 1.0 by definition"
        )
    unknown = sorted(set(spec.gates) - set(GATE_NAMES))
    if unknown:
        warnings.append(f"unknown gates ignored: {', '.join(unknown)}")
    for gate in gates:
        if gate.empty and gate.name != "critical_failures":
            warnings.append(f"gate {gate.name} had no data and passes (flagged empty)")
    if _looks_stateful(spec, records):
        python = spec.agent.get("type") == "python"
        warnings.append(STATEFUL_WARNING_PYTHON if python else STATEFUL_WARNING)
    warnings.extend(_unreached_chaos_warnings(spec, records))
    warnings.extend(_passed_unfinished_warnings(spec, records, scores))
    unpriced = _unpriced_models(records)
    if unpriced:
        count = sum(1 for record in records if record.unpriced_models)
        warnings.append(
            f"the cost of {count} execution(s) leaves out their calls to models "
            f"Keystone has no price for: {no_price_for(unpriced)}"
        )
    return warnings


def _passed_unfinished_warnings(
    spec: Spec, records: Sequence[ExecutionRecord], scores: Sequence[ExecutionScore]
) -> list[str]:
    """Executions of a scenario without chaos that passed although their agent did not
    finish (it exited non-zero, answered an HTTP error, timed out): each invariant held on
    what it left, and none asked for the agent to finish. Under chaos that is what
    resilience looks like (the agent may fail, not break its rules); without it, an agent
    that fails every prompt would pass a spec of "must not" rules unnoticed. A warning
    only: the verdict stays what the invariants say (SPEC_FORMAT)."""
    calm = {s.name for s in spec.scenarios if not s.any_chaos_active}
    unfinished = [
        record
        for record, score in zip(records, scores, strict=True)
        if score.passed
        and record.status in ("failed", "timed_out")
        and record.pillar in MATRIX_PILLARS
        and record.scenario in calm
    ]
    if not unfinished:
        return []
    said = (unfinished[0].error or f"status {unfinished[0].status}").strip().splitlines()
    return [
        f"{len(unfinished)} execution(s) without chaos passed although their agent did not "
        f"finish ({said[0][:200] if said else unfinished[0].status}): every invariant held on "
        "what it left; add a `completes` invariant to make finishing part of the verdict"
    ]


# Where each channel's faults meet the agent, as the warning names it.
_CHANNEL_CALLS = {
    "proxy": "a tool through the tool proxy",
    "gateway": "the model through the gateway",
}


def _unreached_chaos_warnings(spec: Spec, records: Sequence[ExecutionRecord]) -> list[str]:
    """Faulted scenarios none of whose executions called the gateway or the tool proxy, where
    their faults are injected: they ran exactly as with no chaos. Validation refuses faults
    with no way in at all; this is the agent that has one and never uses it (an `llm` it
    never calls). A warning only: the scores stay what the results say. A scenario whose
    faults partly reached the agent is not named (the agent met chaos)."""
    by_scenario: dict[str, list[ExecutionRecord]] = defaultdict(list)
    for record in records:
        if record.pillar in MATRIX_PILLARS:
            by_scenario[record.scenario].append(record)
    warnings = []
    for scenario in spec.scenarios:
        channels = scenario.faults_by_channel()
        executions = by_scenario.get(scenario.name, [])
        # Executions whose agent never ran (status `error`) say nothing about its calls.
        ran = [r for r in executions if r.status != "error"]
        if not channels or not ran:
            continue
        if any(_calls(r, channel) is None for r in ran for channel in channels):
            continue  # not counted: rows or a report from before the counts
        if any(_calls(r, channel) for r in executions for channel in channels):
            continue
        profile = f" (profile {scenario.profile})" if scenario.profile else ""
        kinds = " and ".join(kind for names in channels.values() for kind in names)
        where = " or ".join(_CHANNEL_CALLS[channel] for channel in channels)
        count = len(executions)
        warnings.append(
            f"scenario '{scenario.name}'{profile} injects {kinds}, but none of its "
            f"{counted(count, 'execution')} called {where}: its faults never fired,"
            " so it measured nothing about resilience"
        )
    return warnings


def _calls(record: ExecutionRecord, channel: str) -> int | None:
    return record.gateway_calls if channel == "gateway" else record.proxy_calls


def _looks_stateful(spec: Spec, records: Sequence[ExecutionRecord]) -> bool:
    """Same prompt, no chaos, different answers, and nothing resets the agent."""
    agent = spec.agent
    if (
        agent.get("type") not in ("http", "python")
        or agent.get("reset_endpoint")
        or agent.get("reset_function")
    ):
        return False
    calm = {s.name for s in spec.scenarios if not s.any_chaos_active}
    outputs: dict[str, set[str]] = defaultdict(set)
    for record in records:
        if (
            record.scenario in calm
            and record.pillar in MATRIX_PILLARS
            and record.status == "success"
        ):
            outputs[record.prompt].add(record.output)
    return any(len(seen) > 1 for seen in outputs.values())


# ---------------------------------------------------------------- small helpers


def _failure_codes(results: Iterable[CheckResult]) -> list[str]:
    codes: list[str] = []
    for r in results:
        if not r.passed and r.failure_code and r.failure_code.value not in codes:
            codes.append(r.failure_code.value)
    return codes


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _max(values: Sequence[float]) -> float | None:
    return max(values) if values else None


def _fmt(value: float) -> str:
    return f"{value:.4g}" if not float(value).is_integer() else str(int(value))
