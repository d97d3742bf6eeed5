"""checks.evaluate: run the active invariants of a scenario on one artifact."""

from __future__ import annotations

import time
from collections.abc import Iterable

from checks.artifact import RunArtifact
from checks.context import CheckContext
from checks.registry import get_check_class
from checks.results import ERROR_CODES, JUDGE_CHECK_TYPES, CheckResult, FailureCode, Outcome
from checks.spec.model import Invariant, Scenario


def evaluate_invariant(
    invariant: Invariant, artifact: RunArtifact, context: CheckContext
) -> CheckResult:
    """One invariant on one artifact. A check that raises becomes a CHECK_ERROR result."""
    check = get_check_class(invariant.check_type)(invariant.check)
    started = time.perf_counter()
    try:
        outcome = check.evaluate(artifact, context)
    except Exception as exc:  # a broken check must not take the execution down with it
        outcome = Outcome.error(
            f"check raised {type(exc).__name__}: {exc}", FailureCode.INTERNAL_ERROR
        )
    # A check that does not apply here (a prompt that is not a dangerous one, no baseline
    # yet) said nothing about the agent either way: negated, it still passes as not
    # applicable, as "no verdict" (an error) stays no verdict.
    applies = outcome.details.get("applicable") is not False
    if invariant.negate and applies and outcome.failure_code not in _NOT_NEGATABLE:
        outcome = _negated(outcome, invariant)
    details = dict(outcome.details)
    details.setdefault("elapsed_ms", round((time.perf_counter() - started) * 1000, 3))
    return CheckResult(
        invariant_id=invariant.id,
        check_type=invariant.check_type,
        passed=outcome.passed,
        score=min(1.0, max(0.0, float(outcome.score))),
        failure_code=outcome.failure_code,
        message=outcome.message,
        details=details,
        severity=invariant.severity,
        weight=invariant.weight,
        gate=invariant.gate,
        dimensions=list(invariant.dimensions),
        source="judge" if invariant.check_type in JUDGE_CHECK_TYPES else "engine",
    )


# A result with an error code gave no verdict (a broken script, a pattern that timed out, a
# judge that failed): "no verdict" negated is still no verdict, never a pass. The set is
# ERROR_CODES itself, so an error code added there can never be negated into a pass.
_NOT_NEGATABLE = ERROR_CODES

# When a negated check passes, the agent did what the invariant forbids: name that.
_NEGATED_CODES = {
    "contains": FailureCode.NOT_CONTAINS_FAILED,
    "contains_any": FailureCode.NOT_CONTAINS_FAILED,
    "not_contains": FailureCode.CONTAINS_FAILED,
    "file_exists": FailureCode.FILE_PRESENT,
    "path_exists": FailureCode.FILE_PRESENT,
    "file_absent": FailureCode.FILE_MISSING,
}


def _negated(outcome: Outcome, invariant: Invariant) -> Outcome:
    if outcome.passed:
        code = _NEGATED_CODES.get(invariant.check_type, FailureCode.PATTERN_FAILED)
        message = f"negated check matched: {outcome.message or invariant.check_type + ' held'}"
        return Outcome(
            False, 1.0 - outcome.score, code, message, {**outcome.details, "negated": True}
        )
    return Outcome(
        True,
        1.0 - outcome.score,
        None,
        f"negated check did not match ({outcome.message})",
        {**outcome.details, "negated": True},
    )


def evaluate(
    artifact: RunArtifact,
    invariants: Iterable[Invariant],
    context: CheckContext,
    scenario: Scenario | None = None,
) -> list[CheckResult]:
    """Evaluate every invariant active in `scenario` (its `when`), judges last so that they
    can take the deterministic outcomes as evidence."""
    active = [inv for inv in invariants if scenario is None or scenario.activates(inv.when)]
    deterministic = [inv for inv in active if inv.check_type not in JUDGE_CHECK_TYPES]
    judged = [inv for inv in active if inv.check_type in JUDGE_CHECK_TYPES]
    results = [evaluate_invariant(inv, artifact, context) for inv in deterministic]
    context.evidence = [
        {
            "invariant_id": r.invariant_id,
            "passed": r.passed,
            "dimensions": r.dimensions,
            "message": r.message,
        }
        for r in results
        if r.dimensions
    ]
    results.extend(evaluate_invariant(inv, artifact, context) for inv in judged)
    return results
