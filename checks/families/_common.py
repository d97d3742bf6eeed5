"""Helpers shared by the check families: reading config safely, workspace paths, text tails.

The spec's JSON Schema validates config before a check runs, but a check must still never
crash on a bad value: helpers raise ConfigError, and `guarded` turns it into a CHECK_ERROR.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import stat
import unicodedata
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext, JudgeError, ServiceHandle
from checks.results import FailureCode, Outcome

TAIL_BYTES = 2048  # how much of stdout/stderr a reviewer gets in details
MESSAGE_TAIL = 300  # how much of it goes into the one-line message


class ConfigError(Exception):
    """The check's configuration (or its environment) does not allow a verdict."""


CheckT = TypeVar("CheckT", bound=Check)
Evaluate = Callable[[CheckT, RunArtifact, CheckContext], Outcome]


def guarded(method: Evaluate[CheckT]) -> Evaluate[CheckT]:
    """Decorate `evaluate`: a ConfigError (or a JudgeError) becomes Outcome.error instead of
    an exception."""

    @functools.wraps(method)
    def wrapper(self: CheckT, artifact: RunArtifact, context: CheckContext) -> Outcome:
        try:
            return method(self, artifact, context)
        except ConfigError as exc:
            return Outcome.error(f"{self.type}: {exc}")
        except PatternTimeout as exc:
            return Outcome.error(
                f"{self.type}: {exc}", FailureCode.CHECK_TIMEOUT, pattern=exc.pattern
            )
        except JudgeError as exc:  # the judge's provider failed: its code, not a check error
            return Outcome.error(f"{self.type}: judge error {exc.code}: {exc}", _judge_code(exc))

    return wrapper


def _judge_code(exc: JudgeError) -> FailureCode:
    try:
        return FailureCode(exc.code)
    except ValueError:
        return FailureCode.PROVIDER_ERROR


# --- config readers -------------------------------------------------------------------------


def get_str(config: dict[str, Any], key: str, default: str | None = None) -> str:
    value = config.get(key, default)
    if value is None:
        raise ConfigError(f"'{key}' is required")
    if not isinstance(value, str):
        raise ConfigError(f"'{key}' must be a string, got {type(value).__name__}")
    return value


def get_optional_str(config: dict[str, Any], key: str) -> str | None:
    if config.get(key) is None:
        return None
    return get_str(config, key)


def get_number(config: dict[str, Any], key: str, default: float | None = None) -> float:
    value = config.get(key, default)
    if value is None:
        raise ConfigError(f"'{key}' is required")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"'{key}' must be a number, got {value!r}")
    return float(value)


def get_int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise ConfigError(f"'{key}' is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"'{key}' must be an integer, got {value!r}")
    return value


def get_bool(config: dict[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"'{key}' must be true or false, got {value!r}")
    return value


def get_str_list(config: dict[str, Any], key: str, *, required: bool = False) -> list[str]:
    value = config.get(key)
    if value is None:
        if required:
            raise ConfigError(f"'{key}' is required")
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"'{key}' must be a list of strings")
    if required and not value:
        raise ConfigError(f"'{key}' must not be empty")
    return list(value)


def one_or_many(config: dict[str, Any], single: str, many: str) -> list[str]:
    """`value` / `values` style fields: at least one string in total."""
    items = get_str_list(config, single) + get_str_list(config, many)
    if not items:
        raise ConfigError(f"one of '{single}' or '{many}' is required")
    return items


# A user's pattern may backtrack catastrophically (`(a+)+$` on "aaaa...b"): each search runs
# with a time limit (the `regex` package stops it), so no pattern can freeze a worker.
REGEX_TIMEOUT_SECONDS = 1.0


class PatternTimeout(Exception):
    """A user pattern ran past REGEX_TIMEOUT_SECONDS: a CHECK_TIMEOUT naming the pattern."""

    def __init__(self, pattern: str) -> None:
        super().__init__(
            f"pattern {pattern!r} took longer than {REGEX_TIMEOUT_SECONDS:g}s on this output "
            "(catastrophic backtracking?); simplify it"
        )
        self.pattern = pattern


class UserPattern:
    """A regular expression from a spec, searched with a time limit."""

    def __init__(self, pattern: str, flags: int = 0) -> None:
        # Imported with the first pattern (~35 ms), not by every process that loads the
        # check registry; the flags are the re module's, which regex shares.
        import regex

        self.pattern = pattern
        try:
            self._compiled = regex.compile(pattern, flags)
        except regex.error as exc:
            raise ConfigError(f"invalid regular expression {pattern!r}: {exc}") from exc

    def search(self, text: str) -> Any:
        try:
            return self._compiled.search(text, timeout=REGEX_TIMEOUT_SECONDS)
        except TimeoutError as exc:
            raise PatternTimeout(self.pattern) from exc

    def finditer(self, text: str) -> list[Any]:
        try:
            return list(self._compiled.finditer(text, timeout=REGEX_TIMEOUT_SECONDS))
        except TimeoutError as exc:
            raise PatternTimeout(self.pattern) from exc


def compile_regex(pattern: str, flags: int = 0) -> UserPattern:
    return UserPattern(pattern, flags)


# --- workspace paths ------------------------------------------------------------------------


def workspace_root(artifact: RunArtifact, context: CheckContext) -> Path:
    if context.workspace is not None:
        return Path(context.workspace)
    if artifact.workspace_path:
        return Path(artifact.workspace_path)
    raise ConfigError("no workspace is available for this execution")


def resolve_inside(root: Path, relative: str, what: str = "path") -> Path:
    """`relative` under `root`, refusing anything that resolves outside it (`..`, absolute
    paths elsewhere, symlinks pointing out): checks must not read the server's files."""
    if not relative:
        raise ConfigError(f"{what} is empty")
    base = root.resolve()
    candidate = Path(relative)
    joined = candidate if candidate.is_absolute() else base / candidate
    # The last component stays unresolved so that a symlink is seen as what it is (a dangling
    # link is still "something at path"); where it points must be inside too.
    target = (
        joined.parent.resolve() / joined.name
        if joined.name not in ("", ".", "..")
        else joined.resolve()
    )
    for path in (target, target.resolve()):
        if path != base and base not in path.parents:
            raise ConfigError(f"{what} {relative!r} is outside the workspace")
    return target


def workspace_file(artifact: RunArtifact, context: CheckContext, relative: str) -> Path:
    return resolve_inside(workspace_root(artifact, context), relative)


READ_CAP = 16 * 1024 * 1024  # a check reads at most this much of one file


def read_text(path: Path, cap: int = READ_CAP) -> str:
    """A regular file's text (resolve_inside has checked where it is). Opened without
    blocking and read with a cap: the agent may have left a FIFO or a huge file there."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read {path.name}: {exc.strerror or exc}") from exc
    with os.fdopen(handle, "rb") as file:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise ConfigError(f"cannot read {path.name}: not a regular file")
        data = file.read(cap + 1)
    if len(data) > cap:
        raise ConfigError(f"cannot read {path.name}: larger than {cap} bytes")
    return data.decode("utf-8", errors="replace")


# --- text helpers ---------------------------------------------------------------------------


def tail(text: str | None, limit: int = TAIL_BYTES) -> str:
    """The last `limit` characters: the end of a log is where the error usually is."""
    if not text:
        return ""
    return text if len(text) <= limit else "..." + text[-limit:]


def preview(text: str | None, limit: int = 200) -> str:
    if not text:
        return ""
    return text if len(text) <= limit else text[:limit] + "..."


def quote(text: str, limit: int = 80) -> str:
    """A value as shown in a message: single-quoted and shortened."""
    return "'" + preview(text, limit) + "'"


def snippet(text: str, start: int, end: int, radius: int = 40) -> str:
    """The match with a little context around it, for reviewers."""
    left = max(0, start - radius)
    right = min(len(text), end + radius)
    return ("..." if left else "") + text[left:right] + ("..." if right < len(text) else "")


def plain_text(text: str) -> str:
    """The text as a reader sees it: NFKC (a no-break or narrow space is a space, a full-width
    letter or digit is that letter or digit) without the invisible format characters (zero-
    width spaces and joiners, soft hyphens, byte order marks). Models write them: searched as
    it came, "wire\u00a0transfer" or "pass\u200bword" passed a check that forbids the phrase
    a reader sees."""
    if text.isascii():
        return text
    normal = unicodedata.normalize("NFKC", text)
    return "".join(ch for ch in normal if unicodedata.category(ch) != "Cf")


class ShownText:
    """An output searched as it came or, failing that, as a reader sees it (plain_text,
    made once however many patterns are tried), since a pattern may name the very
    characters plain_text changes."""

    def __init__(self, text: str) -> None:
        self.raw = text

    @functools.cached_property
    def plain(self) -> str:
        return plain_text(self.raw)

    def search(self, regex: UserPattern) -> tuple[Any, str]:
        """(the first match of `regex`, the text searched last); None when neither
        matches."""
        match = regex.search(self.raw)
        if match is None and self.plain != self.raw:
            return regex.search(self.plain), self.plain
        return match, self.raw


def normalise(text: str) -> str:
    """Case-folded with accents removed (NFKD, combining marks dropped): 'Sebastián' ->
    'sebastian', and without the invisible format characters (as plain_text). Used wherever
    the contract asks for forgiving matching."""
    decomposed = unicodedata.normalize("NFKD", plain_text(text).casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def json_equal(actual: Any, expected: Any) -> bool:
    """Deep equality of JSON values where true != 1 (Python's == says otherwise) and 1 == 1.0."""
    if isinstance(actual, bool) or isinstance(expected, bool):
        return isinstance(actual, bool) and isinstance(expected, bool) and actual == expected
    if isinstance(actual, int | float) and isinstance(expected, int | float):
        return float(actual) == float(expected)
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(
            json_equal(actual[k], expected[k]) for k in expected
        )
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            json_equal(a, e) for a, e in zip(actual, expected, strict=True)
        )
    return bool(type(actual) is type(expected) and actual == expected)


def verdict_from(
    result: dict[str, Any], default_fail: FailureCode = FailureCode.PATTERN_FAILED
) -> Outcome:
    """{passed, score?, reason?, details?, failure_code?} -> Outcome (custom scripts and hooks)."""
    passed = bool(result.get("passed"))
    score = result.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float):
        score = 1.0 if passed else 0.0
    score = min(1.0, max(0.0, float(score)))
    reason = str(result.get("reason") or ("passed" if passed else "failed"))
    details = result.get("details")
    extra = (
        dict(details)
        if isinstance(details, dict)
        else ({"details": details} if details is not None else {})
    )
    if passed:
        return Outcome(True, score, None, reason, extra)
    code = default_fail
    own = result.get("failure_code")
    if isinstance(own, str) and own in FailureCode.__members__:
        code = FailureCode(own)
    return Outcome(False, score, code, reason, extra)


def get_service(context: CheckContext, name: str) -> ServiceHandle:
    service = context.services.get(name)
    if service is None:
        known = ", ".join(sorted(context.services)) or "none"
        raise ConfigError(f"service {name!r} is not defined for this execution (services: {known})")
    return service


def json_schema_validator(schema: dict[str, Any] | bool, what: str) -> Any:
    """A validator for a user's JSON Schema that also checks `format` (email, date-time,
    uri, ...; KindLM does), or ConfigError naming `what` when the schema itself is invalid."""
    from checks.json_schema import format_checker, jsonschema

    validator_class = jsonschema.validators.validator_for(schema)
    formats = format_checker(validator_class)
    try:
        # The metaschema's formats too (a `$ref` that is no URI reference), as a plain
        # check_schema checks them.
        validator_class.check_schema(schema, format_checker=formats)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"{what} is invalid: {exc.message}") from exc
    return validator_class(schema, format_checker=formats)


# --- similarity of two texts (similarity, behavior_unchanged, drift) -------------------------
# Lexical similarity (deterministic, in [0, 1], 1.0 for identical texts):
#   1. Normalise: case-fold, strip accents (NFKD, combining marks dropped), keep word tokens.
#   2. Features: word unigrams plus adjacent-word bigrams (bigrams reward the same word order).
#   3. Score = 0.5 x Jaccard(feature sets) + 0.5 x cosine(feature counts).
# Jaccard punishes vocabulary that only one side has; cosine weighs repeated words, so the
# blend is stable for both short answers and long paragraphs. Two texts with no word tokens
# are compared for exact equality. Embedding similarity is in _embeddings.py.


_WORD = re.compile(r"\w+")


def _features(text: str) -> Counter[str]:
    words = _WORD.findall(normalise(text))
    features: Counter[str] = Counter(words)
    features.update(f"{a} {b}" for a, b in zip(words, words[1:], strict=False))
    return features


def lexical_similarity(left: str, right: str) -> float:
    """See above. Symmetric; 1.0 for identical texts, 0.0 for disjoint ones."""
    if left == right:
        return 1.0
    a, b = _features(left), _features(right)
    if not a or not b:
        return 1.0 if not a and not b and left.strip() == right.strip() else 0.0
    shared = a.keys() & b.keys()
    jaccard = len(shared) / len(a.keys() | b.keys())
    dot = sum(a[k] * b[k] for k in shared)
    cosine = dot / (
        math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values()))
    )
    return round(min(1.0, 0.5 * jaccard + 0.5 * cosine), 6)


def cosine(left: list[float], right: list[float]) -> float:
    dot = sum(x * y for x, y in zip(left, right, strict=False))
    norm = math.sqrt(sum(x * x for x in left)) * math.sqrt(sum(y * y for y in right))
    return dot / norm if norm else 0.0


# --- recorded HTTP requests (http_mock_assertions, and judges reading `service.field`) -------


_FIELD = re.compile(
    r"^(?:request_count|last_request|requests\[(\d+)\])(?:\.(body|headers|method|path|query))?$"
)


def request_headers(request: dict[str, Any]) -> dict[str, str]:
    """Header names lower-cased (HTTP header names are case-insensitive)."""
    raw = request.get("headers") or {}
    pairs = raw.items() if isinstance(raw, dict) else raw
    return {str(k).lower(): str(v) for k, v in pairs}


def request_body(request: dict[str, Any]) -> str:
    body = request.get("body")
    if body is None:
        return ""
    if isinstance(body, bytes | bytearray):
        return bytes(body).decode(errors="replace")
    if isinstance(body, str):
        return body
    return json.dumps(body)


class FieldMissing(Exception):
    """The field names a request that does not exist (an assertion failure, not a check error)."""


def resolve_field(requests: list[dict[str, Any]], field: str) -> Any:
    """The value of `field` over already-filtered recorded requests."""
    match = _FIELD.match(field)
    if match is None:
        raise ConfigError(
            f"unknown field {field!r} (request_count, last_request[.body|.headers], requests[N][.body|.headers])"
        )
    index, part = match.groups()
    if field.startswith("request_count"):
        if part:
            raise ConfigError(f"unknown field {field!r}")
        return len(requests)
    if not requests:
        raise FieldMissing("no matching request was recorded")
    if index is not None:
        if int(index) >= len(requests):
            raise FieldMissing(
                f"requests[{index}] does not exist: {len(requests)} matching request(s)"
            )
        request = requests[int(index)]
    else:
        request = requests[-1]
    if part == "body":
        return request_body(request)
    if part == "headers":
        return request_headers(request)
    if part is not None:
        return request.get(part)
    return {**request, "headers": request_headers(request), "body": request_body(request)}
