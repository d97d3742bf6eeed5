from __future__ import annotations

import json

import pytest

from checks.results import FailureCode

SCHEMA = {
    "type": "object",
    "required": ["status", "amount"],
    "properties": {"status": {"enum": ["refunded", "pending"]}, "amount": {"type": "number"}},
}


def test_schema_valid_output_passes(run_check):
    assert run_check(
        {"type": "schema", "schema": SCHEMA}, output='{"status": "refunded", "amount": 12.5}'
    ).passed


def test_schema_violations_listed_with_paths(run_check):
    outcome = run_check({"type": "schema", "schema": SCHEMA}, output='{"status": "lost"}')
    assert outcome.failure_code is FailureCode.SCHEMA_INVALID
    paths = {e["path"] for e in outcome.details["errors"]}
    assert paths == {"/", "/status"}
    assert "'amount' is a required property" in outcome.message


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json_and_meet_no_bound(run_check, value):
    """Python's parser reads them, no other does; NaN compares false to every bound, so
    {"amount": NaN} passed a minimum and a maximum."""
    bounded = {"type": "object", "properties": {"amount": {"minimum": 0, "maximum": 100}}}
    outcome = run_check({"type": "schema", "schema": bounded}, output=f'{{"amount": {value}}}')
    assert outcome.failure_code is FailureCode.SCHEMA_PARSE_ERROR
    assert outcome.message == f"output is not valid JSON: {value} is not a JSON value"
    assert run_check({"type": "schema", "schema": bounded}, output='{"amount": 99.5}').passed


def test_schema_non_json_output_is_parse_error(run_check):
    outcome = run_check({"type": "schema", "schema": SCHEMA}, output="Refund issued.")
    assert outcome.failure_code is FailureCode.SCHEMA_PARSE_ERROR
    assert outcome.details["output_preview"] == "Refund issued."


def test_schema_file_relative_to_spec_dir(run_check, ws_context):
    (ws_context.spec_dir / "schemas").mkdir()
    (ws_context.spec_dir / "schemas" / "refund.json").write_text(json.dumps(SCHEMA))
    config = {"type": "schema", "schema_file": "schemas/refund.json"}
    assert run_check(config, context=ws_context, output='{"status": "pending", "amount": 1}').passed
    assert not run_check(config, context=ws_context, output='{"status": "pending"}').passed


def test_schema_bad_configuration_is_check_error(run_check, ws_context):
    cases = [
        {"type": "schema"},
        {"type": "schema", "schema": SCHEMA, "schema_file": "x.json"},
        {"type": "schema", "schema_file": "missing.json"},
        {"type": "schema", "schema_file": "../../etc/passwd"},
        {"type": "schema", "schema": {"type": "no-such-type"}},
    ]
    for config in cases:
        outcome = run_check(config, context=ws_context, output="{}")
        assert outcome.failure_code is FailureCode.CHECK_ERROR, config


def test_schema_file_that_is_not_json_is_check_error(run_check, ws_context):
    (ws_context.spec_dir / "bad.json").write_text("{nope")
    outcome = run_check(
        {"type": "schema", "schema_file": "bad.json"}, context=ws_context, output="{}"
    )
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "not valid JSON" in outcome.message


def test_format_is_checked_as_kindlm_does(run_check) -> None:
    # issue 12, item 3: format: email accepted "not-an-email" before.
    schema = {
        "type": "object",
        "properties": {
            "email": {"type": "string", "format": "email"},
            "when": {"type": "string", "format": "date-time"},
            "site": {"type": "string", "format": "uri"},
        },
    }
    good = (
        '{"email": "a@example.com", "when": "2026-11-24T10:00:00Z", "site": "https://x.example/"}'
    )
    assert run_check({"type": "schema", "schema": schema}, output=good).passed
    bad = '{"email": "not-an-email", "when": "yesterday", "site": "not a uri"}'
    outcome = run_check({"type": "schema", "schema": schema}, output=bad)
    assert not outcome.passed
    paths = {error["path"] for error in outcome.details["errors"]}
    assert paths == {"/email", "/when", "/site"}
    assert "'not-an-email' is not a 'email'" in outcome.message


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ("P3D", True),
        ("P1W", True),
        ("PT1H30M", True),
        ("PT45S", True),
        ("P1Y2M3DT4H5M6S", True),
        ("P2M", True),
        ("P", False),
        ("PT", False),
        ("3D", False),
        ("P1H", False),  # hours only after T
        ("P1M2Y", False),  # the largest unit first
        ("P1.5D", False),  # RFC 3339 Appendix A has no fractions
        ("P1W2D", False),  # weeks stand alone
        ("P3D ", False),
        ("P\u0663D", False),  # an Arabic-Indic digit is not a DIGIT
    ],
)
def test_duration_format_follows_rfc_3339_appendix_a(run_check, value: str, valid: bool) -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "string",
        "format": "duration",
    }
    outcome = run_check({"type": "schema", "schema": schema}, output=json.dumps(value))
    assert outcome.passed is valid, outcome.message
