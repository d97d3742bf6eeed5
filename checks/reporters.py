"""Reports of a scored run: terminal text, JSON (re-scorable), JUnit XML and Markdown.

The JSON shape is documented in docs/scoring.md ("JSON report"); `load_report` reads it
back so `keystone score` can recompute everything with `score_run`.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from checks.artifact import NO_VERDICT_STATUSES
from checks.output_files import write_whole
from checks.pricing import format_usd
from checks.report_model import ExecutionRecord, ExecutionScore, RunSummary
from checks.results import CheckResult
from checks.spec.model import Spec
from checks.wording import counted

REPORT_FORMAT = "keystone-run-report"
REPORT_VERSION = 1
# The parts of a spec that scoring reads; the rest (agent command, env, services) stays out of
# reports, which get attached to CI jobs and may be public.
SPEC_SCORING_KEYS = (
    "version",
    "id",
    "description",
    "task",
    "invariants",
    "chaos_matrix",
    "forbidden",
    "replicas",
    "isolation",
    "scoring",
    "gates",
)
AGENT_SCORING_KEYS = ("type", "reset_endpoint", "reset_function")


class ReportError(ValueError):
    """A JSON report that cannot be read or is not in the documented shape."""


# ---------------------------------------------------------------- JSON


def spec_scoring_dict(spec: Spec) -> dict[str, Any]:
    raw = spec.raw
    data: dict[str, Any] = {k: raw[k] for k in SPEC_SCORING_KEYS if k in raw}
    data.setdefault("version", 1)
    data["id"] = spec.id
    data.setdefault("task", {"prompts": list(spec.prompts)})
    data.setdefault("invariants", {i.id: _invariant_dict(i) for i in spec.invariants.values()})
    agent = spec.agent
    data["agent"] = {k: agent[k] for k in AGENT_SCORING_KEYS if k in agent}
    return data


def _invariant_dict(invariant: Any) -> dict[str, Any]:
    return {
        "description": invariant.description,
        "weight": invariant.weight,
        "gate": invariant.gate,
        "severity": invariant.severity,
        "when": invariant.when,
        "negate": invariant.negate,
        "dimensions": list(invariant.dimensions),
        "probes": list(invariant.probes),
        "check": dict(invariant.check),
    }


def report_dict(summary: RunSummary) -> dict[str, Any]:
    if summary.spec is None:
        raise ValueError("a RunSummary without its spec cannot be written as a JSON report")
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "spec": spec_scoring_dict(summary.spec),
        "kappa": summary.kappa,
        "executions": [record.to_dict() for record in summary.records],
        "summary": summary.to_dict(),
    }


_REPORT_ENCODER = json.JSONEncoder(indent=2, default=str)


def render_json(summary: RunSummary) -> str:
    return "".join(json_chunks(summary))


def json_chunks(summary: RunSummary) -> Iterator[str]:
    """The JSON report a piece at a time, for writing to a file: the whole text of a large
    run's report (every execution's results) never exists at once."""
    yield from _REPORT_ENCODER.iterencode(report_dict(summary))
    yield "\n"


@dataclass(slots=True)
class LoadedReport:
    """A JSON run report read back by `load_report`: score_run's inputs (spec, records, kappa)
    and the summary the report holds."""

    spec: Spec
    records: list[ExecutionRecord]
    kappa: float | None
    summary: dict[str, Any]


def load_report(source: str | Path | dict[str, Any]) -> LoadedReport:
    """Read a JSON report (a path or the parsed mapping) back into score_run's inputs."""
    if isinstance(source, dict):
        data: Any = source
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise ReportError(f"cannot read {source}: {exc.strerror or exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ReportError(
                f"{source} is not JSON: {exc.msg} at line {exc.lineno}, col {exc.colno}"
            ) from exc
    if not isinstance(data, dict) or data.get("format") != REPORT_FORMAT:
        raise ReportError(f"not a Keystone run report (expected format {REPORT_FORMAT!r})")
    if data.get("version") != REPORT_VERSION:
        raise ReportError(
            f"unsupported report version {data.get('version')!r} (this Keystone reads {REPORT_VERSION})"
        )
    spec_data = data.get("spec")
    executions = data.get("executions")
    if not isinstance(spec_data, dict) or "id" not in spec_data:
        raise ReportError("report has no 'spec' mapping with an 'id'")
    if not isinstance(executions, list):
        raise ReportError("report has no 'executions' list")
    try:
        spec = Spec.from_dict(spec_data)
        records = [ExecutionRecord.from_dict(e) for e in executions]
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"report is malformed: {type(exc).__name__}: {exc}") from exc
    kappa = data.get("kappa")
    return LoadedReport(
        spec=spec,
        records=records,
        kappa=float(kappa) if isinstance(kappa, int | float) else None,
        summary=dict(data.get("summary") or {}),
    )


# ---------------------------------------------------------------- terminal

_COLOURS = {"pass": "32", "fail": "31", "flaky": "33", "error": "35", "dim": "2", "bold": "1"}


def render_terminal(summary: RunSummary, *, color: bool = False) -> str:
    def paint(text: str, style: str) -> str:
        code = _COLOURS.get(style)
        return f"\x1b[{code}m{text}\x1b[0m" if color and code else text

    lines: list[str] = []
    verdict = summary.verdict.upper()
    lines.append(
        f"{paint('Keystone', 'bold')} {summary.spec_id}: "
        f"{paint(verdict, summary.verdict)} (exit {summary.exit_code})"
    )
    resilience = summary.resilience
    head = [
        f"overall {_num(summary.overall)}",
        f"pass rate {_ratio(summary)}",
        f"resilience {_pct(resilience.score)}",
    ]
    if resilience.critical_failed:
        head.append(paint(f"CRITICAL FAILURES: {resilience.critical_failures}", "fail"))
    lines.append("  " + "   ".join(head))
    lines.append(
        "  pillars: "
        + "  ".join(f"{name} {_num(value)}" for name, value in summary.pillar_scores.items())
    )

    if summary.groups:
        lines.append("")
        lines.append(paint("Scenario x prompt", "bold"))
        width = max(len(g.key) for g in summary.groups)
        for g in summary.groups:
            codes = f"  [{', '.join(g.failure_codes)}]" if g.failure_codes else ""
            lines.append(
                f"  {paint(f'{g.status.upper():<5}', g.status)}  {g.key:<{width}}  "
                f"{g.c}/{g.n} passed  pass@{g.n} {g.pass_at_k:.2f}  pass^{g.n} {g.pass_hat_k:.2f}  "
                f"composite {g.mean_composite:.2f} ({g.min_composite:.2f}-{g.max_composite:.2f})"
                f"{codes}"
            )

    reasons, more = summary.failure_reasons()
    if reasons:
        lines.append("")
        lines.append(paint("Why executions did not pass", "bold"))
        for status, where, reason in reasons:
            lines.append(f"  {paint(f'{status.upper():<5}', status)}  {where}: {reason}")
        if more:
            lines.append(f"  ... and {more} more (the JSON report has every execution)")

    if summary.matrix:
        lines.append("")
        lines.append(paint("Invariant x scenario", "bold"))
        scenarios = _ordered_unique(c.scenario for c in summary.matrix)
        invariants = _ordered_unique(c.invariant_id for c in summary.matrix)
        cells = {(c.invariant_id, c.scenario): c for c in summary.matrix}
        label_width = max(len(i) + 12 for i in invariants)
        col = max(8, *(len(s) for s in scenarios))
        lines.append("  " + " " * label_width + "  " + "  ".join(f"{s:<{col}}" for s in scenarios))
        for inv in invariants:
            severity = next(c.severity for c in summary.matrix if c.invariant_id == inv)
            row = [f"{inv} ({severity})".ljust(label_width)]
            for s in scenarios:
                cell = cells.get((inv, s))
                if cell is None:
                    row.append(paint(f"{'-':<{col}}", "dim"))
                else:
                    row.append(paint(f"{cell.label:<{col}}", cell.status))
            lines.append("  " + "  ".join(row))

    lines.append("")
    lines.append(paint("Gates", "bold"))
    for gate in summary.gates:
        state = "EMPTY" if gate.empty else ("PASS" if gate.passed else "FAIL")
        style = "dim" if gate.empty else ("pass" if gate.passed else "fail")
        lines.append(f"  {paint(f'{state:<5}', style)}  {gate.name}: {gate.message}")

    m = summary.metrics
    lines.append("")
    lines.append(
        f"  {counted(m.executions, 'execution')}  mean {_num(m.mean_duration_ms, 0)} ms  "
        f"p95 {_num(m.p95_duration_ms, 0)} ms  tokens/exec {_num(m.mean_tokens, 0)}  "
        f"tool calls/exec {_num(m.mean_tool_calls, 1)}  tool success {_pct_of(m.tool_success_rate)}  "
        f"cost {format_usd(m.total_cost_usd)}"
    )
    for warning in summary.warnings:
        lines.append(paint(f"  warning: {warning}", "flaky"))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- JUnit XML

_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(value: object) -> str:
    """XML 1.0 cannot carry control characters even escaped: replace them."""
    return _XML_INVALID.sub("\ufffd", str(value))


def render_junit(summary: RunSummary) -> str:
    """One testsuite per scenario and one testcase per execution x invariant, plus a
    `gates` suite; the run's scores are the suites' properties."""
    spec_id = summary.spec_id
    root = ET.Element("testsuites", name=_xml_text(f"keystone.{spec_id}"))
    by_scenario: dict[str, list[ExecutionRecord]] = {}
    for record in summary.records:
        by_scenario.setdefault(record.scenario, []).append(record)
    totals = {"tests": 0, "failures": 0, "errors": 0}
    scores = {score.execution_id: score for score in summary.executions}
    for scenario, records in by_scenario.items():
        suite = ET.SubElement(root, "testsuite", name=_xml_text(f"{spec_id}.{scenario}"))
        _properties(suite, summary)
        counts = {"tests": 0, "failures": 0, "errors": 0}
        seconds = 0.0
        for record in records:
            seconds += record.duration_ms / 1000.0
            for case in _execution_cases(spec_id, record, scores.get(record.id)):
                suite.append(case)
                counts["tests"] += 1
                if case.find("failure") is not None:
                    counts["failures"] += 1
                if case.find("error") is not None:
                    counts["errors"] += 1
        _set_counts(suite, counts, seconds)
        for key in totals:
            totals[key] += counts[key]
    gate_suite = ET.SubElement(root, "testsuite", name=_xml_text(f"{spec_id}.gates"))
    _properties(gate_suite, summary)
    gate_counts = {"tests": 0, "failures": 0, "errors": 0}
    for gate in summary.gates:
        case = ET.SubElement(
            gate_suite, "testcase", classname=_xml_text(f"{spec_id}.gates"), name=gate.name
        )
        gate_counts["tests"] += 1
        if not gate.passed:
            gate_counts["failures"] += 1
            failure = ET.SubElement(
                case, "failure", type="GATE_FAILED", message=_xml_text(gate.message)
            )
            failure.text = _xml_text(gate.message)
        elif gate.empty:
            ET.SubElement(case, "system-out").text = _xml_text(gate.message)
    _set_counts(gate_suite, gate_counts, 0.0)
    for key in totals:
        totals[key] += gate_counts[key]
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + body + "\n"


def _execution_cases(
    spec_id: str, record: ExecutionRecord, score: ExecutionScore | None
) -> list[ET.Element]:
    classname = _xml_text(f"{spec_id}.{record.scenario}")
    where = f"prompt {record.prompt_index}, replica {record.replica}"
    if record.pillar not in ("contract", "chaos"):
        where += f", {record.pillar}" + (f" {record.mutation_type}" if record.mutation_type else "")
    cases: list[ET.Element] = []
    for result in record.results:
        case = ET.Element(
            "testcase",
            classname=classname,
            name=_xml_text(f"{result.invariant_id} [{where}]"),
            time=f"{float(result.details.get('elapsed_ms', 0.0)) / 1000.0:.3f}",
        )
        _result_outcome(case, result)
        cases.append(case)
    if record.forbidden_violations:
        case = ET.Element("testcase", classname=classname, name=_xml_text(f"forbidden [{where}]"))
        text = json.dumps(record.forbidden_violations, indent=1, default=str)
        failure = ET.SubElement(
            case,
            "failure",
            type="FORBIDDEN_VIOLATION",
            message=_xml_text(f"{len(record.forbidden_violations)} forbidden rule violation(s)"),
        )
        failure.text = _xml_text(text)
        cases.append(case)
    shown = any(c.find("failure") is not None or c.find("error") is not None for c in cases)
    if record.status in NO_VERDICT_STATUSES and not any(c.find("error") is not None for c in cases):
        # The execution itself failed (a provider answering 401, an agent that cannot start):
        # one <error> that names it, whatever its check results say.
        case = ET.Element("testcase", classname=classname, name=_xml_text(f"execution [{where}]"))
        code = "PROVIDER_ERROR" if record.status == "provider_error" else "EXECUTION_ERROR"
        error = ET.SubElement(
            case, "error", type=code, message=_xml_text(record.error or record.status)
        )
        error.text = _xml_text(record.error or record.status)
        cases.append(case)
    elif score is not None and not score.passed and not shown:
        # Every invariant passed on its own, yet the execution failed (its composite is below
        # pass_threshold, or a gate scored below 1.0): say why, or CI would show all green.
        case = ET.Element("testcase", classname=classname, name=_xml_text(f"verdict [{where}]"))
        failure = ET.SubElement(
            case, "failure", type="EXECUTION_FAILED", message=_xml_text(score.reason)
        )
        failure.text = _xml_text(score.reason)
        cases.append(case)
    return cases


def _result_outcome(case: ET.Element, result: CheckResult) -> None:
    if result.passed:
        return
    tag = "error" if result.is_error else "failure"
    code = result.failure_code.value if result.failure_code else "FAILED"
    element = ET.SubElement(case, tag, type=code, message=_xml_text(result.message or code))
    lines = [result.message or code, f"score: {result.score:.4g}"]
    if result.details:
        lines.append(json.dumps(result.details, indent=1, sort_keys=True, default=str))
    element.text = _xml_text("\n".join(lines))


def _properties(suite: ET.Element, summary: RunSummary) -> None:
    props = ET.SubElement(suite, "properties")
    values: dict[str, object] = {
        "verdict": summary.verdict,
        "exit_code": summary.exit_code,
        "overall": summary.overall,
        "pass_rate": summary.pass_rate,
        "resilience": summary.resilience.score,
        "critical_failed": summary.resilience.critical_failed,
    }
    values.update({f"pillar.{name}": value for name, value in summary.pillar_scores.items()})
    for name, value in values.items():
        text = "" if value is None else (f"{value:.6g}" if isinstance(value, float) else str(value))
        ET.SubElement(props, "property", name=name, value=_xml_text(text))


def _set_counts(suite: ET.Element, counts: dict[str, int], seconds: float) -> None:
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("skipped", "0")
    suite.set("time", f"{seconds:.3f}")


# ---------------------------------------------------------------- Markdown


# GitHub refuses a comment longer than 65,536 characters; the summary stays below it with
# room for what a CI job adds around it.
MARKDOWN_MAX_CHARS = 60_000
# Failure rows listed before the rest is counted (the JSON report has them all).
MARKDOWN_MAX_FAILURE_ROWS = 200


def render_markdown(summary: RunSummary) -> str:
    return cap_markdown("\n".join(_markdown_lines(summary)) + "\n")


def cap_markdown(text: str, limit: int = MARKDOWN_MAX_CHARS) -> str:
    """Markdown meant for a pull request or a chat message, whole lines up to `limit`
    characters; past it, a last line says how many were left out and where the rest is."""
    if len(text) <= limit:
        return text
    lines = text.split("\n")
    kept: list[str] = []
    size = 0
    room = limit - 400  # for the closing note
    for line in lines:
        if size + len(line) + 1 > room:
            break
        kept.append(line)
        size += len(line) + 1
    left_out = len(lines) - len(kept)
    kept += [
        "",
        f"_{left_out} more lines left out to stay under GitHub's 65,536-character comment "
        "limit: the whole of it is in the JSON report and on the run's page._",
    ]
    return "\n".join(kept) + "\n"


def _markdown_lines(summary: RunSummary) -> list[str]:
    out: list[str] = []
    icon = {"pass": "PASS", "fail": "FAIL", "error": "ERROR"}.get(summary.verdict, summary.verdict)
    out.append(f"# Keystone run: {_md(summary.spec_id)} — {icon}")
    out.append("")
    out.append("| metric | value |")
    out.append("|---|---|")
    rows = [
        ("verdict", f"{summary.verdict} (exit {summary.exit_code})"),
        ("overall score", _num(summary.overall)),
        ("pass rate", _ratio(summary)),
        ("resilience", _pct(summary.resilience.score)),
        ("critical failures", str(summary.resilience.critical_failures)),
    ]
    rows += [(f"pillar: {name}", _num(value)) for name, value in summary.pillar_scores.items()]
    m = summary.metrics
    rows += [
        ("executions", str(m.executions)),
        (
            "mean / p95 wall time (ms)",
            f"{_num(m.mean_duration_ms, 0)} / {_num(m.p95_duration_ms, 0)}",
        ),
        ("mean tokens", _num(m.mean_tokens, 0)),
        ("mean tool calls", _num(m.mean_tool_calls, 1)),
        ("tool success rate", _pct_of(m.tool_success_rate)),
        ("total cost (USD)", format_usd(m.total_cost_usd).removeprefix("$")),
    ]
    out += [f"| {_md(k)} | {_md(v)} |" for k, v in rows]

    out += [
        "",
        "## Gates",
        "",
        "| gate | result | actual | threshold | detail |",
        "|---|---|---|---|---|",
    ]
    for gate in summary.gates:
        state = "empty (pass)" if gate.empty else ("pass" if gate.passed else "**FAIL**")
        actual = "-" if gate.actual is None else f"{gate.actual:.4g}"
        out.append(
            f"| {gate.name} | {state} | {actual} | {gate.threshold:.4g} | {_md(gate.message)} |"
        )

    if summary.groups:
        out += [
            "",
            "## Scenario x prompt",
            "",
            "| group | status | passed | pass@k | pass^k | mean composite | failure codes |",
            "|---|---|---|---|---|---|---|",
        ]
        for g in summary.groups:
            out.append(
                f"| {_md(g.key)} | {g.status} | {g.c}/{g.n} | {g.pass_at_k:.2f} | "
                f"{g.pass_hat_k:.2f} | {g.mean_composite:.2f} | {_md(', '.join(g.failure_codes))} |"
            )

    if summary.matrix:
        scenarios = _ordered_unique(c.scenario for c in summary.matrix)
        invariants = _ordered_unique(c.invariant_id for c in summary.matrix)
        cells = {(c.invariant_id, c.scenario): c for c in summary.matrix}
        out += ["", "## Invariant x scenario", ""]
        out.append("| invariant | " + " | ".join(_md(s) for s in scenarios) + " |")
        out.append("|---|" + "---|" * len(scenarios))
        for inv in invariants:
            row = []
            for s in scenarios:
                cell = cells.get((inv, s))
                row.append("-" if cell is None else cell.label)
            severity = next(c.severity for c in summary.matrix if c.invariant_id == inv)
            out.append(f"| {_md(inv)} ({severity}) | " + " | ".join(row) + " |")

    failures = [
        (record, result)
        for record in summary.records
        for result in record.results
        if not result.passed
    ]
    forbidden = [r for r in summary.records if r.forbidden_violations]
    if failures or forbidden:
        out += [
            "",
            "## Failures",
            "",
            "| execution | invariant | code | score | message |",
            "|---|---|---|---|---|",
        ]
        for record, result in failures[:MARKDOWN_MAX_FAILURE_ROWS]:
            code = result.failure_code.value if result.failure_code else ""
            out.append(
                f"| {_md(_where(record))} | {_md(result.invariant_id)} | {code} | "
                f"{result.score:.2f} | {_md(result.message)} |"
            )
        for record in forbidden[:MARKDOWN_MAX_FAILURE_ROWS]:
            out.append(
                f"| {_md(_where(record))} | forbidden | FORBIDDEN_VIOLATION | 0.00 | "
                f"{len(record.forbidden_violations)} violation(s) |"
            )
        hidden = max(0, len(failures) - MARKDOWN_MAX_FAILURE_ROWS)
        hidden += max(0, len(forbidden) - MARKDOWN_MAX_FAILURE_ROWS)
        if hidden:
            out.append(f"| ... | | | | {hidden} more failures in the JSON report |")

    reasons, more = summary.failure_reasons(limit=50)
    if reasons:
        out += ["", "## Why executions did not pass", "", "| execution | status | why |"]
        out.append("|---|---|---|")
        out += [f"| {_md(where)} | {status} | {_md(reason)} |" for status, where, reason in reasons]
        if more:
            out.append(f"| ... | | {more} more in the JSON report |")

    if summary.warnings:
        out += ["", "## Warnings", ""]
        out += [f"- {_md(w)}" for w in summary.warnings]
    return out


def _where(record: ExecutionRecord) -> str:
    text = f"{record.scenario} / prompt {record.prompt_index} / replica {record.replica}"
    if record.mutation_type:
        text += f" / {record.mutation_type}"
    return text


def _md(text: object) -> str:
    """One table cell: pipes escaped, newlines folded."""
    cleaned = _XML_INVALID.sub(" ", str(text).replace("\r", " ").replace("\n", " "))
    return cleaned.replace("\\", "\\\\").replace("|", "\\|")


# ---------------------------------------------------------------- files and formatting


def write_reports(
    summary: RunSummary,
    *,
    json_path: str | Path | None = None,
    junit_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
) -> list[Path]:
    """Each report asked for, written whole or not at all (output_files)."""
    written: list[Path] = []
    for path, chunks in (
        (json_path, lambda: json_chunks(summary)),
        (junit_path, lambda: [render_junit(summary)]),
        (markdown_path, lambda: [render_markdown(summary)]),
    ):
        if path is not None:
            written.append(write_whole(path, chunks()))
    return written


def _ordered_unique(values: Any) -> list[str]:
    seen: list[str] = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _pct_of(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}%"


def _ratio(summary: RunSummary) -> str:
    groups = [g for g in summary.groups if g.pillar in ("contract", "chaos")]
    if not groups:
        return "-"
    passed = sum(1 for g in groups if g.passed)
    return f"{passed}/{len(groups)} ({passed / len(groups) * 100:.1f}%)"
