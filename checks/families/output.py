"""Checks on the agent's final output text (Flakestorm and KindLM's simple assertions)."""

from __future__ import annotations

from typing import Any

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ShownText,
    compile_regex,
    get_bool,
    get_int,
    get_str,
    get_str_list,
    guarded,
    one_or_many,
    plain_text,
    preview,
    quote,
    snippet,
)
from checks.json_text import loads_strict
from checks.results import FailureCode, Outcome
from checks.wording import counted


def _locate(
    values: list[str], config: dict[str, Any], artifact: RunArtifact
) -> tuple[str, list[tuple[str, int]]]:
    """The final output as a reader sees it (plain_text), and each value with where it first
    occurs there (-1: absent), honouring the check's `case_sensitive`: the search the
    substring checks share."""
    case_sensitive = get_bool(config, "case_sensitive", True)
    output = plain_text(artifact.final_output or "")  # each value is looked for as shown
    searched = output if case_sensitive else output.casefold()

    def shown(value: str) -> str:
        plain = plain_text(value)
        return plain if case_sensitive else plain.casefold()

    return output, [(value, searched.find(shown(value))) for value in values]


def _listing(values: list[str]) -> str:
    return ", ".join(quote(v, 60) for v in values)


class ContainsCheck(Check):
    type = "contains"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        values = one_or_many(self.config, "value", "values")
        output, located = _locate(values, self.config, artifact)
        missing = [value for value, index in located if index < 0]
        if missing:
            return Outcome.fail(
                FailureCode.CONTAINS_FAILED,
                f"output does not contain {_listing(missing)}",
                missing=missing,
                output_preview=preview(output),
            )
        return Outcome.ok(f"output contains {_listing(values)}", found=values)


class NotContainsCheck(Check):
    type = "not_contains"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        values = one_or_many(self.config, "value", "values")
        output, located = _locate(values, self.config, artifact)
        found = [
            {"value": value, "context": snippet(output, index, index + len(value))}
            for value, index in located
            if index >= 0
        ]
        if found:
            names = [item["value"] for item in found]
            return Outcome.fail(
                FailureCode.NOT_CONTAINS_FAILED,
                f"output contains forbidden {_listing(names)}",
                found=found,
            )
        return Outcome.ok(f"output contains none of {_listing(values)}")


class ContainsAnyCheck(Check):
    type = "contains_any"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        values = get_str_list(self.config, "values", required=True)
        output, located = _locate(values, self.config, artifact)
        found = [value for value, index in located if index >= 0]
        if not found:
            return Outcome.fail(
                FailureCode.CONTAINS_FAILED,
                f"output contains none of {_listing(values)}",
                expected_any=values,
                output_preview=preview(output),
            )
        return Outcome.ok(f"output contains {_listing(found)}", found=found)


class RegexCheck(Check):
    type = "regex"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        pattern = get_str(self.config, "pattern")
        match, output = ShownText(artifact.final_output or "").search(compile_regex(pattern))
        if match is None:
            return Outcome.fail(
                FailureCode.PATTERN_FAILED,
                f"output does not match /{pattern}/",
                pattern=pattern,
                output_preview=preview(output),
            )
        # The match is named in the message so that a negated regex explains itself.
        return Outcome.ok(
            f"output matches /{pattern}/ at {quote(match.group(0))}",
            pattern=pattern,
            matched=match.group(0),
            context=snippet(output, match.start(), match.end()),
        )


class ExcludesPatternCheck(Check):
    type = "excludes_pattern"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        patterns = one_or_many(self.config, "pattern", "patterns")
        compiled = [compile_regex(p) for p in patterns]
        shown = ShownText(artifact.final_output or "")
        matches = []
        for pattern, regex in zip(patterns, compiled, strict=True):
            match, output = shown.search(regex)
            if match is not None:
                matches.append(
                    {
                        "pattern": pattern,
                        "matched": match.group(0),
                        "context": snippet(output, match.start(), match.end()),
                    }
                )
        if matches:
            first = matches[0]
            return Outcome.fail(
                FailureCode.PATTERN_FAILED,
                f"output matches excluded /{first['pattern']}/ at {quote(first['matched'])}"
                + (f" (and {len(matches) - 1} more pattern(s))" if len(matches) > 1 else ""),
                matches=matches,
            )
        return Outcome.ok(f"output matches none of {len(patterns)} excluded pattern(s)")


class MaxLengthCheck(Check):
    type = "max_length"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        limit = get_int(self.config, "max")
        length = len(artifact.final_output or "")
        if length > limit:
            return Outcome.fail(
                FailureCode.MAX_LENGTH_EXCEEDED,
                f"output length {length} exceeds max {limit}",
                length=length,
                max=limit,
            )
        return Outcome.ok(f"output length {length} <= {limit}", length=length, max=limit)


class OutputNotEmptyCheck(Check):
    type = "output_not_empty"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        output = artifact.final_output or ""
        if not output.strip():
            return Outcome.fail(
                FailureCode.CONTAINS_FAILED,
                "output is empty" if not output else "output is only whitespace",
                length=len(output),
            )
        return Outcome.ok(f"output has {counted(len(output), 'character')}")


class CompletesCheck(Check):
    type = "completes"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        if artifact.status != "success":
            reason = f": {preview(artifact.error, 300)}" if artifact.error else ""
            return Outcome.fail(
                FailureCode.STATUS_MISMATCH,
                f"execution ended with status {artifact.status!r}, expected 'success'{reason}",
                status=artifact.status,
                error=artifact.error,
            )
        return Outcome.ok("execution completed successfully")


class ValidJsonCheck(Check):
    type = "valid_json"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        output = artifact.final_output or ""
        try:
            loads_strict(output)
        except ValueError as exc:
            return Outcome.fail(
                FailureCode.SCHEMA_PARSE_ERROR,
                f"output is not valid JSON: {exc}",
                output_preview=preview(output),
            )
        return Outcome.ok("output is valid JSON")


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (
    ContainsCheck,
    NotContainsCheck,
    ContainsAnyCheck,
    RegexCheck,
    ExcludesPatternCheck,
    MaxLengthCheck,
    OutputNotEmptyCheck,
    CompletesCheck,
    ValidJsonCheck,
)
