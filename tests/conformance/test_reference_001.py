"""Reference 001 (Flakestorm behavioral contracts): its configuration block, verbatim (the
`contract:` layout, re-indented), run through `keystone run` and `keystone score`.

The document leaves out the agent and its tool; the agent here cites a source and quotes a
dollar figure, which the contract forbids while tools are failing.

One thing in the document does not do what it says: its pattern is single-quoted with
doubled backslashes, so the regex starts with a literal backslash followed by the end of the
text and never matches a dollar figure (in Flakestorm's Python as in Keystone). The first
test runs it verbatim and shows exactly that; the second writes the regex the description
means.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import embedded_env, run_keystone

SPEC = """\
version: 1
id: finance-contract
task: {prompt: "What is ACME's share price?"}
agent: {type: command, command: "echo 'According to the source, ACME trades at $12.50'"}
sandbox: {backend: local}
tools:
  - {name: market_data_api, url: "http://127.0.0.1:9/quote"}
contract:
  name: "Finance Agent Contract"
  description: "Invariants that must hold under all failure conditions"
  invariants:
    - id: always-cite-source
      type: regex
      pattern: "(?i)(source|according to|reference)"
      severity: critical
      when: always
      description: "Must always cite a data source"
    - id: never-fabricate-when-tools-fail
      type: regex
      pattern: '\\\\$[\\\\d,]+\\\\.\\\\d{2}'
      negate: true
      severity: critical
      when: tool_faults_active
      description: "Must not return dollar figures when tools are failing"
    - id: max-latency
      type: latency
      max_ms: 60000
      severity: medium
      when: always
  chaos_matrix:
    - name: "no-chaos"
      tool_faults: []
      llm_faults: []
    - name: "search-tool-down"
      tool_faults:
        - tool: market_data_api
          mode: error
          error_code: 503
"""


def _run(tmp_path: Path, text: str) -> tuple[dict, object, dict[str, str]]:
    spec = tmp_path / "flakestorm.yaml"
    spec.write_text(text)
    report = tmp_path / "report.json"
    env = embedded_env(tmp_path / "home")
    assert run_keystone("validate", str(spec), env=env).returncode == 0
    done = run_keystone("run", str(spec), "--json", str(report), env=env)
    return json.loads(report.read_text())["summary"], done, env


def test_the_verbatim_contract_runs_and_its_escaped_pattern_never_matches(
    tmp_path: Path,
) -> None:
    summary, done, _env = _run(tmp_path, SPEC)
    assert done.returncode == 0, done.stdout + done.stderr
    cells = {(c["invariant_id"], c["scenario"]): c["passed"] for c in summary["matrix"]}
    assert cells[("never-fabricate-when-tools-fail", "search-tool-down")] is True
    assert ("never-fabricate-when-tools-fail", "no-chaos") not in cells  # when: tool_faults_active
    assert summary["resilience"]["score"] == 100.0


def test_contract_run_scores_resilience_and_fails_on_a_critical_invariant(
    tmp_path: Path,
) -> None:
    """Resilience = sum(passed x weight) / sum(total x weight) x 100 with critical = 3,
    medium = 1; "any critical failure = automatic fail" whatever the number."""
    meant = SPEC.replace("'\\\\$[\\\\d,]+\\\\.\\\\d{2}'", "'\\$[\\d,]+\\.\\d{2}'")
    assert meant != SPEC
    summary, done, env = _run(tmp_path, meant)
    report = tmp_path / "report.json"
    assert done.returncode == 1, done.stdout + done.stderr
    cells = {(c["invariant_id"], c["scenario"]): c["passed"] for c in summary["matrix"]}
    assert cells == {
        ("always-cite-source", "no-chaos"): True,
        ("always-cite-source", "search-tool-down"): True,
        ("never-fabricate-when-tools-fail", "search-tool-down"): False,
        ("max-latency", "no-chaos"): True,
        ("max-latency", "search-tool-down"): True,
    }
    # (3 + 3 + 0 + 1 + 1) / (3 + 3 + 3 + 1 + 1) = 8 / 11
    assert summary["resilience"]["score"] == pytest.approx(8 / 11 * 100)
    gates = {g["name"]: g["passed"] for g in summary["gates"]}
    assert gates["critical_failures"] is False
    # `flakestorm contract score`: only the number.
    score = run_keystone("score", str(report), "--resilience", env=env)
    assert (score.returncode, score.stdout) == (0, "72.7\n")
