"""Issue 13, item 1: the worker must never follow a link the agent (or the spec's fixture)
planted where Keystone reads or writes a file. Each test is the attack: a link from a file
Keystone touches to a host file holding a secret. The secret must not reach the stored
output, and the host file must be unchanged. Run under every sandbox backend that works here.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from checks.context import SecurityPolicy
from checks.planning import PlannedExecution
from checks.spec.model import Spec
from evaluations.runner.harness import ExecutionOutcome, HarnessConfig, run_execution
from evaluations.runner.sandbox import bwrap_available

SECRET = "SECRET_KEY=planted-link-must-not-leak"
BACKENDS = ["local"] + (["bwrap"] if bwrap_available() else [])


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A host file outside every workspace, standing for /proc/self/environ or another
    project's artifact."""
    path = tmp_path / "host" / "secret.env"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


def _run(
    tmp_path: Path,
    backend: str,
    agent: dict[str, Any],
    files: dict[str, str],
    *,
    invariants: dict[str, Any] | None = None,
    links: dict[str, Path] | None = None,
) -> ExecutionOutcome:
    spec_dir = tmp_path / "spec"
    fixture = spec_dir / "fixture"
    fixture.mkdir(parents=True)
    for name, text in files.items():
        (spec_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (spec_dir / name).write_text(text)
    for name, target in (links or {}).items():  # the fixture itself carries the links
        (fixture / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, fixture / name)
    spec = Spec.from_dict(
        {
            "version": 1,
            "id": "attack",
            "task": {"prompt": "p"},
            "agent": {"timeout": 30, **agent},
            "sandbox": {"backend": backend, "workspace": "fixture"},
            "invariants": invariants
            or {"any": {"description": "d", "check": {"type": "completes"}}},
        }
    )
    planned = PlannedExecution(
        scenario="no-chaos", prompt_index=0, prompt="p", replica=0, pillar="contract",
        invariant_ids=list(spec.invariants),
    )  # fmt: skip
    config = HarnessConfig(
        workspaces_root=tmp_path / "workspaces",
        spec_dir=spec_dir,
        policy=SecurityPolicy(allow_host_scripts=True),
    )
    return run_execution(spec, planned, config, execution_key="attack", seed=0)


def _leaked(outcome: ExecutionOutcome) -> bool:
    stored = json.dumps(outcome.artifact.to_dict(), default=str)
    stored += json.dumps([r.to_dict() for r in outcome.results], default=str)
    return "planted-link-must-not-leak" in stored


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_replaced_by_a_link_to_a_host_file_is_not_read(
    tmp_path: Path, victim: Path, backend: str
) -> None:
    agent = f'ln -sf {victim} "$KEYSTONE_OUTPUT"; echo answered'
    outcome = _run(tmp_path, backend, {"type": "command", "command": agent}, {})
    assert not _leaked(outcome)
    assert outcome.artifact.final_output.strip() == "answered"  # stdout, as with no output


@pytest.mark.parametrize("backend", BACKENDS)
def test_prompt_file_linked_to_a_host_file_is_not_written_through(
    tmp_path: Path, victim: Path, backend: str
) -> None:
    agent = {"type": "command", "command": 'cat "$KEYSTONE_PROMPT_FILE"'}
    outcome = _run(tmp_path, backend, agent, {}, links={".keystone/prompt.txt": victim})
    assert victim.read_text() == SECRET
    assert outcome.artifact.final_output.strip() == "p"


@pytest.mark.parametrize("backend", BACKENDS)
def test_keystone_directory_linked_out_of_the_workspace_by_the_fixture_is_replaced(
    tmp_path: Path, victim: Path, backend: str
) -> None:
    # The spec's fixture makes .keystone a link to the host directory holding the secret.
    agent = {"type": "command", "command": "echo hi"}
    outcome = _run(tmp_path, backend, agent, {}, links={".keystone": victim.parent})
    assert victim.read_text() == SECRET
    assert sorted(p.name for p in victim.parent.iterdir()) == ["secret.env"]
    assert outcome.artifact.status == "success"
    assert not _leaked(outcome)


@pytest.mark.parametrize("backend", BACKENDS)
def test_keystone_directory_linked_out_by_the_agent_is_refused(
    tmp_path: Path, victim: Path, backend: str
) -> None:
    # The agent swaps .keystone for a link while it runs: Keystone reads and writes nothing
    # through it, and says so (the audit and trace, written for a check that reads files).
    command = f"rm -rf .keystone; ln -s {victim.parent} .keystone; echo hi"
    reads = {"gone": {"description": "d", "check": {"type": "file_absent", "path": "out.txt"}}}
    outcome = _run(tmp_path, backend, {"type": "command", "command": command}, {}, invariants=reads)
    assert victim.read_text() == SECRET
    assert sorted(p.name for p in victim.parent.iterdir()) == ["secret.env"]
    assert outcome.artifact.final_output.strip() == "hi"
    assert any("audit and trace files not written" in w for w in outcome.warnings)
    assert not _leaked(outcome)


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_agent_result_linked_to_a_host_file_is_not_read(
    tmp_path: Path, victim: Path, backend: str
) -> None:
    agent_code = (
        "import os\n"
        "def run(prompt, context):\n"
        "    path = os.environ['KEYSTONE_AGENT_RESULT']\n"
        "    # replace the result file the host writes next with a link, after it is written\n"
        "    import atexit\n"
        f"    atexit.register(lambda: (os.remove(path), os.symlink({str(victim)!r}, path)))\n"
        "    return 'ok'\n"
    )
    # A host file shaped like a result: read through the link, its "output" would be stored.
    victim.write_text(json.dumps({"ok": True, "output": SECRET}))
    agent = {"type": "python", "callable": "attacker:run"}
    outcome = _run(tmp_path, backend, agent, {"attacker.py": agent_code})
    assert not _leaked(outcome)
    assert outcome.artifact.status == "error"  # no result the worker could trust


@pytest.mark.parametrize("backend", BACKENDS)
def test_workspace_file_linked_to_a_host_file_is_diffed_as_a_link(
    tmp_path: Path, victim: Path, backend: str
) -> None:
    agent = {"type": "command", "command": f"ln -s {victim} stolen.txt; echo done"}
    outcome = _run(tmp_path, backend, agent, {})
    [change] = outcome.artifact.workspace_diff
    assert (change.path, change.change, change.content) == ("stolen.txt", "added", None)
    assert not _leaked(outcome)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fifo_in_the_workspace_does_not_hang_the_worker(tmp_path: Path, backend: str) -> None:
    # Opening a FIFO with no writer blocks forever: the snapshot and checks must skip it.
    def give_up(*_: Any) -> None:
        raise TimeoutError("the worker blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(60)
    started = time.monotonic()
    try:
        agent = {"type": "command", "command": "mkfifo trap.txt; echo done"}
        invariants = {
            "reads": {
                "description": "d",
                "check": {"type": "file_content", "path": "trap.txt", "contains": "x"},
            }
        }
        outcome = _run(tmp_path, backend, agent, {}, invariants=invariants)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 30
    assert outcome.artifact.workspace_diff == []
    [result] = outcome.results
    assert not result.passed  # and the worker came back


@pytest.mark.parametrize("backend", BACKENDS)
def test_sandbox_custom_script_is_not_written_through_a_planted_link(
    tmp_path: Path, victim: Path, backend: str
) -> None:
    agent = {
        "type": "command",
        "command": f"mkdir -p .keystone/checks && ln -s {victim} .keystone/checks/verify.py; echo done",
    }
    invariants = {
        "custom": {
            "description": "d",
            "check": {"type": "custom", "script": "verify.py", "runs_in": "sandbox"},
        }
    }
    script = 'import json; print(json.dumps({"passed": True}))\n'
    outcome = _run(tmp_path, backend, agent, {"verify.py": script}, invariants=invariants)
    assert victim.read_text() == SECRET
    [result] = outcome.results
    assert result.passed, result.message
