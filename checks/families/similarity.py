"""`similarity` and `behavior_unchanged` (Flakestorm); the lexical and embedding similarity
they use are in families/_common.py, shared with `drift`."""

from __future__ import annotations

from typing import Any

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ConfigError,
    get_number,
    get_str,
    guarded,
    lexical_similarity,
    preview,
)
from checks.families._embeddings import embedding_similarity
from checks.results import FailureCode, Outcome


def similarity_by(method: str, context: CheckContext, left: str, right: str) -> float:
    if method == "lexical":
        return lexical_similarity(left, right)
    if method == "embedding":
        return embedding_similarity(context, left, right)
    raise ConfigError(f"unknown similarity method {method!r} (lexical or embedding)")


def _verdict(
    similarity: float, threshold: float, against: str, reference: str, output: str
) -> Outcome:
    details: dict[str, Any] = {
        "similarity": similarity,
        "threshold": threshold,
        "reference_preview": preview(reference),
        "output_preview": preview(output),
    }
    if similarity < threshold:
        # Binary like the other deterministic checks (a negated check scores 1 - score).
        return Outcome.fail(
            FailureCode.DRIFT_EXCEEDED,
            f"similarity to {against} is {similarity:.3f}, below the threshold {threshold:g}",
            **details,
        )
    return Outcome.ok(f"similarity to {against} is {similarity:.3f} >= {threshold:g}", **details)


def _threshold(config: dict[str, Any], key: str, default: float) -> float:
    value = get_number(config, key, default)
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"'{key}' must be between 0 and 1")
    return value


class SimilarityCheck(Check):
    type = "similarity"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        expected = get_str(self.config, "expected")
        threshold = _threshold(self.config, "threshold", 0.8)
        method = get_str(self.config, "method", "lexical")
        output = artifact.final_output or ""
        value = similarity_by(method, context, output, expected)
        outcome = _verdict(value, threshold, "the expected text", expected, output)
        outcome.details["method"] = method
        return outcome


class BehaviorUnchangedCheck(Check):
    type = "behavior_unchanged"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        baseline = get_str(self.config, "baseline", "auto")
        threshold = _threshold(self.config, "similarity_threshold", 0.75)
        if baseline == "auto":
            if context.baseline_output is None:
                raise ConfigError("no no-chaos baseline output for this prompt")
            reference, against, kind = context.baseline_output, "the no-chaos output", "auto"
        elif baseline == "active" or context.baseline_name is not None:
            # `active` or a baseline's name, resolved by the server to the matching cell.
            if context.baseline_output is None or context.baseline_name is None:
                return Outcome.ok(
                    "no baseline to compare with",
                    flag="no_baseline",
                    applicable=False,
                    baseline=baseline,
                )
            reference, against = context.baseline_output, f"the baseline {context.baseline_name}"
            kind = "stored"
        else:
            reference, against, kind = baseline, "the baseline text", "text"
        output = artifact.final_output or ""
        outcome = _verdict(
            lexical_similarity(output, reference), threshold, against, reference, output
        )
        outcome.details["baseline"] = kind
        if kind == "stored":
            outcome.details["baseline_name"] = context.baseline_name
        return outcome


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (SimilarityCheck, BehaviorUnchangedCheck)
