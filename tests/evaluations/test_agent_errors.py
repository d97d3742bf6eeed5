"""Issue 12, item 9: an agent that cannot be imported, or whose setup fails, is the agent's
error (status `error`, the reason in words, exit code 1), not Keystone's internal error."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from evaluations.models import ExecutionStatus, Project
from tests.evaluations.execution_helpers import run_spec

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_unimportable_python_agent_is_the_agents_error_with_exit_1(
    project: Project, tmp_path: Path
) -> None:
    source = """\
version: 1
id: broken-import
task: {prompt: "p"}
agent: {type: python, callable: "no_such_module:run", timeout: 30}
sandbox: {backend: local}
invariants:
  answers: {description: d, check: {type: output_not_empty}}
"""
    run = run_spec(project, source, spec_dir=tmp_path)
    execution = run.executions.get()
    assert execution.status == ExecutionStatus.ERROR
    assert "ModuleNotFoundError" in execution.error
    assert run.exit_code == 1
    assert "ModuleNotFoundError" in run.summary["why_failed"][0]["reason"]
    # No check ran on an agent that never ran: the cell is an error, not the agent failing.
    assert not execution.check_results.exists()
    assert run.summary["matrix"][0]["status"] == "error"


def test_a_failing_setup_command_names_its_exit_code_and_output(
    project: Project, tmp_path: Path
) -> None:
    source = """\
version: 1
id: broken-setup
task: {prompt: "p"}
agent: {type: command, command: "echo hi", timeout: 30}
sandbox: {backend: local}
setup: ["echo cannot install >&2; exit 3"]
invariants:
  answers: {description: d, check: {type: output_not_empty}}
"""
    run = run_spec(project, source, spec_dir=tmp_path)
    execution = run.executions.get()
    assert execution.status == ExecutionStatus.ERROR
    assert execution.error == (
        "setup command 'echo cannot install >&2; exit 3' exited with code 3: cannot install"
    )
    assert run.exit_code == 1
    # Issue 12, item 10: no check ran on an agent that never ran, so nothing reads as the
    # agent failing an invariant: the matrix cell is an error, the group has no check codes.
    assert not execution.check_results.exists()
    [cell] = run.summary["matrix"]
    assert (cell["invariant_id"], cell["status"]) == ("answers", "error")
    [group] = run.summary["groups"]
    assert group["status"] == "error" and group["failure_codes"] == []


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    "agent",
    [
        pytest.param(lambda: "{type: command, command: keystone-no-such-agent}", id="not-found"),
        pytest.param(
            lambda: f"{{type: http, endpoint: 'http://127.0.0.1:{_closed_port()}/invoke'}}",
            id="unreachable",
        ),
    ],
)
def test_an_agent_that_never_started_fails_the_run_even_when_every_check_would_pass(
    project: Project, tmp_path: Path, agent: Callable[[], str]
) -> None:
    """SPEC_FORMAT: an execution that could not run is `error`, never counted as a pass. A
    command the shell cannot find, or an HTTP agent nobody answers at, passed before: its
    empty output contains nothing forbidden."""
    source = f"""\
version: 1
id: never-started
task: {{prompt: "p"}}
agent: {agent()}
sandbox: {{backend: local}}
invariants:
  no-secrets: {{description: d, check: {{type: not_contains, value: "password"}}}}
"""
    run = run_spec(project, source, spec_dir=tmp_path)
    execution = run.executions.get()
    assert execution.status == ExecutionStatus.ERROR
    assert "could not be run" in execution.error or "unreachable" in execution.error
    assert not execution.check_results.exists()
    assert run.summary["matrix"][0]["status"] == "error"
    assert run.exit_code == 1 and run.summary["verdict"] == "fail"


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env().ping()
    except Exception:
        return False
    return True


@pytest.mark.skipif(
    not _docker_answers(), reason="NO DOCKER DAEMON: the docker backend cannot be tried here"
)
def test_a_container_that_cannot_start_does_not_make_command_exit_blame_the_agent(
    project: Project, tmp_path: Path
) -> None:
    """Issue 12, item 9: the agent never ran, so command_exit (which would run in the same
    missing container) must not fail it with EXIT_CODE_MISMATCH."""
    source = """\
version: 1
id: no-container
task: {prompt: "p"}
agent: {type: command, command: "echo hi", timeout: 30}
sandbox: {backend: docker, image: "keystone-no-such-image:never"}
invariants:
  tests_pass: {description: t, check: {type: command_exit, command: "true"}}
"""
    run = run_spec(project, source, spec_dir=tmp_path)
    execution = run.executions.get()
    assert execution.status == ExecutionStatus.ERROR
    assert "No such image: keystone-no-such-image:never" in execution.error
    assert not execution.check_results.exists()
    assert run.summary["matrix"][0]["status"] == "error"
    assert run.exit_code == 1
