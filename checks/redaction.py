"""Secret values taken out of what Keystone stores and reports.

`forbidden: {secrets_in_logs: deny}` detects a leak on the raw artifact; this module then
replaces every occurrence of the spec's secret values in the artifact, the check results,
the violations and the warnings, so the stored output, the stdout/stderr artifacts, the
trace and every report built from them never repeat the secret (issue 12, item 18).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from checks.artifact import RunArtifact
from checks.results import CheckResult

REDACTED = "[REDACTED]"
# Shorter values would redact ordinary words; detection uses the same floor.
MIN_SECRET_LENGTH = 4


def usable_secrets(values: Iterable[str]) -> list[str]:
    """The values worth redacting, longest first (a secret containing another is replaced
    whole)."""
    return sorted({v for v in values if len(v) >= MIN_SECRET_LENGTH}, key=len, reverse=True)


def redact(value: Any, secrets: list[str]) -> Any:
    """`value` with every secret replaced, through strings, mappings (keys too) and lists."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(v, secrets) for v in value)
    return value


def redact_artifact(artifact: RunArtifact, secrets: list[str]) -> RunArtifact:
    return RunArtifact.from_dict(redact(artifact.to_dict(), secrets)) if secrets else artifact


def redact_results(results: list[CheckResult], secrets: list[str]) -> list[CheckResult]:
    if not secrets:
        return results
    return [
        replace(r, message=redact(r.message, secrets), details=redact(r.details, secrets))
        for r in results
    ]
