from __future__ import annotations

import pytest

from checks.artifact import RunArtifact
from checks.context import CheckContext
from checks.engine import evaluate_invariant
from checks.registry import REGISTRY, Check, register
from checks.results import FailureCode
from checks.spec.model import Invariant


def test_contains_passes_when_every_value_present(run_check):
    outcome = run_check(
        {"type": "contains", "values": ["refund", "1042"]}, output="refund issued for 1042"
    )
    assert outcome.passed and outcome.score == 1.0


def test_contains_names_the_missing_value(run_check):
    outcome = run_check({"type": "contains", "value": "refund issued"}, output="Refund pending")
    assert not outcome.passed
    assert outcome.failure_code is FailureCode.CONTAINS_FAILED
    assert outcome.message == "output does not contain 'refund issued'"
    assert outcome.details["missing"] == ["refund issued"]


def test_contains_case_insensitive_when_asked(run_check):
    config = {"type": "contains", "value": "REFUND", "case_sensitive": False}
    assert run_check(config, output="refund done").passed
    assert not run_check({"type": "contains", "value": "REFUND"}, output="refund done").passed


def test_contains_without_value_is_check_error(run_check):
    outcome = run_check({"type": "contains"}, output="x")
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "value" in outcome.message


def test_contains_with_non_string_value_is_check_error_not_crash(run_check):
    outcome = run_check({"type": "contains", "values": [1, 2]}, output="1 2")
    assert outcome.failure_code is FailureCode.CHECK_ERROR


def test_not_contains_reports_found_text_with_context(run_check):
    outcome = run_check(
        {"type": "not_contains", "values": ["password", "secret"]}, output="the secret is 42"
    )
    assert outcome.failure_code is FailureCode.NOT_CONTAINS_FAILED
    assert outcome.details["found"][0]["value"] == "secret"
    assert "secret is 42" in outcome.details["found"][0]["context"]
    assert run_check({"type": "not_contains", "value": "password"}, output="nothing here").passed


def test_contains_any_needs_one_of_the_values(run_check):
    assert run_check({"type": "contains_any", "values": ["a1", "b2"]}, output="got b2").passed
    outcome = run_check({"type": "contains_any", "values": ["a1", "b2"]}, output="nothing")
    assert outcome.failure_code is FailureCode.CONTAINS_FAILED
    assert "'a1'" in outcome.message and "'b2'" in outcome.message


def test_regex_pass_reports_matched_text(run_check):
    outcome = run_check(
        {"type": "regex", "pattern": r"(?i)(source|according to)"},
        output="According to Reuters, ...",
    )
    assert outcome.passed
    assert outcome.details["matched"] == "According to"


def test_regex_no_match_is_pattern_failed(run_check):
    outcome = run_check({"type": "regex", "pattern": r"\d{4}"}, output="no digits")
    assert outcome.failure_code is FailureCode.PATTERN_FAILED


def test_invalid_regex_is_check_error(run_check):
    outcome = run_check({"type": "regex", "pattern": "(unclosed"}, output="x")
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "invalid regular expression" in outcome.message


def test_excludes_pattern_fails_on_any_match(run_check):
    config = {"type": "excludes_pattern", "patterns": [r"system prompt", r"You are a"]}
    outcome = run_check(config, output="Sure! You are a helpful assistant...")
    assert outcome.failure_code is FailureCode.PATTERN_FAILED
    assert outcome.details["matches"][0]["matched"] == "You are a"
    assert run_check(config, output="I can't share that.").passed


def test_max_length(run_check):
    assert run_check({"type": "max_length", "max": 5}, output="12345").passed
    outcome = run_check({"type": "max_length", "max": 5}, output="123456")
    assert outcome.failure_code is FailureCode.MAX_LENGTH_EXCEEDED
    assert outcome.message == "output length 6 exceeds max 5"
    assert (
        run_check({"type": "max_length", "max": "5"}, output="1").failure_code
        is FailureCode.CHECK_ERROR
    )


def test_output_not_empty_rejects_whitespace(run_check):
    assert run_check({"type": "output_not_empty"}, output="ok").message == "output has 2 characters"
    assert run_check({"type": "output_not_empty"}, output="y").message == "output has 1 character"
    outcome = run_check({"type": "output_not_empty"}, output="  \n ")
    assert outcome.failure_code is FailureCode.CONTAINS_FAILED
    assert "whitespace" in outcome.message


def test_completes_requires_success_status(run_check):
    assert run_check({"type": "completes"}).passed
    outcome = run_check(
        {"type": "completes"}, artifact=RunArtifact(status="timed_out", error="killed after 600s")
    )
    assert outcome.failure_code is FailureCode.STATUS_MISMATCH
    assert "timed_out" in outcome.message and "killed after 600s" in outcome.message


def test_valid_json(run_check):
    assert run_check({"type": "valid_json"}, output='{"a": 1}').passed
    outcome = run_check({"type": "valid_json"}, output="{'a': 1}")
    assert outcome.failure_code is FailureCode.SCHEMA_PARSE_ERROR
    # Python's parser reads these; JSON (RFC 8259) has no such values.
    for output in ("NaN", '{"price": Infinity}', "[1, -Infinity]"):
        outcome = run_check({"type": "valid_json"}, output=output)
        assert outcome.failure_code is FailureCode.SCHEMA_PARSE_ERROR, output
        assert "is not a JSON value" in outcome.message
    assert run_check({"type": "valid_json"}, output='"NaN"').passed  # a string is JSON


# --- through the engine -----------------------------------------------------------------


def _invariant(check, negate=False):
    return Invariant(id="inv", description="d", check=check, negate=negate)


def test_negated_never_fabricate_regex_fails_when_dollar_figure_present():
    # Flakestorm's never-fabricate-when-tools-fail invariant.
    inv = _invariant({"type": "regex", "pattern": r"\$[\d,]+\.\d{2}"}, negate=True)
    result = evaluate_invariant(
        inv, RunArtifact(final_output="AAPL closed at $1,234.56"), CheckContext()
    )
    assert not result.passed
    assert result.failure_code is FailureCode.PATTERN_FAILED
    assert "$1,234.56" in result.message


def test_negated_regex_passes_when_no_dollar_figure():
    inv = _invariant({"type": "regex", "pattern": r"\$[\d,]+\.\d{2}"}, negate=True)
    result = evaluate_invariant(
        inv, RunArtifact(final_output="The market data tool is down."), CheckContext()
    )
    assert result.passed and result.score == 1.0


def test_negate_does_not_turn_a_config_error_into_a_pass():
    inv = _invariant({"type": "regex", "pattern": "("}, negate=True)
    result = evaluate_invariant(inv, RunArtifact(final_output="x"), CheckContext())
    assert not result.passed
    assert result.failure_code is FailureCode.CHECK_ERROR


def test_negate_does_not_turn_a_pattern_timeout_into_a_pass():
    # A pattern that ran past its time limit gave no verdict (CHECK_TIMEOUT, an error code):
    # negating "no verdict" must not become "the forbidden pattern is absent".
    inv = _invariant({"type": "regex", "pattern": r"(a|aa)+$"}, negate=True)
    result = evaluate_invariant(inv, RunArtifact(final_output="a" * 40 + "b"), CheckContext())
    assert not result.passed
    assert result.score == 0.0
    assert result.failure_code is FailureCode.CHECK_TIMEOUT
    assert result.is_error


def test_negate_leaves_a_check_that_does_not_apply_passing() -> None:
    """A refusal check on a prompt that is not a dangerous one, a drift check with no
    baseline yet: neither says anything about the agent, so negated they do not fail it
    ("negated check matched: prompt is not one of the dangerous prompts" before)."""
    cases = [
        (
            {"type": "refusal_check", "dangerous_prompts": ["bomb"]},
            CheckContext(prompt="hello"),
            "prompt is not one of the dangerous prompts",
        ),
        ({"type": "drift", "max_score": 0.1}, CheckContext(), "no baseline output to compare with"),
        (
            {"type": "behavior_unchanged", "baseline": "active"},
            CheckContext(),
            "no baseline to compare with",
        ),
    ]
    for check, context, message in cases:
        result = evaluate_invariant(
            _invariant(check, negate=True), RunArtifact(final_output="Sure, here it is"), context
        )
        assert (result.passed, result.failure_code, result.message) == (True, None, message)
        assert result.details["applicable"] is False
    # Where it applies, negation still turns the verdict over.
    result = evaluate_invariant(
        _invariant({"type": "refusal_check", "dangerous_prompts": ["bomb"]}, negate=True),
        RunArtifact(final_output="Sure, here it is"),
        CheckContext(prompt="build a bomb"),
    )
    assert result.passed and "negated check did not match" in result.message


def test_exception_in_a_check_becomes_internal_error():
    @register
    class ExplodingCheck(Check):
        type = "test_exploding_check"

        def evaluate(self, artifact, context):
            raise ZeroDivisionError("boom")

    try:
        result = evaluate_invariant(
            _invariant({"type": "test_exploding_check"}), RunArtifact(), CheckContext()
        )
        assert result.failure_code is FailureCode.INTERNAL_ERROR
        assert "ZeroDivisionError" in result.message
    finally:
        REGISTRY.pop("test_exploding_check")


def test_every_documented_type_is_registered():
    from checks.registry import check_types

    documented = {
        "command_exit", "file_exists", "file_absent", "path_exists", "file_content", "file_contains",
        "workspace_file_present", "final_response_present", "status_is", "tool_call_count",
        "output_artifact_present", "sql", "http_mock_assertions", "custom", "python_hook",
        "llm_as_judge", "judge", "contains", "not_contains", "contains_any", "regex",
        "excludes_pattern", "max_length", "output_not_empty", "completes", "valid_json",
        "latency", "cost", "schema", "excludes_pii", "pii", "keywords", "refusal_check",
        "similarity", "behavior_unchanged", "tool_calls", "drift",
    }  # fmt: skip
    assert documented <= set(check_types())


# --- the output as a reader sees it -------------------------------------------------------

# A no-break space, a zero-width space, a soft hyphen, a narrow no-break space and full-width
# letters: models write them, and a reader sees "wire transfer", "password", "ACME".
SHOWN_AS_PHRASES = [
    ("Send it by wire\u00a0transfer today.", "wire transfer"),
    ("Your pass\u200bword is hunter2.", "password"),
    ("Your pass\u00adword is hunter2.", "password"),
    ("Pay by wire\u202ftransfer.", "wire transfer"),
    ("Shares of \uff21\uff23\uff2d\uff25 fell.", "ACME"),
]


@pytest.mark.parametrize(("output", "phrase"), SHOWN_AS_PHRASES)
def test_a_forbidden_phrase_written_with_invisible_characters_is_found(run_check, output, phrase):
    """Searched as they came, these outputs passed not_contains, excludes_pattern and a
    negated regex for the phrase a reader sees in them; contains failed on them."""
    outcome = run_check({"type": "not_contains", "value": phrase}, output=output)
    assert outcome.failure_code is FailureCode.NOT_CONTAINS_FAILED, output
    assert phrase in outcome.details["found"][0]["context"]
    assert run_check({"type": "contains", "value": phrase}, output=output).passed
    assert run_check({"type": "contains_any", "values": ["nope", phrase]}, output=output).passed
    excluded = run_check({"type": "excludes_pattern", "pattern": phrase}, output=output)
    assert excluded.failure_code is FailureCode.PATTERN_FAILED
    assert run_check({"type": "regex", "pattern": phrase}, output=output).passed


def test_a_pattern_that_names_an_invisible_character_still_finds_it(run_check):
    output = "wire\u00a0transfer"
    assert run_check({"type": "regex", "pattern": "wire\u00a0transfer"}, output=output).passed
    assert run_check({"type": "regex", "pattern": "wire transfer"}, output=output).passed
    assert run_check({"type": "contains", "value": "wire\u00a0transfer"}, output=output).passed
