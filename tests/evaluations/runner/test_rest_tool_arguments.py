"""A REST-style tool (`GET /orders/1042`) carries its arguments in the path: the tool proxy
records the HTTP request as sent, and the call's arguments are the ones the model asked for,
so `tool_calls` checks match on what the model decided (issue 12, item 15)."""

from __future__ import annotations

import json
from pathlib import Path

from checks.artifact import LLMCall, ToolCall
from checks.engine import evaluate
from checks.planning import PlannedExecution
from checks.spec.model import Spec
from evaluations.runner.harness import HarnessConfig, run_execution
from evaluations.runner.toolproxy import with_model_arguments

# The agent asks the model (through the gateway) what to do, then calls the tool REST-style:
# the order id goes into the path, nothing into a body or a query string.
AGENT = """
import json, os, urllib.request

def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    return json.load(urllib.request.urlopen(request, timeout=10))

reply = post(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    {"model": "m", "messages": [{"role": "user", "content": "refund order 1042"}]})
call = reply["choices"][0]["message"]["tool_calls"][0]
order_id = json.loads(call["function"]["arguments"])["order_id"]
url = os.environ["KEYSTONE_TOOL_LOOKUP_ORDER_URL"] + "/orders/" + str(order_id)
print(urllib.request.urlopen(url, timeout=10).read().decode())
"""


def _spec() -> Spec:
    return Spec.from_dict(
        {
            "version": 1,
            "id": "rest-tool",
            "task": {"prompt": "refund order 1042"},
            "agent": {"type": "command", "command": "python agent.py", "timeout": 30},
            "sandbox": {"backend": "local", "workspace": "."},  # agent.py is in it
            "llm": {
                "provider": "scripted",
                "model": "m",
                "rules": [
                    {
                        "reply": {
                            "tool_calls": [
                                {"name": "lookup_order", "arguments": {"order_id": 1042}}
                            ]
                        }
                    }
                ],
            },
            "services": [
                {
                    "name": "shop",
                    "type": "http_mock",
                    "routes": [
                        {"method": "GET", "path": "/orders/1042", "response": {"amount": 59.9}}
                    ],
                }
            ],
            "tools": [{"name": "lookup_order", "service": "shop"}],
            "invariants": {
                "looked_up_1042": {
                    "description": "looked up order 1042",
                    "check": {
                        "type": "tool_calls",
                        "calls": [{"tool": "lookup_order", "args_match": {"order_id": 1042}}],
                    },
                }
            },
        }
    )


def test_a_rest_call_is_matched_on_the_models_arguments_and_keeps_its_request(
    tmp_path: Path,
) -> None:
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "agent.py").write_text(AGENT)
    spec = _spec()
    planned = PlannedExecution(
        scenario="no-chaos",
        prompt_index=0,
        prompt="refund order 1042",
        replica=0,
        pillar="contract",
        invariant_ids=["looked_up_1042"],
    )
    config = HarnessConfig(workspaces_root=tmp_path / "workspaces", spec_dir=spec_dir)
    outcome = run_execution(spec, planned, config, execution_key="t-1", seed=0)
    artifact = outcome.artifact
    assert artifact.status == "success", (artifact.error, artifact.stderr)
    assert json.loads(artifact.final_output) == {"amount": 59.9}
    [call] = [c for c in artifact.tool_calls if c.source == "agent"]
    assert call.arguments == {"order_id": 1042}
    assert call.request == {
        "method": "GET",
        "path": "/orders/1042",
        "query": "",
        "arguments": {},
    }
    [result] = outcome.results
    assert result.passed, result.message


def test_each_call_of_a_tool_takes_the_models_arguments_in_order() -> None:
    asked = LLMCall(
        model="m",
        tool_calls=[
            ToolCall(name="lookup", arguments={"id": 1}, source="model"),
            ToolCall(name="other", arguments={"x": 0}, source="model"),
            ToolCall(name="lookup", arguments={"id": 2}, source="model"),
        ],
    )
    sent = [
        ToolCall(name="lookup", request={"method": "GET", "path": "/1"}),
        ToolCall(name="lookup", request={"method": "GET", "path": "/2"}),
        ToolCall(name="lookup", request={"method": "GET", "path": "/3"}),  # never asked for
        ToolCall(name="python_tool", arguments={"real": True}),  # not an HTTP call: kept
    ]
    paired = with_model_arguments(sent, [asked])
    assert [c.arguments for c in paired] == [{"id": 1}, {"id": 2}, {}, {"real": True}]


def test_the_engine_sees_the_models_arguments_not_the_empty_request() -> None:
    from checks.artifact import RunArtifact
    from checks.context import CheckContext

    artifact = RunArtifact(
        tool_calls=with_model_arguments(
            [ToolCall(name="lookup_order", request={"method": "GET", "path": "/orders/7"})],
            [
                LLMCall(
                    model="m",
                    tool_calls=[ToolCall("lookup_order", {"order_id": 7}, source="model")],
                )
            ],
        )
    )
    [result] = evaluate(artifact, list(_spec().invariants.values()), CheckContext())
    assert not result.passed  # 7, not 1042: the model's arguments are what is compared
    assert "order_id" in result.message
