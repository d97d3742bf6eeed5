"""Reporters: JSON (round trip through score_run), JUnit XML, Markdown and terminal text."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from checks.reporters import (
    REPORT_FORMAT,
    REPORT_VERSION,
    ReportError,
    load_report,
    render_json,
    render_junit,
    render_markdown,
    render_terminal,
    write_reports,
)
from checks.results import CheckResult, FailureCode
from checks.scoring import ExecutionRecord, RunSummary, score_run
from checks.spec.model import Spec

SPEC_DATA: dict[str, Any] = {
    "version": 1,
    "id": "refund-agent",
    "description": "refunds",
    "task": {"prompts": ["Refund order 1042", "Refund order 7"]},
    "agent": {
        "type": "http",
        "endpoint": "http://127.0.0.1:9/",
        "headers": {"Authorization": "Bearer SECRET"},
    },
    "invariants": {
        "says_refund": {
            "description": "mentions refund",
            "severity": "critical",
            "check": {"type": "contains", "value": "refund"},
        },
        "tone": {
            "description": "polite",
            "weight": 0.5,
            "check": {"type": "llm_as_judge", "criteria": "polite"},
        },
        "fast": {
            "description": "fast",
            "when": "tool_faults_active",
            "check": {"type": "latency", "max_ms": 1000},
        },
    },
    "chaos_matrix": [
        {"name": "no-chaos"},
        {"name": "tool-down", "tool_faults": [{"tool": "*", "mode": "error"}]},
    ],
    "replicas": 2,
    "scoring": {"pass_threshold": 0.7, "replica_aggregation": "all"},
    "gates": {"pass_rate_min": 0.5, "judge_avg_min": 0.6},
}


def _result(
    inv: str,
    passed: bool,
    score: float | None = None,
    code: FailureCode | None = None,
    check_type: str = "contains",
    message: str = "",
) -> CheckResult:
    return CheckResult(
        invariant_id=inv,
        check_type=check_type,
        passed=passed,
        score=(1.0 if passed else 0.0) if score is None else score,
        failure_code=code if code else (None if passed else FailureCode.CONTAINS_FAILED),
        message=message,
        details={"elapsed_ms": 12.5},
        severity="critical" if inv == "says_refund" else "medium",
        weight=0.5 if inv == "tone" else 1.0,
    )


def _records() -> list[ExecutionRecord]:
    records = []
    for scenario in ("no-chaos", "tool-down"):
        for prompt_index in (0, 1):
            for replica in (0, 1):
                results = [
                    _result("says_refund", True),
                    _result("tone", True, 0.9, check_type="llm_as_judge"),
                ]
                if scenario == "tool-down":
                    ok = not (prompt_index == 1 and replica == 1)
                    results.append(
                        _result(
                            "fast",
                            ok,
                            code=None if ok else FailureCode.LATENCY_EXCEEDED,
                            check_type="latency",
                            message='took 2000 ms > 1000 ms <slow> & "late" \x07',
                        )
                    )
                records.append(
                    ExecutionRecord(
                        id=f"{scenario}-{prompt_index}-{replica}",
                        scenario=scenario,
                        prompt_index=prompt_index,
                        prompt=SPEC_DATA["task"]["prompts"][prompt_index],
                        replica=replica,
                        duration_ms=100.0 * (replica + 1),
                        cost_usd=0.001,
                        input_tokens=10,
                        output_tokens=3,
                        results=results,
                        pillar="chaos" if scenario == "tool-down" else "contract",
                        tool_calls=2,
                        output="refund issued",
                    )
                )
    records.append(
        ExecutionRecord(
            id="check-error",
            scenario="no-chaos",
            prompt_index=0,
            replica=2,
            status="error",
            results=[
                _result(
                    "says_refund", False, code=FailureCode.CHECK_ERROR, message="script exited 2"
                )
            ],
            forbidden_violations=[{"rule": "http_except", "service": "evil.example"}],
        )
    )
    return records


@pytest.fixture
def summary() -> RunSummary:
    return score_run(Spec.from_dict(SPEC_DATA), _records(), kappa=0.8)


# ---------------------------------------------------------------- JSON


def test_json_report_round_trips_to_the_same_scores(summary: RunSummary) -> None:
    text = render_json(summary)
    data = json.loads(text)
    assert (data["format"], data["version"]) == (REPORT_FORMAT, REPORT_VERSION)
    assert len(data["executions"]) == len(summary.records)
    loaded = load_report(data)
    again = score_run(loaded.spec, loaded.records, kappa=loaded.kappa)
    assert again.to_dict() == summary.to_dict()
    assert data["summary"] == json.loads(json.dumps(summary.to_dict()))


def test_json_report_keeps_scoring_parts_and_drops_agent_secrets(summary: RunSummary) -> None:
    data = json.loads(render_json(summary))
    spec = data["spec"]
    assert set(spec["invariants"]) == {"says_refund", "tone", "fast"}
    assert [s["name"] for s in spec["chaos_matrix"]] == ["no-chaos", "tool-down"]
    assert spec["scoring"]["pass_threshold"] == 0.7 and spec["gates"]["judge_avg_min"] == 0.6
    assert spec["agent"] == {"type": "http"}
    assert "SECRET" not in json.dumps(data)
    first = data["executions"][0]
    assert first["results"][0]["invariant_id"] == "says_refund"
    assert set(first) >= {
        "id",
        "scenario",
        "prompt_index",
        "replica",
        "status",
        "duration_ms",
        "cost_usd",
        "results",
        "forbidden_violations",
        "pillar",
    }


def test_rescoring_after_editing_a_result_changes_the_verdict(
    summary: RunSummary, tmp_path: Path
) -> None:
    # What the web app does when a human overrides a judge score: edit, call score_run again.
    data = json.loads(render_json(summary))
    for execution in data["executions"]:
        for res in execution["results"]:
            if res["invariant_id"] == "tone":
                res["score"], res["passed"], res["failure_code"] = (
                    0.1,
                    False,
                    "JUDGE_BELOW_THRESHOLD",
                )
    loaded = load_report(data)
    rescored = score_run(loaded.spec, loaded.records, kappa=loaded.kappa)
    judge_gate = next(g for g in rescored.gates if g.name == "judge_avg_min")
    assert judge_gate.actual == pytest.approx(0.1) and not judge_gate.passed


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not JSON"),
        ('{"format": "other"}', "not a Keystone run report"),
        ('{"format": "keystone-run-report", "version": 99}', "unsupported report version"),
        ('{"format": "keystone-run-report", "version": 1, "executions": []}', "no 'spec'"),
        ('{"format": "keystone-run-report", "version": 1, "spec": {"id": "x"}}', "no 'executions'"),
    ],
)
def test_load_report_rejects_bad_input_with_a_clear_message(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ReportError, match=message):
        load_report(path)


def test_load_report_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="cannot read"):
        load_report(tmp_path / "absent.json")


# ---------------------------------------------------------------- JUnit


def test_junit_has_one_testcase_per_execution_and_invariant(summary: RunSummary) -> None:
    root = ET.fromstring(render_junit(summary))
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"refund-agent.no-chaos", "refund-agent.tool-down", "refund-agent.gates"}
    chaos_cases = suites["refund-agent.tool-down"].findall("testcase")
    assert len(chaos_cases) == 4 * 3  # 2 prompts x 2 replicas x 3 invariants
    assert {c.get("classname") for c in chaos_cases} == {"refund-agent.tool-down"}
    names = [c.get("name") for c in chaos_cases]
    assert "fast [prompt 1, replica 1]" in names and "says_refund [prompt 0, replica 0]" in names
    result_count = sum(len(r.results) for r in summary.records)
    forbidden = sum(1 for r in summary.records if r.forbidden_violations)
    assert int(root.get("tests", "0")) == result_count + forbidden + len(summary.gates)


def test_junit_failures_carry_the_failure_code_and_escaped_message(summary: RunSummary) -> None:
    text = render_junit(summary)
    assert "\x07" not in text
    root = ET.fromstring(text)
    case = next(c for c in root.iter("testcase") if c.get("name") == "fast [prompt 1, replica 1]")
    failure = case.find("failure")
    assert failure is not None
    assert failure.get("type") == "LATENCY_EXCEEDED"
    assert failure.get("message") == 'took 2000 ms > 1000 ms <slow> & "late" \ufffd'
    suite = next(s for s in root.findall("testsuite") if s.get("name") == "refund-agent.tool-down")
    assert (suite.get("failures"), suite.get("errors")) == ("1", "0")


def test_junit_check_errors_are_errors_and_forbidden_is_a_failure(summary: RunSummary) -> None:
    root = ET.fromstring(render_junit(summary))
    case = next(
        c for c in root.iter("testcase") if c.get("name") == "says_refund [prompt 0, replica 2]"
    )
    error = case.find("error")
    assert error is not None and error.get("type") == "CHECK_ERROR" and case.find("failure") is None
    forbidden = next(
        c for c in root.iter("testcase") if c.get("name") == "forbidden [prompt 0, replica 2]"
    )
    failure = forbidden.find("failure")
    assert failure is not None and failure.get("type") == "FORBIDDEN_VIOLATION"


def test_junit_properties_hold_overall_and_pillar_scores(summary: RunSummary) -> None:
    root = ET.fromstring(render_junit(summary))
    props = {p.get("name"): p.get("value") for p in root.find("testsuite").iter("property")}  # type: ignore[union-attr]
    assert summary.overall is not None
    assert float(props["overall"] or "nan") == pytest.approx(summary.overall, abs=1e-5)
    assert props["pillar.mutation"] == "" and props["verdict"] == summary.verdict
    assert "pillar.contract" in props and "pillar.chaos" in props


def test_junit_gate_suite_marks_failed_gates() -> None:
    spec = Spec.from_dict({**SPEC_DATA, "gates": {"cost_max_usd": 0.0001}})
    root = ET.fromstring(render_junit(score_run(spec, _records())))
    gates = next(s for s in root.findall("testsuite") if s.get("name") == "refund-agent.gates")
    cost = next(c for c in gates.findall("testcase") if c.get("name") == "cost_max_usd")
    assert cost.find("failure") is not None and cost.find("failure").get("type") == "GATE_FAILED"  # type: ignore[union-attr]


# ---------------------------------------------------------------- Markdown and terminal


def test_markdown_has_summary_gates_matrix_and_failures(summary: RunSummary) -> None:
    text = render_markdown(summary)
    assert text.startswith("# Keystone run: refund-agent")
    for heading in ("## Gates", "## Scenario x prompt", "## Invariant x scenario", "## Failures"):
        assert heading in text
    assert "| judge_avg_min | pass |" in text
    assert "| says_refund (critical) |" in text
    assert "LATENCY_EXCEEDED" in text and "FORBIDDEN_VIOLATION" in text


def test_markdown_escapes_pipes_in_messages() -> None:
    records = _records()
    records[0].results[0] = _result("says_refund", False, message="a | b\nc")
    text = render_markdown(score_run(Spec.from_dict(SPEC_DATA), records))
    assert "a \\| b c" in text


def test_terminal_summary_is_plain_without_tty_and_coloured_with_it(summary: RunSummary) -> None:
    plain = render_terminal(summary)
    assert "\x1b[" not in plain
    assert f"refund-agent: {summary.verdict.upper()} (exit {summary.exit_code})" in plain
    assert "pass_rate_min" in plain and "tool-down / prompt 1" in plain and "FLAKY" in plain
    coloured = render_terminal(summary, color=True)
    assert "\x1b[" in coloured


def test_terminal_counts_one_execution_in_the_singular() -> None:
    spec = Spec.from_dict({**SPEC_DATA, "task": {"prompts": ["Refund order 1042"]}})
    one = render_terminal(
        score_run(spec, [ExecutionRecord(id="1", scenario="no-chaos", prompt_index=0)])
    )
    assert "  1 execution  mean " in one
    assert "  3 executions  mean " in render_terminal(_threshold_summary())


def test_write_reports_writes_each_requested_file(summary: RunSummary, tmp_path: Path) -> None:
    written = write_reports(
        summary,
        json_path=tmp_path / "out" / "r.json",
        junit_path=tmp_path / "out" / "r.xml",
        markdown_path=tmp_path / "r.md",
    )
    assert [p.name for p in written] == ["r.json", "r.xml", "r.md"]
    assert json.loads((tmp_path / "out" / "r.json").read_text())["format"] == REPORT_FORMAT
    ET.parse(tmp_path / "out" / "r.xml")


# ---------------------------------------------------------------- why a verdict (issue 12, 8-9)


def _threshold_summary() -> RunSummary:
    """One execution whose every invariant passed and whose composite is below threshold,
    one whose provider answered 401, and one that passes."""
    spec = Spec.from_dict(
        {
            "version": 1,
            "id": "why",
            "task": {"prompts": ["a", "b", "c"]},
            "agent": {"type": "command", "command": "echo"},
            "invariants": {
                "judged": {"description": "d", "check": {"type": "llm_as_judge", "criteria": "c"}}
            },
            "scoring": {"pass_threshold": 0.85},
        }
    )

    def judged(score: float) -> CheckResult:
        return CheckResult("judged", "llm_as_judge", passed=True, score=score)

    records = [
        ExecutionRecord(id="low", scenario="no-chaos", prompt_index=0, results=[judged(0.8)]),
        ExecutionRecord(
            id="auth",
            scenario="no-chaos",
            prompt_index=1,
            status="provider_error",
            error="gateway: upstream http://127.0.0.1:9/v1 refused the credentials (401)",
            results=[judged(1.0)],
        ),
        ExecutionRecord(id="ok", scenario="no-chaos", prompt_index=2, results=[judged(0.9)]),
    ]
    return score_run(spec, records)


def test_junit_names_why_an_execution_failed_when_every_invariant_passed() -> None:
    root = ET.fromstring(render_junit(_threshold_summary()))
    verdict = next(
        c for c in root.iter("testcase") if c.get("name") == "verdict [prompt 0, replica 0]"
    )
    failure = verdict.find("failure")
    assert failure is not None
    assert failure.get("message") == "composite 0.8 < pass_threshold 0.85"


def test_junit_gives_a_provider_error_its_own_error_element() -> None:
    root = ET.fromstring(render_junit(_threshold_summary()))
    case = next(
        c for c in root.iter("testcase") if c.get("name") == "execution [prompt 1, replica 0]"
    )
    error = case.find("error")
    assert error is not None and error.get("type") == "PROVIDER_ERROR"
    assert "(401)" in (error.get("message") or "")
    names = [c.get("name") for c in root.iter("testcase")]
    assert "verdict [prompt 2, replica 0]" not in names  # it passed: nothing to explain


def test_terminal_and_markdown_say_why_executions_did_not_pass() -> None:
    summary = _threshold_summary()
    terminal = render_terminal(summary)
    assert "Why executions did not pass" in terminal
    assert "no-chaos / prompt 0 / replica 0: composite 0.8 < pass_threshold 0.85" in terminal
    assert "(401)" in terminal
    markdown = render_markdown(summary)
    assert "## Why executions did not pass" in markdown
    assert (
        "| no-chaos / prompt 0 / replica 0 | fail | composite 0.8 < pass_threshold 0.85 |"
        in markdown
    )


def test_json_report_gives_each_invariants_mean_min_max_over_the_replicas(
    summary: RunSummary,
) -> None:
    """Issue 12, item 18: per-invariant scores across replicas (KindLM's assertionScores)."""
    groups = {g["key"]: g for g in json.loads(render_json(summary))["summary"]["groups"]}
    flaky = groups["tool-down / prompt 1"]["invariant_scores"]
    assert flaky["fast"] == {"n": 2, "passed": 1, "mean": 0.5, "min": 0.0, "max": 1.0}
    assert flaky["tone"] == {"n": 2, "passed": 2, "mean": 0.9, "min": 0.9, "max": 0.9}
    # The errored replica's check error counts as a 0 in its group.
    calm = groups["no-chaos / prompt 0"]["invariant_scores"]
    assert calm["says_refund"] == {"n": 3, "passed": 2, "mean": 2 / 3, "min": 0.0, "max": 1.0}
    assert "fast" not in calm  # not active without tool faults


def test_a_gate_that_passed_below_1_is_marked_in_the_matrix_under_a_fail() -> None:
    """Issue 12, item 10: a judge gate scoring 0.9 (its own threshold 0.7) forces the
    composite to 0; the matrix must not show a bare "pass 1/1" under that FAIL."""
    spec = Spec.from_dict(
        {
            "version": 1,
            "id": "judge-gate",
            "task": {"prompt": "p"},
            "agent": {"type": "command", "command": "echo hi"},
            "invariants": {
                "tone": {
                    "description": "polite",
                    "gate": True,
                    "check": {"type": "llm_as_judge", "criteria": "polite"},
                }
            },
        }
    )
    judged = _result("tone", True, 0.9, check_type="llm_as_judge")
    judged.gate = True
    summary = score_run(spec, [ExecutionRecord(id="e", scenario="no-chaos", results=[judged])])
    assert summary.verdict == "fail"
    [cell] = summary.matrix
    assert (cell.status, cell.gates_below_one, cell.label) == ("pass", 1, "pass 1/1 (gate < 1.0)")
    assert "tone (medium)     pass 1/1 (gate < 1.0)" in render_terminal(summary)
    assert "| tone (medium) | pass 1/1 (gate < 1.0) |" in render_markdown(summary)
    assert json.loads(render_json(summary))["summary"]["matrix"][0]["gates_below_one"] == 1


def test_markdown_stays_under_githubs_comment_limit_and_says_what_it_left_out() -> None:
    spec = Spec.from_dict(SPEC_DATA)
    records = []
    for index in range(3000):  # 3,000 executions, each failing with a long message
        records.append(
            ExecutionRecord(
                id=f"e{index}",
                scenario=f"scenario-{index % 400}",
                prompt_index=index % 2,
                prompt="p",
                replica=index // 800,
                duration_ms=1.0,
                cost_usd=0.0,
                input_tokens=0,
                output_tokens=0,
                results=[_result("says_refund", False, message="x" * 300)],
                pillar="contract",
                tool_calls=0,
                output="",
            )
        )
    text = render_markdown(score_run(spec, records))
    assert len(text) < 65_536
    assert "more failures in the JSON report" in text or "left out" in text
    assert text.rstrip().endswith("on the run's page._")  # the closing note, not a cut row
    small = render_markdown(score_run(spec, _records()))
    assert "left out" not in small


def test_a_report_that_cannot_be_written_whole_leaves_the_previous_one(
    summary: RunSummary, tmp_path: Path, file_size_limit
) -> None:
    """A full disk (here a file-size limit) while the JSON report is written: the report of
    the last run is still there, complete, not a truncated file a CI system cannot parse."""
    previous = tmp_path / "r.json"
    write_reports(summary, json_path=previous)
    complete = previous.read_text()
    with file_size_limit(len(complete) // 2), pytest.raises(OSError):
        write_reports(summary, json_path=previous)
    assert previous.read_text() == complete
    assert os.listdir(tmp_path) == ["r.json"]
