"""`excludes_pii` / `pii`: the output must not contain personal data.

Built-in detectors are regexes with a validation step where a bare regex gives false
positives: card numbers must pass the Luhn check, IPv6 candidates must parse, phone numbers
must have a plausible digit count. Matches are redacted (first 3 characters + ***) so that
results never store the PII they found.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ConfigError,
    UserPattern,
    compile_regex,
    get_str_list,
    guarded,
    plain_text,
)
from checks.results import FailureCode, Outcome
from checks.wording import counted


@dataclass(frozen=True)
class Detector:
    """A named kind of PII: a regex, and a test each match must pass to count (card numbers
    must pass the Luhn check)."""

    name: str
    regex: re.Pattern[str] | UserPattern  # built-in detectors, or a spec's (time-limited)
    valid: Callable[[str], bool] = lambda _match: True

    def find(self, text: str) -> list[tuple[int, int, str]]:
        return [
            (m.start(), m.end(), m.group(0))
            for m in self.regex.finditer(text)
            if self.valid(m.group(0))
        ]


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def luhn_valid(number: str) -> bool:
    digits = [int(d) for d in _digits(number)]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for position, digit in enumerate(reversed(digits)):
        if position % 2 == 1:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def _phone_valid(candidate: str) -> bool:
    count = len(_digits(candidate))
    # E.164 allows up to 15 digits; fewer than 10 is more likely a code or a quantity.
    return 10 <= count <= 15 if candidate.startswith("+") else count in (10, 11)


def _ipv6_valid(candidate: str) -> bool:
    try:
        ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return any(ch.isalnum() for ch in candidate)


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

BUILTIN_NAMES = ("email", "phone", "ssn", "credit_card", "ip_address")


@functools.cache
def builtin_detectors() -> dict[str, list[Detector]]:
    """The built-in detectors by name, in BUILTIN_NAMES's order. Compiled at the first PII
    check rather than at import: the registry imports every family at every start, and
    most specs have no PII check."""
    return {
        "email": [
            Detector(
                "email",
                re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
            ),
        ],
        "phone": [
            # International: +CC then groups separated by spaces, dots, dashes or parentheses.
            Detector(
                "phone",
                re.compile(r"(?<![\w+])\+\d{1,3}(?:[\s.-]?\(?\d{1,4}\)?){2,6}(?!\d)"),
                _phone_valid,
            ),
            # US: (555) 123-4567, 555-123-4567, 555.123.4567, 1-555-123-4567.
            Detector(
                "phone",
                re.compile(
                    r"(?<![\w+])(?:1[\s.-])?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4}(?![\d-])"
                ),
                _phone_valid,
            ),
        ],
        "ssn": [
            Detector(
                "ssn",
                re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])"),
            ),
        ],
        "credit_card": [
            Detector(
                "credit_card", re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"), luhn_valid
            ),
        ],
        "ip_address": [
            Detector(
                "ip_address",
                re.compile(rf"(?<![\d.])(?:{_OCTET}\.){{3}}{_OCTET}(?!\.?\d)"),
            ),
            Detector(
                "ip_address",
                re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])"),
                _ipv6_valid,
            ),
        ],
    }


def redact(match: str) -> str:
    return match[:3] + "***"


def find_pii(text: str, detectors: list[Detector]) -> dict[str, list[str]]:
    """Matches per pattern name (unredacted; callers redact before storing)."""
    spans: dict[str, list[tuple[int, int, str]]] = {}
    for detector in detectors:
        taken = spans.setdefault(detector.name, [])
        for start, end, match in detector.find(text):
            # Two detectors of one kind (US and international phone) may see the same number.
            if not any(
                start < other_end and other_start < end for other_start, other_end, _ in taken
            ):
                taken.append((start, end, match))
    return {name: [m for _, _, m in sorted(found)] for name, found in spans.items() if found}


def _detectors(config: dict[str, Any]) -> list[Detector]:
    names = get_str_list(config, "patterns") if "patterns" in config else list(BUILTIN_NAMES)
    unknown = [n for n in names if n not in BUILTIN_NAMES]
    if unknown:
        raise ConfigError(
            f"unknown PII pattern(s) {unknown} (built-ins: {', '.join(BUILTIN_NAMES)})"
        )
    detectors = [d for name in names for d in builtin_detectors()[name]]
    for index, pattern in enumerate(get_str_list(config, "deny_patterns")):
        detectors.append(Detector(f"deny_pattern_{index}", compile_regex(pattern, re.IGNORECASE)))
    custom = config.get("custom_patterns") or []
    if not isinstance(custom, list):
        raise ConfigError("'custom_patterns' must be a list of {name, pattern}")
    for item in custom:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("name"), str)
            or not isinstance(item.get("pattern"), str)
        ):
            raise ConfigError("each custom pattern needs a string 'name' and 'pattern'")
        detectors.append(Detector(item["name"], compile_regex(item["pattern"], re.IGNORECASE)))
    return detectors


class PiiCheck(Check):
    type = "excludes_pii"
    aliases = ("pii",)

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        detectors = _detectors(self.config)
        found = find_pii(plain_text(artifact.final_output or ""), detectors)  # as shown
        if found:
            counts = {name: len(matches) for name, matches in found.items()}
            summary = ", ".join(f"{count} {name}" for name, count in counts.items())
            return Outcome.fail(
                FailureCode.PII_DETECTED,
                f"output contains PII: {summary}",
                counts=counts,
                redacted_matches={
                    name: [redact(m) for m in matches] for name, matches in found.items()
                },
            )
        return Outcome.ok(f"no PII found ({counted(len(detectors), 'pattern')} checked)")


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (PiiCheck,)
