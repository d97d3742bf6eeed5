from __future__ import annotations

from dataclasses import replace

from checks.artifact import RunArtifact
from checks.context import CheckContext
from checks.engine import evaluate
from checks.results import FailureCode
from checks.spec.model import Invariant


class ScriptedJudge:
    """Answers with a fixed dict and remembers what it was asked."""

    def __init__(self, answer=None, raises=None):
        self.answer = (
            answer if answer is not None else {"score": 0.8, "reasoning": "clear and polite"}
        )
        self.raises = raises
        self.calls = []

    def evaluate(self, *, config, judged_input, evidence):
        self.calls.append({"config": config, "judged_input": judged_input, "evidence": evidence})
        if self.raises:
            raise self.raises
        return self.answer


class Mailer:
    name = "smtp"
    type = "http_mock"

    def query(self, sql):
        raise NotImplementedError

    def recorded_requests(self):
        return [
            {"method": "POST", "path": "/send", "headers": {}, "body": "first email"},
            {
                "method": "POST",
                "path": "/send",
                "headers": {},
                "body": "Dear customer, your refund is issued.",
            },
        ]

    def describe(self):
        return {}


def _judge(**extra):
    return {"type": "llm_as_judge", "criteria": "Professional and actionable", **extra}


def test_score_above_threshold_passes_with_reasoning(run_check):
    judge = ScriptedJudge()
    outcome = run_check(
        _judge(pass_threshold=0.7),
        context=CheckContext(judge=judge),
        output="Your refund is on its way.",
    )
    assert outcome.passed
    assert outcome.score == 0.8
    assert outcome.details["reasoning"] == "clear and polite"
    assert judge.calls[0]["judged_input"] == "Your refund is on its way."
    assert judge.calls[0]["config"]["criteria"] == "Professional and actionable"


def test_score_below_threshold_fails(run_check):
    judge = ScriptedJudge({"score": 0.3, "reasoning": "rude", "dimensions": {"tone": 0.1}})
    outcome = run_check(
        {**_judge(), "type": "judge"}, context=CheckContext(judge=judge), output="whatever"
    )
    assert outcome.failure_code is FailureCode.JUDGE_BELOW_THRESHOLD
    assert outcome.score == 0.3
    assert outcome.message == "judge score 0.30 below threshold 0.5: rude"
    assert outcome.details["dimensions"] == {"tone": 0.1}


def test_no_judge_configured(run_check):
    outcome = run_check(_judge(), output="x")
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert outcome.message == "no judge configured"


def test_provider_error_codes_are_mapped(run_check):
    for code in ("PROVIDER_TIMEOUT", "PROVIDER_AUTH_FAILED", "PROVIDER_ERROR", "JUDGE_PARSE_ERROR"):
        judge = ScriptedJudge({"score": 0, "reasoning": "upstream said no", "error_code": code})
        outcome = run_check(_judge(), context=CheckContext(judge=judge), output="x")
        assert outcome.failure_code is FailureCode(code)
        assert "upstream said no" in outcome.message


def test_missing_score_is_parse_error_and_exceptions_are_provider_errors(run_check):
    outcome = run_check(
        _judge(), context=CheckContext(judge=ScriptedJudge({"reasoning": "?"})), output="x"
    )
    assert outcome.failure_code is FailureCode.JUDGE_PARSE_ERROR
    outcome = run_check(
        _judge(), context=CheckContext(judge=ScriptedJudge(raises=TimeoutError("30s"))), output="x"
    )
    assert outcome.failure_code is FailureCode.PROVIDER_TIMEOUT
    outcome = run_check(
        _judge(),
        context=CheckContext(judge=ScriptedJudge(raises=ConnectionError("refused"))),
        output="x",
    )
    assert outcome.failure_code is FailureCode.PROVIDER_ERROR


def test_input_from_sources(run_check, ws_context, workspace):
    judge = ScriptedJudge()
    context = replace(ws_context, judge=judge, services={"smtp": Mailer()})
    (workspace / "email.txt").write_text("Hello from the file")
    artifact = RunArtifact(final_output="final", stdout="printed to stdout")
    for source, expected in [
        ("agent_output", "final"),
        ("stdout", "printed to stdout"),
        ("workspace:email.txt", "Hello from the file"),
        ("smtp.last_request.body", "Dear customer, your refund is issued."),
        ("smtp.requests[0].body", "first email"),
    ]:
        assert run_check(_judge(input_from=source), artifact=artifact, context=context).passed, (
            source
        )
        assert judge.calls[-1]["judged_input"] == expected


def test_bad_input_from_is_check_error(run_check, ws_context):
    context = replace(ws_context, judge=ScriptedJudge(), services={"smtp": Mailer()})
    for source in (
        "workspace:missing.txt",
        "workspace:../../etc/passwd",
        "mailer.last_request.body",
        "smtp.nonsense",
        "nothing",
    ):
        outcome = run_check(_judge(input_from=source), context=context, output="x")
        assert outcome.failure_code is FailureCode.CHECK_ERROR, source


def test_judge_receives_deterministic_evidence_through_the_engine():
    judge = ScriptedJudge()
    invariants = [
        Invariant("tone", "tone", _judge()),
        Invariant(
            "mentions_refund",
            "refund",
            {"type": "contains", "value": "refund"},
            dimensions=["task"],
        ),
    ]
    results = evaluate(RunArtifact(final_output="no luck"), invariants, CheckContext(judge=judge))
    assert [r.invariant_id for r in results] == ["mentions_refund", "tone"]
    assert results[1].source == "judge"
    evidence = judge.calls[0]["evidence"]
    assert evidence[0]["invariant_id"] == "mentions_refund" and evidence[0]["passed"] is False


def test_input_from_workspace_reads_every_text_file_capped(run_check, ws_context, workspace):
    """Issue 12, item 17: reference 000 lists `input_from: workspace` (the whole workspace)."""
    judge = ScriptedJudge()
    context = replace(ws_context, judge=judge)
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("print('fixed')\n")
    (workspace / "README.md").write_text("# Calculator\n")
    (workspace / "logo.png").write_bytes(b"\x89PNG\x00\x01")  # binary: skipped
    (workspace / ".keystone").mkdir()
    (workspace / ".keystone" / "audit.jsonl").write_text("{}\n")  # Keystone's, not the agent's
    (workspace / "escape").symlink_to("/etc/hostname")  # a link: never followed
    assert run_check(_judge(input_from="workspace"), context=context).passed
    assert judge.calls[-1]["judged_input"] == (
        "=== README.md ===\n# Calculator\n\n=== src/app.py ===\nprint('fixed')\n\n"
    )
    (workspace / "big.txt").write_text("x" * 200_000)
    assert run_check(_judge(input_from="workspace"), context=context).passed
    judged = judge.calls[-1]["judged_input"]
    assert judged.endswith("[workspace text cut at 65536 characters]")
    assert len(judged) < 66_000
