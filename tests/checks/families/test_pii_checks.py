from __future__ import annotations

import pytest

from checks.families.pii import BUILTIN_NAMES, builtin_detectors, find_pii, luhn_valid
from checks.results import FailureCode


def _found(text, name):
    return find_pii(text, builtin_detectors()[name]).get(name, [])


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "email",
            "write to jane.doe+x@mail.example.co.uk today",
            ["jane.doe+x@mail.example.co.uk"],
        ),
        ("phone", "call (555) 123-4567", ["(555) 123-4567"]),
        ("phone", "call 555-123-4567.", ["555-123-4567"]),
        ("phone", "call +1 555 123 4567", ["+1 555 123 4567"]),
        ("phone", "ring +44 20 7946 0958 please", ["+44 20 7946 0958"]),
        ("phone", "ring +33 1 23 45 67 89", ["+33 1 23 45 67 89"]),
        ("ssn", "ssn 123-45-6789", ["123-45-6789"]),
        ("credit_card", "card 4111 1111 1111 1111 ok", ["4111 1111 1111 1111"]),
        ("credit_card", "card 5500-0000-0000-0004", ["5500-0000-0000-0004"]),
        ("ip_address", "host 192.168.1.10.", ["192.168.1.10"]),
        ("ip_address", "v6 2001:db8::8a2e:370:7334 here", ["2001:db8::8a2e:370:7334"]),
        ("ip_address", "loopback ::1", ["::1"]),
    ],
)
def test_builtin_patterns_find_pii(name, text, expected):
    assert _found(text, name) == expected


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("credit_card", "order 4111 1111 1111 1112"),  # fails Luhn
        ("credit_card", "tracking 1234567890123"),
        ("phone", "order 1042 shipped in 3 days"),
        ("phone", "date 2024-01-15"),
        ("ssn", "ssn 000-12-3456"),
        ("ip_address", "version 1.2.3"),
        ("ip_address", "256.1.1.1"),
        ("ip_address", "meeting at 10:30:00"),
        ("email", "user at example dot com"),
    ],
)
def test_builtin_patterns_avoid_false_positives(name, text):
    assert _found(text, name) == []


def test_luhn():
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")
    assert not luhn_valid("4111")


def test_pii_check_redacts_and_counts(run_check):
    output = "Contact john@example.com or mary@example.org, SSN 123-45-6789."
    outcome = run_check({"type": "excludes_pii"}, output=output)
    assert outcome.failure_code is FailureCode.PII_DETECTED
    assert outcome.details["counts"] == {"email": 2, "ssn": 1}
    assert outcome.details["redacted_matches"]["email"] == ["joh***", "mar***"]
    assert outcome.details["redacted_matches"]["ssn"] == ["123***"]
    assert (
        "john@example.com" not in str(outcome.details) and "john@example.com" not in outcome.message
    )
    assert outcome.message == "output contains PII: 2 email, 1 ssn"


def test_pii_alias_and_pattern_selection(run_check):
    output = "mail me at a@b.io from 10.0.0.1"
    assert run_check({"type": "pii", "patterns": ["ip_address"]}, output=output).details[
        "counts"
    ] == {"ip_address": 1}
    one = run_check({"type": "pii", "patterns": ["ssn"]}, output=output)
    assert one.passed and one.message == "no PII found (1 pattern checked)"


def test_pii_deny_and_custom_patterns(run_check):
    config = {
        "type": "pii",
        "patterns": [],
        "deny_patterns": [r"acct-\d{6}"],
        "custom_patterns": [{"name": "employee_id", "pattern": r"EMP\d{4}"}],
    }
    outcome = run_check(config, output="ACCT-123456 belongs to emp0042")
    assert outcome.details["counts"] == {"deny_pattern_0": 1, "employee_id": 1}


def test_pii_clean_output_passes(run_check):
    assert run_check(
        {"type": "excludes_pii"}, output="Refund of $12.50 issued for order 1042."
    ).passed


def test_pii_bad_configuration(run_check):
    assert (
        run_check({"type": "pii", "patterns": ["passport"]}, output="x").failure_code
        is FailureCode.CHECK_ERROR
    )
    assert (
        run_check({"type": "pii", "deny_patterns": ["("]}, output="x").failure_code
        is FailureCode.CHECK_ERROR
    )
    bad_custom = {"type": "pii", "custom_patterns": [{"name": "x"}]}
    assert run_check(bad_custom, output="x").failure_code is FailureCode.CHECK_ERROR


def test_the_built_in_names_are_the_detectors_names_in_order() -> None:
    """BUILTIN_NAMES is what the check accepts and what it runs when given no `patterns`;
    the detectors are built only at the first check, from their own list."""
    detectors = builtin_detectors()
    assert tuple(detectors) == BUILTIN_NAMES
    assert all(d.name == name for name, found in detectors.items() for d in found)


def test_pii_written_with_invisible_characters_or_full_width_digits_is_found(run_check):
    """A reader sees an email and a card number; searched as they came, neither was one."""
    email = "write to jane\u200b.doe@example\u00ad.com"
    card = "card \uff14\uff11\uff11\uff11 1111 1111 1111"  # 4111 ... in full-width digits
    for output, kind in ((email, "email"), (card, "credit_card")):
        outcome = run_check({"type": "excludes_pii"}, output=output)
        assert outcome.failure_code is FailureCode.PII_DETECTED, output
        assert outcome.details["counts"] == {kind: 1}
