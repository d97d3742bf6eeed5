"""Spec validation: YAML with positions -> JSON Schema -> semantic rules -> SpecError list."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from checks.spec.contract_layout import unfold_contract
from checks.spec.errors import SpecError, SpecValidationError, format_path
from checks.spec.loader import LoadedYaml, Mark, load_yaml
from checks.spec.model import Spec
from checks.spec.schema import Problem, describe, schema_problems
from checks.spec.semantics import semantic_problems


def validate_spec_text(
    text: str | bytes, *, source: str = "<spec>", spec_dir: Path | None = None
) -> tuple[dict[str, Any] | None, list[SpecError]]:
    """(the loaded data, every error sorted by line). Never raises for any input."""
    try:
        return _validate(text, spec_dir)
    except Exception as exc:  # last line of defence: a validator bug must not crash an upload
        return None, [
            SpecError(
                "", f"internal error while validating {source}: {type(exc).__name__}: {exc}", 1, 1
            )
        ]


def parse_spec(text: str | bytes, *, source: str = "<spec>", spec_dir: Path | None = None) -> Spec:
    """The parsed Spec, or SpecValidationError carrying all errors."""
    data, errors = validate_spec_text(text, source=source, spec_dir=spec_dir)
    if errors or data is None:
        raise SpecValidationError(errors or [SpecError("", "the spec is empty", 1, 1)], source)
    return Spec.from_dict(data)


def load_spec_file(path: str | Path) -> Spec:
    """Read and parse a spec file; relative file references resolve against its directory."""
    file_path = Path(path)
    try:
        content = file_path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SpecValidationError(
            [SpecError("", f"cannot read {file_path}: {reason}", None, None)], str(file_path)
        ) from exc
    return parse_spec(content, source=str(file_path), spec_dir=file_path.resolve().parent)


def _validate(
    text: str | bytes, spec_dir: Path | None
) -> tuple[dict[str, Any] | None, list[SpecError]]:
    decoded = _decode(text)
    if isinstance(decoded, SpecError):
        return None, [decoded]
    loaded = load_yaml(decoded)
    errors = [_positioned(Problem(p.path, p.message), loaded, p.mark) for p in loaded.problems]
    data = loaded.data
    if data is None:
        if not loaded.problems:
            errors.append(SpecError("", "the spec is empty", 1, 1))
        return None, _sorted(errors)
    if not isinstance(data, dict):
        errors.append(
            _positioned(
                Problem((), f"the spec must be a mapping at the top level, got {describe(data)}"),
                loaded,
            )
        )
        return None, _sorted(errors)
    unfolded = unfold_contract(loaded)
    if unfolded:
        return None, _sorted([*errors, *(_positioned(p, loaded) for p in unfolded)])
    problems: list[Problem] = list(schema_problems(data))
    problems.extend(semantic_problems(data, spec_dir))
    # A value the loader already refused (`.nan`) was built as null: one error for it, not
    # a second one about the null.
    refused = {tuple(p.path) for p in loaded.problems}
    errors.extend(
        _positioned(problem, loaded) for problem in problems if tuple(problem.path) not in refused
    )
    return data, _sorted(errors)


def _decode(text: str | bytes) -> str | SpecError:
    if isinstance(text, bytes | bytearray):
        try:
            return bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = text[: exc.start].count(b"\n") + 1
            column = exc.start - (text.rfind(b"\n", 0, exc.start) + 1) + 1
            return SpecError(
                "", f"the spec is not valid UTF-8 (byte 0x{text[exc.start]:02x})", line, column
            )
    if not isinstance(text, str):
        return SpecError("", f"the spec must be text, got {type(text).__name__}", None, None)
    try:
        # Lone surrogates can't reach the YAML parser; report them like bad bytes.
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        column = exc.start - (text.rfind("\n", 0, exc.start) + 1) + 1
        return SpecError(
            "", "the spec contains characters that are not valid Unicode", line, column
        )
    return text


def _positioned(problem: Problem, loaded: LoadedYaml, mark: Mark | None = None) -> SpecError:
    where = mark or loaded.mark_for(problem.path, prefer_key=problem.at_key)
    return SpecError(format_path(problem.path), problem.message, where.line, where.column)


def _sorted(errors: Iterable[SpecError]) -> list[SpecError]:
    unique = dict.fromkeys(errors)  # jsonschema can reach one spot twice through if/then
    return sorted(unique, key=SpecError.sort_key)
