"""`tool_calls`: expectations on the tools the agent called (KindLM's tool-call assertions).

Each expectation contributes sub-expectations (called or not, args_match, args_schema, order,
response_contains); the score is the fraction met and the failure code is the first failing
one's, in the order the expectations are written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from checks.artifact import RunArtifact, ToolCall
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import ConfigError, guarded, json_equal, json_schema_validator, quote
from checks.results import FailureCode, Outcome


def _show(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


@dataclass
class _Tally:
    """The sub-expectations checked so far: how many were met, the failures in order, and one
    entry per sub-expectation for the result's details."""

    met: int = 0
    total: int = 0
    failures: list[tuple[FailureCode, str]] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)

    def record(self, ok: bool, code: FailureCode, message: str, **details: Any) -> None:
        self.total += 1
        if ok:
            self.met += 1
        else:
            self.failures.append((code, message))
        self.details.append(
            {"ok": ok, "code": None if ok else code.value, "message": message, **details}
        )


def _arg_mismatches(call: ToolCall, expected: dict[str, Any]) -> list[str]:
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    mismatches = []
    for key, value in expected.items():
        if key not in arguments:
            mismatches.append(f"{key}: expected {_show(value)}, missing")
        elif not json_equal(arguments[key], value):
            mismatches.append(f"{key}: expected {_show(value)}, got {_show(arguments[key])}")
    return mismatches


def _schema_validator(schema: Any, tool: str) -> Any:
    if not isinstance(schema, dict):
        raise ConfigError(f"args_schema of {tool!r} must be a JSON Schema object")
    return json_schema_validator(schema, f"args_schema of {tool!r}")


def _check_expectation(expectation: dict[str, Any], calls: list[ToolCall], tally: _Tally) -> None:
    tool = expectation["tool"]
    matching = [c for c in calls if c.name == tool]
    called = [c.name for c in calls]

    if expectation.get("should_not_call"):
        tally.record(
            not matching,
            FailureCode.TOOL_CALL_UNEXPECTED,
            f"tool {tool!r} was called {len(matching)} time(s) but should not have been"
            if matching
            else f"tool {tool!r} was not called",
            tool=tool,
        )
        return

    subs = [
        k for k in ("args_match", "args_schema", "order", "response_contains") if k in expectation
    ]
    if not matching:
        message = (
            f"expected tool {tool!r} was never called; called: {', '.join(called) or '(none)'}"
        )
        tally.record(False, FailureCode.TOOL_CALL_MISSING, message, tool=tool, called=called[:100])
        # What could not be checked for lack of a call counts as not met.
        tally.total += len(subs)
        return
    tally.record(
        True,
        FailureCode.TOOL_CALL_MISSING,
        f"tool {tool!r} was called {len(matching)} time(s)",
        tool=tool,
    )

    if "args_match" in expectation:
        _check_args_match(tool, expectation["args_match"], matching, tally)
    if "args_schema" in expectation:
        validator = _schema_validator(expectation["args_schema"], tool)
        invalid: list[dict[str, Any]] = []
        for index, call in enumerate(matching):
            errors = [e.message for e in validator.iter_errors(call.arguments)]
            if errors:
                invalid.append({"call": index, "arguments": call.arguments, "errors": errors[:5]})
        tally.record(
            not invalid,
            FailureCode.TOOL_CALL_ARGS_SCHEMA_INVALID,
            f"arguments of {tool!r} call #{invalid[0]['call']} do not match args_schema: {invalid[0]['errors'][0]}"
            if invalid
            else f"arguments of every {tool!r} call match args_schema",
            tool=tool,
            invalid=invalid,
        )
    if "order" in expectation:
        order = expectation["order"]
        if isinstance(order, bool) or not isinstance(order, int):
            raise ConfigError(f"order of {tool!r} must be an integer")
        position = called.index(tool)
        tally.record(
            position == order,
            FailureCode.TOOL_CALL_ORDER_WRONG,
            f"expected {tool!r} at position {order}, found at {position}; calls: {', '.join(called[:20])}",
            tool=tool,
            position=position,
        )
    if "response_contains" in expectation:
        text = expectation["response_contains"]
        if not isinstance(text, str):
            raise ConfigError(f"response_contains of {tool!r} must be a string")
        ok = any(text in (c.response or "") for c in matching)
        tally.record(
            ok,
            FailureCode.CONTAINS_FAILED,
            f"a response of {tool!r} contains {quote(text)}"
            if ok
            else f"no response of {tool!r} contains {quote(text)}",
            tool=tool,
        )


def _check_args_match(tool: str, expected: Any, matching: list[ToolCall], tally: _Tally) -> None:
    if not isinstance(expected, dict):
        raise ConfigError(f"args_match of {tool!r} must be a mapping")
    # Any call with matching arguments will do; otherwise report the closest one.
    best_index, best = 0, _arg_mismatches(matching[0], expected)
    for index, call in enumerate(matching[1:], start=1):
        mismatches = _arg_mismatches(call, expected)
        if len(mismatches) < len(best):
            best_index, best = index, mismatches
    tally.record(
        not best,
        FailureCode.TOOL_CALL_ARGS_MISMATCH,
        f"arguments of {tool!r} do not match: {'; '.join(best)}"
        + (f" (closest of {len(matching)} calls)" if len(matching) > 1 else "")
        if best
        else f"arguments of {tool!r} call #{best_index} match",
        tool=tool,
        closest_call=best_index,
        mismatches=best,
        actual_args=matching[best_index].arguments,
    )


class ToolCallsCheck(Check):
    type = "tool_calls"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        expectations = self.config.get("calls")
        if not isinstance(expectations, list) or not expectations:
            raise ConfigError("'calls' must be a non-empty list of {tool, ...}")
        calls = artifact.all_tool_calls()
        tally = _Tally()
        for expectation in expectations:
            if not isinstance(expectation, dict) or not isinstance(expectation.get("tool"), str):
                raise ConfigError("every entry of 'calls' needs a string 'tool'")
            _check_expectation(expectation, calls, tally)
        score = tally.met / tally.total if tally.total else 1.0
        if tally.failures:
            code, message = tally.failures[0]
            more = f" (+{len(tally.failures) - 1} more)" if len(tally.failures) > 1 else ""
            return Outcome.fail(
                code,
                message + more,
                score=score,
                expectations=tally.details,
                called=[c.name for c in calls][:100],
            )
        return Outcome.ok(
            f"all {tally.total} tool-call expectations hold", expectations=tally.details
        )


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (ToolCallsCheck,)
