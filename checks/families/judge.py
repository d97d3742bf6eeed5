"""`llm_as_judge` (alias `judge`): a model scores the judged input against criteria.

This module only chooses what is judged (`input_from`) and turns the judge's answer into an
Outcome whose details carry the verdict's metadata under `judge` (docs/checks.md); talking to
the model is the judge client's job (context.judge, checks.judge_client). The engine marks
these results `source="judge"`, so a human review can later override them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from checks import safe_files
from checks.artifact import RunArtifact
from checks.check import Check
from checks.context import CheckContext, JudgeError
from checks.families._common import (
    ConfigError,
    FieldMissing,
    get_number,
    get_service,
    get_str,
    guarded,
    preview,
    read_text,
    resolve_field,
    workspace_file,
    workspace_root,
)
from checks.results import FailureCode, Outcome

_ERROR_CODES = {
    "PROVIDER_TIMEOUT": FailureCode.PROVIDER_TIMEOUT,
    "PROVIDER_AUTH_FAILED": FailureCode.PROVIDER_AUTH_FAILED,
    "PROVIDER_ERROR": FailureCode.PROVIDER_ERROR,
    "JUDGE_PARSE_ERROR": FailureCode.JUDGE_PARSE_ERROR,
}


def judged_input(source: str, artifact: RunArtifact, context: CheckContext) -> str:
    """The text `input_from` names: agent_output, stdout, workspace, workspace:PATH or
    SERVICE.FIELD."""
    if source == "agent_output":
        return artifact.final_output or ""
    if source == "stdout":
        return artifact.stdout or ""
    if source == "workspace":
        return workspace_text(workspace_root(artifact, context))
    if source.startswith("workspace:"):
        relative = source.removeprefix("workspace:").strip()
        path = workspace_file(artifact, context, relative)
        if not path.is_file():
            raise ConfigError(f"input_from file {relative!r} does not exist in the workspace")
        return read_text(path)
    service_name, dot, field = source.partition(".")
    if not dot or not field:
        raise ConfigError(
            f"input_from {source!r} is not agent_output, stdout, workspace, workspace:PATH"
            " or SERVICE.FIELD"
        )
    service = get_service(context, service_name)
    try:
        value = resolve_field(list(service.recorded_requests()), field)
    except FieldMissing as exc:
        raise ConfigError(f"input_from {source!r}: {exc}") from exc
    return value if isinstance(value, str) else str(value)


# What a judge reads of a whole workspace: enough for a small project, bounded for a big one.
WORKSPACE_TEXT_CAP = 64 * 1024


def workspace_text(root: Path, cap: int = WORKSPACE_TEXT_CAP) -> str:
    """Every text file of the workspace (reference 000's `input_from: workspace`), each under
    a `=== path ===` header, in path order, cut at `cap` characters with a note saying so.
    Keystone's own .keystone directory is left out, links are not followed and binary files
    (a NUL byte) are skipped."""
    parts: list[str] = []
    total = 0
    for relative in _workspace_files(root):
        text = safe_files.read_text(root, relative, cap=cap + 1)
        if text is None or "\0" in text:
            continue
        part = f"=== {relative} ===\n{text}\n"
        if total + len(part) > cap:
            parts.append(part[: max(0, cap - total)])
            parts.append(f"\n[workspace text cut at {cap} characters]")
            break
        parts.append(part)
        total += len(part)
    return "".join(parts)


def _workspace_files(root: Path) -> list[str]:
    found: list[str] = []
    for directory, dirs, files in os.walk(root):  # os.walk does not follow links
        dirs[:] = sorted(d for d in dirs if not (directory == str(root) and d == ".keystone"))
        for name in files:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(os.path.relpath(path, root).replace(os.sep, "/"))
    return sorted(found)


class JudgeCheck(Check):
    type = "llm_as_judge"
    aliases = ("judge",)

    @guarded
    def evaluate(self, artifact: RunArtifact, context: CheckContext) -> Outcome:
        get_str(self.config, "criteria")
        threshold = get_number(self.config, "pass_threshold", 0.5)
        source = get_str(self.config, "input_from", "agent_output")
        if context.judge is None:
            return Outcome.error("no judge configured")
        text = judged_input(source, artifact, context)
        try:
            answer = context.judge.evaluate(
                config=self.config, judged_input=text, evidence=context.evidence
            )
        except JudgeError as exc:
            code = _ERROR_CODES.get(exc.code, FailureCode.PROVIDER_ERROR)
            return Outcome.error(f"judge error {exc.code}: {exc}", code)
        except TimeoutError as exc:
            return Outcome.error(f"judge timed out: {exc}", FailureCode.PROVIDER_TIMEOUT)
        except (
            Exception
        ) as exc:  # the client should map its errors; anything left is the provider's
            return Outcome.error(
                f"judge failed: {type(exc).__name__}: {exc}", FailureCode.PROVIDER_ERROR
            )
        return self._outcome(answer, threshold, source, text)

    def _outcome(self, answer: Any, threshold: float, source: str, text: str) -> Outcome:
        if not isinstance(answer, dict):
            return Outcome.error(
                "the judge returned no answer object", FailureCode.JUDGE_PARSE_ERROR
            )
        reasoning = str(answer.get("reasoning", ""))
        details: dict[str, Any] = {
            "input_from": source,
            "judged_input_preview": preview(text, 300),
            "criteria": str(self.config.get("criteria", "")),
            "reasoning": reasoning,
            "pass_threshold": threshold,
        }
        if isinstance(self.config.get("rubric"), dict):
            details["rubric"] = dict(self.config["rubric"])
        if answer.get("dimensions"):
            details["dimensions"] = answer["dimensions"]
        model = answer.get("model") or self.config.get("model")
        if model:
            details["model"] = str(model)
        error_code = answer.get("error_code")
        if error_code:
            code = _ERROR_CODES.get(str(error_code), FailureCode.PROVIDER_ERROR)
            details["judge"] = _judge_details(answer, None, reasoning, model)
            details["judge"]["error_code"] = code.value
            reason = answer.get("reasoning") or answer.get("error") or error_code
            return Outcome.error(f"judge error {error_code}: {reason}", code, **details)
        score = answer.get("score")
        if isinstance(score, bool) or not isinstance(score, int | float):
            details["judge"] = _judge_details(answer, None, reasoning, model)
            return Outcome.error(
                "the judge's answer has no numeric score", FailureCode.JUDGE_PARSE_ERROR, **details
            )
        score = min(1.0, max(0.0, float(score)))
        details["score"] = score
        details["judge"] = _judge_details(answer, score, reasoning, model)
        if "passed" in answer:
            details["judge_passed"] = answer["passed"]
        if score < threshold:
            message = (
                f"judge score {score:.2f} below threshold {threshold:g}: {preview(reasoning, 200)}"
            )
            return Outcome(False, score, FailureCode.JUDGE_BELOW_THRESHOLD, message, details)
        return Outcome(True, score, None, f"judge score {score:.2f} >= {threshold:g}", details)


def _judge_details(
    answer: dict[str, Any], score: float | None, reasoning: str, model: Any
) -> dict[str, Any]:
    """details["judge"]: the verdict and everything needed to audit or re-check it later
    (docs/checks.md, "The judge"). Fields a judge did not report get neutral values."""
    spread = answer.get("spread")
    if not isinstance(spread, int | float) or isinstance(spread, bool):
        spread = 0.0 if score is not None else None  # one verdict: no spread to speak of
    passed = answer.get("passed")
    return {
        "model": str(model or ""),
        "prompt_version": str(answer.get("prompt_version") or ""),
        "raw_reply": str(answer.get("raw_reply") or ""),
        "reasoning": reasoning,
        "score": score,
        "passed": passed if isinstance(passed, bool) else None,
        "samples": list(answer.get("samples") or []),
        "spread": spread,
        "dimensions": dict(answer.get("dimensions") or {}),
        "input_tokens": _int(answer.get("input_tokens")),
        "output_tokens": _int(answer.get("output_tokens")),
        "cost_usd": float(answer.get("cost_usd") or 0.0),
        "cached": bool(answer.get("cached", False)),
        "latency_ms": float(answer.get("latency_ms") or 0.0),
    }


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


# The check types this family contributes (checks.registry lists the families).
CHECKS: tuple[type[Check], ...] = (JudgeCheck,)
