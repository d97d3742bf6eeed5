from __future__ import annotations

from checks.artifact import LLMCall, OutputArtifact, RunArtifact, ToolCall
from checks.context import CheckContext, CommandResult
from checks.results import FailureCode


def test_command_exit_passes_on_expected_code_in_the_workspace(run_check, workspace, ws_context):
    (workspace / "marker").write_text("here")
    outcome = run_check(
        {"type": "command_exit", "command": "test -f marker && cat marker"}, context=ws_context
    )
    assert outcome.passed
    assert outcome.details["stdout_tail"] == "here"


def test_command_exit_failure_shows_stderr(run_check, ws_context):
    outcome = run_check(
        {"type": "command_exit", "command": "echo 'AssertionError: 2 != 3' >&2; exit 1"},
        context=ws_context,
    )
    assert outcome.failure_code is FailureCode.EXIT_CODE_MISMATCH
    assert outcome.message == "exit code 1, expected 0; stderr: AssertionError: 2 != 3"
    assert outcome.details["exit_code"] == 1


def test_command_exit_expected_non_zero(run_check, ws_context):
    assert run_check(
        {"type": "command_exit", "command": "exit 3", "exit_code": 3}, context=ws_context
    ).passed
    outcome = run_check(
        {"type": "command_exit", "command": "echo fine", "exit_code": 3}, context=ws_context
    )
    assert outcome.message == "exit code 0, expected 3; stdout: fine"


def test_command_exit_caps_output_tails(run_check, ws_context):
    outcome = run_check(
        {"type": "command_exit", "command": "yes x | head -c 100000 >&2; exit 2"},
        context=ws_context,
    )
    assert not outcome.passed
    assert len(outcome.details["stderr_tail"]) <= 2100
    assert len(outcome.message) < 400


def test_command_exit_timeout_is_a_failure(run_check, ws_context):
    outcome = run_check(
        {"type": "command_exit", "command": "sleep 5", "timeout": 0.3}, context=ws_context
    )
    assert outcome.failure_code is FailureCode.EXIT_CODE_MISMATCH
    assert "timed out after 0.3s" in outcome.message
    assert outcome.details["timed_out"] is True


def test_command_exit_uses_the_contexts_runner(run_check):
    seen = {}

    def runner(command, *, stdin=None, timeout=60.0):
        seen.update(command=command, timeout=timeout)
        return CommandResult(0, "from sandbox", "")

    outcome = run_check(
        {"type": "command_exit", "command": "npm test", "timeout": 12},
        context=CheckContext(run_command=runner),
    )
    assert outcome.passed
    assert seen == {"command": "npm test", "timeout": 12.0}


def test_command_exit_without_workspace_or_runner_is_check_error(run_check):
    outcome = run_check({"type": "command_exit", "command": "true"})
    assert outcome.failure_code is FailureCode.CHECK_ERROR


def test_command_exit_bad_config(run_check, ws_context):
    assert (
        run_check({"type": "command_exit"}, context=ws_context).failure_code
        is FailureCode.CHECK_ERROR
    )
    outcome = run_check(
        {"type": "command_exit", "command": "true", "exit_code": "0"}, context=ws_context
    )
    assert outcome.failure_code is FailureCode.CHECK_ERROR


def test_status_is(run_check):
    assert run_check({"type": "status_is", "status": "success"}).passed
    outcome = run_check(
        {"type": "status_is", "status": "success"}, artifact=RunArtifact(status="provider_error")
    )
    assert outcome.failure_code is FailureCode.STATUS_MISMATCH
    assert outcome.message == "status is 'provider_error', expected 'success'"
    assert (
        run_check({"type": "status_is", "status": "done"}).failure_code is FailureCode.CHECK_ERROR
    )


def test_final_response_present(run_check, workspace, ws_context):
    assert run_check({"type": "final_response_present"}, output="done").passed
    one = run_check({"type": "final_response_present"}, output="y")
    assert one.message == "final response has 1 character"
    outcome = run_check({"type": "final_response_present"}, output=" ")
    assert outcome.failure_code is FailureCode.CONTAINS_FAILED
    # A readable key output in the workspace counts as a response.
    (workspace / "answer.md").write_text("the answer")
    artifact = RunArtifact(
        output_artifacts=[OutputArtifact("openclaw_key_output", path="answer.md")]
    )
    assert run_check(
        {"type": "final_response_present"}, artifact=artifact, context=ws_context
    ).passed
    missing = RunArtifact(output_artifacts=[OutputArtifact("openclaw_key_output", path="gone.md")])
    assert not run_check(
        {"type": "final_response_present"}, artifact=missing, context=ws_context
    ).passed


def test_tool_call_count_too_many_and_too_few(run_check):
    artifact = RunArtifact(tool_calls=[ToolCall("search"), ToolCall("search"), ToolCall("email")])
    assert run_check({"type": "tool_call_count", "count": 3}, artifact=artifact).passed
    outcome = run_check({"type": "tool_call_count", "count": 2}, artifact=artifact)
    assert outcome.failure_code is FailureCode.TOOL_CALL_UNEXPECTED
    assert outcome.details["called"] == ["search", "search", "email"]
    assert (
        run_check({"type": "tool_call_count", "count": 4}, artifact=artifact).failure_code
        is FailureCode.TOOL_CALL_MISSING
    )


def test_tool_call_count_falls_back_to_model_requested_calls(run_check):
    artifact = RunArtifact(llm_calls=[LLMCall("m", tool_calls=[ToolCall("lookup_order")])])
    assert run_check({"type": "tool_call_count", "count": 1}, artifact=artifact).passed


def test_output_artifact_present(run_check):
    artifact = RunArtifact(output_artifacts=[OutputArtifact("report", path="r.pdf")])
    assert run_check(
        {"type": "output_artifact_present", "artifact_type": "report"}, artifact=artifact
    ).passed
    outcome = run_check(
        {"type": "output_artifact_present", "artifact_type": "chart"}, artifact=artifact
    )
    assert outcome.failure_code is FailureCode.FILE_MISSING
    assert "recorded: report" in outcome.message


def test_latency(run_check):
    assert run_check(
        {"type": "latency", "max_ms": 1000}, artifact=RunArtifact(duration_ms=1000)
    ).passed
    outcome = run_check(
        {"type": "latency", "max_ms": 1000}, artifact=RunArtifact(duration_ms=1500.4)
    )
    assert outcome.failure_code is FailureCode.LATENCY_EXCEEDED
    assert outcome.message == "took 1500 ms, max 1000 ms"
    assert run_check({"type": "latency"}).failure_code is FailureCode.CHECK_ERROR


def test_cost(run_check):
    assert run_check({"type": "cost", "max_usd": 0.05}, artifact=RunArtifact(cost_usd=0.05)).passed
    outcome = run_check({"type": "cost", "max_usd": 0.05}, artifact=RunArtifact(cost_usd=0.0712))
    assert outcome.failure_code is FailureCode.COST_EXCEEDED
    assert "$0.0712" in outcome.message


def test_cost_of_calls_to_a_model_with_no_price_is_no_verdict(run_check):
    """Their calls count $0: the check passed, whatever they cost."""
    calls = [
        LLMCall(model="gpt-4o-mini", input_tokens=10, cost_usd=0.000002),
        LLMCall(model="acme-9", input_tokens=90_000, cost_usd=0.0, priced=False),
    ]
    artifact = RunArtifact(llm_calls=calls, cost_usd=0.000002)
    outcome = run_check({"type": "cost", "max_usd": 0.05}, artifact=artifact)
    assert outcome.failure_code is FailureCode.CHECK_ERROR and not outcome.passed
    assert outcome.message.startswith(
        "cost: the execution's cost is unknown: no price for the model(s) 'acme-9';"
    )
    assert "llm.prices" in outcome.message
    calls[1].priced = True
    assert run_check({"type": "cost", "max_usd": 0.05}, artifact=artifact).passed


def test_cost_messages_show_enough_digits_to_tell_cost_and_limit_apart(run_check):
    """Issue 12, item 18: "cost $0.0001, max $0.0001" failed without showing why."""
    outcome = run_check(
        {"type": "cost", "max_usd": 0.0001}, artifact=RunArtifact(cost_usd=0.000123)
    )
    assert outcome.failure_code is FailureCode.COST_EXCEEDED
    assert outcome.message == "cost $0.00012, max $0.00010"
    outcome = run_check({"type": "cost", "max_usd": 0.01}, artifact=RunArtifact(cost_usd=0.00002))
    assert outcome.passed and outcome.message == "cost $0.00002 <= $0.0100"
    assert (
        run_check({"type": "cost", "max_usd": 0.05}, artifact=RunArtifact(cost_usd=0.0712)).message
        == "cost $0.0712, max $0.0500"
    )
