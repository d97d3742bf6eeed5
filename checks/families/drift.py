"""`drift`: how far the output moved from the baseline output (KindLM). Score = 1 - drift.

Methods: lexical (1 - lexical similarity), field-diff (JSON fields; mean per-field distance,
strings by normalised edit distance), tool-sequence (tool names, then arguments), embedding (1 - cosine, needs `judge.embed`), judge
(needs `judge.drift(baseline=..., current=..., config=...) -> {drift_score, reasoning}`).
"""

from __future__ import annotations

import json
from typing import Any

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ConfigError,
    get_number,
    get_str,
    get_str_list,
    guarded,
    json_equal,
    lexical_similarity,
    preview,
)
from checks.families._embeddings import embedding_similarity
from checks.results import FailureCode, Outcome


def string_distance(left: str, right: str) -> float:
    """Levenshtein distance normalised by the longer length: 0.0 identical, 1.0 nothing in
    common (rapidfuzz, linear memory and bit-parallel, so no length cap is needed)."""
    # rapidfuzz is imported where a drift check measures (~50 ms), not by every process
    # that loads the check registry.
    from rapidfuzz.distance import Levenshtein

    return float(Levenshtein.normalized_distance(left, right))


def _arguments_text(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def tool_sequence_distance(
    baseline: list[dict[str, Any]], current: list[dict[str, Any]]
) -> tuple[float, float, float]:
    """(drift, name distance, argument distance) of two tool-call sequences, names first:

    - name distance: the Indel distance (insertions and deletions, as longest common
      subsequence) of the two lists of tool names, normalised to [0, 1]: a reordered pair
      costs half as much as two different tools;
    - argument distance: over the calls the two sequences share in order (same name), the
      mean normalised edit distance of their canonical JSON arguments;
    - drift = names + (1 - names) x arguments / 2: changed arguments never weigh more than
      half, a changed set of tools weighs everything."""
    from rapidfuzz.distance import Indel  # see string_distance

    names_before = [str(c.get("name", "")) for c in baseline]
    names_after = [str(c.get("name", "")) for c in current]
    names = float(Indel.normalized_distance(names_before, names_after))
    pairs = [
        (baseline[block.src_start + i], current[block.dest_start + i])
        for block in Indel.opcodes(names_before, names_after)
        if block.tag == "equal"
        for i in range(block.src_end - block.src_start)
    ]
    arguments = (
        sum(
            string_distance(
                _arguments_text(a.get("arguments")), _arguments_text(b.get("arguments"))
            )
            for a, b in pairs
        )
        / len(pairs)
        if pairs
        else 0.0
    )
    return names + (1.0 - names) * arguments / 2, names, arguments


_MISSING = object()

_JUDGE_ERRORS = {
    code.value: code
    for code in (
        FailureCode.PROVIDER_TIMEOUT,
        FailureCode.PROVIDER_AUTH_FAILED,
        FailureCode.PROVIDER_ERROR,
        FailureCode.JUDGE_PARSE_ERROR,
    )
}


class JudgeFailed(Exception):
    """The drift judge answered with an error_code (provider down, unparsable answer)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


def field_distance(baseline: Any, current: Any) -> float:
    if baseline is _MISSING or current is _MISSING:
        return 1.0
    if isinstance(baseline, str) and isinstance(current, str):
        return string_distance(baseline, current)
    return 0.0 if json_equal(baseline, current) else 1.0


def field_diff(
    baseline_text: str, current_text: str, fields: list[str]
) -> tuple[float, dict[str, float]]:
    """Mean per-field distance over `fields` (or every top-level key of either side)."""
    try:
        baseline = json.loads(baseline_text)
    except ValueError as exc:
        raise ConfigError(f"field-diff needs a JSON baseline, and it is not JSON: {exc}") from exc
    if not isinstance(baseline, dict):
        raise ConfigError("field-diff needs a JSON object as baseline")
    try:
        current = json.loads(current_text)
    except ValueError:
        current = None
    if not isinstance(current, dict):
        names = fields or sorted(baseline)
        return 1.0, dict.fromkeys(names, 1.0)  # the output lost its structure: everything drifted
    names = fields or sorted(set(baseline) | set(current))
    per_field = {
        name: round(field_distance(baseline.get(name, _MISSING), current.get(name, _MISSING)), 6)
        for name in names
    }
    return (sum(per_field.values()) / len(per_field) if per_field else 0.0), per_field


class DriftCheck(Check):
    type = "drift"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        max_score = get_number(self.config, "max_score", 0.15)
        method = get_str(self.config, "method", "lexical")
        fields = get_str_list(self.config, "fields")
        reference = get_str(self.config, "baseline", "")
        baseline = context.baseline_output
        if baseline is None or (reference and context.baseline_name is None):
            # KindLM: no baseline yet is not a failure, but it is flagged so nobody mistakes it.
            return Outcome.ok(
                "no baseline output to compare with",
                flag="no_baseline",
                applicable=False,
                method=method,
            )
        output = artifact.final_output or ""
        details: dict[str, Any] = {"method": method, "max_score": max_score}
        if context.baseline_name is not None:
            details["baseline"] = context.baseline_name

        if method == "tool-sequence":
            before = context.baseline_tool_calls or []
            after = [{"name": c.name, "arguments": c.arguments} for c in artifact.all_tool_calls()]
            drift, names, arguments = tool_sequence_distance(before, after)
            details.update(
                names_distance=round(names, 6),
                arguments_distance=round(arguments, 6),
                baseline_tools=[c.get("name") for c in before],
                tools=[c["name"] for c in after],
            )
        elif method == "lexical":
            drift = 1.0 - lexical_similarity(output, baseline)
        elif method == "field-diff":
            drift, per_field = field_diff(baseline, output, fields)
            details["fields"] = per_field
        elif method == "embedding":
            drift = 1.0 - embedding_similarity(context, output, baseline)
        elif method == "judge":
            try:
                drift, reasoning = self._judge_drift(context, baseline, output)
            except JudgeFailed as exc:
                code = _JUDGE_ERRORS.get(exc.code, FailureCode.PROVIDER_ERROR)
                return Outcome.error(
                    f"drift judge error {exc.code}: {exc.reason}", code, method=method
                )
            details["reasoning"] = reasoning
        else:
            raise ConfigError(
                f"unknown drift method {method!r} "
                "(judge, embedding, lexical, field-diff, tool-sequence)"
            )

        drift = round(min(1.0, max(0.0, drift)), 6)
        details.update(
            drift=drift, baseline_preview=preview(baseline), output_preview=preview(output)
        )
        if drift > max_score:
            changed = [k for k, v in details.get("fields", {}).items() if v > 0]
            where = f" (fields changed: {', '.join(changed)})" if changed else ""
            return Outcome.fail(
                FailureCode.DRIFT_EXCEEDED,
                f"drift {drift:.3f} exceeds max {max_score:g}{where}",
                score=1.0 - drift,
                **details,
            )
        return Outcome(True, 1.0 - drift, None, f"drift {drift:.3f} <= {max_score:g}", details)

    def _judge_drift(self, context: CheckContext, baseline: str, output: str) -> tuple[float, str]:
        drift_fn = getattr(context.judge, "drift", None)
        if not callable(drift_fn):
            raise ConfigError(
                "method 'judge' needs a judge with drift scoring, and none is configured"
            )
        answer = drift_fn(baseline=baseline, current=output, config=self.config)
        if isinstance(answer, dict) and answer.get("error_code"):
            raise JudgeFailed(
                str(answer["error_code"]), str(answer.get("reasoning") or answer.get("error") or "")
            )
        if not isinstance(answer, dict) or not isinstance(answer.get("drift_score"), int | float):
            raise ConfigError("the judge's drift answer has no numeric drift_score")
        return float(answer["drift_score"]), str(answer.get("reasoning", ""))


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (DriftCheck,)
