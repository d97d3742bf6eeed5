"""Output artifacts: declared by the spec (a glob and a type) or emitted by the agent in
`.keystone/artifacts.json`, so `output_artifact_present` can pass (issue 12, item 14)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checks.planning import PlannedExecution
from checks.spec.model import Spec
from evaluations.runner.harness import ExecutionOutcome, HarnessConfig, run_execution

AGENT = """
import json, os
os.makedirs("out", exist_ok=True)
open("out/receipt.json", "w").write("{}")
open("out/notes.txt", "w").write("not a receipt")
open("out/report.md", "w").write("# report")
os.symlink("/etc/hostname", "out/stolen.json")  # a link: never an artifact
os.makedirs(".keystone", exist_ok=True)
json.dump([
    {"type": "report", "path": "out/report.md"},
    {"type": "dashboard", "uri": "https://example.invalid/d/1"},
    {"type": "escape", "path": "../../etc/passwd"},
    {"path": "out/report.md"},
], open(".keystone/artifacts.json", "w"))
print("done")
"""


def _check(artifact_type: str) -> dict[str, Any]:
    return {
        "description": f"a {artifact_type}",
        "check": {"type": "output_artifact_present", "artifact_type": artifact_type},
    }


def _run(tmp_path: Path) -> ExecutionOutcome:
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "agent.py").write_text(AGENT)
    types = ["receipt", "report", "dashboard", "escape", "missing"]
    spec = Spec.from_dict(
        {
            "version": 1,
            "id": "outputs",
            "task": {"prompt": "p"},
            "agent": {"type": "command", "command": "python agent.py", "timeout": 30},
            "sandbox": {"backend": "local", "workspace": "."},
            "output_artifacts": [{"path": "out/*.json", "type": "receipt"}],
            "invariants": {name: _check(name) for name in types},
        }
    )
    planned = PlannedExecution(
        scenario="no-chaos", prompt_index=0, prompt="p", replica=0, pillar="contract",
        invariant_ids=types,
    )  # fmt: skip
    config = HarnessConfig(workspaces_root=tmp_path / "workspaces", spec_dir=spec_dir)
    outcome = run_execution(spec, planned, config, execution_key="t-1", seed=0)
    assert outcome.artifact.status == "success", (outcome.artifact.error, outcome.artifact.stderr)
    return outcome


def test_declared_globs_and_emitted_entries_are_recorded_and_checked(tmp_path: Path) -> None:
    outcome = _run(tmp_path)
    passed = {r.invariant_id: r.passed for r in outcome.results}
    assert passed == {
        "receipt": True,
        "report": True,
        "dashboard": True,
        "escape": False,
        "missing": False,
    }
    recorded = [(a.artifact_type, a.path or a.uri) for a in outcome.artifact.output_artifacts]
    assert recorded == [
        ("receipt", "out/receipt.json"),
        ("report", "out/report.md"),
        ("dashboard", "https://example.invalid/d/1"),
    ]


def test_entries_that_cannot_count_are_named_in_warnings(tmp_path: Path) -> None:
    outcome = _run(tmp_path)
    # The sandbox's own warnings (the local backend's user) are not this test's subject.
    assert [w for w in outcome.warnings if w.startswith(".keystone/")] == [
        ".keystone/artifacts.json[2]: 'path' must name a regular file inside the workspace",
        ".keystone/artifacts.json[3]: needs a string 'type'",
    ]
