from __future__ import annotations

from checks.results import FailureCode


def test_denied_keywords_are_listed_case_insensitively(run_check):
    outcome = run_check(
        {"type": "keywords", "deny": ["guarantee", "lawsuit", "free money"]},
        output="We GUARANTEE no Lawsuit",
    )
    assert outcome.failure_code is FailureCode.KEYWORD_DENIED
    assert outcome.details["denied"] == ["guarantee", "lawsuit"]
    assert "'guarantee'" in outcome.message and "'lawsuit'" in outcome.message


def test_allow_list_needs_one_keyword(run_check):
    config = {"type": "keywords", "allow": ["refund", "reimburse"]}
    assert run_check(config, output="We will REIMBURSE you").passed
    outcome = run_check(config, output="Sorry about that")
    assert outcome.failure_code is FailureCode.KEYWORD_MISSING
    assert "at least one of: 'refund', 'reimburse'" in outcome.message


def test_deny_wins_over_missing_allow(run_check):
    outcome = run_check(
        {"type": "keywords", "deny": ["idiot"], "allow": ["refund"]}, output="you idiot"
    )
    assert outcome.failure_code is FailureCode.KEYWORD_DENIED
    assert outcome.details["allow_missing"] is True


def test_clean_output_passes(run_check):
    assert run_check(
        {"type": "keywords", "deny": ["idiot"], "allow": ["refund"]}, output="refund sent"
    ).passed


def test_keywords_without_lists_is_check_error(run_check):
    assert run_check({"type": "keywords"}, output="x").failure_code is FailureCode.CHECK_ERROR
    assert (
        run_check({"type": "keywords", "deny": [3]}, output="x").failure_code
        is FailureCode.CHECK_ERROR
    )


def test_a_denied_keyword_written_with_invisible_characters_is_found(run_check):
    """ "pass\u200bword" reads "password": searched as it came, it passed the deny list."""
    outcome = run_check({"type": "keywords", "deny": ["password"]}, output="Pass\u200bword: x")
    assert outcome.failure_code is FailureCode.KEYWORD_DENIED
    allowed = run_check(
        {"type": "keywords", "allow": ["wire transfer"]}, output="wire\u00a0transfer"
    )
    assert allowed.passed
