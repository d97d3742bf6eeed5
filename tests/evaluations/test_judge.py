"""The judge wired into runs: the database cache, the judge built from the spec or the server's
settings, in-process runs with the scripted judge, and `keystone run` exiting 3 when the
judge cannot be reached. The judge talks HTTP to Keystone's scripted OpenAI-compatible server
through the real openai SDK; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from checks.judge_client import JUDGE_PROMPT_VERSION, JudgeClient, JudgeSettings
from evaluations import services
from evaluations.judge import DatabaseJudgeCache, judge_block, judge_for_run, scripted_rules
from evaluations.models import CheckResult, JudgeCacheEntry, Project, Run, RunStatus
from evaluations.runner.scripted import ScriptedServer
from tests.cli_helpers import embedded_env, run_keystone
from tests.evaluations.execution_helpers import run_spec

REPO_ROOT = Path(__file__).resolve().parents[2]

JUDGED_SPEC = """\
version: 1
id: judged-agent
description: "A shell agent whose answer is judged by the scripted judge"
task: {prompt: "Refund order 1042"}
agent:
  type: command
  command: "echo 'Your refund of 40 EUR is issued. Kind regards.'"
  timeout: 30
sandbox: {backend: local}
invariants:
  mentions_refund:
    description: "Mentions the refund"
    dimensions: [task]
    check: {type: contains, value: refund}
  tone:
    description: "Polite answer"
    check:
      type: llm_as_judge
      criteria: "The answer is polite and states the refund."
      rubric: {pass: "Polite, refund stated", fail: "Rude or vague"}
      pass_threshold: 0.7
  amount:
    description: "States the amount"
    check: {type: judge, criteria: "States the amount in euros", pass_threshold: 0.5}
scoring:
  pass_threshold: 0.5
judge:
  provider: scripted
  model: scripted-judge
  rules:
    - when: {output_matches: "(?i)refund", criteria_matches: "(?i)polite"}
      score: 0.9
      reason: "Polite and mentions the refund"
    - {score: 0.3, reason: "Not what was asked"}
"""

OPENAI_JUDGE_SPEC = """\
version: 1
id: openai-judged
description: "Judged by an OpenAI-compatible endpoint"
task: {prompt: "Say hello"}
agent: {type: command, command: "echo hello", timeout: 30}
sandbox: {backend: local}
invariants:
  tone:
    description: "Friendly"
    check: {type: llm_as_judge, criteria: "The answer is friendly."}
judge:
  provider: openai
  model: gpt-4o-mini
__JUDGE_EXTRA__
"""


def openai_spec(**judge: str) -> str:
    extra = "\n".join(f"  {key}: {value}" for key, value in judge.items())
    return OPENAI_JUDGE_SPEC.replace("__JUDGE_EXTRA__", extra)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def judge_rows(run: Run) -> dict[str, CheckResult]:
    return {
        row.invariant_id: row
        for row in CheckResult.objects.filter(run=run, check_type__in=["llm_as_judge", "judge"])
    }


# --------------------------------------------------------------------------- the database cache


@pytest.mark.django_db
def test_database_cache_answers_identical_calls_and_counts_hits() -> None:
    rules = scripted_rules([{"score": 0.75, "reason": "fine"}])
    with ScriptedServer(rules, model="scripted-judge") as server:
        client = JudgeClient(
            JudgeSettings(base_url=server.base_url, api_key="k", model="scripted-judge"),
            cache=DatabaseJudgeCache(),
        )
        config = {"criteria": "Is it fine?"}
        first = client.evaluate(config=config, judged_input="some text", evidence=[])
        assert len(server.requests) == 1
        entry = JudgeCacheEntry.objects.get()
        assert (entry.model, entry.hits) == ("scripted-judge", 0)
        assert json.loads(entry.reply["text"])["score"] == 0.75

        second = client.evaluate(config=config, judged_input="some text", evidence=[])
        assert len(server.requests) == 1  # no second request reached the server
        entry.refresh_from_db()
        assert entry.hits == 1
        assert (first["cached"], second["cached"]) == (False, True)
        assert second["score"] == first["score"] == 0.75

        client.evaluate(config=config, judged_input="other text", evidence=[])
        assert len(server.requests) == 2 and JudgeCacheEntry.objects.count() == 2
        client.close()


# --------------------------------------------------------------------------- building the judge


@pytest.mark.django_db
def test_judge_block_falls_back_to_settings_and_keeps_the_server_key_home(
    project: Project, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply = {"reply": {"content": '{"score": 1.0, "passed": true, "reasoning": "ok"}'}}
    monkeypatch.setenv("KEYSTONE_TEST_SERVER_KEY", "sk-server-secret")
    monkeypatch.setenv("SPEC_JUDGE_TEST_KEY", "sk-spec-key")
    settings.KEYSTONE_JUDGE_API_KEY_ENV = "KEYSTONE_TEST_SERVER_KEY"
    with ScriptedServer([reply]) as server:
        settings.KEYSTONE_JUDGE_BASE_URL = server.base_url
        settings.KEYSTONE_JUDGE_MODEL = "server-default-model"

        def authorization_for(source: str) -> str:
            version = services.spec_version_create(project=project, source_yaml=source)
            # No cache: an identical call would otherwise be answered without a request.
            run = services.run_create(spec_version=version, enqueue=False, judge_cache=False)
            with judge_for_run(run) as judge:
                assert judge is not None
                answer = judge.evaluate(
                    config={"criteria": "friendly"}, judged_input="hi", evidence=[]
                )
            assert answer["score"] == 1.0, answer
            return server.authorizations[-1]

        # The server's own endpoint gets the server's key.
        assert authorization_for(openai_spec()) == "Bearer sk-server-secret"
        assert server.requests[-1]["model"] == "gpt-4o-mini"
        # A spec pointing the judge at another endpoint must name its own key...
        other = f"http://localhost:{server.base_url.rsplit(':', 1)[1]}"
        assert authorization_for(openai_spec(base_url=other)) == "Bearer keystone-no-key"
        assert authorization_for(
            openai_spec(base_url=other, api_key_env="SPEC_JUDGE_TEST_KEY")
        ) == ("Bearer sk-spec-key")

    block = judge_block({"judge": {"provider": "openai", "temperature": 0.2}})
    assert block["model"] == "server-default-model" and block["temperature"] == 0.2


@pytest.mark.django_db
def test_runs_without_judge_checks_get_no_judge(project: Project) -> None:
    source = openai_spec().replace(
        'check: {type: llm_as_judge, criteria: "The answer is friendly."}',
        "check: {type: contains, value: hello}",
    )
    version = services.spec_version_create(project=project, source_yaml=source)
    run = services.run_create(spec_version=version, enqueue=False)
    with judge_for_run(run) as judge:
        assert judge is None


# --------------------------------------------------------------------------- runs, end to end


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_in_process_run_stores_judge_verdicts_caches_them_and_bypasses_on_request() -> None:
    project = services.project_default()
    run = run_spec(project, JUDGED_SPEC, spec_dir=REPO_ROOT)
    assert run.status == RunStatus.COMPLETED and run.exit_code == 0, run.summary
    rows = judge_rows(run)
    assert set(rows) == {"tone", "amount"}
    tone, amount = rows["tone"], rows["amount"]
    assert tone.source == amount.source == "judge"
    assert (tone.score, tone.passed, tone.failure_code) == (0.9, True, "")
    # criteria_matches picked the first rule only for the criteria that say "polite".
    assert (amount.score, amount.passed, amount.failure_code) == (
        0.3,
        False,
        "JUDGE_BELOW_THRESHOLD",
    )
    judge = tone.details["judge"]
    assert tone.details["pass_threshold"] == 0.7
    assert judge["model"] == "scripted-judge"
    assert judge["prompt_version"] == JUDGE_PROMPT_VERSION
    assert judge["score"] == 0.9 and judge["reasoning"] == "Polite and mentions the refund"
    assert judge["spread"] == 0.0 and judge["cached"] is False
    assert json.loads(judge["raw_reply"])["score"] == 0.9
    assert judge["input_tokens"] > 0 and judge["output_tokens"] > 0
    assert judge["cost_usd"] == 0.0  # the scripted provider is free
    assert len(judge["samples"]) == 1
    assert run.judge_mean == pytest.approx(0.6)
    assert JudgeCacheEntry.objects.count() == 2

    # The same spec again: both verdicts come from the database cache.
    again = run_spec(project, JUDGED_SPEC, spec_dir=REPO_ROOT)
    cached = judge_rows(again)
    assert cached["tone"].details["judge"]["cached"] is True
    assert cached["amount"].details["judge"]["cached"] is True
    assert cached["tone"].score == 0.9
    assert sorted(JudgeCacheEntry.objects.values_list("hits", flat=True)) == [1, 1]

    # A run that bypasses the cache asks the judge again and leaves the cache alone.
    fresh = run_spec(project, JUDGED_SPEC, spec_dir=REPO_ROOT, judge_cache=False)
    assert fresh.options["judge_cache"] is False
    assert all(not r.details["judge"]["cached"] for r in judge_rows(fresh).values())
    assert sorted(JudgeCacheEntry.objects.values_list("hits", flat=True)) == [1, 1]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_judge_without_credentials_marks_the_run_and_exits_3() -> None:
    project = services.project_default()
    os.environ.pop("SPEC_JUDGE_UNSET_KEY", None)
    run = run_spec(project, openai_spec(api_key_env="SPEC_JUDGE_UNSET_KEY"), spec_dir=REPO_ROOT)
    row = judge_rows(run)["tone"]
    assert row.failure_code == "PROVIDER_AUTH_FAILED" and row.source == "judge"
    assert row.details["judge"]["error_code"] == "PROVIDER_AUTH_FAILED"
    assert run.exit_code == 3, run.summary
    assert any(
        "judge provider error in tone: PROVIDER_AUTH_FAILED" in w
        and "SPEC_JUDGE_UNSET_KEY is not set on the server" in w
        for w in run.warnings
    ), run.warnings


@pytest.mark.slow
def test_cli_exits_3_when_the_judge_endpoint_is_unreachable(tmp_path: Path) -> None:
    spec = tmp_path / "judged.yaml"
    spec.write_text(openai_spec(base_url=f"http://127.0.0.1:{closed_port()}/v1"))
    env = embedded_env(
        tmp_path / "home", KEYSTONE_JUDGE_MAX_RETRIES="1", KEYSTONE_JUDGE_BACKOFF="0.01"
    )
    result = run_keystone("run", str(spec), "--no-judge-cache", env=env, timeout=180)
    described = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 3, described
    assert "judge provider error in tone: PROVIDER_ERROR" in result.stdout, described
    assert "cannot reach" in result.stdout and "after 2 attempts" in result.stdout, described
    with sqlite3.connect(tmp_path / "home" / "keystone.sqlite3") as db:
        options, exit_code = db.execute("SELECT options, exit_code FROM evaluations_run").fetchone()
    assert json.loads(options)["judge_cache"] is False
    assert exit_code == 3
