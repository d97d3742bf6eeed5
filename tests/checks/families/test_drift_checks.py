from __future__ import annotations

import json

from checks.context import CheckContext
from checks.families.drift import field_diff, string_distance
from checks.results import FailureCode

BASELINE = json.dumps({"status": "refunded", "amount": 12.5, "note": "Refund issued to card"})


class DriftJudge:
    def evaluate(self, *, config, judged_input, evidence):  # pragma: no cover - not used here
        return {"score": 1.0}

    def drift(self, *, baseline, current, config):
        return {"drift_score": 0.0 if baseline == current else 0.6, "reasoning": "compared"}


def test_string_distance_is_levenshtein_over_the_longer_length():
    assert string_distance("kitten", "sitting") == 3 / 7
    assert string_distance("", "abc") == 1.0
    assert string_distance("", "") == 0.0
    assert string_distance("abc", "abc") == 0.0
    assert string_distance("abcd", "abcx") == 0.25
    # No length cap: a change after 5,000 characters is still seen.
    assert 0 < string_distance("a" * 20000, "a" * 19999 + "b") < 0.001


def test_field_diff_per_field_distance():
    current = json.dumps({"status": "refunded", "amount": 13, "note": "Refund issued to card!"})
    drift, fields = field_diff(BASELINE, current, [])
    assert fields["status"] == 0.0
    assert fields["amount"] == 1.0
    assert 0 < fields["note"] < 0.1
    assert drift == sum(fields.values()) / 3


def test_no_baseline_passes_flagged(run_check):
    outcome = run_check({"type": "drift"}, output="anything")
    assert outcome.passed
    assert outcome.details["flag"] == "no_baseline"


def test_lexical_drift(run_check):
    context = CheckContext(baseline_output="Refund of $12.50 issued for order 1042.")
    same = run_check(
        {"type": "drift"}, context=context, output="Refund of $12.50 issued for order 1042."
    )
    assert same.passed and same.score == 1.0
    outcome = run_check(
        {"type": "drift", "max_score": 0.15}, context=context, output="Cannot reach payments."
    )
    assert outcome.failure_code is FailureCode.DRIFT_EXCEEDED
    assert outcome.score == 1.0 - outcome.details["drift"]
    assert outcome.message.startswith("drift ")


def test_field_diff_only_listed_fields(run_check):
    context = CheckContext(baseline_output=BASELINE)
    current = json.dumps(
        {"status": "refunded", "amount": 12.5, "note": "totally different text here"}
    )
    config = {"type": "drift", "method": "field-diff", "fields": ["status", "amount"]}
    assert run_check(config, context=context, output=current).passed
    outcome = run_check({"type": "drift", "method": "field-diff"}, context=context, output=current)
    assert outcome.failure_code is FailureCode.DRIFT_EXCEEDED
    assert "fields changed: note" in outcome.message


def test_field_diff_non_json_output_is_full_drift(run_check):
    context = CheckContext(baseline_output=BASELINE)
    outcome = run_check({"type": "drift", "method": "field-diff"}, context=context, output="oops")
    assert outcome.failure_code is FailureCode.DRIFT_EXCEEDED
    assert outcome.details["drift"] == 1.0


def test_field_diff_non_json_baseline_is_check_error(run_check):
    context = CheckContext(baseline_output="plain text")
    outcome = run_check({"type": "drift", "method": "field-diff"}, context=context, output="{}")
    assert outcome.failure_code is FailureCode.CHECK_ERROR


def test_judge_drift_needs_the_provider_and_embedding_falls_back_to_the_offline_model(
    run_check,
):
    context = CheckContext(baseline_output="a")
    outcome = run_check({"type": "drift", "method": "judge"}, context=context, output="b")
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    # No judge endpoint: the offline model (keystone[embeddings]) measures it.
    same = run_check({"type": "drift", "method": "embedding"}, context=context, output="a")
    assert same.passed and same.details["drift"] < 0.001
    judged = CheckContext(baseline_output="a", judge=DriftJudge())
    outcome = run_check({"type": "drift", "method": "judge"}, context=judged, output="b")
    assert outcome.failure_code is FailureCode.DRIFT_EXCEEDED
    assert outcome.details["reasoning"] == "compared"
    assert run_check({"type": "drift", "method": "judge"}, context=judged, output="a").passed


def test_unknown_method_is_check_error(run_check):
    outcome = run_check(
        {"type": "drift", "method": "astrology"},
        context=CheckContext(baseline_output="a"),
        output="a",
    )
    assert outcome.failure_code is FailureCode.CHECK_ERROR


class FailingDriftJudge(DriftJudge):
    def drift(self, *, baseline, current, config):
        return {"error_code": "PROVIDER_AUTH_FAILED", "reasoning": "bad key"}


def test_drift_judge_provider_error_is_mapped(run_check):
    context = CheckContext(baseline_output="a", judge=FailingDriftJudge())
    outcome = run_check({"type": "drift", "method": "judge"}, context=context, output="b")
    assert outcome.failure_code is FailureCode.PROVIDER_AUTH_FAILED
    assert "bad key" in outcome.message
