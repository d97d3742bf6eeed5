"""Issue 13, item 6: a pattern written to backtrack catastrophically cannot freeze the
worker: the search stops at its time limit and the result is a CHECK_TIMEOUT naming it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from checks.artifact import RunArtifact
from checks.context import CheckContext
from checks.registry import get_check_class
from checks.results import ERROR_CODES, FailureCode

EVIL = r"(a|aa)+$"
OUTPUT = "a" * 40 + "b"  # with `re`, this search would take longer than the universe


@pytest.mark.parametrize(
    "config",
    [
        {"type": "regex", "pattern": EVIL},
        {"type": "excludes_pattern", "pattern": EVIL},
        {"type": "pii", "deny_patterns": [EVIL]},
        {"type": "pii", "custom_patterns": [{"name": "evil", "pattern": EVIL}]},
    ],
    ids=["regex", "excludes_pattern", "pii deny", "pii custom"],
)
def test_a_catastrophic_pattern_times_out_and_is_named(config: dict[str, Any]) -> None:
    check = get_check_class(config["type"])(config)
    started = time.monotonic()
    outcome = check.evaluate(RunArtifact(final_output=OUTPUT), CheckContext())
    assert time.monotonic() - started < 10
    assert outcome.failure_code is FailureCode.CHECK_TIMEOUT
    assert EVIL in outcome.message
    assert FailureCode.CHECK_TIMEOUT in ERROR_CODES  # an error, never a silent pass or fail


def test_a_file_content_pattern_times_out_too(tmp_path: Any) -> None:
    (tmp_path / "out.txt").write_text(OUTPUT)
    check = get_check_class("file_content")(
        {"type": "file_content", "path": "out.txt", "pattern": EVIL}
    )
    outcome = check.evaluate(RunArtifact(), CheckContext(workspace=tmp_path))
    assert outcome.failure_code is FailureCode.CHECK_TIMEOUT
