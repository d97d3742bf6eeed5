from __future__ import annotations

from checks.artifact import LLMCall, RunArtifact, ToolCall
from checks.families._common import json_equal
from checks.results import FailureCode


def _artifact():
    return RunArtifact(
        tool_calls=[
            ToolCall(
                "lookup_order", {"order_id": 1042}, response='{"status": "paid", "total": 12.5}'
            ),
            ToolCall(
                "issue_refund",
                {"order_id": 1042, "amount": 12.5, "notify": True},
                response="refund r-1 created",
            ),
            ToolCall("issue_refund", {"order_id": 7, "amount": 1}, response="refund r-2 created"),
        ]
    )


def _run(run_check, calls, artifact=None):
    return run_check({"type": "tool_calls", "calls": calls}, artifact=artifact or _artifact())


def test_all_expectations_met(run_check):
    calls = [
        {
            "tool": "lookup_order",
            "order": 0,
            "args_match": {"order_id": 1042},
            "response_contains": "paid",
        },
        {"tool": "issue_refund", "order": 1, "args_match": {"order_id": 7}},
        {"tool": "delete_account", "should_not_call": True},
    ]
    outcome = _run(run_check, calls)
    assert outcome.passed and outcome.score == 1.0


def test_unexpected_call(run_check):
    outcome = _run(run_check, [{"tool": "issue_refund", "should_not_call": True}])
    assert outcome.failure_code is FailureCode.TOOL_CALL_UNEXPECTED
    assert outcome.message == "tool 'issue_refund' was called 2 time(s) but should not have been"


def test_missing_call_lists_what_was_called_and_counts_sub_expectations(run_check):
    outcome = _run(
        run_check, [{"tool": "send_email", "args_match": {"to": "a@b.c"}}, {"tool": "lookup_order"}]
    )
    assert outcome.failure_code is FailureCode.TOOL_CALL_MISSING
    assert "called: lookup_order, issue_refund, issue_refund" in outcome.message
    # send_email: called + args_match both unmet; lookup_order: met -> 1/3.
    assert outcome.score == 1 / 3


def test_args_match_passes_when_any_call_matches_and_reports_closest(run_check):
    assert _run(
        run_check, [{"tool": "issue_refund", "args_match": {"order_id": 7, "amount": 1.0}}]
    ).passed
    outcome = _run(
        run_check, [{"tool": "issue_refund", "args_match": {"order_id": 1042, "amount": 99}}]
    )
    assert outcome.failure_code is FailureCode.TOOL_CALL_ARGS_MISMATCH
    assert "amount: expected 99, got 12.5" in outcome.message
    closest = next(e for e in outcome.details["expectations"] if e.get("closest_call") is not None)
    assert closest["closest_call"] == 0
    assert outcome.score == 0.5


def test_args_match_is_strict_about_booleans(run_check):
    outcome = _run(run_check, [{"tool": "issue_refund", "args_match": {"notify": 1}}])
    assert outcome.failure_code is FailureCode.TOOL_CALL_ARGS_MISMATCH


def test_args_schema(run_check):
    schema = {
        "type": "object",
        "required": ["order_id"],
        "properties": {"order_id": {"type": "integer"}},
    }
    assert _run(run_check, [{"tool": "issue_refund", "args_schema": schema}]).passed
    strict = {**schema, "required": ["order_id", "notify"]}
    outcome = _run(run_check, [{"tool": "issue_refund", "args_schema": strict}])
    assert outcome.failure_code is FailureCode.TOOL_CALL_ARGS_SCHEMA_INVALID
    assert "call #1" in outcome.message and "'notify' is a required property" in outcome.message


def test_order_wrong(run_check):
    outcome = _run(run_check, [{"tool": "issue_refund", "order": 0}])
    assert outcome.failure_code is FailureCode.TOOL_CALL_ORDER_WRONG
    assert outcome.message.startswith("expected 'issue_refund' at position 0, found at 1")


def test_response_contains(run_check):
    assert _run(run_check, [{"tool": "issue_refund", "response_contains": "r-2"}]).passed
    outcome = _run(run_check, [{"tool": "issue_refund", "response_contains": "r-9"}])
    assert outcome.failure_code is FailureCode.CONTAINS_FAILED


def test_failure_code_is_the_first_failing_expectation(run_check):
    calls = [
        {"tool": "lookup_order", "order": 2},
        {"tool": "issue_refund", "should_not_call": True},
    ]
    outcome = _run(run_check, calls)
    assert outcome.failure_code is FailureCode.TOOL_CALL_ORDER_WRONG
    assert "(+1 more)" in outcome.message


def test_model_requested_calls_are_used_when_agent_calls_are_absent(run_check):
    artifact = RunArtifact(
        llm_calls=[LLMCall("m", tool_calls=[ToolCall("lookup_order", {"order_id": 1})])]
    )
    assert _run(
        run_check, [{"tool": "lookup_order", "args_match": {"order_id": 1}}], artifact
    ).passed


def test_bad_configuration(run_check):
    assert _run(run_check, []).failure_code is FailureCode.CHECK_ERROR
    assert _run(run_check, [{"name": "x"}]).failure_code is FailureCode.CHECK_ERROR
    outcome = _run(run_check, [{"tool": "issue_refund", "args_schema": {"type": "nope"}}])
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert (
        _run(run_check, [{"tool": "issue_refund", "order": "first"}]).failure_code
        is FailureCode.CHECK_ERROR
    )


def test_json_equal():
    assert json_equal({"a": [1, 2.0]}, {"a": [1.0, 2]})
    assert not json_equal(True, 1)
    assert not json_equal("1", 1)
    assert not json_equal({"a": 1}, {"a": 1, "b": 2})


def test_args_schema_checks_formats_too() -> None:
    from checks.artifact import RunArtifact, ToolCall
    from checks.context import CheckContext
    from checks.registry import get_check_class

    check = get_check_class("tool_calls")(
        {
            "type": "tool_calls",
            "calls": [
                {
                    "tool": "send_email",
                    "args_schema": {
                        "type": "object",
                        "properties": {"to": {"type": "string", "format": "email"}},
                    },
                }
            ],
        }
    )
    sent = RunArtifact(tool_calls=[ToolCall("send_email", {"to": "finance team"})])
    outcome = check.evaluate(sent, CheckContext())
    assert not outcome.passed and outcome.failure_code.value == "TOOL_CALL_ARGS_SCHEMA_INVALID"
