"""Checks on how the execution went: commands in the sandbox, status, tool-call count, output
artifacts, wall time and cost."""

from __future__ import annotations

from typing import Any

from checks.artifact import EXECUTION_STATUSES, RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    MESSAGE_TAIL,
    ConfigError,
    get_int,
    get_number,
    get_str,
    guarded,
    resolve_inside,
    tail,
    workspace_root,
)
from checks.pricing import format_usd, no_price_for
from checks.results import FailureCode, Outcome
from checks.wording import counted


def _stream_summary(stdout: str, stderr: str) -> str:
    """The part of the output most likely to explain a failure, for the one-line message."""
    if stderr.strip():
        return f"; stderr: {tail(stderr.strip(), MESSAGE_TAIL)}"
    if stdout.strip():
        return f"; stdout: {tail(stdout.strip(), MESSAGE_TAIL)}"
    return ""


class CommandExitCheck(Check):
    type = "command_exit"
    reads_workspace = True

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        command = get_str(self.config, "command")
        expected = get_int(self.config, "exit_code", 0)
        timeout = get_number(self.config, "timeout", 60)
        if timeout <= 0:
            raise ConfigError("'timeout' must be positive")
        try:
            runner = context.command_runner()
        except RuntimeError as exc:
            raise ConfigError(str(exc)) from exc
        try:
            result = runner(command, timeout=timeout)
        except OSError as exc:
            raise ConfigError(f"could not start the command: {exc}") from exc
        if result.error is not None:
            # The sandbox never ran the command: its -1 is no exit code, and read as one it
            # would fail the check, which `negate: true` turns into a pass. No verdict.
            raise ConfigError(f"the sandbox could not run the command: {result.error}")
        details: dict[str, Any] = {
            "command": command,
            "exit_code": result.exit_code,
            "expected_exit_code": expected,
            "stdout_tail": tail(result.stdout),
            "stderr_tail": tail(result.stderr),
        }
        if result.timed_out:
            # A hanging command (tests that never finish) is the agent's doing: a failure.
            return Outcome.fail(
                FailureCode.EXIT_CODE_MISMATCH,
                f"command timed out after {timeout:g}s, expected exit code {expected}"
                + _stream_summary(result.stdout, result.stderr),
                timed_out=True,
                **details,
            )
        if result.exit_code != expected:
            return Outcome.fail(
                FailureCode.EXIT_CODE_MISMATCH,
                f"exit code {result.exit_code}, expected {expected}"
                + _stream_summary(result.stdout, result.stderr),
                **details,
            )
        return Outcome.ok(f"command exited with {expected}", **details)


class StatusIsCheck(Check):
    type = "status_is"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        expected = get_str(self.config, "status")
        if expected not in EXECUTION_STATUSES:
            raise ConfigError(
                f"unknown status {expected!r} (one of {', '.join(EXECUTION_STATUSES)})"
            )
        if artifact.status != expected:
            return Outcome.fail(
                FailureCode.STATUS_MISMATCH,
                f"status is {artifact.status!r}, expected {expected!r}",
                status=artifact.status,
                expected=expected,
                error=artifact.error,
            )
        return Outcome.ok(f"status is {expected!r}", status=expected)


def _is_key_output(artifact_type: str) -> bool:
    return artifact_type == "key_output" or artifact_type.endswith("_key_output")


class FinalResponsePresentCheck(Check):
    type = "final_response_present"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        if (artifact.final_output or "").strip():
            characters = counted(len(artifact.final_output), "character")
            return Outcome.ok(f"final response has {characters}")
        # As in reference 003: a readable key output in the workspace counts as a response.
        for output in artifact.output_artifacts:
            if not _is_key_output(output.artifact_type):
                continue
            if output.uri:
                return Outcome.ok(f"key output artifact {output.uri} recorded", artifact=output.uri)
            if output.path:
                try:
                    target = resolve_inside(workspace_root(artifact, context), output.path)
                except ConfigError:
                    continue
                if target.is_file():
                    return Outcome.ok(f"key output {output.path} exists", artifact=output.path)
        return Outcome.fail(
            FailureCode.CONTAINS_FAILED, "no final response and no key output artifact"
        )


class ToolCallCountCheck(Check):
    type = "tool_call_count"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        expected = get_int(self.config, "count")
        calls = [call.name for call in artifact.all_tool_calls()]
        details: dict[str, Any] = {"count": len(calls), "expected": expected, "called": calls[:100]}
        if len(calls) > expected:
            return Outcome.fail(
                FailureCode.TOOL_CALL_UNEXPECTED,
                f"{len(calls)} tool calls, expected exactly {expected}",
                **details,
            )
        if len(calls) < expected:
            return Outcome.fail(
                FailureCode.TOOL_CALL_MISSING,
                f"{len(calls)} tool calls, expected exactly {expected}",
                **details,
            )
        return Outcome.ok(f"exactly {expected} tool calls", **details)


class OutputArtifactPresentCheck(Check):
    type = "output_artifact_present"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        wanted = get_str(self.config, "artifact_type")
        matching = [o for o in artifact.output_artifacts if o.artifact_type == wanted]
        if not matching:
            recorded = sorted({o.artifact_type for o in artifact.output_artifacts})
            return Outcome.fail(
                FailureCode.FILE_MISSING,
                f"no output artifact of type {wanted!r}"
                + (f" (recorded: {', '.join(recorded)})" if recorded else " (none recorded)"),
                recorded_types=recorded,
            )
        first = matching[0]
        return Outcome.ok(
            f"output artifact of type {wanted!r}: {first.path or first.uri or '(no path)'}",
            count=len(matching),
        )


class LatencyCheck(Check):
    type = "latency"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        limit = get_number(self.config, "max_ms")
        took = float(artifact.duration_ms)
        if took > limit:
            return Outcome.fail(
                FailureCode.LATENCY_EXCEEDED,
                f"took {took:.0f} ms, max {limit:g} ms",
                duration_ms=took,
                max_ms=limit,
            )
        return Outcome.ok(f"took {took:.0f} ms <= {limit:g} ms", duration_ms=took, max_ms=limit)


class CostCheck(Check):
    type = "cost"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        limit = get_number(self.config, "max_usd")
        unpriced = artifact.unpriced_models()
        if unpriced:
            # Their calls count $0 in cost_usd: a pass on it would be a guess.
            raise ConfigError(f"the execution's cost is unknown: {no_price_for(unpriced)}")
        spent = float(artifact.cost_usd)
        shown = f"cost {format_usd(spent, limit)}"
        if spent > limit:
            return Outcome.fail(
                FailureCode.COST_EXCEEDED,
                f"{shown}, max {format_usd(limit, spent)}",
                cost_usd=spent,
                max_usd=limit,
            )
        return Outcome.ok(f"{shown} <= {format_usd(limit, spent)}", cost_usd=spent, max_usd=limit)


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (
    CommandExitCheck,
    StatusIsCheck,
    FinalResponsePresentCheck,
    ToolCallCountCheck,
    OutputArtifactPresentCheck,
    LatencyCheck,
    CostCheck,
)
