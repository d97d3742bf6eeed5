"""The execution's audit and trace, written into its workspace for custom checks.

Reference 000 hands a custom script `audit_log_path` and `trace_path`:
`.keystone/audit.jsonl` holds what the agent did to the world (the command it ran, files it
wrote, database tables it changed, HTTP calls the mocks answered, connections the sandbox
refused), `.keystone/trace.jsonl`
its conversation (LLM calls and tool calls), one JSON event per line in time order:

    {"type": "http_call", "time": 1732450000.1, "details": {"response_body": "...", ...}}

The event types and their `details` are listed in docs/checks.md. The files are written
after the agent finished and before the checks run, through checks.safe_files: the agent
could have planted a link where a file goes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from checks import safe_files
from checks.artifact import RunArtifact
from evaluations.runner.workspace import KEYSTONE_DIR

AUDIT_FILE = "audit.jsonl"
TRACE_FILE = "trace.jsonl"


def audit_events(artifact: RunArtifact, command: str) -> list[dict[str, Any]]:
    """What the agent did to the world: its command, file writes, database writes, HTTP calls."""
    events: list[dict[str, Any]] = [
        {
            "type": "command",
            "time": artifact.started_at,
            "details": {
                "command": command,
                "exit_code": artifact.exit_code,
                "status": artifact.status,
                "duration_ms": round(artifact.duration_ms, 3),
            },
        }
    ]
    for change in artifact.workspace_diff:
        events.append(
            {
                "type": "file_write",
                "time": artifact.finished_at,
                "details": {"path": change.path, "change": change.change, "size": change.size},
            }
        )
    for write in artifact.db_writes:
        events.append({"type": "db_write", "time": artifact.finished_at, "details": dict(write)})
    for attempt in artifact.refused_connections:
        events.append(
            {
                "type": "connection_refused",
                "time": attempt.get("time"),
                "details": {"host": attempt.get("host"), "port": attempt.get("port")},
            }
        )
    for call in artifact.http_calls:
        events.append(
            {
                "type": "http_call",
                "time": call.time,
                "details": {
                    "service": call.service,
                    "method": call.method,
                    "path": call.path,
                    "query": call.query,
                    "request_headers": call.headers,
                    "request_body": call.body,
                    "status": call.status,
                    "response_body": call.response_body,
                },
            }
        )
    return sorted(events, key=lambda event: event["time"] or 0.0)


def trace_events(artifact: RunArtifact) -> list[dict[str, Any]]:
    """The agent's conversation: every LLM call (with the tools the model asked for), then
    every tool call the agent made (through the tool proxy or a python tool wrapper)."""
    events: list[dict[str, Any]] = []
    for index, llm in enumerate(artifact.llm_calls):
        events.append(
            {
                "type": "llm_call",
                "index": index,
                "details": {
                    "model": llm.model,
                    "status": llm.status,
                    "fault": llm.fault,
                    "input_tokens": llm.input_tokens,
                    "output_tokens": llm.output_tokens,
                    "latency_ms": llm.latency_ms,
                    "cost_usd": llm.cost_usd,
                    "priced": llm.priced,
                    "request": llm.request,
                    "response": llm.response,
                    "tool_calls": [
                        {"name": call.name, "arguments": call.arguments} for call in llm.tool_calls
                    ],
                },
            }
        )
    for index, call in enumerate(artifact.tool_calls):
        events.append(
            {
                "type": "tool_call",
                "index": index,
                "details": {
                    "name": call.name,
                    "arguments": call.arguments,
                    "request": call.request,
                    "status": call.status,
                    "error": call.error,
                    "fault": call.fault,
                    "latency_ms": call.latency_ms,
                    "response": call.response,
                },
            }
        )
    return events


def write_audit(workspace: Path, artifact: RunArtifact, command: str) -> tuple[str, str]:
    """Write both files into `<workspace>/.keystone/`; their paths, for the check context."""
    paths = []
    for name, events in (
        (AUDIT_FILE, audit_events(artifact, command)),
        (TRACE_FILE, trace_events(artifact)),
    ):
        lines = "".join(json.dumps(e, ensure_ascii=False, default=str) + "\n" for e in events)
        paths.append(str(safe_files.write_text(workspace, f"{KEYSTONE_DIR}/{name}", lines)))
    return paths[0], paths[1]
