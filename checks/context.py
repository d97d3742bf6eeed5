"""What a check may use besides the artifact: the workspace, services, policy, judge, baseline.

The runner (evaluations/runner) fills this in; tests build it by hand. Nothing here imports Django.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class SecurityPolicy:
    """Operator switches. Both are off by default: they run arbitrary code on the server."""

    allow_python_hooks: bool = False
    allow_host_scripts: bool = False


@dataclass(slots=True)
class CommandResult:
    """How a command run for a check ended: exit code, output, and whether it timed out."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    # Set when the sandbox could not start the command at all (its engine failed): then
    # exit_code is no answer of the command's, and a check must not read it as one.
    error: str | None = None


class CommandRunner(Protocol):
    """Runs a shell command where the agent ran (its sandbox, in its workspace)."""

    def __call__(
        self, command: str, *, stdin: str | None = None, timeout: float = 60.0
    ) -> CommandResult: ...


class ServiceHandle(Protocol):
    """A service of one execution as the checks see it (sql and http_mock_assertions)."""

    name: str
    type: str

    def query(self, sql: str) -> list[tuple[Any, ...]]: ...

    def recorded_requests(self) -> list[dict[str, Any]]: ...

    def describe(self) -> dict[str, Any]: ...


class Judge(Protocol):
    """An LLM judge (checks.judge_client.JudgeClient). `evaluate` answers a dict with score,
    passed, reasoning, dimensions and the verdict's metadata, or with `error_code` (a
    PROVIDER_* code or JUDGE_PARSE_ERROR) when it could not give a verdict. A client may also
    offer `drift(baseline=, current=, config=)` and `embed(texts)` (the drift and similarity
    families look for them); those raise JudgeError when the provider fails."""

    def evaluate(
        self, *, config: dict[str, Any], judged_input: str, evidence: list[dict[str, Any]]
    ) -> dict[str, Any]: ...


class JudgeError(Exception):
    """The judge's provider failed for good (after its retries). `code` is a failure code
    value (PROVIDER_TIMEOUT, PROVIDER_AUTH_FAILED, PROVIDER_ERROR, JUDGE_PARSE_ERROR), so the
    check ends with that code and the run's exit code says "provider error"."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def local_command_runner(workspace: Path, env: dict[str, str] | None = None) -> CommandRunner:
    """A runner for a plain workspace on this machine (CLI without sandbox, and tests)."""

    def run(command: str, *, stdin: str | None = None, timeout: float = 60.0) -> CommandResult:
        try:
            done = subprocess.run(
                ["sh", "-c", command],
                cwd=workspace,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
            )
        except subprocess.TimeoutExpired as exc:
            return CommandResult(-1, _text(exc.stdout), _text(exc.stderr), timed_out=True)
        return CommandResult(done.returncode, done.stdout, done.stderr)

    return run


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


@dataclass(slots=True)
class CheckContext:
    """What a check may use besides the artifact: the workspace, services, policy, judge, the
    baseline to compare with, and the earlier results of the same execution."""

    workspace: Path | None = None
    spec_dir: Path = field(default_factory=Path.cwd)
    prompt: str = ""
    scenario: str = "no-chaos"
    scenario_params: dict[str, Any] = field(default_factory=dict)
    services: dict[str, ServiceHandle] = field(default_factory=dict)
    policy: SecurityPolicy = field(default_factory=SecurityPolicy)
    run_command: CommandRunner | None = None
    judge: Judge | None = None
    baseline_output: str | None = None  # drift / behavior_unchanged: the reference output
    # The reference's tool calls in order ({name, arguments}), for drift by tool-sequence.
    baseline_tool_calls: list[dict[str, Any]] | None = None
    # Set when the reference is a promoted baseline's cell (`baseline: active` or a name),
    # not the no-chaos output of the same run.
    baseline_name: str | None = None
    audit_log_path: str | None = None
    trace_path: str | None = None
    sandbox_id: str = ""
    # Earlier results of the same execution, for judges that take deterministic evidence.
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def command_runner(self) -> CommandRunner:
        if self.run_command is not None:
            return self.run_command
        if self.workspace is None:
            raise RuntimeError("no workspace to run the command in")
        return local_command_runner(self.workspace)
