"""Each drift method on fixed pairs (identical, paraphrase, contradiction, changed JSON
field, reordered tool calls): the scores must order as a person would order the changes."""

from __future__ import annotations

import json

from checks.artifact import RunArtifact, ToolCall
from checks.context import CheckContext
from checks.families.drift import DriftCheck
from checks.results import FailureCode

ANSWER = "Your refund of $12.50 for order 1042 was issued to your card today."
PARAPHRASE = "Today your refund of $12.50 for order 1042 was issued to the card."
CONTRADICTION = "We cannot refund order 1042: the payment service refused the request."

RECORD = {"status": "refunded", "amount": 12.5, "order": "1042", "note": "issued to card"}

LOOKUP = {"name": "lookup_order", "arguments": {"order_id": "1042"}}
REFUND = {"name": "refund", "arguments": {"order_id": "1042", "amount": 12.5}}
EMAIL = {"name": "send_email", "arguments": {"to": "ana@example.com"}}


def drift_of(check: dict, output: str, context: CheckContext, tools=()) -> float:
    artifact = RunArtifact(
        final_output=output,
        tool_calls=[ToolCall(name=t["name"], arguments=t["arguments"]) for t in tools],
    )
    outcome = DriftCheck({"type": "drift", **check}).evaluate(artifact, context)
    assert outcome.failure_code in (None, FailureCode.DRIFT_EXCEEDED), outcome.message
    return outcome.details["drift"]


def test_lexical_orders_identical_paraphrase_contradiction():
    context = CheckContext(baseline_output=ANSWER)
    same = drift_of({}, ANSWER, context)
    paraphrase = drift_of({}, PARAPHRASE, context)
    contradiction = drift_of({}, CONTRADICTION, context)

    assert same == 0.0
    assert 0.0 < paraphrase < contradiction
    assert paraphrase < 0.6 and contradiction > 0.7


def test_field_diff_orders_identical_small_edit_changed_field_lost_structure():
    context = CheckContext(baseline_output=json.dumps(RECORD))
    method = {"method": "field-diff"}
    same = drift_of(method, json.dumps(dict(reversed(list(RECORD.items())))), context)
    small_edit = drift_of(method, json.dumps({**RECORD, "note": "issued to card."}), context)
    changed_field = drift_of(method, json.dumps({**RECORD, "status": "denied"}), context)
    two_fields = drift_of(method, json.dumps({**RECORD, "status": "denied", "amount": 0}), context)
    not_json = drift_of(method, "refund denied", context)

    assert same == 0.0  # key order does not matter
    assert 0.0 < small_edit < changed_field < two_fields < not_json == 1.0
    assert two_fields == 0.25 + changed_field  # the amount moved from 12.5 to 0: a whole field


def test_tool_sequence_orders_identical_argument_reordered_different():
    context = CheckContext(baseline_output="done", baseline_tool_calls=[LOOKUP, REFUND])
    method = {"method": "tool-sequence"}
    same = drift_of(method, "done", context, [LOOKUP, REFUND])
    changed_argument = drift_of(
        method,
        "done",
        context,
        [LOOKUP, {**REFUND, "arguments": {"order_id": "1042", "amount": 99}}],
    )
    reordered = drift_of(method, "done", context, [REFUND, LOOKUP])
    extra_call = drift_of(method, "done", context, [LOOKUP, REFUND, EMAIL])
    different = drift_of(method, "done", context, [EMAIL])
    nothing = drift_of(method, "done", context, [])

    assert same == 0.0
    assert 0.0 < changed_argument < extra_call < reordered < different == nothing == 1.0
    assert reordered == 0.5  # one of the two calls is out of order: half the names moved


def test_tool_sequence_fails_past_max_score_and_names_both_sequences():
    context = CheckContext(baseline_output="done", baseline_tool_calls=[LOOKUP, REFUND])
    artifact = RunArtifact(final_output="done", tool_calls=[ToolCall(name="send_email")])
    outcome = DriftCheck({"type": "drift", "method": "tool-sequence"}).evaluate(artifact, context)

    assert not outcome.passed and outcome.failure_code is FailureCode.DRIFT_EXCEEDED
    assert outcome.details["baseline_tools"] == ["lookup_order", "refund"]
    assert outcome.details["tools"] == ["send_email"]


def test_a_named_baseline_with_no_matching_cell_passes_flagged():
    # The server resolved `baseline: active` to a baseline, but it has no cell for this
    # execution: nothing was measured, and the result says so.
    context = CheckContext(baseline_name="release-1")
    outcome = DriftCheck({"type": "drift", "baseline": "active"}).evaluate(
        RunArtifact(final_output="x"), context
    )
    assert outcome.passed and outcome.details["flag"] == "no_baseline"
    # `baseline: active` never falls back to the no-chaos output of the same run.
    in_run_only = CheckContext(baseline_output="x")
    outcome = DriftCheck({"type": "drift", "baseline": "active"}).evaluate(
        RunArtifact(final_output="y"), in_run_only
    )
    assert outcome.passed and outcome.details["flag"] == "no_baseline"


def test_a_stored_baseline_is_named_in_the_result():
    context = CheckContext(baseline_output=ANSWER, baseline_name="release-1")
    outcome = DriftCheck({"type": "drift", "baseline": "active"}).evaluate(
        RunArtifact(final_output=CONTRADICTION), context
    )
    assert not outcome.passed and outcome.details["baseline"] == "release-1"


def test_embedding_with_no_endpoint_uses_the_offline_model_and_orders_by_meaning():
    # No judge configured: the model shipped in `keystone[embeddings]` is really loaded here
    # (CI installs the extra); nothing reaches a network.
    context = CheckContext(baseline_output=ANSWER)
    method = {"method": "embedding", "max_score": 0.3}
    same = drift_of(method, ANSWER, context)
    paraphrase = drift_of(method, PARAPHRASE, context)
    contradiction = drift_of(method, CONTRADICTION, context)
    unrelated = drift_of(method, "Paris is the capital of France.", context)

    assert same < 0.001
    assert same < paraphrase < contradiction < unrelated
    assert paraphrase < 0.3 < unrelated  # the paraphrase passes max_score, the unrelated fails
