"""Replay sessions (regression pillar): load, build from an execution, export.

A session is the input the agent got, its context, and the tool answers it saw, in order per
tool; replaying serves those answers from the tool proxy (`ToolProxy(replay_responses=...)`)
instead of calling the tools. The JSON format is documented in docs/replay.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from checks.artifact import RunArtifact
from checks.output_files import write_whole

REPLAY_FORMAT_VERSION = 1


class ReplayFormatError(ValueError):
    """A replay session that does not follow the format; the message names the field."""


@dataclass(slots=True)
class ReplaySession:
    """A replay session (docs/replay.md): the input the agent got, its context, and the answers
    each tool gave, to serve again; `expected` is what the recorded execution ended with."""

    id: str
    input: str
    context: Any = None
    # tool name -> the answers it gave, in call order: {"status": int, "body": str | JSON}
    tool_responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    expected: dict[str, Any] | None = None
    source: str = "manual"


def load_session(
    source: str | Path | dict[str, Any], *, base_dir: str | Path | None = None
) -> ReplaySession:
    """A session from a JSON (or YAML) file path, or from a dict (inline or `{file: ...}`)."""
    if isinstance(source, dict) and "file" in source:
        source = _resolve(source["file"], base_dir)
    elif isinstance(source, str | Path):
        source = _resolve(source, base_dir)
    if isinstance(source, Path):
        return _session_from_dict(_read_file(source), where=f"{source}: ")
    if not isinstance(source, dict):
        raise ReplayFormatError(f"a replay session must be an object, got {type(source).__name__}")
    return _session_from_dict(source, where="")


def _resolve(path: Any, base_dir: str | Path | None) -> Path:
    candidate = Path(str(path))
    if not candidate.is_absolute() and base_dir is not None:
        candidate = Path(base_dir) / candidate
    return candidate


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplayFormatError(f"file: cannot read replay file {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ReplayFormatError(f"{path}: not valid JSON/YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ReplayFormatError(f"{path}: a replay file must hold one JSON object")
    return data


def _session_from_dict(data: dict[str, Any], *, where: str) -> ReplaySession:
    version = data.get("version", REPLAY_FORMAT_VERSION)
    if version != REPLAY_FORMAT_VERSION:
        raise ReplayFormatError(f"{where}version: must be {REPLAY_FORMAT_VERSION}, got {version!r}")
    session_id = data.get("id")
    if not isinstance(session_id, str) or not session_id.strip():
        raise ReplayFormatError(f"{where}id: required, a non-empty string")
    prompt = data.get("input")
    if not isinstance(prompt, str):
        raise ReplayFormatError(f"{where}input: required, a string (the prompt the agent got)")
    expected = data.get("expected")
    if expected is not None and not isinstance(expected, dict):
        raise ReplayFormatError(f"{where}expected: must be an object")
    return ReplaySession(
        id=session_id,
        input=prompt,
        context=data.get("context"),
        tool_responses=_tool_responses(data.get("tool_responses"), where),
        expected=expected,
        source=str(data.get("source") or "manual"),
    )


def _tool_responses(value: Any, where: str) -> dict[str, list[dict[str, Any]]]:
    """Accept `{tool: [answers]}` or Flakestorm's flat `[{tool, status, response}]` list."""
    if value is None:
        return {}
    grouped: dict[str, list[dict[str, Any]]] = {}
    if isinstance(value, dict):
        for tool, answers in value.items():
            if not isinstance(answers, list):
                raise ReplayFormatError(f"{where}tool_responses.{tool}: must be a list of answers")
            grouped[str(tool)] = [
                _answer(item, f"{where}tool_responses.{tool}[{i}]")
                for i, item in enumerate(answers)
            ]
        return grouped
    if isinstance(value, list):
        for index, item in enumerate(value):
            field_path = f"{where}tool_responses[{index}]"
            if not isinstance(item, dict) or not isinstance(item.get("tool"), str):
                raise ReplayFormatError(f"{field_path}.tool: required, the tool's name")
            position = len(grouped.get(item["tool"], []))
            grouped.setdefault(item["tool"], []).append(
                _answer(item, f"{where}tool_responses.{item['tool']}[{position}]")
            )
        return grouped
    raise ReplayFormatError(f"{where}tool_responses: must be an object or a list")


def _answer(item: Any, field_path: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ReplayFormatError(f"{field_path}: must be an object with status and body")
    status = item.get("status", 200)
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ReplayFormatError(
            f"{field_path}.status: must be an HTTP status (100-599), got {status!r}"
        )
    body = item["body"] if "body" in item else item.get("response")
    if body is not None and not isinstance(body, str | dict | list | int | float | bool):
        raise ReplayFormatError(f"{field_path}.body: must be text or JSON")
    answer: dict[str, Any] = {"status": status, "body": body}
    headers = item.get("headers")
    if headers is not None:
        if not isinstance(headers, dict):
            raise ReplayFormatError(f"{field_path}.headers: must be an object")
        answer["headers"] = {str(k): str(v) for k, v in headers.items()}
    return answer


def session_from_artifact(
    prompt: str, artifact: RunArtifact, id: str, *, context: Any = None
) -> ReplaySession:
    """A session from an earlier execution: the tool answers its agent saw through the proxy."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for call in artifact.tool_calls:
        if call.source != "agent":
            continue  # calls the model only asked for have no answer to serve
        status = call.status if call.status is not None else (502 if call.error else 200)
        grouped.setdefault(call.name, []).append({"status": status, "body": call.response or ""})
    return ReplaySession(
        id=id,
        input=prompt,
        context=context,
        tool_responses=grouped,
        expected={"final_output": artifact.final_output, "status": artifact.status},
        source="execution",
    )


def export_session(session: ReplaySession) -> dict[str, Any]:
    """The session as a JSON-serialisable dict that `load_session` reads back unchanged."""
    document: dict[str, Any] = {
        "version": REPLAY_FORMAT_VERSION,
        "id": session.id,
        "input": session.input,
        "context": session.context,
        "tool_responses": {
            tool: [dict(answer) for answer in answers]
            for tool, answers in session.tool_responses.items()
        },
        "source": session.source,
    }
    if session.expected is not None:
        document["expected"] = dict(session.expected)
    return document


def save_session(session: ReplaySession, path: str | Path) -> Path:
    """Write the session as a replay file (pretty JSON)."""
    return write_whole(
        path, [json.dumps(export_session(session), indent=2, ensure_ascii=False), "\n"]
    )


def plan_sessions(
    config: dict[str, Any] | None,
    *,
    base_dir: str | Path | None,
    from_execution: Callable[[int], ReplaySession | None],
) -> tuple[list[dict[str, Any]], list[str]]:
    """The spec's `replay.sessions` as plan_run takes them (exported dicts), and warnings.

    `{execution: N}` is looked up with `from_execution` (the caller knows the database); with
    no `base_dir` (a spec written in the browser) file sessions are refused. A
    session that cannot be loaded is left out with a warning naming it, so the run still
    says what was not replayed instead of failing whole.
    """
    sessions: list[dict[str, Any]] = []
    warnings: list[str] = []
    for index, entry in enumerate((config or {}).get("sessions") or []):
        where = f"replay.sessions[{index}]"
        try:
            if isinstance(entry, dict) and "execution" in entry:
                session = from_execution(int(entry["execution"]))
                if session is None:
                    warnings.append(
                        f"{where}: execution {entry['execution']} not found in this project "
                        "(or it kept no artifact); session not replayed"
                    )
                    continue
            elif base_dir is None and (
                isinstance(entry, str) or (isinstance(entry, dict) and "file" in entry)
            ):
                # A spec typed in the browser has no directory: a path would be read from
                # wherever the server runs, so files are refused rather than guessed.
                warnings.append(
                    f"{where}: a replay file needs a spec read from a directory on the server "
                    "(use an inline session or {execution: N}); session not replayed"
                )
                continue
            else:
                session = load_session(entry, base_dir=base_dir)
        except (ReplayFormatError, ValueError, TypeError) as exc:
            warnings.append(f"{where}: {exc}; session not replayed")
            continue
        sessions.append(export_session(session))
    return sessions, warnings
