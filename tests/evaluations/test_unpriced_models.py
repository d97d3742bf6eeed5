"""An agent's model that Keystone has no price for: its calls cost nothing in the price table,
so a `cost` check and the `cost_max_usd` gate passed on $0 whatever the agent spent. Now the
call is recorded as not priced, the check gives no verdict, the gate fails and the run warns,
each naming the model and `llm.prices`, where the spec gives its price. Real runs: the agent
calls the gateway over HTTP, which forwards to Keystone's scripted OpenAI-compatible server."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from checks.pricing import cost_usd
from checks.results import FailureCode
from evaluations.models import Membership, Project, Role
from evaluations.runner.scripted import ScriptedServer
from tests.evaluations.execution_helpers import agent_asking_the_model, run_spec, script_agent

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "acme-frontier-9"  # in no price table


@pytest.fixture
def upstream() -> Iterator[ScriptedServer]:
    rules = [{"reply": {"content": "a long and expensive answer from the frontier model"}}]
    with ScriptedServer(rules) as server:
        yield server


def _spec(base_url: str, prices: str = "") -> str:
    return f"""\
version: 1
id: pricey-agent
task: {{prompt: "hi"}}
{script_agent(agent_asking_the_model("the model failed"))}\
llm: {{provider: openai, base_url: "{base_url}", model: {MODEL}, timeout: 5{prices}}}
invariants:
  cheap:
    description: "costs at most a cent"
    check: {{type: cost, max_usd: 0.01}}
gates: {{cost_max_usd: 1.0}}
"""


def test_a_model_with_no_price_gives_no_cost_verdict_fails_the_gate_and_warns(
    project: Project, tmp_path: Path, upstream: ScriptedServer, django_user_model: Any
) -> None:
    run = run_spec(project, _spec(upstream.base_url), spec_dir=tmp_path)
    execution = run.executions.get()
    assert execution.input_tokens > 0  # the call used tokens: it was not free
    result = execution.check_results.get(invariant_id="cheap")
    assert not result.passed, result.message
    assert result.failure_code == FailureCode.CHECK_ERROR.value
    assert f"cost is unknown: no price for the model(s) '{MODEL}'" in result.message
    assert "llm.prices" in result.message
    gate = next(g for g in run.summary["gates"] if g["name"] == "cost_max_usd")
    assert gate["passed"] is False and gate["actual"] is None
    assert MODEL in gate["message"] and "unknown" in gate["message"]
    assert run.exit_code != 0
    assert any(MODEL in w and "llm.prices" in w for w in run.warnings), run.warnings
    assert execution.unpriced_models == [MODEL]
    # What the execution page and the API show of its cost says so too.
    viewer = django_user_model.objects.create_user(username="viewer")
    Membership.objects.create(project=project, user=viewer, role=Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    page = client.get(f"/p/{project.slug}/executions/{execution.pk}/")
    assert page.status_code == 200
    text = " ".join(html.unescape(re.sub("<[^>]+>", " ", page.content.decode())).split())
    assert f"not priced the calls to {MODEL}" in text
    assert "no price for this model" in text  # its LLM call in the transcript
    detail = client.get(f"/api/projects/{project.slug}/executions/{execution.pk}")
    assert detail.status_code == 200 and detail.json()["unpriced_models"] == [MODEL]


def test_a_price_in_llm_prices_gives_the_verdict_back(
    project: Project, tmp_path: Path, upstream: ScriptedServer
) -> None:
    # $4,000 per million input tokens: a few tokens cost more than the cent allowed.
    prices = f", prices: {{{MODEL}: {{input: 4000, output: 0}}}}"
    run = run_spec(project, _spec(upstream.base_url, prices), spec_dir=tmp_path)
    execution = run.executions.get()
    assert execution.unpriced_models == []
    table = {MODEL: (4000.0, 0.0)}
    assert execution.cost_usd == pytest.approx(
        cost_usd(MODEL, execution.input_tokens, execution.output_tokens, table)
    )
    assert execution.cost_usd > 0.01
    result = execution.check_results.get(invariant_id="cheap")
    assert not result.passed and result.failure_code == FailureCode.COST_EXCEEDED.value
    gate = next(g for g in run.summary["gates"] if g["name"] == "cost_max_usd")
    assert gate["passed"] is True and gate["actual"] == pytest.approx(execution.cost_usd)
    assert not any("llm.prices" in w for w in run.warnings)
