"""Agent adapters against real processes, real sandboxes and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evaluations.runner.agents import (
    AgentConfigError,
    AgentResult,
    extract_path,
    has_reset,
    invoke_agent,
    render_request,
    reset_agent,
)
from evaluations.runner.sandbox import DockerSandbox, LocalSandbox, Sandbox
from evaluations.runner.workspace import create_workspace, diff, snapshot
from tests.http_peer import HttpPeer, PeerHandler

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SHELL_AGENT = PROJECT_ROOT / "examples" / "agents" / "shell_agent"


def _invoke(
    agent: dict[str, Any],
    sandbox: Sandbox,
    workspace: Path,
    *,
    prompt: str = "hello",
    spec_dir: Path | None = None,
    timeout: float = 30,
    env: dict[str, str] | None = None,
    context: dict[str, Any] | None = None,
    max_output_bytes: int = 1024 * 1024,
) -> AgentResult:
    return invoke_agent(
        agent,
        prompt=prompt,
        sandbox=sandbox,
        workspace=workspace,
        env=env or {},
        timeout=timeout,
        max_output_bytes=max_output_bytes,
        network="services",
        spec_dir=spec_dir or workspace,
        context=context or {},
    )


# --------------------------------------------------------------------------- command agents


def test_command_agent_gets_the_prompt_on_stdin_and_in_env_and_stdout_is_the_output(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    prompt = 'Refund order 1042 "now"\nplease'
    result = _invoke(
        {
            "type": "command",
            "command": 'cat; echo "|$KEYSTONE_PROMPT|$MODE|$GATEWAY"',
            "env": {"MODE": "strict"},
        },
        process_sandbox,
        workspace,
        prompt=prompt,
        env={"GATEWAY": "http://127.0.0.1:1/v1"},
    )
    assert result.status == "success" and result.exit_code == 0
    assert result.final_output == f"{prompt}|{prompt}|strict|http://127.0.0.1:1/v1\n"
    assert result.agent_cpu_ms is not None and result.duration_ms > 0


def test_command_agent_output_file_wins_over_stdout(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    result = _invoke(
        {"type": "command", "command": 'echo chatter; printf "final answer" > "$KEYSTONE_OUTPUT"'},
        process_sandbox,
        workspace,
    )
    assert result.final_output == "final answer"
    assert result.stdout == "chatter\n"


def test_command_agent_nonzero_exit_is_failed(process_sandbox: Sandbox, workspace: Path) -> None:
    result = _invoke(
        {"type": "command", "command": "echo partial; exit 2"}, process_sandbox, workspace
    )
    assert result.status == "failed" and result.exit_code == 2
    assert result.final_output == "partial\n"
    assert result.error is not None and "code 2" in result.error


def test_command_agent_the_shell_cannot_find_never_ran(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    """`sh: ...: not found` (exit 127): the agent never started, so its status is `error`,
    which no check may judge (a `not_contains` would have passed on its empty output)."""
    result = _invoke(
        {"type": "command", "command": "keystone-no-such-agent --serve"}, process_sandbox, workspace
    )
    assert result.status == "error" and result.exit_code == 127
    assert result.error is not None
    assert "could not be run" in result.error and "keystone-no-such-agent" in result.error


def test_command_agent_that_is_not_executable_never_ran(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    (workspace / "agent.sh").write_text("#!/bin/sh\necho hi\n")  # mode 0644: no x bit
    result = _invoke({"type": "command", "command": "./agent.sh"}, process_sandbox, workspace)
    assert result.status == "error" and result.exit_code == 126
    assert result.error is not None and "not executable" in result.error


def test_hung_command_agent_times_out_on_the_stricter_timeout(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    started = time.monotonic()
    result = _invoke(
        {"type": "command", "command": "sleep 100", "timeout": 1},
        process_sandbox,
        workspace,
        timeout=30,
    )
    assert result.status == "timed_out"
    assert time.monotonic() - started < 5


def test_command_agent_stdout_is_capped(process_sandbox: Sandbox, workspace: Path) -> None:
    result = _invoke(
        {"type": "command", "command": "yes | head -c 3000000"},
        process_sandbox,
        workspace,
        max_output_bytes=1000,
    )
    assert result.stdout_truncated
    assert result.final_output.endswith("[... truncated 2999000 bytes by Keystone]")


def test_shell_agent_example_fixes_the_bug_and_runs_the_tests(
    process_sandbox: Sandbox, tmp_path: Path
) -> None:
    workspace = create_workspace(
        tmp_path / "root", spec_dir=SHELL_AGENT.parent, source_dir="shell_agent"
    )
    before = snapshot(workspace)
    result = _invoke(
        {"type": "command", "command": "sh agent.sh"},
        process_sandbox,
        workspace,
        prompt="The add function in calculator.py is wrong; fix the bug.",
        spec_dir=SHELL_AGENT.parent,
    )
    assert result.status == "success", result.stderr
    assert result.final_output == "Fixed calculator.add; all tests pass.\n"
    changes = diff(before, snapshot(workspace), workspace)
    assert [(c.path, c.change) for c in changes] == [("calculator.py", "modified")]
    assert "return a + b" in (changes[0].content or "")


def test_shell_agent_example_fails_when_it_does_not_fix_anything(
    process_sandbox: Sandbox, tmp_path: Path
) -> None:
    workspace = create_workspace(
        tmp_path / "root", spec_dir=SHELL_AGENT.parent, source_dir="shell_agent"
    )
    result = _invoke(
        {"type": "command", "command": "sh agent.sh"},
        process_sandbox,
        workspace,
        prompt="Write a poem.",
        spec_dir=SHELL_AGENT.parent,
    )
    assert result.status == "failed" and result.exit_code == 1
    assert result.final_output.startswith("Tests still fail")


def test_command_agent_runs_in_docker(docker_sandbox: DockerSandbox, workspace: Path) -> None:
    result = _invoke(
        {
            "type": "command",
            "command": 'cat > got.txt; echo "done $KEYSTONE_WORKSPACE" > "$KEYSTONE_OUTPUT"',
        },
        docker_sandbox,
        workspace,
        prompt="from the prompt",
    )
    assert result.status == "success", result.stderr
    assert result.final_output == "done /workspace\n"
    assert (workspace / "got.txt").read_text() == "from the prompt"


# --------------------------------------------------------------------------- python agents

AGENT_MODULE = """
import asyncio
import json
import os


def echo(prompt, context):
    return f"echo: {prompt} (scenario {context.get('scenario')})"


async def structured(prompt, context):
    await asyncio.sleep(0)
    return {"answer": prompt.upper(), "items": [1, 2]}


def broken(prompt, context):
    raise RuntimeError("the model said no")


def slow(prompt, context):
    import time
    time.sleep(100)


def writes_file(prompt, context):
    with open(os.path.join(os.environ["KEYSTONE_WORKSPACE"], "answer.txt"), "w") as handle:
        handle.write(prompt)
    return "written"


def reset():
    with open(os.path.join(os.environ["KEYSTONE_WORKSPACE"], ".keystone", "reset-marker"), "w") as handle:
        handle.write("reset")


def failing_reset():
    raise ValueError("cannot reset")
"""


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "spec"
    (directory / "myagent").mkdir(parents=True)
    (directory / "myagent" / "__init__.py").write_text("")
    (directory / "myagent" / "core.py").write_text(AGENT_MODULE)
    return directory


def test_python_agent_sync_callable_returns_text(
    process_sandbox: Sandbox, workspace: Path, spec_dir: Path
) -> None:
    result = _invoke(
        {"type": "python", "callable": "myagent.core:echo"},
        process_sandbox,
        workspace,
        prompt="hi",
        spec_dir=spec_dir,
        context={"scenario": "no-chaos"},
    )
    assert result.status == "success", result.error
    assert result.final_output == "echo: hi (scenario no-chaos)"
    assert (workspace / ".keystone" / "output").read_text() == "echo: hi (scenario no-chaos)"


def test_python_agent_async_callable_returning_a_dict_keeps_its_structure(
    process_sandbox: Sandbox, workspace: Path, spec_dir: Path
) -> None:
    result = _invoke(
        {"type": "python", "callable": "myagent.core:structured"},
        process_sandbox,
        workspace,
        prompt="ok",
        spec_dir=spec_dir,
    )
    assert result.status == "success", result.error
    assert json.loads(result.final_output) == {"answer": "OK", "items": [1, 2]}


def test_python_agent_that_raises_is_failed_with_its_traceback(
    process_sandbox: Sandbox, workspace: Path, spec_dir: Path
) -> None:
    result = _invoke(
        {"type": "python", "callable": "myagent.core:broken"},
        process_sandbox,
        workspace,
        spec_dir=spec_dir,
    )
    assert result.status == "failed"
    assert result.error is not None and "RuntimeError: the model said no" in result.error
    assert "Traceback" in result.error


def test_python_agent_that_cannot_be_imported_is_an_error(
    process_sandbox: Sandbox, workspace: Path, spec_dir: Path
) -> None:
    result = _invoke(
        {"type": "python", "callable": "myagent.nope:echo"},
        process_sandbox,
        workspace,
        spec_dir=spec_dir,
    )
    assert result.status == "error"
    assert result.error is not None and "ModuleNotFoundError" in result.error


def test_hung_python_agent_times_out(
    process_sandbox: Sandbox, workspace: Path, spec_dir: Path
) -> None:
    result = _invoke(
        {"type": "python", "callable": "myagent.core:slow"},
        process_sandbox,
        workspace,
        spec_dir=spec_dir,
        timeout=1.5,
    )
    assert result.status == "timed_out"


def test_python_agent_writes_into_the_workspace_without_pycache(
    process_sandbox: Sandbox, workspace: Path, spec_dir: Path
) -> None:
    before = snapshot(workspace)
    result = _invoke(
        {"type": "python", "callable": "myagent.core:writes_file"},
        process_sandbox,
        workspace,
        prompt="42",
        spec_dir=spec_dir,
    )
    assert result.status == "success", result.error
    assert [(c.path, c.content) for c in diff(before, snapshot(workspace), workspace)] == [
        ("answer.txt", "42")
    ]
    assert not list(spec_dir.rglob("__pycache__"))


def test_python_reset_function_runs_in_the_sandbox(
    process_sandbox: Sandbox, workspace: Path, spec_dir: Path
) -> None:
    error = reset_agent(
        {"type": "python", "callable": "myagent.core:echo", "reset_function": "myagent.core:reset"},
        sandbox=process_sandbox,
        workspace=workspace,
        env={},
        timeout=20,
        spec_dir=spec_dir,
    )
    assert error is None
    assert (workspace / ".keystone" / "reset-marker").read_text() == "reset"


def test_python_reset_function_failure_is_reported(
    process_sandbox: Sandbox, workspace: Path, spec_dir: Path
) -> None:
    error = reset_agent(
        {
            "type": "python",
            "callable": "myagent.core:echo",
            "reset_function": "myagent.core:failing_reset",
        },
        sandbox=process_sandbox,
        workspace=workspace,
        env={},
        timeout=20,
        spec_dir=spec_dir,
    )
    assert error is not None and "ValueError: cannot reset" in error


def test_python_agent_host_runs_without_keystone_importable(
    workspace: Path, spec_dir: Path, tmp_path: Path
) -> None:
    # The host is copied into the workspace and run by path: it must not need the project.
    isolated_python = shutil.which("python3") or "python3"
    result = _invoke(
        {"type": "python", "callable": "myagent.core:echo", "python": isolated_python},
        LocalSandbox(),
        workspace,
        prompt="alone",
        spec_dir=spec_dir,
    )
    assert result.status == "success", result.error
    assert result.final_output.startswith("echo: alone")


# --------------------------------------------------------------------------- http agents


class _AgentServer(HttpPeer):
    """A real HTTP agent on 127.0.0.1 that records what it receives."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        self.delay = 0.0
        self.reply: Any = {"output": "default"}
        owner = self

        class Handler(PeerHandler):
            def do_POST(self) -> None:
                owner.requests.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": self.read_body().decode(),
                        "method": self.command,
                    }
                )
                time.sleep(owner.delay)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # client gave up
                    self.send_json(owner.status, owner.reply)

            do_PUT = do_POST

        super().__init__(Handler)


@pytest.fixture
def agent_server() -> Iterator[_AgentServer]:
    with _AgentServer() as server:
        yield server


def test_http_agent_substitutes_the_prompt_json_safely_and_follows_the_response_path(
    agent_server: _AgentServer, workspace: Path
) -> None:
    agent_server.reply = {"data": {"items": [{"text": "refund issued"}]}}
    prompt = 'He said "refund" \\ now\nline two {braces}'
    result = _invoke(
        {
            "type": "http",
            "endpoint": agent_server.url + "/chat",
            "headers": {"Authorization": "Bearer test-token"},
            "request_template": {"input": {"message": "{prompt}", "history": []}, "stream": False},
            "response_path": "$.data.items[0].text",
        },
        LocalSandbox(),
        workspace,
        prompt=prompt,
    )
    assert result.status == "success", result.error
    assert result.final_output == "refund issued"
    sent = agent_server.requests[0]
    assert sent["path"] == "/chat"
    assert sent["headers"]["Authorization"] == "Bearer test-token"
    assert json.loads(sent["body"]) == {
        "input": {"message": prompt, "history": []},
        "stream": False,
    }


def test_http_agent_string_template_stays_valid_json(
    agent_server: _AgentServer, workspace: Path
) -> None:
    prompt = 'quote " backslash \\ newline \n'
    result = _invoke(
        {
            "type": "http",
            "endpoint": agent_server.url,
            "method": "PUT",
            "request_template": '{"q": "{prompt}"}',
            "response_path": "$.output",
        },
        LocalSandbox(),
        workspace,
        prompt=prompt,
    )
    assert result.status == "success" and result.final_output == "default"
    assert json.loads(agent_server.requests[0]["body"]) == {"q": prompt}
    assert agent_server.requests[0]["method"] == "PUT"


def test_http_agent_non_string_response_value_becomes_json_text(
    agent_server: _AgentServer, workspace: Path
) -> None:
    agent_server.reply = {"result": {"status": "ok", "amount": 12.5}}
    result = _invoke(
        {"type": "http", "endpoint": agent_server.url, "response_path": "$.result"},
        LocalSandbox(),
        workspace,
    )
    assert json.loads(result.final_output) == {"status": "ok", "amount": 12.5}
    assert json.loads(agent_server.requests[0]["body"]) == {"prompt": "hello"}


def test_http_agent_server_error_is_failed(agent_server: _AgentServer, workspace: Path) -> None:
    agent_server.status = 503
    result = _invoke({"type": "http", "endpoint": agent_server.url}, LocalSandbox(), workspace)
    assert result.status == "failed" and result.exit_code == 503
    assert result.error is not None and "HTTP 503" in result.error


def test_http_agent_connection_refused_never_ran(workspace: Path) -> None:
    """SPEC_FORMAT: an agent that could not be reached is `error`, never a verdict."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _invoke(
        {"type": "http", "endpoint": f"http://127.0.0.1:{port}/"}, LocalSandbox(), workspace
    )
    assert result.status == "error"
    assert result.error is not None and "unreachable" in result.error


def test_http_agent_that_drops_the_request_unanswered_failed(workspace: Path) -> None:
    """Reached, then gone without an answer: the agent died on this prompt (`failed`)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def drop_one() -> None:
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)  # the request arrived; close without a word

        dropper = threading.Thread(target=drop_one)
        dropper.start()
        result = _invoke(
            {"type": "http", "endpoint": f"http://127.0.0.1:{port}/"}, LocalSandbox(), workspace
        )
        dropper.join()
    assert result.status == "failed"
    assert result.error is not None and "without a whole answer" in result.error


def test_http_agent_slow_answer_times_out(agent_server: _AgentServer, workspace: Path) -> None:
    agent_server.delay = 3
    started = time.monotonic()
    result = _invoke(
        {"type": "http", "endpoint": agent_server.url, "timeout": 0.5}, LocalSandbox(), workspace
    )
    assert result.status == "timed_out"
    assert time.monotonic() - started < 2.5


def test_stop_all_ends_a_waiting_http_agent_call_at_once(
    agent_server: _AgentServer, workspace: Path
) -> None:
    """Its run was cancelled: the call ends now, not at the agent's timeout; and a call
    made after stop_all ends at once too."""
    agent_server.delay = 8
    sandbox = LocalSandbox()
    results: list[AgentResult] = []
    call = threading.Thread(
        target=lambda: results.append(
            _invoke(
                {"type": "http", "endpoint": agent_server.url, "timeout": 60}, sandbox, workspace
            )
        )
    )
    call.start()
    deadline = time.monotonic() + 5
    while not agent_server.requests and time.monotonic() < deadline:
        time.sleep(0.02)
    assert agent_server.requests, "the agent was never called"
    started = time.monotonic()
    sandbox.stop_all()
    call.join(timeout=5)
    assert not call.is_alive(), "the call went on after stop_all"
    assert time.monotonic() - started < 5
    assert results[0].status == "failed" and results[0].final_output == ""
    started = time.monotonic()
    late = _invoke(
        {"type": "http", "endpoint": agent_server.url, "timeout": 60}, sandbox, workspace
    )
    # Shut before its request went out: it never reached the agent (a cancelled run keeps
    # no result of either call anyway).
    assert late.status == "error" and time.monotonic() - started < 5


def test_http_agent_missing_response_path_is_failed(
    agent_server: _AgentServer, workspace: Path
) -> None:
    result = _invoke(
        {"type": "http", "endpoint": agent_server.url, "response_path": "$.nothing.here"},
        LocalSandbox(),
        workspace,
    )
    assert result.status == "failed"
    assert result.error is not None and "$.nothing.here" in result.error


def test_http_reset_endpoint_is_posted_before_an_execution(
    agent_server: _AgentServer, workspace: Path
) -> None:
    config = {
        "type": "http",
        "endpoint": agent_server.url + "/chat",
        "reset_endpoint": agent_server.url + "/reset",
    }
    assert (
        reset_agent(
            config,
            sandbox=LocalSandbox(),
            workspace=workspace,
            env={},
            timeout=5,
            spec_dir=workspace,
        )
        is None
    )
    assert [r["path"] for r in agent_server.requests] == ["/reset"]
    agent_server.status = 500
    error = reset_agent(
        config, sandbox=LocalSandbox(), workspace=workspace, env={}, timeout=5, spec_dir=workspace
    )
    assert error is not None and "HTTP 500" in error


def test_stop_all_ends_a_waiting_http_reset_at_once(
    agent_server: _AgentServer, workspace: Path
) -> None:
    agent_server.delay = 8
    sandbox = LocalSandbox()
    config = {"type": "http", "endpoint": agent_server.url, "reset_endpoint": agent_server.url}
    errors: list[str | None] = []
    call = threading.Thread(
        target=lambda: errors.append(
            reset_agent(config, sandbox=sandbox, workspace=workspace, env={}, spec_dir=workspace)
        )
    )
    call.start()
    deadline = time.monotonic() + 5
    while not agent_server.requests and time.monotonic() < deadline:
        time.sleep(0.02)
    sandbox.stop_all()
    call.join(timeout=5)
    assert not call.is_alive(), "the reset went on after stop_all"
    assert errors[0] is not None and "unreachable" in errors[0]


def test_has_reset_tells_which_agents_can_share_state() -> None:
    assert not has_reset({"type": "http", "endpoint": "http://x"})
    assert has_reset({"type": "http", "endpoint": "http://x", "reset_endpoint": "http://x/reset"})
    assert not has_reset({"type": "python", "callable": "a:b"})
    assert has_reset({"type": "command", "command": "true"})


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("$", {"a": [{"b": "x"}], "odd key": 3}),
        ("$.a[0].b", "x"),
        ("$['odd key']", 3),
        ("$.a", [{"b": "x"}]),
    ],
)
def test_extract_path_follows_keys_and_indexes(path: str, expected: Any) -> None:
    assert extract_path({"a": [{"b": "x"}], "odd key": 3}, path) == expected


@pytest.mark.parametrize("path", ["$.missing", "$.a[5]", "$.a.b", "a.b", "$..a"])
def test_extract_path_rejects_what_is_not_there(path: str) -> None:
    with pytest.raises((KeyError, IndexError, TypeError, ValueError)):
        extract_path({"a": [{"b": "x"}]}, path)


def test_render_request_without_template_sends_the_prompt_field() -> None:
    assert json.loads(render_request(None, 'a"b') or b"") == {"prompt": 'a"b'}


def test_unknown_agent_type_is_a_config_error(workspace: Path) -> None:
    with pytest.raises(AgentConfigError, match="unknown agent type"):
        _invoke({"type": "carrier-pigeon"}, LocalSandbox(), workspace)
