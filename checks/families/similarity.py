"""`similarity` and `behavior_unchanged` (Flakestorm), and the lexical similarity they use.

Lexical similarity (deterministic, in [0, 1], 1.0 for identical texts):
  1. Normalise: case-fold, strip accents (NFKD, combining marks dropped), keep word tokens.
  2. Features: word unigrams plus adjacent-word bigrams (bigrams reward the same word order).
  3. Score = 0.5 x Jaccard(feature sets) + 0.5 x cosine(feature counts).
Jaccard punishes vocabulary that only one side has; cosine weighs repeated words, so the blend
is stable for both short answers and long paragraphs. Two texts with no word tokens are
compared for exact equality.

Embedding similarity needs an embedder: a judge object with `embed(texts) -> list[vector]`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import ConfigError, get_number, get_str, guarded, normalise, preview
from checks.results import FailureCode, Outcome

_WORD = re.compile(r"\w+")


def _features(text: str) -> Counter[str]:
    words = _WORD.findall(normalise(text))
    features: Counter[str] = Counter(words)
    features.update(f"{a} {b}" for a, b in zip(words, words[1:], strict=False))
    return features


def lexical_similarity(left: str, right: str) -> float:
    """See the module docstring. Symmetric; 1.0 for identical texts, 0.0 for disjoint ones."""
    if left == right:
        return 1.0
    a, b = _features(left), _features(right)
    if not a or not b:
        return 1.0 if not a and not b and left.strip() == right.strip() else 0.0
    shared = a.keys() & b.keys()
    jaccard = len(shared) / len(a.keys() | b.keys())
    dot = sum(a[k] * b[k] for k in shared)
    cosine = dot / (
        math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values()))
    )
    return round(min(1.0, 0.5 * jaccard + 0.5 * cosine), 6)


def cosine(left: list[float], right: list[float]) -> float:
    dot = sum(x * y for x, y in zip(left, right, strict=False))
    norm = math.sqrt(sum(x * x for x in left)) * math.sqrt(sum(y * y for y in right))
    return dot / norm if norm else 0.0


def embedding_similarity(context: CheckContext, left: str, right: str) -> float:
    """Cosine of the two texts' embeddings, clamped to [0, 1]; ConfigError if no embedder."""
    embed = getattr(context.judge, "embed", None)
    if not callable(embed):
        raise ConfigError(
            "method 'embedding' needs an embedding provider (a judge with embed), and none is configured"
        )
    vectors: Any = embed([left, right])
    if not isinstance(vectors, list | tuple) or len(vectors) != 2:
        raise ConfigError("the embedding provider did not return two vectors")
    return max(0.0, min(1.0, cosine(list(vectors[0]), list(vectors[1]))))


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
            reference, against = context.baseline_output, "the no-chaos output"
        else:
            reference, against = baseline, "the baseline text"
        output = artifact.final_output or ""
        outcome = _verdict(
            lexical_similarity(output, reference), threshold, against, reference, output
        )
        outcome.details["baseline"] = "auto" if baseline == "auto" else "text"
        return outcome


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (SimilarityCheck, BehaviorUnchangedCheck)
