"""Reference 002 (Flakestorm V2 clarifications): "If no reset is configured and the agent
appears stateful (same prompt produces different responses on two calls), Flakestorm warns
(does not fail)", in the document's exact words; with a reset_endpoint the cells start clean
and nothing is said. A real HTTP agent that remembers how often it was asked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import embedded_env, run_keystone
from tests.http_peer import HttpPeer, PeerHandler

WARNING = (
    "Warning: No reset_endpoint configured. Contract matrix cells may share state. "
    "Results may be contaminated. Add reset_endpoint to your config for accurate isolation."
)


class CountingAgent(PeerHandler):
    calls = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.read_body()
        if self.path == "/reset":
            CountingAgent.calls = 0
            body = b"{}"
        else:
            CountingAgent.calls += 1
            body = json.dumps({"output": f"answer number {CountingAgent.calls}"}).encode()
        self.send_json(200, body)


@pytest.fixture
def agent_url() -> Iterator[str]:
    with HttpPeer(CountingAgent) as peer:
        yield peer.url


def _spec(url: str, reset: bool) -> str:
    agent = f'{{type: http, endpoint: "{url}/ask"'
    agent += f', reset_endpoint: "{url}/reset"}}' if reset else "}"
    return f"""\
version: 1
id: stateful
task: {{prompt: "What is the refund policy?"}}
agent: {agent}
chaos_matrix:
  - {{name: no-chaos}}
  - {{name: calm-again}}
invariants:
  answers: {{description: answers, check: {{type: output_not_empty}}}}
"""


@pytest.mark.parametrize("reset", [False, True])
def test_stateful_agent_warning_in_the_documents_words(
    tmp_path: Path, agent_url: str, reset: bool
) -> None:
    # One replica: each prompt runs once per scenario, so only the cells can be compared.
    spec = tmp_path / "spec.yaml"
    spec.write_text(_spec(agent_url, reset))
    report = tmp_path / "report.json"
    done = run_keystone(
        "run", str(spec), "--json", str(report), env=embedded_env(tmp_path / "home")
    )
    assert done.returncode == 0, done.stdout + done.stderr  # warns, does not fail
    warnings = json.loads(report.read_text())["summary"]["warnings"]
    assert (WARNING in warnings) is not reset, warnings
    assert (WARNING in done.stdout + done.stderr) is not reset
