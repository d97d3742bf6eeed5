"""Issue 12, item 4: a reset that fails (an http agent's reset_endpoint answering 500, a
python agent's reset_function that does not exist) ends the execution as `error` with the
reason; the agent is not run on the state the previous cell left behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.planning import PlannedExecution
from checks.spec.model import Spec
from evaluations.runner.harness import ExecutionOutcome, HarnessConfig, run_execution
from tests.http_peer import HttpPeer, PeerHandler


class _Agent(PeerHandler):
    asked: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.read_body()
        _Agent.asked.append(self.path)
        status, body = (
            (500, b"reset broke") if self.path == "/reset" else (200, b'{"output": "hi"}')
        )
        self.send_json(status, body)


@pytest.fixture
def agent_url() -> Iterator[str]:
    with HttpPeer(_Agent) as peer:
        _Agent.asked = []
        yield peer.url


def _run(
    tmp_path: Path, agent: dict[str, Any], files: dict[str, str] | None = None
) -> ExecutionOutcome:
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    for name, text in (files or {}).items():
        (spec_dir / name).write_text(text)
    spec = Spec.from_dict(
        {
            "version": 1,
            "id": "resets",
            "task": {"prompt": "p"},
            "agent": agent,
            "sandbox": {"backend": "local"},
            "invariants": {"any": {"description": "d", "check": {"type": "completes"}}},
        }
    )
    planned = PlannedExecution(
        scenario="no-chaos", prompt_index=0, prompt="p", replica=0, pillar="contract",
        invariant_ids=["any"],
    )  # fmt: skip
    config = HarnessConfig(workspaces_root=tmp_path / "workspaces", spec_dir=spec_dir)
    return run_execution(spec, planned, config, execution_key="reset", seed=0)


def test_a_reset_endpoint_answering_500_makes_the_execution_an_error(
    tmp_path: Path, agent_url: str
) -> None:
    outcome = _run(
        tmp_path,
        {
            "type": "http",
            "endpoint": agent_url + "/agent",
            "reset_endpoint": agent_url + "/reset",
            "response_path": "$.output",
        },
    )
    assert outcome.artifact.status == "error"
    assert outcome.artifact.error == "agent reset failed: reset_endpoint answered HTTP 500"
    assert _Agent.asked == ["/reset"]  # the agent itself was not asked


def test_a_missing_reset_function_makes_the_execution_an_error(tmp_path: Path) -> None:
    agent_code = "def run(prompt, context):\n    return 'hi'\n"
    outcome = _run(
        tmp_path,
        {"type": "python", "callable": "agent:run", "reset_function": "agent:no_such_reset"},
        {"agent.py": agent_code},
    )
    assert outcome.artifact.status == "error"
    assert (outcome.artifact.error or "").startswith(
        "agent reset failed: python agent reset_function"
    )
    assert "no_such_reset" in (outcome.artifact.error or "")
    assert json.dumps(outcome.artifact.final_output) == '""'
