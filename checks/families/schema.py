"""`schema`: the final output must be JSON valid against a JSON Schema (KindLM's schema assertion)."""

from __future__ import annotations

import json
from typing import Any

from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext
from checks.families._common import (
    ConfigError,
    guarded,
    json_schema_validator,
    preview,
    read_text,
    resolve_inside,
)
from checks.json_text import loads_strict
from checks.results import FailureCode, Outcome

MAX_ERRORS = 20


def load_schema(config: dict[str, Any], context: CheckContext) -> dict[str, Any] | bool:
    """The inline `schema` or the JSON file `schema_file` (relative to the spec's directory)."""
    inline = config.get("schema")
    schema_file = config.get("schema_file")
    if (inline is None) == (schema_file is None):
        raise ConfigError("exactly one of 'schema' or 'schema_file' is required")
    if inline is not None:
        if not isinstance(inline, dict | bool):
            raise ConfigError("'schema' must be a JSON Schema object")
        return inline
    if not isinstance(schema_file, str):
        raise ConfigError("'schema_file' must be a path")
    path = resolve_inside(context.spec_dir, schema_file, "schema_file")
    if not path.is_file():
        raise ConfigError(f"schema_file {schema_file!r} not found")
    try:
        loaded = json.loads(read_text(path))
    except ValueError as exc:
        raise ConfigError(f"schema_file {schema_file!r} is not valid JSON: {exc}") from exc
    if not isinstance(loaded, dict | bool):
        raise ConfigError(f"schema_file {schema_file!r} is not a JSON Schema object")
    return loaded


def schema_errors(schema: dict[str, Any] | bool, instance: Any) -> list[dict[str, str]]:
    """Every validation error as {path, message}, most specific first; [] when valid."""
    validator = json_schema_validator(schema, "the JSON Schema itself")
    errors = sorted(
        validator.iter_errors(instance), key=lambda e: (list(e.absolute_path), e.message)
    )
    return [
        {"path": "/" + "/".join(str(p) for p in error.absolute_path), "message": error.message}
        for error in errors[:MAX_ERRORS]
    ]


class SchemaCheck(Check):
    type = "schema"

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        schema = load_schema(self.config, context)
        output = artifact.final_output or ""
        try:
            instance = loads_strict(output)
        except ValueError as exc:
            return Outcome.fail(
                FailureCode.SCHEMA_PARSE_ERROR,
                f"output is not valid JSON: {exc}",
                output_preview=preview(output),
            )
        errors = schema_errors(schema, instance)
        if errors:
            shown = "; ".join(f"{e['path']}: {e['message']}" for e in errors[:3])
            more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
            return Outcome.fail(
                FailureCode.SCHEMA_INVALID,
                f"output does not match the schema: {shown}{more}",
                errors=errors,
            )
        return Outcome.ok("output is valid against the schema")


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (SchemaCheck,)
