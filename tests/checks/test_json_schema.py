"""checks/json_schema.py: jsonschema loads without the libraries of its format checks, and a
schema still checks every format a plain `import jsonschema` gives, with the same results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checks.families._common import ConfigError, json_schema_validator
from checks.json_schema import FORMAT_LIBRARIES, format_checker, jsonschema
from checks.spec import validate_spec_text

ROOT = Path(__file__).resolve().parents[2]
DRAFTS = (
    "Draft3Validator",
    "Draft4Validator",
    "Draft6Validator",
    "Draft7Validator",
    "Draft201909Validator",
    "Draft202012Validator",
)


def _printed_by(code: str) -> object:
    """The JSON a fresh Python process printed, run in the repository."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_loading_the_spec_engine_imports_no_format_library_and_leaves_each_importable() -> None:
    loaded, imported = _printed_by(
        "import importlib, json, sys\n"
        "import checks.spec\n"
        "from checks.json_schema import FORMAT_LIBRARIES\n"
        "loaded = [name for name in FORMAT_LIBRARIES if name in sys.modules]\n"
        "imported = [importlib.import_module(name).__name__ for name in FORMAT_LIBRARIES]\n"
        "print(json.dumps([loaded, imported]))"
    )
    assert loaded == []
    assert imported == list(FORMAT_LIBRARIES)  # hidden while jsonschema loaded, not after


def test_each_draft_checks_every_format_a_plain_import_of_jsonschema_registers() -> None:
    plain = _printed_by(
        "import json, jsonschema\n"
        f"print(json.dumps({{d: sorted(getattr(jsonschema, d).FORMAT_CHECKER.checkers) "
        f"for d in {DRAFTS!r}}}))"
    )
    assert isinstance(plain, dict)
    # Each hidden library's formats are among them (so the comparison below covers them).
    assert {"hostname", "idn-hostname", "uri", "date-time", "json-pointer", "uri-template"} <= set(
        plain["Draft202012Validator"]
    )
    assert "color" in plain["Draft3Validator"]  # webcolors
    for draft in DRAFTS:
        ours = set(format_checker(getattr(jsonschema, draft)).checkers)
        duration = (
            {"duration"} if draft in ("Draft201909Validator", "Draft202012Validator") else set()
        )
        assert ours == set(plain[draft]) | duration, draft


@pytest.mark.parametrize(
    ("format_name", "valid", "invalid"),
    [
        ("hostname", "api.example.com", "-bad-.example.com"),  # fqdn
        ("idn-hostname", "bücher.example", "a..b"),  # idna
        ("uri", "https://x.example/a?b=c", "no scheme here"),  # rfc3986-validator
        ("uri-reference", "../a/b#c", "a b"),
        ("date-time", "2026-11-26T10:00:00+01:00", "2026-11-26 10:00"),  # rfc3339-validator
        ("time", "10:00:00Z", "10h"),
        ("json-pointer", "/a/0", "a/0"),  # jsonpointer
        ("relative-json-pointer", "1/a", "/a"),
        ("uri-template", "https://x.example/{id}", "https://x.example/{id"),  # uri-template
        ("duration", "P3DT4H", "3 days"),  # Keystone's own
    ],
)
def test_a_schema_check_checks_each_library_s_formats(
    format_name: str, valid: str, invalid: str
) -> None:
    validator = json_schema_validator({"type": "string", "format": format_name}, "the schema")
    assert validator.is_valid(valid)
    assert not validator.is_valid(invalid)


def test_a_draft_3_schema_checks_css_colors() -> None:  # webcolors
    schema = {"$schema": "http://json-schema.org/draft-03/schema#", "format": "color"}
    validator = json_schema_validator(schema, "the schema")
    assert validator.is_valid("red") and validator.is_valid("#ff0000")
    assert not validator.is_valid("not-a-color")


def test_a_user_schema_is_checked_against_its_metaschema_s_formats() -> None:
    """A `$ref` that is no URI reference is refused where the schema is written (the spec) and
    where it is used (the check), as a plain check_schema refuses it."""
    schema = {"$ref": "has spaces and %zz"}
    with pytest.raises(ConfigError, match="is not a 'uri-reference'"):
        json_schema_validator(schema, "the JSON Schema itself")
    spec = f"""\
version: 1
id: bad-ref
task: {{prompt: "hi"}}
agent: {{type: command, command: "echo hi"}}
invariants:
  shaped:
    description: "JSON of a shape"
    check: {{type: schema, schema: {json.dumps(schema)}}}
"""
    _, errors = validate_spec_text(spec)
    assert [str(e) for e in errors] == [
        "invariants.shaped.check.schema: invalid JSON Schema: 'has spaces and %zz' is not a "
        "'uri-reference' at line 8, col 35"
    ]
