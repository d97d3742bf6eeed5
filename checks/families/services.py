"""Checks on the execution's services: `sql` (database state) and `http_mock_assertions`
(what the agent sent to a recorded HTTP mock)."""

from __future__ import annotations

import fnmatch
import json
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import parse_qs

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ConfigError,
    FieldMissing,
    get_service,
    get_str,
    guarded,
    json_equal,
    preview,
    request_body,
    request_headers,
    resolve_field,
)
from checks.json_text import loads_strict
from checks.results import FailureCode, Outcome

# --- sql ------------------------------------------------------------------------------------


def _as_number(value: Any) -> Decimal | None:
    if isinstance(value, bool):
        return Decimal(int(value))
    if isinstance(value, int | float | Decimal):
        try:
            return Decimal(str(value))
        except InvalidOperation:
            return None
    if isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            return None
        return number if number.is_finite() else None
    return None


def sql_values_equal(actual: Any, expected: Any) -> bool:
    """Numbers numerically (0 == 0.0 == '0' == Decimal('0')), NULL only equals null, else text."""
    if actual is None or expected is None:
        return actual is None and expected is None
    left, right = _as_number(actual), _as_number(expected)
    if left is not None and right is not None:
        return left == right
    if isinstance(actual, bytes | bytearray | memoryview):
        actual = bytes(actual).decode(errors="replace")
    return str(actual) == str(expected)


class SqlCheck(Check):
    type = "sql"
    needs_service = True

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        name = get_str(self.config, "service")
        query = get_str(self.config, "query")
        if "equals" not in self.config:
            raise ConfigError("'equals' is required")
        expected = self.config["equals"]
        service = get_service(context, name)
        try:
            rows = service.query(query)
        except Exception as exc:  # any driver error: the query could not give a verdict
            raise ConfigError(f"query on {name!r} failed: {type(exc).__name__}: {exc}") from exc
        details: dict[str, Any] = {"service": name, "query": query, "expected": expected}
        if not rows or not rows[0]:
            return Outcome.fail(
                FailureCode.SQL_MISMATCH,
                f"query on {name!r} returned no rows, expected {expected!r}",
                **details,
            )
        actual = rows[0][0]
        details["actual"] = (
            actual
            if isinstance(actual, int | float | str | bool) or actual is None
            else str(actual)
        )
        if not sql_values_equal(actual, expected):
            return Outcome.fail(
                FailureCode.SQL_MISMATCH,
                f"query on {name!r} returned {actual!r}, expected {expected!r}",
                **details,
            )
        return Outcome.ok(f"query on {name!r} returned {actual!r}", **details)


# --- http_mock_assertions -------------------------------------------------------------------


def _parse_json(text: Any) -> tuple[bool, Any]:
    if not isinstance(text, str):
        return False, None
    try:
        return True, loads_strict(text)
    except ValueError:
        return False, None


def _path_matches(actual: str, wanted: str) -> bool:
    path = actual.split("?", 1)[0]
    return fnmatch.fnmatchcase(path, wanted) if any(c in wanted for c in "*?[") else path == wanted


def _extra_filter_matches(request: dict[str, Any], key: str, wanted: Any) -> bool:
    """A filter that is not method/path/headers: a top-level field of the JSON body or a query
    parameter (reference 000's example filters an email mock by `to`)."""
    is_json, body = _parse_json(request_body(request))
    if is_json and isinstance(body, dict) and key in body:
        value = body[key]
        return json_equal(value, wanted) or (
            not isinstance(value, dict | list) and str(value) == str(wanted)
        )
    query = request.get("query") or ""
    params = (
        parse_qs(query) if isinstance(query, str) else {k: [str(v)] for k, v in dict(query).items()}
    )
    return str(wanted) in params.get(key, [])


def filter_requests(
    requests: list[dict[str, Any]], filters: dict[str, Any]
) -> list[dict[str, Any]]:
    if not isinstance(filters, dict):
        raise ConfigError("'filters' must be a mapping")
    selected = []
    for request in requests:
        if (
            "method" in filters
            and str(request.get("method", "")).upper() != str(filters["method"]).upper()
        ):
            continue
        if "path" in filters and not _path_matches(
            str(request.get("path", "")), str(filters["path"])
        ):
            continue
        if "headers" in filters:
            wanted = filters["headers"]
            if not isinstance(wanted, dict):
                raise ConfigError("'filters.headers' must be a mapping")
            have = request_headers(request)
            if any(have.get(str(k).lower()) != str(v) for k, v in wanted.items()):
                continue
        extras = {k: v for k, v in filters.items() if k not in ("method", "path", "headers")}
        if any(not _extra_filter_matches(request, k, v) for k, v in extras.items()):
            continue
        selected.append(request)
    return selected


def _subset(actual: Any, expected: Any, case_insensitive_keys: bool = False) -> bool:
    if isinstance(expected, dict) and isinstance(actual, dict):
        lookup = {str(k).lower(): v for k, v in actual.items()} if case_insensitive_keys else actual
        for key, value in expected.items():
            name = str(key).lower() if case_insensitive_keys else key
            if name not in lookup or not _subset(lookup[name], value):
                return False
        return True
    if isinstance(expected, str) and isinstance(actual, str):
        return expected in actual
    return json_equal(actual, expected)


def value_equals(actual: Any, expected: Any, headers: bool = False) -> bool:
    if headers and isinstance(actual, dict) and isinstance(expected, dict):
        lowered = {str(k).lower(): str(v) for k, v in expected.items()}
        return actual == lowered
    actual_json, actual_value = _parse_json(actual)
    if actual_json:
        if isinstance(expected, dict | list):
            return json_equal(actual_value, expected)
        expected_json, expected_value = _parse_json(expected)
        if expected_json:
            return json_equal(actual_value, expected_value)
    if isinstance(actual, int | float) and not isinstance(actual, bool):
        return json_equal(actual, expected)
    if isinstance(actual, dict) or isinstance(expected, dict | list):
        return json_equal(actual, expected)
    return str(actual) == str(expected)


def value_contains(actual: Any, expected: Any, headers: bool = False) -> bool:
    if isinstance(expected, dict):
        if isinstance(actual, str):
            is_json, parsed = _parse_json(actual)
            if not is_json:
                return False
            actual = parsed
        return _subset(actual, expected, case_insensitive_keys=headers)
    if isinstance(actual, dict):
        # A string in a headers/request mapping: substring of its JSON form. Header names are
        # stored lower-cased, so a name written as sent ("Content-Type") matches any case.
        needle = str(expected)
        if headers and needle.lower() in actual:
            return True
        return needle in json.dumps(actual, default=str)
    if isinstance(actual, str):
        return str(expected) in actual
    raise ConfigError(f"'contains' cannot apply to {type(actual).__name__} (use 'equals')")


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(preview(text, 120)) if isinstance(value, str) else preview(text, 120)


def _check_assertion(
    requests: list[dict[str, Any]], assertion: dict[str, Any]
) -> tuple[bool, str, Any]:
    field = assertion.get("field")
    if not isinstance(field, str):
        raise ConfigError("each assertion needs a string 'field'")
    has_equals, has_contains = "equals" in assertion, "contains" in assertion
    if has_equals == has_contains:
        raise ConfigError(f"assertion on {field!r} needs exactly one of 'equals' or 'contains'")
    selected = filter_requests(requests, assertion.get("filters") or {})
    label = field + (f" {json.dumps(assertion['filters'])}" if assertion.get("filters") else "")
    try:
        actual = resolve_field(selected, field)
    except FieldMissing as exc:
        return False, f"{label}: {exc}", None
    is_headers = field.endswith("headers")
    if has_equals:
        expected = assertion["equals"]
        ok = value_equals(actual, expected, headers=is_headers)
        return ok, f"{label} is {_show(actual)}, expected {_show(expected)}", actual
    expected = assertion["contains"]
    ok = value_contains(actual, expected, headers=is_headers)
    return ok, f"{label} is {_show(actual)}, expected to contain {_show(expected)}", actual


class HttpMockAssertionsCheck(Check):
    type = "http_mock_assertions"
    needs_service = True

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        name = get_str(self.config, "service")
        assertions = self.config.get("assertions")
        if not isinstance(assertions, list) or not assertions:
            raise ConfigError("'assertions' must be a non-empty list")
        service = get_service(context, name)
        try:
            requests = list(service.recorded_requests())
        except Exception as exc:  # the mock could not be read: no verdict possible
            raise ConfigError(f"could not read the requests recorded by {name!r}: {exc}") from exc
        results = []
        for assertion in assertions:
            if not isinstance(assertion, dict):
                raise ConfigError("each assertion must be a mapping")
            ok, message, _ = _check_assertion(requests, assertion)
            results.append({"field": assertion.get("field"), "passed": ok, "message": message})
        failed = [r for r in results if not r["passed"]]
        details: dict[str, Any] = {
            "service": name,
            "assertions": results,
            "recorded_requests": len(requests),
        }
        if failed:
            more = f" (+{len(failed) - 1} more failed assertion(s))" if len(failed) > 1 else ""
            return Outcome.fail(
                FailureCode.HTTP_ASSERTION_FAILED,
                f"{name}: {failed[0]['message']}{more}",
                **details,
            )
        return Outcome.ok(f"{name}: all {len(results)} assertion(s) hold", **details)


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (SqlCheck, HttpMockAssertionsCheck)
