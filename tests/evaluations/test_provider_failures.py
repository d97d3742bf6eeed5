"""Issue 12, item 1: when the agent's own model endpoint fails it (unreachable, timing out,
a server error, refused credentials), the execution is a provider error: exit code 3 and a
run warning naming the endpoint, never a pass because the agent apologised politely.
Injected faults (the chaos under test) never count as the provider's failure."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from checks.artifact import LLMCall
from evaluations.models import ExecutionStatus, Project
from evaluations.runner.harness import provider_failure
from tests.evaluations.execution_helpers import agent_asking_the_model, run_spec, script_agent

pytestmark = pytest.mark.django_db(transaction=True)

# Asks the model once; on any error it apologises and exits 0, as a polite agent does.
AGENT = agent_asking_the_model("Sorry, I cannot help right now.")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _spec(base_url: str) -> str:
    return f"""\
version: 1
id: polite-agent
task: {{prompt: "hi"}}
{script_agent(AGENT)}\
llm: {{provider: openai, base_url: "{base_url}", model: m, timeout: 5}}
invariants:
  answers:
    description: "says something"
    check: {{type: output_not_empty}}
"""


def test_an_unreachable_model_endpoint_is_a_provider_error_with_exit_3(
    project: Project, tmp_path: Path
) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}/v1"
    run = run_spec(project, _spec(endpoint), spec_dir=tmp_path)
    execution = run.executions.get()
    assert execution.status == ExecutionStatus.PROVIDER_ERROR
    assert run.exit_code == 3
    assert any(endpoint in w and "502" in w and "unreachable" in w for w in run.warnings), (
        run.warnings
    )
    assert endpoint in execution.error


def test_a_server_error_on_the_last_call_fails_but_one_the_agent_recovered_from_does_not() -> None:
    def call(status: int, fault: str | None = None) -> LLMCall:
        return LLMCall(
            model="m", status=status, fault=fault, response={"error": {"message": "boom"}}
        )

    assert provider_failure([call(200), call(503)], "http://x/v1") == (
        "model endpoint http://x/v1 answered 503: boom"
    )
    assert provider_failure([call(503), call(200)], "http://x/v1") is None  # it recovered
    assert provider_failure([call(200), call(503, fault="rate_limit")], "http://x/v1") is None
    assert provider_failure([call(401), call(200)], None) == (
        "model endpoint the scripted provider answered 401: boom"
    )
