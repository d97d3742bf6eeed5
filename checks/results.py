"""Typed results of a check, and the failure codes of the contract (SPEC_FORMAT.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from checks.plain import fields_dict


class FailureCode(StrEnum):
    SCHEMA_INVALID = "SCHEMA_INVALID"
    SCHEMA_PARSE_ERROR = "SCHEMA_PARSE_ERROR"
    PII_DETECTED = "PII_DETECTED"
    KEYWORD_DENIED = "KEYWORD_DENIED"
    KEYWORD_MISSING = "KEYWORD_MISSING"
    CONTAINS_FAILED = "CONTAINS_FAILED"
    NOT_CONTAINS_FAILED = "NOT_CONTAINS_FAILED"
    PATTERN_FAILED = "PATTERN_FAILED"
    MAX_LENGTH_EXCEEDED = "MAX_LENGTH_EXCEEDED"
    JUDGE_BELOW_THRESHOLD = "JUDGE_BELOW_THRESHOLD"
    JUDGE_PARSE_ERROR = "JUDGE_PARSE_ERROR"
    TOOL_CALL_MISSING = "TOOL_CALL_MISSING"
    TOOL_CALL_UNEXPECTED = "TOOL_CALL_UNEXPECTED"
    TOOL_CALL_ARGS_MISMATCH = "TOOL_CALL_ARGS_MISMATCH"
    TOOL_CALL_ORDER_WRONG = "TOOL_CALL_ORDER_WRONG"
    TOOL_CALL_ARGS_SCHEMA_INVALID = "TOOL_CALL_ARGS_SCHEMA_INVALID"
    DRIFT_EXCEEDED = "DRIFT_EXCEEDED"
    FILE_MISSING = "FILE_MISSING"
    FILE_PRESENT = "FILE_PRESENT"
    EXIT_CODE_MISMATCH = "EXIT_CODE_MISMATCH"
    SQL_MISMATCH = "SQL_MISMATCH"
    HTTP_ASSERTION_FAILED = "HTTP_ASSERTION_FAILED"
    LATENCY_EXCEEDED = "LATENCY_EXCEEDED"
    COST_EXCEEDED = "COST_EXCEEDED"
    STATUS_MISMATCH = "STATUS_MISMATCH"
    FORBIDDEN_VIOLATION = "FORBIDDEN_VIOLATION"
    PROVIDER_TIMEOUT = "PROVIDER_TIMEOUT"
    PROVIDER_AUTH_FAILED = "PROVIDER_AUTH_FAILED"
    PROVIDER_ERROR = "PROVIDER_ERROR"
    CHECK_ERROR = "CHECK_ERROR"
    CHECK_TIMEOUT = "CHECK_TIMEOUT"  # a user pattern ran past its time limit
    INTERNAL_ERROR = "INTERNAL_ERROR"


# Codes that mean the check could not give a verdict (not that the agent failed it).
ERROR_CODES = frozenset(
    {
        FailureCode.CHECK_ERROR,
        FailureCode.CHECK_TIMEOUT,
        FailureCode.INTERNAL_ERROR,
        FailureCode.JUDGE_PARSE_ERROR,
        FailureCode.PROVIDER_TIMEOUT,
        FailureCode.PROVIDER_AUTH_FAILED,
        FailureCode.PROVIDER_ERROR,
    }
)
# How an execution's error starts when Keystone itself failed it (a crash in the platform,
# the infrastructure away after every attempt), not the agent or its spec: exit code 4.
INTERNAL_ERROR_PREFIX = "Keystone internal error: "
# The check types whose results come from the LLM judge (source "judge", not "engine").
JUDGE_CHECK_TYPES = frozenset({"llm_as_judge", "judge"})
# Checks whose score a model gave by method (drift, similarity): "judge" or "embedding".
_MODEL_METHODS = frozenset({"judge", "embedding"})


def gradable(check_type: str, details: Any) -> bool:
    """Whether a person's grade means something for this result: its score is a model's
    opinion (a judge, a judged or embedded drift or similarity), not a fact the engine read
    off the output, the files or the database, which a person could only repeat."""
    if check_type in JUDGE_CHECK_TYPES:
        return True
    method = details.get("method") if isinstance(details, dict) else None
    return check_type in ("drift", "similarity", "behavior_unchanged") and method in _MODEL_METHODS


PROVIDER_CODES = frozenset(
    {FailureCode.PROVIDER_TIMEOUT, FailureCode.PROVIDER_AUTH_FAILED, FailureCode.PROVIDER_ERROR}
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one check says about one artifact, before the invariant's metadata is applied."""

    passed: bool
    score: float
    failure_code: FailureCode | None = None
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, message: str = "", **details: Any) -> Outcome:
        return cls(True, 1.0, None, message, details)

    @classmethod
    def fail(cls, code: FailureCode, message: str, score: float = 0.0, **details: Any) -> Outcome:
        return cls(False, score, code, message, details)

    @classmethod
    def error(
        cls, message: str, code: FailureCode = FailureCode.CHECK_ERROR, **details: Any
    ) -> Outcome:
        return cls(False, 0.0, code, message, details)


@dataclass(slots=True)
class CheckResult:
    """One invariant evaluated on one execution: the unit the scores are computed from."""

    invariant_id: str
    check_type: str
    passed: bool
    score: float
    failure_code: FailureCode | None = None
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    severity: str = "medium"
    weight: float = 1.0
    gate: bool = False
    dimensions: list[str] = field(default_factory=list)
    source: str = "engine"  # engine | judge | human

    @property
    def is_error(self) -> bool:
        return self.failure_code in ERROR_CODES

    def to_dict(self) -> dict[str, Any]:
        data = fields_dict(self)
        data["failure_code"] = self.failure_code.value if self.failure_code else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        values = dict(data)
        code = values.get("failure_code")
        values["failure_code"] = FailureCode(code) if code else None
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in values.items() if k in known})
