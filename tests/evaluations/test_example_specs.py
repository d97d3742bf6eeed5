"""The example specs that run offline are run for real: `keystone run` (its in-process path,
called here in this process on the test database) executes examples/specs/support-agent-
python.yaml with the real support agent (examples/agents/support_agent, the openai SDK) as a
python agent in the local sandbox, against the scripted model, and it passes its gates.

support-agent-live.yaml needs a model server and MySQL, so it is only validated (by
tests/checks/spec/test_spec_examples.py); its two python hooks are real and checked here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from checks.artifact import RunArtifact
from checks.context import CheckContext, SecurityPolicy
from checks.engine import evaluate_invariant
from checks.spec import load_spec_file
from evaluations.cli import build_parser
from evaluations.cli_commands import cmd_run
from evaluations.models import Artifact, ArtifactKind, Execution, ExecutionStatus, Run

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "examples" / "specs"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@override_settings(CELERY_TASK_ALWAYS_EAGER=True)
def test_support_agent_python_example_runs_offline_and_passes_its_gates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = tmp_path / "report.json"
    args = build_parser().parse_args(
        ["run", str(SPECS / "support-agent-python.yaml"), "--json", str(report_path)]
    )

    exit_code = cmd_run(args)

    out = capsys.readouterr().out
    assert exit_code == 0, out
    assert "Keystone support-agent-python: PASS (exit 0)" in out
    run = Run.objects.get()
    assert run.status == "completed" and run.gate_passed and run.exit_code == 0
    assert run.pass_rate == 1.0 and run.resilience == 100.0
    gates = {gate["name"]: gate for gate in run.summary["gates"]}
    assert set(gates) >= {"schema_failures_max", "keyword_failures_max"}
    assert all(gate["passed"] and not gate["empty"] for gate in gates.values()), gates
    executions = list(Execution.objects.filter(run=run))
    assert len(executions) == 2 * 3 * 2  # prompts x scenarios x replicas
    assert {e.status for e in executions} == {ExecutionStatus.SUCCESS}
    replies = {(e.scenario, e.prompt_index): json.loads(e.final_output) for e in executions}
    # No chaos: looked up, then updated, then answered as JSON.
    assert replies[("no-chaos", 0)]["status"] == "escalated"
    assert replies[("no-chaos", 1)] == {
        "ticket_id": "T-19",
        "status": "closed",
        "reply": "Hello, the customer confirmed the fix, so ticket T-19 is closed.",
    }
    # The lookup tool failed (503, injected where the agent calls it): the agent changed
    # nothing and still answered with valid JSON.
    for prompt_index in (0, 1):
        assert replies[("lookup-down", prompt_index)]["ticket_id"] == "unknown"
    down = next(e for e in executions if e.scenario == "lookup-down")
    assert [(c["name"], c["status"], c["fault"]) for c in _tool_calls(down)] == [
        ("lookup_ticket", 503, "error")
    ]
    assert down.tool_call_count == 1 and down.tool_error_count == 1
    # The row keeps the tool-call sequence (drift by tool-sequence, baselines, compare page).
    for execution in executions:
        assert execution.tool_sequence == [
            {"name": c["name"], "arguments": c["arguments"]} for c in _tool_calls(execution)
        ]
    calm = next(e for e in executions if (e.scenario, e.prompt_index) == ("no-chaos", 1))
    assert [c["name"] for c in calm.tool_sequence] == ["lookup_ticket", "update_ticket"]
    # Four lookup-down executions, one failed call each, count against the tool success rate.
    calls = sum(e.tool_call_count for e in executions)
    assert sum(e.tool_error_count for e in executions) == 4
    assert run.summary["metrics"]["tool_success_rate"] == pytest.approx((calls - 4) / calls)
    # A payload written into the lookup's answer reached the model and not the reply.
    injected = next(e for e in executions if (e.scenario, e.prompt_index) == ("injected-lookup", 1))
    lookup, update = _tool_calls(injected)
    assert "reveal the API key" in lookup["response"] and update["response"] == "ok"
    assert replies[("injected-lookup", 1)] == replies[("no-chaos", 1)]
    report = json.loads(report_path.read_text())
    assert report["summary"]["exit_code"] == 0
    assert len(report["executions"]) == 12


def _tool_calls(execution: Execution) -> list[dict[str, Any]]:
    trace = Artifact.objects.get(execution=execution, kind=ArtifactKind.TRACE)
    with trace.file.open("rb") as handle:
        calls: list[dict[str, Any]] = json.load(handle)["tool_calls"]
    return calls


def _hook_result(invariant_id: str, output: str) -> Any:
    spec = load_spec_file(SPECS / "support-agent-live.yaml")
    context = CheckContext(spec_dir=SPECS, policy=SecurityPolicy(allow_python_hooks=True))
    return evaluate_invariant(
        spec.invariants[invariant_id], RunArtifact(final_output=output), context
    )


@pytest.mark.parametrize(
    ("invariant_id", "output", "passed"),
    [
        ("hook-by-import", '{"ticket_id": "T-19", "status": "closed", "reply": "Closed."}', True),
        ("hook-by-import", '{"ticket_id": "INTERNAL-9", "status": "open", "reply": "x"}', False),
        ("hook-by-import", "not json", False),
        (
            "hook-by-file",
            '{"ticket_id": "T-7", "status": "escalated", "reply": "Escalated."}',
            True,
        ),
        (
            "hook-by-file",
            '{"ticket_id": "T-7", "status": "closed", "reply": "We will see."}',
            False,
        ),
    ],
)
def test_support_agent_live_example_hooks_exist_and_decide(
    monkeypatch: pytest.MonkeyPatch, invariant_id: str, output: str, passed: bool
) -> None:
    # The import_path form imports from the server's path, where the agent's package is.
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "agents"))

    result = _hook_result(invariant_id, output)

    assert result.passed is passed, result.message
    assert not result.is_error, result.message


@pytest.mark.parametrize(
    ("final_output", "passed", "reason"),
    [
        ("Refund issued for order 1042; the customer has been e-mailed.", True, "order 1042"),
        ("Refunded order 1043 instead.", False, "other orders: 1043"),
        ("All done.", False, "names no order"),
    ],
)
def test_refund_agent_summary_script_checks_the_order_number(
    final_output: str, passed: bool, reason: str
) -> None:
    """refund-agent.yaml's `custom` check script, run the way the sandbox runs it."""
    import subprocess
    import sys

    script = ROOT / "examples" / "specs" / "checks" / "verify_summary.py"
    context: dict[str, Any] = {
        "task": {"prompt": "Refund order 1042 and email the customer"},
        "final_output": final_output,
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        input=json.dumps(context),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    verdict = json.loads(done.stdout)
    assert verdict["passed"] is passed and reason in verdict["reason"]
