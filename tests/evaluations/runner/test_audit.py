"""Every execution writes `.keystone/audit.jsonl` and `.keystone/trace.jsonl` and hands their
paths, and the cell's scenario parameters, to custom checks (reference 000; issue 12, item 13).
Reference 000's own example script (audit_files/validate_api_responses.py, its code as the
document prints it, indented) runs unchanged against them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from checks.context import SecurityPolicy
from checks.planning import PlannedExecution
from checks.spec.model import Spec
from evaluations.runner.harness import HarnessConfig, run_execution

HERE = Path(__file__).parent / "audit_files"

# Two calls to the mock: /orders/1 answers with id and status, /orders/2 without a status.
AGENT = """
import os, urllib.request
base = os.environ["KEYSTONE_SERVICE_SHOP_URL"]
for order in ("1", "PATHS"):
    urllib.request.urlopen(base + "/orders/" + order, timeout=10).read()
open("note.txt", "w").write("done")
print("ok")
"""

CONTEXT_DUMP = """
import json, sys
ctx = json.load(sys.stdin)
# A host script sees a read-only copy of the workspace, removed afterwards: what it read
# travels back in the verdict's details.
ctx["audit"] = open(ctx["audit_log_path"]).read()
ctx["trace"] = open(ctx["trace_path"]).read()
print(json.dumps({"passed": True, "details": {"context": ctx}}))
"""


def _raw(second_order: str, runs_in: str) -> dict[str, Any]:
    return {
        "version": 1,
        "id": "audit",
        "task": {"prompt": "look up two orders"},
        "agent": {"type": "command", "command": "python agent.py", "timeout": 30},
        "sandbox": {"backend": "local", "workspace": "."},
        "llm": {
            "provider": "scripted",
            "model": "scripted-audit",
            "rules": [{"reply": {"content": "hi"}}],
        },
        "services": [
            {
                "name": "shop",
                "type": "http_mock",
                "record": True,
                "routes": [
                    {"method": "GET", "path": "/orders/1", "response": {"id": 1, "status": "open"}},
                    {"method": "GET", "path": "/orders/2", "response": {"id": 2}},
                    {"method": "GET", "path": "/orders/3", "response": {"id": 3, "status": "paid"}},
                ],
            }
        ],
        "invariants": {
            "api_responses_valid": {
                "description": "Every API response is valid JSON with required fields",
                "check": {
                    "type": "custom",
                    "script": "checks/validate_api_responses.py",
                    "runs_in": runs_in,
                },
            },
            "context_seen": {
                "description": "the custom-check context, kept for the test",
                "check": {"type": "custom", "script": "checks/dump_context.py", "runs_in": "host"},
            },
        },
    }


def _run(tmp_path: Path, second_order: str, runs_in: str) -> Any:
    spec_dir = tmp_path / "spec"
    (spec_dir / "checks").mkdir(parents=True)
    (spec_dir / "agent.py").write_text(AGENT.replace("PATHS", second_order))
    shutil.copy(HERE / "validate_api_responses.py", spec_dir / "checks")
    (spec_dir / "checks" / "dump_context.py").write_text(CONTEXT_DUMP)
    spec = Spec.from_dict(_raw(second_order, runs_in))
    planned = PlannedExecution(
        scenario="no-chaos",
        prompt_index=0,
        prompt="look up two orders",
        replica=1,
        pillar="contract",
        invariant_ids=["api_responses_valid", "context_seen"],
    )
    config = HarnessConfig(
        workspaces_root=tmp_path / "workspaces",
        spec_dir=spec_dir,
        policy=SecurityPolicy(allow_host_scripts=True),
        keep_workspace=True,
    )
    outcome = run_execution(spec, planned, config, execution_key="t-1", seed=11)
    assert outcome.artifact.status == "success", (outcome.artifact.error, outcome.artifact.stderr)
    return outcome


@pytest.mark.parametrize("runs_in", ["host", "sandbox"])
def test_reference_000_example_script_passes_unchanged_on_valid_responses(
    tmp_path: Path, runs_in: str
) -> None:
    outcome = _run(tmp_path, "3", runs_in)
    result = {r.invariant_id: r for r in outcome.results}["api_responses_valid"]
    assert result.passed, result.message
    assert result.message == "2/2 responses valid"


def test_reference_000_example_script_fails_on_a_response_without_status(tmp_path: Path) -> None:
    outcome = _run(tmp_path, "2", "sandbox")
    result = {r.invariant_id: r for r in outcome.results}["api_responses_valid"]
    assert not result.passed
    assert result.message == "1/2 responses valid"


def test_the_context_names_both_files_and_the_cells_parameters(tmp_path: Path) -> None:
    outcome = _run(tmp_path, "3", "host")
    context = {r.invariant_id: r for r in outcome.results}["context_seen"].details["context"]
    assert context["audit_log_path"].endswith("/.keystone/audit.jsonl")
    audit = [json.loads(line) for line in context["audit"].splitlines()]
    trace = [json.loads(line) for line in context["trace"].splitlines()]
    assert [e["type"] for e in audit] == ["command", "http_call", "http_call", "file_write"]
    assert audit[0]["details"]["command"] == "python agent.py"
    assert audit[1]["details"]["path"] == "/orders/1"
    assert json.loads(audit[1]["details"]["response_body"]) == {"id": 1, "status": "open"}
    assert audit[3]["details"] == {"path": "note.txt", "change": "added", "size": 4}
    assert trace == []  # this agent never called its model or a tool
    assert context["scenario_params"]["scenario"] == "no-chaos"
    assert context["scenario_params"]["model"] == "scripted-audit"
    assert context["scenario_params"]["replica"] == 1
    assert context["scenario_params"]["seed"] == 11


def test_a_link_the_agent_planted_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "host-secret.txt"
    victim.write_text("SECRET=do-not-touch")
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "agent.py").write_text(
        "import os\n"
        "os.makedirs('.keystone', exist_ok=True)\n"
        f"os.symlink({str(victim)!r}, '.keystone/audit.jsonl')\n"
        f"os.symlink({str(victim)!r}, '.keystone/trace.jsonl')\n"
        "print('planted')\n"
    )
    spec = Spec.from_dict(
        {
            "version": 1,
            "id": "plant",
            "task": {"prompt": "p"},
            "agent": {"type": "command", "command": "python agent.py", "timeout": 30},
            "sandbox": {"backend": "local", "workspace": "."},
            # A check that reads the workspace: the files are written for it.
            "invariants": {"ok": {"description": "ok", "check": {"type": "file_exists", "path": "agent.py"}}},
        }
    )  # fmt: skip
    planned = PlannedExecution(
        scenario="no-chaos", prompt_index=0, prompt="p", replica=0, pillar="contract",
        invariant_ids=["ok"],
    )  # fmt: skip
    config = HarnessConfig(
        workspaces_root=tmp_path / "workspaces", spec_dir=spec_dir, keep_workspace=True
    )
    outcome = run_execution(spec, planned, config, execution_key="t-2", seed=0)
    assert outcome.results[0].passed
    assert victim.read_text() == "SECRET=do-not-touch"
    audit = outcome.workspace / ".keystone" / "audit.jsonl"
    assert not audit.is_symlink()
    assert json.loads(audit.read_text().splitlines()[0])["type"] == "command"


def test_the_files_are_written_only_where_a_check_can_read_them(tmp_path: Path) -> None:
    """Checks on the output alone never read the workspace: no audit log or trace is made
    (each file made and removed costs every execution kernel time); a check that reads the
    workspace gets both."""
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    output_only = {"type": "output_not_empty"}
    reads = {"type": "command_exit", "command": "test -s .keystone/audit.jsonl"}
    written = {}
    for name, check in (("output", output_only), ("reads", reads)):
        spec = Spec.from_dict(
            {
                "version": 1,
                "id": "audit-when",
                "task": {"prompt": "p"},
                "agent": {"type": "command", "command": "echo hi", "timeout": 30},
                "sandbox": {"backend": "local"},
                "invariants": {"it": {"description": "it", "check": check}},
            }
        )
        planned = PlannedExecution(
            scenario="no-chaos", prompt_index=0, prompt="p", replica=0, pillar="contract",
            invariant_ids=["it"],
        )  # fmt: skip
        config = HarnessConfig(
            workspaces_root=tmp_path / name, spec_dir=spec_dir, keep_workspace=True
        )
        outcome = run_execution(spec, planned, config, execution_key=f"t-{name}", seed=0)
        assert outcome.results[0].passed, outcome.results[0].message
        own = outcome.workspace / ".keystone"
        written[name] = sorted(p.name for p in own.iterdir() if p.name.endswith(".jsonl"))
    assert written == {"output": [], "reads": ["audit.jsonl", "trace.jsonl"]}
