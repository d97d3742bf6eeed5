"""Agent adapters: invoke the agent under test once (`command`, `http`, `python`) and reset it.

The contract is SPEC_FORMAT.md's `agent` section. Adapters take explicit arguments and never
touch Django; the harness turns an `AgentResult` into the execution's RunArtifact.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import re
import shlex
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks import safe_files
from evaluations.runner.egress import Endpoint
from evaluations.runner.sandbox import (
    DEFAULT_DISK_MB,
    DEFAULT_MAX_PROCESSES,
    ProcessResult,
    Sandbox,
)
from evaluations.runner.workspace import KEYSTONE_DIR, PROMPT_FILE

AGENT_TYPES = ("command", "http", "python")
DEFAULT_AGENT_TIMEOUT = 600.0
HOST_SCRIPT = Path(__file__).with_name("python_agent_host.py")
# Linux refuses a single environment string over 128 KiB; longer prompts go by file only.
_MAX_PROMPT_IN_ENV = 100_000
# The python agent host's result: the output, tool calls and a traceback, never megabytes.
_MAX_AGENT_RESULT_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class AgentResult:
    """What one invocation of the agent gave back, before the harness makes it the
    execution's RunArtifact."""

    final_output: str
    status: str  # success | failed | timed_out | error
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_ms: float = 0.0
    agent_cpu_ms: float | None = None
    error: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    refused_connections: list[dict[str, Any]] = field(default_factory=list)


class AgentConfigError(ValueError):
    """The agent block cannot be invoked as written (the spec validator should catch it first)."""


def invoke_agent(
    agent_config: dict[str, Any],
    *,
    prompt: str,
    sandbox: Sandbox,
    workspace: Path,
    env: dict[str, str],
    timeout: float,
    max_output_bytes: int,
    network: str,
    spec_dir: Path,
    context: dict[str, Any],
    cpus: float | None = None,
    memory_mb: int | None = None,
    egress: Sequence[Endpoint] = (),
    max_processes: int | None = DEFAULT_MAX_PROCESSES,
    disk_mb: int | None = DEFAULT_DISK_MB,
) -> AgentResult:
    """Run the agent once on `prompt`. `env` holds Keystone's variables for this execution
    (gateway, services, tools); the agent's own `env` is merged over it. The stricter of the
    sandbox timeout and the agent's `timeout` applies."""
    kind = agent_config.get("type")
    limit = min(timeout, float(agent_config.get("timeout") or DEFAULT_AGENT_TIMEOUT))
    if kind == "http":
        return _invoke_http(
            agent_config,
            prompt=prompt,
            sandbox=sandbox,
            timeout=limit,
            max_output_bytes=max_output_bytes,
            keystone_env=endpoint_env(env),
        )
    if kind not in ("command", "python"):
        raise AgentConfigError(
            f"unknown agent type {kind!r} (expected one of {', '.join(AGENT_TYPES)})"
        )
    invocation = _SandboxInvocation(
        sandbox=sandbox,
        workspace=workspace,
        spec_dir=spec_dir,
        env={**env, **_agent_env(agent_config)},
        timeout=limit,
        max_output_bytes=max_output_bytes,
        network=network,
        cpus=cpus,
        memory_mb=memory_mb,
        egress=egress,
        max_processes=max_processes,
        disk_mb=disk_mb,
    )
    try:
        if kind == "command":
            return _invoke_command(agent_config, prompt, invocation)
        return _invoke_python(agent_config, prompt, context, invocation)
    except safe_files.UnsafePath as exc:
        # Something in the workspace put a link where Keystone's own files go: refused.
        return AgentResult(
            final_output="",
            status="error",
            error=f"refused to use the workspace's {KEYSTONE_DIR}/: {exc}",
        )


def reset_agent(
    agent_config: dict[str, Any],
    *,
    sandbox: Sandbox,
    workspace: Path,
    env: dict[str, str],
    spec_dir: Path,
    timeout: float = 60.0,
    network: str = "services",
    egress: Sequence[Endpoint] = (),
) -> str | None:
    """Call the agent's reset hook before an execution. Returns an error message, or None
    when the reset worked or there is nothing to reset (command agents start fresh anyway)."""
    kind = agent_config.get("type")
    if kind == "http" and agent_config.get("reset_endpoint"):
        return _reset_http(agent_config, sandbox=sandbox, timeout=timeout)
    if kind == "python" and agent_config.get("reset_function"):
        invocation = _SandboxInvocation(
            sandbox=sandbox,
            workspace=workspace,
            spec_dir=spec_dir,
            env={**env, **_agent_env(agent_config)},
            timeout=timeout,
            max_output_bytes=1024 * 1024,
            network=network,
            egress=egress,
        )
        request = {"mode": "reset", "reset_function": agent_config["reset_function"]}
        process, record = _run_host(agent_config, request, "", invocation)
        if record and record.get("ok"):
            return None
        return _host_failure(process, record, what="reset_function")
    return None


def has_reset(agent_config: dict[str, Any]) -> bool:
    """Whether the stateful-agent warning applies (http/python agents without a reset hook)."""
    kind = agent_config.get("type")
    if kind == "http":
        return bool(agent_config.get("reset_endpoint"))
    if kind == "python":
        return bool(agent_config.get("reset_function"))
    return True


def _agent_env(agent_config: dict[str, Any]) -> dict[str, str]:
    return {
        str(key): "" if value is None else str(value)
        for key, value in (agent_config.get("env") or {}).items()
    }


# --------------------------------------------------------------------------- sandboxed agents


@dataclass(slots=True)
class _SandboxInvocation:
    """One invocation of a command or python agent: its sandbox, workspace and limits, and
    Keystone's files in its `.keystone/`."""

    sandbox: Sandbox
    workspace: Path
    spec_dir: Path
    env: dict[str, str]
    timeout: float
    max_output_bytes: int
    network: str
    cpus: float | None = None
    memory_mb: int | None = None
    egress: Sequence[Endpoint] = ()
    max_processes: int | None = DEFAULT_MAX_PROCESSES
    disk_mb: int | None = DEFAULT_DISK_MB

    @property
    def inside(self) -> str:
        """The workspace path as the agent sees it."""
        return self.sandbox.workspace_path(self.workspace)

    # Keystone's files in `.keystone/` are read and written through checks.safe_files: the
    # agent can write there, and a link it planted must never be followed.

    def keystone_path(self, name: str) -> str:
        """The path of `.keystone/<name>` inside the sandbox."""
        return f"{self.inside}/{KEYSTONE_DIR}/{name}"

    def write_keystone(self, name: str, data: bytes) -> str:
        safe_files.write_bytes(self.workspace, f"{KEYSTONE_DIR}/{name}", data)
        return self.keystone_path(name)

    def read_keystone(self, name: str, cap: int) -> tuple[bytes, int] | None:
        """At most `cap` bytes of `.keystone/<name>` and its size; None when the agent wrote
        none, or put a link or anything but a regular file there."""
        try:
            return safe_files.read_bytes(self.workspace, f"{KEYSTONE_DIR}/{name}", cap=cap)
        except OSError:
            return None

    def remove_keystone(self, name: str) -> str:
        safe_files.remove(self.workspace, f"{KEYSTONE_DIR}/{name}")
        return self.keystone_path(name)

    def ro_binds(self) -> Sequence[Path]:
        # The spec's directory is readable (agent code, fixtures); nothing else of the server.
        spec_dir = self.spec_dir.resolve()
        return [spec_dir] if spec_dir.is_dir() and spec_dir != Path("/") else []

    def run(self, command: str, *, stdin: str, extra_env: dict[str, str]) -> ProcessResult:
        return self.sandbox.run(
            command,
            workspace=self.workspace,
            env={**self.env, **extra_env},
            stdin=stdin,
            timeout=self.timeout,
            max_output_bytes=self.max_output_bytes,
            cpus=self.cpus,
            memory_mb=self.memory_mb,
            network=self.network,
            ro_binds=self.ro_binds(),
            egress=self.egress,
            max_processes=self.max_processes,
            disk_mb=self.disk_mb,
        )


def _prompt_env(prompt: str, invocation: _SandboxInvocation) -> dict[str, str]:
    prompt_inside = invocation.write_keystone(PROMPT_FILE, prompt.encode("utf-8"))
    output_inside = invocation.remove_keystone("output")
    env = {
        "KEYSTONE_PROMPT_FILE": prompt_inside,
        "KEYSTONE_OUTPUT": output_inside,
        "KEYSTONE_SPEC_DIR": str(invocation.spec_dir.resolve()),
    }
    if len(prompt.encode()) <= _MAX_PROMPT_IN_ENV:
        env["KEYSTONE_PROMPT"] = prompt
    return env


# The exit codes POSIX reserves for a shell that could not run a command (`sh -c CMD`).
_SHELL_COULD_NOT_RUN = {126: "found but not executable", 127: "not found"}


def _invoke_command(
    agent_config: dict[str, Any], prompt: str, invocation: _SandboxInvocation
) -> AgentResult:
    command = agent_config.get("command")
    if not command:
        raise AgentConfigError("agent.command is required for type 'command'")
    process = invocation.run(str(command), stdin=prompt, extra_env=_prompt_env(prompt, invocation))
    written = _read_output(invocation, invocation.max_output_bytes)
    result = _from_process(process, final_output=process.stdout if written is None else written)
    if result.status == "failed" and result.error is None:
        if process.exit_code in _SHELL_COULD_NOT_RUN:
            # The shell could not run the command it was given: the agent never started
            # (`error`, so that no check judges what it did not do).
            result.status = "error"
            said = process.stderr.strip()[-500:]
            result.error = (
                f"agent command could not be run: the shell exited with code "
                f"{process.exit_code} ({_SHELL_COULD_NOT_RUN[process.exit_code]})"
                + (f": {said}" if said else "")
            )
        else:
            result.error = f"agent command exited with code {process.exit_code}"
    return result


def _invoke_python(
    agent_config: dict[str, Any],
    prompt: str,
    context: dict[str, Any],
    invocation: _SandboxInvocation,
) -> AgentResult:
    if not agent_config.get("callable"):
        raise AgentConfigError("agent.callable is required for type 'python'")
    request = {
        "mode": "invoke",
        "callable": agent_config["callable"],
        "prompt": prompt,
        "context": context,
        "tools": list(agent_config.get("tools") or []),
        "tool_registry": agent_config.get("tool_registry"),
    }
    process, record = _run_host(agent_config, request, prompt, invocation)
    result = _from_process(process, final_output="")
    if process.timed_out or process.error is not None or process.limit_exceeded:
        return result
    if record is None:
        result.status, result.error = "error", _host_failure(process, None, what="callable")
    elif record.get("ok"):
        result.status, result.error = "success", None
        result.final_output = _cap(str(record.get("output", "")), invocation.max_output_bytes)
        result.tool_calls = list(record.get("tool_calls") or [])
    else:
        # An agent that raises failed its task; one that cannot even be imported is misconfigured.
        result.status = "failed" if record.get("phase") == "call" else "error"
        result.error = _host_failure(process, record, what="callable")
    return result


def _run_host(
    agent_config: dict[str, Any],
    request: dict[str, Any],
    prompt: str,
    invocation: _SandboxInvocation,
) -> tuple[ProcessResult, dict[str, Any] | None]:
    """Copy the host script into the workspace and run it with the request on stdin."""
    script_inside = invocation.write_keystone("python_agent_host.py", HOST_SCRIPT.read_bytes())
    result_inside = invocation.remove_keystone("agent_result.json")
    python_path = [str(invocation.spec_dir.resolve()), invocation.inside]
    if invocation.env.get("PYTHONPATH"):
        python_path.append(invocation.env["PYTHONPATH"])
    extra_env = {
        **_prompt_env(prompt, invocation),
        "KEYSTONE_AGENT_RESULT": result_inside,
        "PYTHONPATH": ":".join(python_path),
        "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ in the workspace diff
        "PYTHONUNBUFFERED": "1",
    }
    python = str(agent_config.get("python") or invocation.sandbox.python_executable())
    command = f"exec {shlex.quote(python)} {shlex.quote(script_inside)}"
    process = invocation.run(command, stdin=json.dumps(request), extra_env=extra_env)
    written = invocation.read_keystone("agent_result.json", _MAX_AGENT_RESULT_BYTES)
    try:
        record = json.loads(written[0].decode("utf-8")) if written else None
    except ValueError:
        record = None
    return process, record if isinstance(record, dict) else None


def _host_failure(process: ProcessResult, record: dict[str, Any] | None, *, what: str) -> str:
    if process.timed_out:
        return f"python agent {what} timed out"
    if process.error:
        return process.error
    if record is not None:
        return f"python agent {what} raised {record.get('error', 'an error')}\n{record.get('traceback', '')}".rstrip()
    tail = process.stderr.strip()[-2000:]
    return f"python agent host wrote no result (exit code {process.exit_code}): {tail}"


def _from_process(process: ProcessResult, *, final_output: str) -> AgentResult:
    if process.error is not None:
        status = "error"
    elif process.timed_out:
        status = "timed_out"
    elif process.limit_exceeded or process.exit_code != 0:
        status = "failed"
    else:
        status = "success"
    return AgentResult(
        final_output=final_output,
        status=status,
        exit_code=process.exit_code,
        stdout=process.stdout,
        stderr=process.stderr,
        duration_ms=process.duration_ms,
        agent_cpu_ms=process.cpu_ms,
        error=process.error
        or process.limit_exceeded
        or (
            f"agent timed out after {process.duration_ms / 1000:.1f}s"
            if process.timed_out
            else None
        ),
        stdout_truncated=process.stdout_truncated,
        stderr_truncated=process.stderr_truncated,
        refused_connections=process.refused_connections,
    )


def _read_output(invocation: _SandboxInvocation, cap: int) -> str | None:
    """The agent's $KEYSTONE_OUTPUT, capped like stdout; None when it did not write one."""
    written = invocation.read_keystone("output", cap)
    if written is None:
        return None
    data, size = written
    text = data.decode("utf-8", errors="replace")
    return text + f"\n[... truncated {size - cap} bytes by Keystone]" if size > cap else text


def _cap(text: str, cap: int) -> str:
    data = text.encode()
    if len(data) <= cap:
        return text
    return (
        data[:cap].decode("utf-8", errors="replace")
        + f"\n[... truncated {len(data) - cap} bytes by Keystone]"
    )


# --------------------------------------------------------------------------- http agents


KEYSTONE_ENV_HEADER = "X-Keystone-Env"
_ENDPOINT_PREFIXES = ("KEYSTONE_TOOL_", "KEYSTONE_SERVICE_")
_ENDPOINT_NAMES = ("KEYSTONE_PROXY_URL", "KEYSTONE_SCENARIO", "KEYSTONE_REPLICA")


def endpoint_env(env: dict[str, str]) -> dict[str, str]:
    """The per-execution endpoints an HTTP agent gets in the X-Keystone-Env header (JSON):
    the gateway (OPENAI_BASE_URL and its per-execution token), tools, services. An HTTP agent
    runs outside the sandbox and cannot read them from its environment; one that talks to
    its model and tools through these gets the scenario's faults where it really calls them.
    Never the spec's secrets."""
    endpoints = {
        key: value
        for key, value in env.items()
        if key.startswith(_ENDPOINT_PREFIXES) or key in _ENDPOINT_NAMES
    }
    if env.get("OPENAI_BASE_URL"):
        # Only with the gateway: then OPENAI_API_KEY is its per-execution token, not a secret.
        endpoints["OPENAI_BASE_URL"] = env["OPENAI_BASE_URL"]
        endpoints["OPENAI_API_KEY"] = env.get("OPENAI_API_KEY", "")
    return endpoints


def _invoke_http(
    agent_config: dict[str, Any],
    *,
    prompt: str,
    sandbox: Sandbox,
    timeout: float,
    max_output_bytes: int,
    keystone_env: dict[str, str] | None = None,
) -> AgentResult:
    endpoint = agent_config.get("endpoint")
    if not endpoint:
        raise AgentConfigError("agent.endpoint is required for type 'http'")
    method = str(agent_config.get("method") or "POST").upper()
    headers = {str(k): str(v) for k, v in (agent_config.get("headers") or {}).items()}
    if keystone_env:
        headers[KEYSTONE_ENV_HEADER] = json.dumps(keystone_env, sort_keys=True)
    body = render_request(agent_config.get("request_template"), prompt)
    if body is not None and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    started = time.perf_counter()

    def elapsed() -> float:
        return (time.perf_counter() - started) * 1000

    try:
        with _agent_response(
            str(endpoint),
            data=body,
            headers=headers,
            method=method,
            sandbox=sandbox,
            timeout=timeout,
        ) as response:
            status_code = response.status
            raw = response.read(max_output_bytes + 1)
    except urllib.error.HTTPError as exc:
        detail = exc.read(2000).decode("utf-8", errors="replace")
        return AgentResult(
            "",
            "failed",
            exc.code,
            stdout=detail,
            duration_ms=elapsed(),
            error=f"agent endpoint answered HTTP {exc.code}: {detail[:500]}",
        )
    except TimeoutError:
        return AgentResult(
            "",
            "timed_out",
            None,
            duration_ms=elapsed(),
            error=f"agent endpoint did not answer within {timeout:g}s",
        )
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError | socket.timeout):
            return AgentResult(
                "",
                "timed_out",
                None,
                duration_ms=elapsed(),
                error=f"agent endpoint did not answer within {timeout:g}s",
            )
        # The request never reached the agent (refused, no route, a name that does not
        # resolve): the agent did not run, so no check may judge it (`error`, never a pass).
        return AgentResult(
            "",
            "error",
            None,
            duration_ms=elapsed(),
            error=f"agent endpoint unreachable: {exc.reason}",
        )
    except ValueError as exc:  # a URL urllib cannot open: nothing was sent either
        return AgentResult(
            "", "error", None, duration_ms=elapsed(), error=f"agent endpoint unusable: {exc}"
        )
    except (OSError, http.client.HTTPException) as exc:
        # The agent had the request, then the connection ended without a whole answer: it
        # (or its server) died on this prompt, which is the agent failing its task.
        return AgentResult(
            "",
            "failed",
            None,
            duration_ms=elapsed(),
            error=f"agent endpoint closed the connection without a whole answer: {exc!r}",
        )
    truncated = len(raw) > max_output_bytes
    text = raw[:max_output_bytes].decode("utf-8", errors="replace")
    result = AgentResult(
        text, "success", status_code, stdout=text, duration_ms=elapsed(), stdout_truncated=truncated
    )
    path = agent_config.get("response_path")
    if path:
        try:
            value = extract_path(json.loads(text), str(path))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            result.status, result.final_output = "failed", ""
            result.error = f"response_path {path} not found in the agent's response: {exc}"
            return result
        result.final_output = value if isinstance(value, str) else json.dumps(value)
    return result


@contextlib.contextmanager
def _agent_response(
    url: str,
    *,
    data: bytes | None,
    headers: dict[str, str],
    method: str,
    sandbox: Sandbox,
    timeout: float,
) -> Iterator[Any]:
    """urlopen for the agent's own endpoints: `sandbox.stop_all()` (its run was cancelled)
    ends the call at once instead of at its timeout."""
    with contextlib.ExitStack() as stops:
        request = _AgentRequest(
            url, data=data, headers=headers, method=method, sandbox=sandbox, stops=stops
        )
        with _AGENT_OPENER.open(request, timeout=timeout) as response:
            yield response


class _AgentRequest(urllib.request.Request):
    """A request to an HTTP agent whose connection the sandbox's stop_all shuts (its run was
    cancelled), so that the call ends at once instead of at the agent's timeout."""

    def __init__(
        self,
        url: str,
        *,
        data: bytes | None,
        headers: dict[str, str],
        method: str,
        sandbox: Sandbox,
        stops: contextlib.ExitStack,
    ) -> None:
        super().__init__(url, data=data, headers=headers, method=method)
        self._sandbox = sandbox
        self._stops = stops

    def connected(self, sock: socket.socket) -> None:
        self._stops.enter_context(self._sandbox.stoppable(functools.partial(_shut_down, sock)))


def _shut_down(sock: socket.socket) -> None:
    """Ends the call blocked on `sock` in another thread: its read returns at once."""
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


class _StoppableConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, request: urllib.request.Request, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request = request

    def connect(self) -> None:
        super().connect()
        # A redirect's request is urllib's own: that hop ends at the timeout only.
        if isinstance(self._request, _AgentRequest) and self.sock is not None:
            self._request.connected(self.sock)


class _StoppableHTTPSConnection(_StoppableConnection, http.client.HTTPSConnection):
    pass


_STOPPABLE = {
    http.client.HTTPConnection: _StoppableConnection,
    http.client.HTTPSConnection: _StoppableHTTPSConnection,
}


class _StoppableOpen:
    def do_open(self, http_class: Any, req: Any, **http_conn_args: Any) -> Any:
        connection = functools.partial(_STOPPABLE[http_class], request=req)
        return super().do_open(connection, req, **http_conn_args)  # type: ignore[misc]


class _StoppableHTTPHandler(_StoppableOpen, urllib.request.HTTPHandler):
    pass


class _StoppableHTTPSHandler(_StoppableOpen, urllib.request.HTTPSHandler):
    pass


# urlopen's handlers (proxies from the environment, redirects, errors) with the two above
# in place of urllib's HTTP and HTTPS handlers.
_AGENT_OPENER = urllib.request.build_opener(_StoppableHTTPHandler, _StoppableHTTPSHandler)


def render_request(template: Any, prompt: str) -> bytes | None:
    """The request body: `{prompt}` replaced JSON-safely. A mapping or list template has the
    prompt put into its strings; a string template gets the prompt JSON-escaped. No template
    sends `{"prompt": ...}`."""
    if template is None:
        return json.dumps({"prompt": prompt}).encode()
    if isinstance(template, str):
        escaped = json.dumps(prompt)[1:-1]
        return template.replace("{prompt}", escaped).encode()
    return json.dumps(_substitute(template, prompt)).encode()


def _substitute(value: Any, prompt: str) -> Any:
    if isinstance(value, str):
        return value.replace("{prompt}", prompt)
    if isinstance(value, dict):
        return {key: _substitute(item, prompt) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, prompt) for item in value]
    return value


_PATH_TOKEN = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]|\[['\"]([^'\"]+)['\"]\]")


def extract_path(document: Any, path: str) -> Any:
    """A JSONPath-like lookup: `$.output`, `$.data.items[0].text`, `$['odd key']`."""
    expression = path.strip()
    if not expression.startswith("$"):
        raise ValueError(f"response_path must start with '$': {path!r}")
    position, value = 1, document
    while position < len(expression):
        match = _PATH_TOKEN.match(expression, position)
        if match is None:
            raise ValueError(f"cannot parse response_path {path!r} at {expression[position:]!r}")
        name, index, quoted = match.groups()
        if index is not None:
            if not isinstance(value, list):
                raise TypeError(f"{expression[:position]} is not a list")
            value = value[int(index)]
        else:
            if not isinstance(value, dict):
                raise TypeError(f"{expression[:position] or '$'} is not an object")
            value = value[name if name is not None else quoted]
        position = match.end()
    return value


def _reset_http(agent_config: dict[str, Any], *, sandbox: Sandbox, timeout: float) -> str | None:
    headers = {str(k): str(v) for k, v in (agent_config.get("headers") or {}).items()}
    try:
        with _agent_response(
            str(agent_config["reset_endpoint"]),
            data=b"",
            headers=headers,
            method="POST",
            sandbox=sandbox,
            timeout=timeout,
        ) as response:
            response.read(1024)
    except urllib.error.HTTPError as exc:
        return f"reset_endpoint answered HTTP {exc.code}"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return f"reset_endpoint unreachable: {exc}"
    return None
