"""RunArtifact: everything one agent invocation left behind, the only input of the checks."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Terminal statuses of an execution (reference 003's RunStatus plus Keystone's `error`).
EXECUTION_STATUSES = ("success", "failed", "timed_out", "invalid", "provider_error", "error")
# Of those, the ones where the agent did not do its task as asked (Keystone or its sandbox
# failed it, or its model did): whatever its checks read, the execution gives no verdict.
NO_VERDICT_STATUSES = ("error", "provider_error")


@dataclass(slots=True)
class ToolCall:
    """One tool call: made by the agent (through the tool proxy, or recorded by a python
    agent's host) or asked for by the model in one of its replies (`source`)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    response: str | None = None
    status: int | None = None  # HTTP status of the tool's answer, when it went through the proxy
    error: str | None = None
    fault: str | None = None  # the fault mode applied, if any
    latency_ms: float = 0.0
    source: str = "agent"  # agent (through the tool proxy) | model (asked for by the LLM)
    # The HTTP request as the tool proxy forwarded it (method, path, query, and the arguments
    # read from its body or query); `arguments` are then the model's when it asked for the call.
    request: dict[str, Any] | None = None
    started_at: float = 0.0  # seconds since the epoch when the call began; 0 when unknown


@dataclass(slots=True)
class LLMCall:
    """One request the agent sent to its model through the LLM gateway: the bodies, tokens,
    cost and latency, the fault injected if any, and the tool calls the model asked for."""

    model: str
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)
    status: int = 200
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0
    cost_usd: float = 0.0
    fault: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    started_at: float = 0.0  # seconds since the epoch when the call began (the timeline)
    # False: the gateway had no price for `model` (neither its table nor the spec's
    # `llm.prices`), so `cost_usd` is 0 without the call having been free.
    priced: bool = True


@dataclass(slots=True)
class HttpCall:
    """One request an `http_mock` service received, and the answer it gave."""

    service: str
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    status: int = 0
    response_body: str = ""
    time: float = 0.0  # seconds since the epoch
    query: str = ""


@dataclass(slots=True)
class FileChange:
    """A file the agent added, removed or modified in its workspace."""

    path: str  # workspace-relative, forward slashes
    change: str  # added | removed | modified
    content: str | None = None  # text content for small text files
    size: int = 0


@dataclass(slots=True)
class OutputArtifact:
    """An output the agent produced, a workspace file (`path`) or a `uri`, with its type: from
    the spec's `output_artifacts` or the agent's own `.keystone/artifacts.json`."""

    artifact_type: str
    path: str = ""
    uri: str = ""


@dataclass(slots=True)
class RunArtifact:
    """Everything one agent invocation left behind: its output and status, its calls to tools,
    model and mocks, its workspace changes and database writes. The only input of the checks."""

    final_output: str = ""
    status: str = "success"
    exit_code: int | None = 0
    stdout: str = ""
    stderr: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    duration_ms: float = 0.0
    tool_calls: list[ToolCall] = field(default_factory=list)
    llm_calls: list[LLMCall] = field(default_factory=list)
    http_calls: list[HttpCall] = field(default_factory=list)
    workspace_path: str | None = None
    workspace_diff: list[FileChange] = field(default_factory=list)
    output_artifacts: list[OutputArtifact] = field(default_factory=list)
    db_writes: list[dict[str, Any]] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    error: str | None = None
    # Connections the agent tried to addresses its execution did not declare, where the
    # sandbox could see them: {"host", "port", "time"} (docs/security.md says which).
    refused_connections: list[dict[str, Any]] = field(default_factory=list)

    @property
    def output_json(self) -> Any:
        """The final output parsed as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.final_output)
        except (ValueError, TypeError):
            return None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def all_tool_calls(self) -> list[ToolCall]:
        """Tool calls the agent made, or else those the model asked for, in order."""
        if self.tool_calls:
            return list(self.tool_calls)
        return [call for llm in self.llm_calls for call in llm.tool_calls]

    def unpriced_models(self) -> list[str]:
        """The models of the LLM calls the gateway could not price: what `cost_usd` leaves
        out."""
        return sorted({call.model for call in self.llm_calls if not call.priced})

    def failed_tool_calls(self) -> list[ToolCall]:
        """Tool calls that raised or answered with an HTTP error status."""
        return [
            call
            for call in self.all_tool_calls()
            if call.error or (call.status is not None and call.status >= 400)
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunArtifact:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["tool_calls"] = [ToolCall(**c) for c in values.get("tool_calls", [])]
        values["llm_calls"] = [
            LLMCall(**{**c, "tool_calls": [ToolCall(**t) for t in c.get("tool_calls", [])]})
            for c in values.get("llm_calls", [])
        ]
        values["http_calls"] = [HttpCall(**c) for c in values.get("http_calls", [])]
        values["workspace_diff"] = [FileChange(**c) for c in values.get("workspace_diff", [])]
        values["output_artifacts"] = [
            OutputArtifact(**c) for c in values.get("output_artifacts", [])
        ]
        return cls(**values)
