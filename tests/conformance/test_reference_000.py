"""Reference 000 (Keystone invariants), its examples run through `keystone run`.

The invariant blocks are the document's own, re-indented (the stored text lost its
indentation); only what the document leaves to the reader is added: the spec's header, an
agent, and for `check: { ... }` placeholders a concrete check. Each test says which
example it runs and what the document says the outcome is.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_helpers import embedded_env, run_keystone

HEADER = """\
version: 1
id: {id}
task: {{prompt: "do the task"}}
agent: {{type: command, command: "sh agent.sh"}}
sandbox: {{backend: local, workspace: "."}}
"""


def _run(tmp_path: Path, spec_id: str, body: str, agent: str) -> tuple[int, str, dict]:
    spec_dir = tmp_path / spec_id
    spec_dir.mkdir()
    (spec_dir / "agent.sh").write_text(agent)
    (spec_dir / "spec.yaml").write_text(HEADER.format(id=spec_id) + body)
    report = tmp_path / f"{spec_id}.json"
    done = run_keystone(
        "run",
        str(spec_dir / "spec.yaml"),
        "--json",
        str(report),
        env=embedded_env(tmp_path / "home"),
    )
    summary = json.loads(report.read_text())["summary"] if report.exists() else {}
    return done.returncode, done.stdout + done.stderr, summary


# "Weights and gates": must_pass (gate) + nice_to_have, scoring.pass_threshold 0.85.
WEIGHTS_AND_GATES = """\
invariants:
  must_pass:
    description: "must pass"
    weight: 1.0
    gate: true # if this fails, composite = 0 regardless
    check: {{type: command_exit, command: "{must}"}}
  nice_to_have:
    description: "nice to have"
    weight: 0.3
    check: {{type: command_exit, command: "{nice}"}}
scoring:
  pass_threshold: 0.85
"""


def test_only_nice_to_have_failing_gives_0_77_below_0_85_so_the_scenario_fails(
    tmp_path: Path,
) -> None:
    """ "If only nice_to_have fails, the composite is (1.0 x 1) / (1.0 + 0.3) ~ 0.77 - below
    the 0.85 threshold, so the scenario fails." """
    code, out, summary = _run(
        tmp_path, "weights", WEIGHTS_AND_GATES.format(must="true", nice="false"), "echo done\n"
    )
    [execution] = summary["executions"]
    assert round(execution["composite"], 2) == 0.77
    assert not execution["passed"]
    assert "composite 0.769 < pass_threshold 0.85" in execution["reason"]
    assert code == 1, out
    assert "composite 0.769 < pass_threshold 0.85" in out


def test_a_failing_gate_forces_the_composite_to_0(tmp_path: Path) -> None:
    """ "If must_pass fails, the composite is forced to 0." """
    code, out, summary = _run(
        tmp_path, "gate", WEIGHTS_AND_GATES.format(must="false", nice="true"), "echo done\n"
    )
    [execution] = summary["executions"]
    assert execution["composite"] == 0.0 and execution["gate_failed"] == ["must_pass"]
    assert "gate `must_pass`" in execution["reason"]
    assert code == 1, out


# "file_exists / file_absent" and "file_content", verbatim.
FILE_CHECKS = """\
invariants:
  output_created:
    description: "Output file exists"
    check:
      type: file_exists
      path: "output.json"
  no_temp_files:
    description: "Temp file cleaned up"
    check:
      type: file_absent
      path: ".tmp/cache"
  output_correct:
    description: "Output contains success marker"
    check:
      type: file_content
      path: "output.json"
      contains: '"status": "success"' # substring match
  no_debug_logs:
    description: "No console.log left in source"
    check:
      type: file_content
      path: "src/main.ts"
      not_contains: "console.log"
  matches_pattern:
    description: "Email follows expected format"
    check:
      type: file_content
      path: "draft.txt"
      pattern: "^Subject: Renewal\\\\b" # regex (matches anywhere unless ^/$)
"""

GOOD_AGENT = """\
mkdir -p src
printf '{"status": "success"}' > output.json
printf 'export const x = 1;\\n' > src/main.ts
printf 'Subject: Renewal of your plan\\n\\nHello' > draft.txt
echo done
"""

BAD_AGENT = """\
mkdir -p src .tmp
printf '{"status": "failed"}' > output.json
printf 'console.log(1);\\n' > src/main.ts
printf 'Re: Subject: Renewals\\n' > draft.txt
printf 'x' > .tmp/cache
echo done
"""


def test_file_checks_pass_on_the_workspace_the_document_describes(tmp_path: Path) -> None:
    code, out, summary = _run(tmp_path, "files-good", FILE_CHECKS, GOOD_AGENT)
    assert code == 0, out
    assert summary["verdict"] == "pass"


def test_file_checks_fail_each_with_its_own_reason(tmp_path: Path) -> None:
    code, out, summary = _run(tmp_path, "files-bad", FILE_CHECKS, BAD_AGENT)
    assert code == 1, out
    failed = {c["invariant_id"]: c["failure_codes"] for c in summary["matrix"] if not c["passed"]}
    assert failed == {
        "no_temp_files": ["FILE_PRESENT"],
        "output_correct": ["CONTAINS_FAILED"],
        "no_debug_logs": ["NOT_CONTAINS_FAILED"],
        "matches_pattern": ["PATTERN_FAILED"],
    }
