"""The `keystone` command line: validate and score, in-process and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from checks.reporters import write_reports
from checks.results import CheckResult, FailureCode
from checks.scoring import ExecutionRecord, score_run
from checks.spec.model import Spec
from evaluations.cli import main
from tests.cli_helpers import run_keystone

ROOT = Path(__file__).resolve().parents[2]

VALID_SPEC = """\
version: 1
id: refund-agent
task:
  prompts: ["Refund order 1042", "Refund order 7"]
agent:
  type: command
  command: "echo refunded"
tools:
  - {name: refunds, url: "http://127.0.0.1:9000"}
invariants:
  says_refund:
    description: "Mentions the refund"
    check: {type: contains, value: "refund"}
  short:
    description: "Short answer"
    check: {type: max_length, max: 200}
chaos_matrix:
  - name: no-chaos
  - name: tool-down
    tool_faults:
      - {tool: "*", mode: error, error_code: 503}
"""

INVALID_SPEC = """\
version: 1
id: refund-agent
task: {prompt: "Refund"}
agent: {type: command, command: "echo hi"}
invariants:
  tests_pass:
    description: "All tests pass"
    check:
      type: comand_exit
      command: "true"
"""


def _keystone(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return run_keystone(*args, env=env, cwd=cwd)


def _report(tmp_path: Path, *, passing: bool, gates: dict[str, Any] | None = None) -> Path:
    data: dict[str, Any] = {
        "version": 1,
        "id": "refund-agent",
        "task": {"prompts": ["Refund order 1042"]},
        "agent": {"type": "command", "command": "echo refunded"},
        "invariants": {
            "says_refund": {"description": "d", "check": {"type": "contains", "value": "refund"}}
        },
    }
    if gates is not None:
        data["gates"] = gates
    spec = Spec.from_dict(data)
    result = CheckResult(
        invariant_id="says_refund",
        check_type="contains",
        passed=passing,
        score=1.0 if passing else 0.0,
        failure_code=None if passing else FailureCode.CONTAINS_FAILED,
        message="" if passing else "output does not contain 'refund'",
    )
    records = [
        ExecutionRecord(
            id="e1",
            scenario="no-chaos",
            prompt="Refund order 1042",
            duration_ms=120.0,
            cost_usd=0.002,
            results=[result],
        )
    ]
    summary = score_run(spec, records)
    path = tmp_path / ("pass.json" if passing else "fail.json")
    write_reports(summary, json_path=path)
    return path


# ---------------------------------------------------------------- validate


def test_validate_accepts_a_valid_spec_and_counts_its_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "refund.yaml"
    spec.write_text(VALID_SPEC)
    assert main(["validate", str(spec)]) == 0
    assert f"{spec}: valid (2 invariants, 2 scenarios)" in capsys.readouterr().out


def test_validate_counts_one_invariant_and_one_scenario_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "one.yaml"
    spec.write_text(
        "version: 1\nid: one\ntask: {prompts: [p]}\n"
        "agent: {type: command, command: 'true'}\n"
        "invariants: {ran: {description: it ran, check: {type: completes}}}\n"
    )
    assert main(["validate", str(spec)]) == 0
    assert f"{spec}: valid (1 invariant, 1 scenario)" in capsys.readouterr().out


def test_validate_reports_each_error_with_its_position_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(VALID_SPEC)
    bad.write_text(INVALID_SPEC)
    assert main(["validate", str(good), str(bad)]) == 2
    captured = capsys.readouterr()
    assert f"{good}: valid" in captured.out
    assert f"{bad}: invariants.tests_pass.check.type:" in captured.err
    assert "comand_exit" in captured.err and "line 9" in captured.err
    assert f"{bad}: invalid (1 error)" in captured.err
    assert "1 of 2 spec(s) invalid" in captured.err


def test_validate_a_missing_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml" in capsys.readouterr().err


def test_validate_as_a_real_subprocess(tmp_path: Path) -> None:
    spec = tmp_path / "refund.yaml"
    spec.write_text(VALID_SPEC)
    bad = tmp_path / "bad.yaml"
    bad.write_text(INVALID_SPEC)
    ok = _keystone("validate", str(spec))
    assert ok.returncode == 0, ok.stderr
    assert "valid (2 invariants, 2 scenarios)" in ok.stdout
    failed = _keystone("validate", str(bad))
    assert failed.returncode == 2
    assert "unknown check type 'comand_exit'" in failed.stderr


# ---------------------------------------------------------------- score


def test_score_a_passing_report_exits_0_and_writes_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report(tmp_path, passing=True)
    junit, markdown, again = tmp_path / "r.xml", tmp_path / "r.md", tmp_path / "again.json"
    code = main(
        [
            "score",
            str(report),
            "--junit",
            str(junit),
            "--markdown",
            str(markdown),
            "--json",
            str(again),
            "--color",
            "never",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "refund-agent: PASS (exit 0)" in out and "\x1b[" not in out
    assert ET.parse(junit).getroot().get("failures") == "0"
    assert "# Keystone run: refund-agent" in markdown.read_text()
    assert json.loads(again.read_text())["summary"]["exit_code"] == 0


def test_score_a_failing_report_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["score", str(_report(tmp_path, passing=False))]) == 1
    out = capsys.readouterr().out
    assert "FAIL (exit 1)" in out and "CONTAINS_FAILED" in out


def test_score_recomputes_instead_of_trusting_the_stored_summary(tmp_path: Path) -> None:
    path = _report(tmp_path, passing=True)
    data = json.loads(path.read_text())
    data["summary"]["exit_code"] = 0
    data["executions"][0]["results"][0].update(
        passed=False, score=0.0, failure_code="CONTAINS_FAILED"
    )
    path.write_text(json.dumps(data))
    assert main(["score", str(path)]) == 1


def test_score_kappa_option_feeds_the_kappa_gate(tmp_path: Path) -> None:
    report = _report(
        tmp_path, passing=True, gates={"pass_rate_min": 1.0, "judge_human_kappa_min": 0.6}
    )
    assert main(["score", str(report)]) == 0  # no kappa: the gate is empty and passes
    assert main(["score", str(report), "--kappa", "0.4"]) == 1
    assert main(["score", str(report), "--kappa", "0.75"]) == 0


def test_score_as_a_real_subprocess_exits_with_the_gate_verdict(tmp_path: Path) -> None:
    passing = _keystone("score", str(_report(tmp_path, passing=True)))
    assert passing.returncode == 0, passing.stderr
    assert "PASS (exit 0)" in passing.stdout
    junit = tmp_path / "fail.xml"
    failing = _keystone("score", str(_report(tmp_path, passing=False)), "--junit", str(junit))
    assert failing.returncode == 1, failing.stderr
    assert "FAIL (exit 1)" in failing.stdout
    case = ET.parse(junit).getroot().find(".//testcase")
    assert case is not None and case.find("failure") is not None


def test_score_resilience_prints_only_the_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Like `flakestorm contract score`: the number alone, for a CI script to read.
    assert main(["score", str(_report(tmp_path, passing=True)), "--resilience"]) == 0
    assert capsys.readouterr().out == "100.0\n"
    assert main(["score", str(_report(tmp_path, passing=False)), "--metric", "resilience"]) == 0
    assert capsys.readouterr().out == "0.0\n"


def test_score_metric_prints_the_named_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = str(_report(tmp_path, passing=True))
    figures = {}
    for metric in ("overall", "pass_rate", "cost_usd", "p95_duration_ms"):
        assert main(["score", report, "--metric", metric]) == 0
        figures[metric] = capsys.readouterr().out
    assert figures == {
        "overall": "1.000\n",
        "pass_rate": "1.000\n",
        "cost_usd": "0.002000\n",
        "p95_duration_ms": "120\n",
    }


def test_score_metric_without_data_says_so_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["score", str(_report(tmp_path, passing=True)), "--metric", "judge_mean"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no data for judge_mean" in captured.err


@pytest.mark.parametrize("content", [None, "{broken", '{"format": "something-else"}'])
def test_score_unusable_input_exits_2_with_a_message(
    tmp_path: Path, content: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    assert main(["score", str(path)]) == 2
    assert "keystone score:" in capsys.readouterr().err


# ---------------------------------------------------------------- the command itself


def test_cli_module_does_not_import_django() -> None:
    code = "import sys, evaluations.cli; sys.exit(1 if any(m == 'django' or m.startswith('django.') for m in sys.modules) else 0)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_no_command_and_unknown_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["score"]) == 2  # RESULTS.json is required
    assert main(["--help"]) == 0
    assert "validate" in capsys.readouterr().out
