"""The LLM gateway over real HTTP, seen through the real openai SDK and a real agent process."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import psycopg
import pytest

from evaluations.runner.gateway import Gateway, GatewayConfigError
from evaluations.runner.llm_faults import parse_llm_faults, select_fault
from evaluations.runner.pricing import cost_usd
from evaluations.runner.scripted import ScriptedServer
from tests.http_peer import HttpPeer, PeerHandler

ROOT = Path(__file__).resolve().parents[3]
AGENT_DIR = ROOT / "examples" / "agents"
AGENT_SCRIPT = AGENT_DIR / "support_agent" / "agent.py"
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

REFUND_RULES: list[dict[str, Any]] = [
    {
        "when": {"last_user_matches": "refund"},
        "reply": {"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": 1042}}]},
    },
    {
        "when": {"last_message_role": "tool"},
        "reply": {"content": "Refund issued. Tool said: {last_tool_result}"},
    },
    {
        "reply": {
            "content": "The quick brown fox jumps over the lazy dog near the river bank today."
        }
    },
]
SCRIPTED = {"provider": "scripted", "rules": REFUND_RULES}


def _client(gateway: Gateway, **options: Any) -> openai.OpenAI:
    options.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=gateway.base_url, api_key=gateway.api_key, **options)


def _ask(client: openai.OpenAI, text: str = "hello") -> Any:
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}]
    )


def _seed_where(faults: list[dict[str, Any]], pattern: list[bool]) -> int:
    """A seed under which the first len(pattern) calls are faulted exactly as `pattern` says."""
    parsed = parse_llm_faults(faults)
    for seed in range(10_000):
        if [
            select_fault(parsed, seed=seed, call_index=i) is not None for i in range(len(pattern))
        ] == pattern:
            return seed
    raise AssertionError("no seed found")


# --------------------------------------------------------------------------- scripted answers


def test_scripted_tool_loop_through_the_sdk_is_recorded() -> None:
    with Gateway(SCRIPTED) as gateway:
        client = _client(gateway)
        messages: list[Any] = [{"role": "user", "content": "Please refund order 1042"}]
        first = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "lookup_order",
            {"order_id": 1042},
        )
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"status": "paid"}'},
        ]
        second = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert second.choices[0].message.content == 'Refund issued. Tool said: {"status": "paid"}'

        calls = gateway.calls()
    assert len(calls) == 2
    assert [c.status for c in calls] == [200, 200]
    assert calls[0].tool_calls[0].name == "lookup_order"
    assert calls[0].tool_calls[0].arguments == {"order_id": 1042}
    assert calls[0].tool_calls[0].source == "model"
    assert calls[1].tool_calls == []
    assert calls[1].request["messages"][-1]["role"] == "tool"
    assert calls[1].response["choices"][0]["message"]["content"].startswith("Refund issued")
    assert all(
        c.model == "gpt-4o-mini" and c.input_tokens > 0 and c.output_tokens > 0 for c in calls
    )
    assert all(c.latency_ms > 0 and c.cost_usd == 0.0 and c.fault is None for c in calls)


def test_streaming_through_the_gateway() -> None:
    with Gateway(SCRIPTED) as gateway:
        stream = _client(gateway).chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        chunks = list(stream)
        calls = gateway.calls()
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == REFUND_RULES[2]["reply"]["content"]
    assert len(chunks) > 3  # really streamed in pieces
    assert calls[0].request["stream"] is True and calls[0].output_tokens > 0


def test_responses_embeddings_and_models_endpoints() -> None:
    with Gateway(SCRIPTED) as gateway:
        client = _client(gateway)
        assert client.responses.create(model="gpt-4o-mini", input="hi").output_text.startswith(
            "The quick"
        )
        vectors = client.embeddings.create(model="text-embedding-3-small", input="hi there")
        assert len(vectors.data[0].embedding) == 64
        assert [m.id for m in client.models.list()] == ["scripted"]
        calls = gateway.calls()
    assert len(calls) == 2  # the model listing is not an LLM call
    assert calls[1].request["input"] == "hi there" and calls[1].input_tokens == 2


def test_tool_call_arguments_with_nan_are_kept_as_text_not_as_a_number() -> None:
    """NaN is no JSON (RFC 8259): read as a number it met every bound of an args_schema."""
    rules = [{"reply": {"tool_calls": [{"name": "refund", "arguments": {"amount": math.nan}}]}}]
    with Gateway({"provider": "scripted", "rules": rules}) as gateway:
        _ask(_client(gateway))
        (call,) = gateway.calls()
    assert call.tool_calls[0].arguments == {"_raw": '{"amount": NaN}'}


def test_gateway_refuses_keys_other_than_its_own() -> None:
    with Gateway(SCRIPTED) as gateway:
        stranger = openai.OpenAI(base_url=gateway.base_url, api_key="sk-other", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            _ask(stranger)
        assert gateway.calls() == []


# --------------------------------------------------------------------------- upstream forwarding


def test_upstream_gets_the_secret_key_and_never_the_agents() -> None:
    secret = "sk-upstream-" + uuid.uuid4().hex
    with ScriptedServer(REFUND_RULES, api_key=secret) as upstream:
        config = {
            "provider": "openai",
            "base_url": upstream.base_url,
            "model": "gpt-4o-mini",
            "api_key_env": "UPSTREAM_KEY",
        }
        with Gateway(config, secrets={"UPSTREAM_KEY": secret}) as gateway:
            assert secret not in json.dumps(gateway.env())
            client = _client(gateway)
            answer = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "refund 1"}]
            )
            streamed = list(
                client.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
                )
            )
            response = client.responses.create(model="gpt-4o", input="hello")
            agent_key = gateway.api_key
            calls = gateway.calls()
    assert answer.choices[0].message.tool_calls[0].function.name == "lookup_order"
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices).startswith(
        "The quick"
    )
    assert response.output_text.startswith("The quick")
    assert upstream.authorizations == [f"Bearer {secret}"] * 3
    assert all(agent_key not in json.dumps(body) for body in upstream.requests)
    # The spec's model replaces the one the agent asked for; streaming is fetched whole.
    assert [body["model"] for body in upstream.requests] == ["gpt-4o-mini"] * 3
    assert "stream" not in upstream.requests[1]
    first = calls[0]
    usage = answer.usage
    assert usage is not None
    assert (first.input_tokens, first.output_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert first.cost_usd == pytest.approx(
        cost_usd("gpt-4o-mini", first.input_tokens, first.output_tokens)
    )
    assert first.cost_usd == pytest.approx(
        (first.input_tokens * 0.15 + first.output_tokens * 0.60) / 1e6
    )
    assert first.cost_usd > 0
    assert first.tool_calls[0].name == "lookup_order"


def test_a_call_to_a_model_with_no_price_is_recorded_as_not_priced_until_the_spec_prices_it() -> (
    None
):
    with ScriptedServer(REFUND_RULES) as upstream:
        config = {"provider": "openai", "base_url": upstream.base_url, "model": "acme-9"}
        with Gateway(config, secrets={"OPENAI_API_KEY": "sk-x"}) as gateway:
            _ask(_client(gateway), "hi")
            (unpriced,) = gateway.calls()
        prices = {"ACME-9": {"input": 2.0, "output": 8.0}}  # names are not case-sensitive
        with Gateway({**config, "prices": prices}, secrets={"OPENAI_API_KEY": "sk-x"}) as gateway:
            _ask(_client(gateway), "hi")
            (priced,) = gateway.calls()
    assert unpriced.input_tokens > 0 and unpriced.cost_usd == 0.0 and not unpriced.priced
    assert priced.priced and priced.cost_usd == pytest.approx(
        (priced.input_tokens * 2.0 + priced.output_tokens * 8.0) / 1e6
    )


def test_missing_upstream_secret_is_a_config_error() -> None:
    with pytest.raises(GatewayConfigError, match="OPENAI_API_KEY"):
        Gateway(
            {
                "provider": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "api_key_env": "OPENAI_API_KEY",
            }
        )


def test_unreachable_upstream_is_a_502_for_the_agent() -> None:
    with ScriptedServer(REFUND_RULES) as dead:
        url = dead.base_url  # the port is free again once the server is closed
    with Gateway({"provider": "openai", "base_url": url}) as gateway:
        with pytest.raises(openai.APIStatusError) as raised:
            _ask(_client(gateway))
        assert raised.value.status_code == 502
        assert gateway.calls()[0].status == 502


# --------------------------------------------------------------------------- faults as the SDK sees them


def test_error_fault_raises_internal_server_error_in_the_sdk() -> None:
    with Gateway(SCRIPTED, llm_faults=[{"mode": "error"}]) as gateway:
        with pytest.raises(openai.InternalServerError) as raised:
            _ask(_client(gateway))
        calls = gateway.calls()
    assert raised.value.status_code == 503
    assert "injected by Keystone" in str(raised.value)
    assert (calls[0].status, calls[0].fault) == (503, "error")


def test_error_fault_with_custom_code() -> None:
    with (
        Gateway(
            SCRIPTED, llm_faults=[{"mode": "error", "error_code": 400, "message": "bad"}]
        ) as gateway,
        pytest.raises(openai.BadRequestError, match="bad"),
    ):
        _ask(_client(gateway))


def test_rate_limit_fault_raises_rate_limit_error_with_retry_after() -> None:
    with Gateway(SCRIPTED, llm_faults=[{"mode": "rate_limit", "retry_after": 7}]) as gateway:
        with pytest.raises(openai.RateLimitError) as raised:
            _ask(_client(gateway))
        assert raised.value.response.headers["retry-after"] == "7"
        assert gateway.calls()[0].fault == "rate_limit"


def test_rate_limited_first_call_succeeds_on_the_sdks_retry() -> None:
    faults = [{"mode": "rate_limit", "retry_after": 0.05, "probability": 0.5}]
    seed = _seed_where(faults, [True, False])
    with Gateway(SCRIPTED, llm_faults=faults, seed=seed) as gateway:
        answer = _ask(_client(gateway, max_retries=2))
        calls = gateway.calls()
    assert answer.choices[0].message.content.startswith("The quick")
    assert [(c.status, c.fault) for c in calls] == [(429, "rate_limit"), (200, None)]


def test_after_calls_faults_only_later_calls() -> None:
    with Gateway(SCRIPTED, llm_faults=[{"mode": "error", "after_calls": 1}]) as gateway:
        client = _client(gateway)
        assert _ask(client).choices[0].message.content
        with pytest.raises(openai.InternalServerError):
            _ask(client)
        assert [c.fault for c in gateway.calls()] == [None, "error"]


def test_truncated_response_has_finish_reason_length() -> None:
    with Gateway(SCRIPTED, llm_faults=[{"mode": "truncated_response", "max_tokens": 3}]) as gateway:
        client = _client(gateway)
        answer = _ask(client)
        chunks = list(
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
        calls = gateway.calls()
    assert answer.choices[0].message.content == "The quick brown"
    assert answer.choices[0].finish_reason == "length"
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The quick brown"
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert calls[0].fault == "truncated_response" and calls[0].output_tokens == 3


def test_timeout_fault_ends_in_the_sdks_timeout() -> None:
    with Gateway(SCRIPTED, llm_faults=[{"mode": "timeout", "delay_ms": 5000}]) as gateway:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            _ask(_client(gateway, timeout=0.3))
        assert time.monotonic() - started < 3
        calls = gateway.calls()
    assert (calls[0].fault, calls[0].status, calls[0].latency_ms) == ("timeout", 504, 5000)


def test_timeout_fault_that_drops_the_connection() -> None:
    with (
        Gateway(
            SCRIPTED, llm_faults=[{"mode": "timeout", "delay_ms": 50, "drop": True}]
        ) as gateway,
        pytest.raises(openai.APIConnectionError),
    ):
        _ask(_client(gateway, timeout=5))


def test_timeout_fault_answers_504_when_the_client_waits() -> None:
    faults = [{"mode": "timeout", "delay_ms": 100}]
    with (
        Gateway(SCRIPTED, llm_faults=faults) as gateway,
        pytest.raises(openai.APIStatusError) as raised,
    ):
        _ask(_client(gateway, timeout=5))
    assert raised.value.status_code == 504


def test_empty_fault_gives_an_empty_answer() -> None:
    with Gateway(SCRIPTED, llm_faults=[{"mode": "empty"}]) as gateway:
        answer = _ask(_client(gateway), "refund 1042")
    assert answer.choices[0].message.content == ""
    assert answer.choices[0].message.tool_calls is None


def test_garbage_fault_is_deterministic_under_the_seed() -> None:
    def garbage(seed: int) -> str:
        with Gateway(SCRIPTED, llm_faults=[{"mode": "garbage"}], seed=seed) as gateway:
            return _ask(_client(gateway)).choices[0].message.content or ""

    first = garbage(3)
    assert first and "quick brown" not in first
    assert first == garbage(3)
    assert first != garbage(4)


def test_response_drift_reaches_the_sdk() -> None:
    rules = [{"reply": {"content": '{"status": "refunded", "order_id": 1042}'}}]
    faults = [{"mode": "response_drift", "drift_type": "json_field_rename"}]
    with Gateway({"provider": "scripted", "rules": rules}, llm_faults=faults) as gateway:
        answer = _ask(_client(gateway))
        assert gateway.calls()[0].fault == "response_drift:json_field_rename"
    assert json.loads(answer.choices[0].message.content or "") == {
        "state": "refunded",
        "orderId": 1042,
    }


def test_same_seed_same_faulted_calls_and_other_seed_differs() -> None:
    faults = [{"mode": "error", "probability": 0.5}]

    def pattern(seed: int) -> list[bool]:
        with Gateway(SCRIPTED, llm_faults=faults, seed=seed) as gateway:
            client = _client(gateway)
            for _ in range(16):
                with contextlib.suppress(openai.InternalServerError):
                    _ask(client)
            return [call.fault == "error" for call in gateway.calls()]

    first = pattern(11)
    assert len(first) == 16 and 0 < sum(first) < 16
    assert first == pattern(11)
    assert first != pattern(12)


# --------------------------------------------------------------------------- the example agent, for real


class _ToolServer(HttpPeer):
    """A tiny HTTP tool that answers with an order and remembers what it was sent."""

    def __init__(self, answer: dict[str, Any], status: int = 200) -> None:
        self.bodies: list[Any] = []
        tool = self

        class Handler(PeerHandler):
            def do_POST(self) -> None:
                tool.bodies.append(json.loads(self.read_body() or b"null"))
                self.send_json(status, answer)

        super().__init__(Handler)
        self.url = f"{self.url}/lookup"


@pytest.fixture
def order_tool() -> Iterator[_ToolServer]:
    with _ToolServer({"order_id": 1042, "status": "paid", "amount": 20}) as tool:
        yield tool


def _run_agent(gateway: Gateway, prompt: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **gateway.env(),
        "KEYSTONE_PROMPT": prompt,
        **extra_env,
    }
    return subprocess.run(
        [sys.executable, str(AGENT_SCRIPT)],
        env=env,
        cwd=AGENT_SCRIPT.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_support_agent_process_calls_the_tool_and_prints_the_answer(
    order_tool: _ToolServer,
) -> None:
    with Gateway(SCRIPTED) as gateway:
        done = _run_agent(
            gateway, "Please refund order 1042", KEYSTONE_TOOL_LOOKUP_ORDER_URL=order_tool.url
        )
        calls = gateway.calls()
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip()
        == 'Refund issued. Tool said: {"order_id": 1042, "status": "paid", "amount": 20}'
    )
    assert order_tool.bodies == [{"order_id": 1042}]
    assert len(calls) == 2
    assert [t.name for t in calls[0].tool_calls] == ["lookup_order"]
    assert calls[0].request["tools"][0]["function"]["name"] == "lookup_order"
    assert calls[1].request["messages"][-1]["role"] == "tool"
    assert '"status": "paid"' in calls[1].request["messages"][-1]["content"]


def test_support_agent_reads_the_prompt_from_stdin(order_tool: _ToolServer) -> None:
    with Gateway(SCRIPTED) as gateway:
        env = {"PATH": os.environ.get("PATH", ""), **gateway.env()}
        done = subprocess.run(
            [sys.executable, str(AGENT_SCRIPT)],
            input="hello there",
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("The quick brown fox")


def test_support_agent_sees_a_503_from_the_sdk_and_apologises() -> None:
    with Gateway(SCRIPTED, llm_faults=[{"mode": "error"}]) as gateway:
        done = _run_agent(gateway, "hello", SUPPORT_AGENT_MAX_RETRIES="1")
        calls = gateway.calls()
    assert done.returncode == 1
    assert "assistant is unavailable" in done.stdout
    assert "InternalServerError status=503" in done.stderr
    assert [(c.status, c.fault) for c in calls] == [
        (503, "error"),
        (503, "error"),
    ]  # the SDK retried once


def test_support_agent_recovers_from_a_rate_limit_by_retrying(order_tool: _ToolServer) -> None:
    faults = [{"mode": "rate_limit", "retry_after": 0.05, "probability": 0.5}]
    seed = _seed_where(faults, [True, False, False])
    with Gateway(SCRIPTED, llm_faults=faults, seed=seed) as gateway:
        done = _run_agent(gateway, "refund 1042", KEYSTONE_TOOL_LOOKUP_ORDER_URL=order_tool.url)
        calls = gateway.calls()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Refund issued.")
    assert [(c.status, c.fault) for c in calls] == [(429, "rate_limit"), (200, None), (200, None)]


def test_support_agent_prints_a_truncated_answer() -> None:
    with Gateway(SCRIPTED, llm_faults=[{"mode": "truncated_response", "max_tokens": 4}]) as gateway:
        done = _run_agent(gateway, "hello")
    assert done.returncode == 0
    assert done.stdout.strip() == "The quick brown fox"
    assert "cut at its token limit" in done.stderr


def test_support_agent_gives_tool_errors_back_to_the_model() -> None:
    with _ToolServer({"error": "down"}, status=503) as failing, Gateway(SCRIPTED) as gateway:
        done = _run_agent(gateway, "refund 1042", KEYSTONE_TOOL_LOOKUP_ORDER_URL=failing.url)
        calls = gateway.calls()
    assert done.returncode == 0
    assert "HTTP 503 from the tool" in done.stdout
    assert "HTTP 503" in calls[1].request["messages"][-1]["content"]


def test_support_agent_writes_to_postgres_through_db_query() -> None:
    name = "ks_gw_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = f"postgresql://postgres@127.0.0.1:5432/{name}"
    try:
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text)")
            db.execute("INSERT INTO orders VALUES (1042, 'paid')")
        rules = [
            {
                "when": {"last_user_matches": "refund"},
                "reply": {
                    "tool_calls": [
                        {
                            "name": "db_query",
                            "arguments": {
                                "sql": "UPDATE orders SET status = 'refunded' WHERE id = %s",
                                "params": [1042],
                            },
                        }
                    ]
                },
            },
            {
                "when": {"last_message_role": "tool"},
                "reply": {"content": "Order 1042 refunded ({last_tool_result})."},
            },
        ]
        with Gateway({"provider": "scripted", "rules": rules}) as gateway:
            done = _run_agent(gateway, "refund order 1042", KEYSTONE_SERVICE_DB_DSN=dsn)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == 'Order 1042 refunded ({"rowcount": 1}).'
        with psycopg.connect(dsn) as db:
            assert db.execute("SELECT status FROM orders WHERE id = 1042").fetchone() == (
                "refunded",
            )
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_support_agent_as_python_callable_uses_context_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(AGENT_DIR))
    from support_agent.agent import run

    seen: list[dict[str, Any]] = []

    def lookup_order(**arguments: Any) -> dict[str, Any]:
        seen.append(arguments)
        return {"status": "shipped"}

    with Gateway(SCRIPTED) as gateway:
        answer = run("refund 1042", {"env": gateway.env(), "tools": {"lookup_order": lookup_order}})
    assert seen == [{"order_id": 1042}]
    assert answer == 'Refund issued. Tool said: {"status": "shipped"}'


def test_upstream_errors_and_embeddings_are_relayed() -> None:
    with ScriptedServer(REFUND_RULES, api_key="sk-right") as upstream:
        config = {"provider": "openai", "base_url": upstream.base_url, "api_key_env": "KEY"}
        with Gateway(config, secrets={"KEY": "sk-wrong"}) as gateway:
            with pytest.raises(openai.AuthenticationError):
                _ask(_client(gateway))
            assert gateway.calls()[0].status == 401
        with Gateway(config, secrets={"KEY": "sk-right"}) as gateway:
            vectors = _client(gateway).embeddings.create(
                model="text-embedding-3-small", input="a b c"
            )
            call = gateway.calls()[0]
    assert len(vectors.data[0].embedding) == 64
    assert upstream.requests[-1]["input"] == "a b c"
    assert call.input_tokens == 3
    assert call.cost_usd == pytest.approx(3 * 0.02 / 1e6)


# --------------------------------------------------------------------------- what the upstream reports


class _OddUsageModel(HttpPeer):
    """A model whose answers carry `usage` as given (negative, words, a list, huge), on the
    chat, responses and embeddings endpoints."""

    def __init__(self, usage: Any) -> None:
        odd = usage

        class Handler(PeerHandler):
            def do_POST(self) -> None:
                self.read_body()
                if self.path.endswith("/chat/completions"):
                    message = {"role": "assistant", "content": "four words of answer"}
                    body = {"object": "chat.completion", "choices": [{"message": message}]}
                elif self.path.endswith("/responses"):
                    text = {"type": "output_text", "text": "four words of answer"}
                    output = [{"type": "message", "role": "assistant", "content": [text]}]
                    body = {"object": "response", "output": output}
                else:
                    body = {"object": "list", "data": [{"embedding": [0.5]}]}
                self.send_json(200, {**body, "model": "m", "usage": odd})

        super().__init__(Handler)


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -5, "completion_tokens": -1, "input_tokens": -5, "output_tokens": -2},
        {"prompt_tokens": "lots", "completion_tokens": "some", "input_tokens": "x"},
        {"prompt_tokens": 10**12, "completion_tokens": 3.5, "input_tokens": 10**12},
        [1, 2],
        "many",
    ],
    ids=["negative", "words", "out-of-range", "a-list", "a-string"],
)
def test_token_counts_the_model_reports_are_kept_only_when_they_are_counts(usage: Any) -> None:
    """The calls' token counts are stored in whole-number columns (PostgreSQL's integer):
    a count that is not one became a gateway error for the agent, or a row the database
    refused. The agent still gets the model's answer as it was."""
    with _OddUsageModel(usage) as model:
        config = {"provider": "openai", "base_url": f"{model.url}/v1", "api_key_env": "KEY"}
        with Gateway(config, secrets={"KEY": "sk-x"}) as gateway:
            client = _client(gateway)
            chat = client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "one two three"}]
            )
            responses = client.responses.with_raw_response.create(model="m", input="hi")
            vectors = client.embeddings.with_raw_response.create(model="m", input="a b")
            calls = gateway.calls()
    assert [r.status_code for r in (chat, responses, vectors)] == [200, 200, 200]
    assert json.loads(chat.text)["usage"] == usage  # relayed as the model sent it
    assert len(calls) == 3
    for call in calls:
        for count in (call.input_tokens, call.output_tokens):
            assert isinstance(count, int) and 0 <= count <= 10**9, (call, count)
    # What is left unusable is counted as without `usage`: from the texts, on the chat and
    # responses endpoints (a call counted as 0 tokens cost $0 whatever it cost).
    for call in calls[:2]:
        assert call.input_tokens > 0 and call.output_tokens > 0, call


def test_a_truncated_answer_of_a_model_that_reports_words_for_counts() -> None:
    with _OddUsageModel({"prompt_tokens": "lots", "completion_tokens": "some"}) as model:
        config = {"provider": "openai", "base_url": f"{model.url}/v1", "api_key_env": "KEY"}
        faults = [{"mode": "truncated_response", "max_tokens": 2}]
        with Gateway(config, secrets={"KEY": "sk-x"}, llm_faults=faults) as gateway:
            answer = _client(gateway).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
            (call,) = gateway.calls()
    assert answer.choices[0].finish_reason == "length"
    assert call.output_tokens == 2 and isinstance(call.input_tokens, int)


class _ListModel(HttpPeer):
    def __init__(self) -> None:
        class Handler(PeerHandler):
            def do_POST(self) -> None:
                self.read_body()
                self.send_json(200, [1, 2])

        super().__init__(Handler)


def test_a_model_answering_json_that_is_no_object_is_a_502_that_says_so() -> None:
    with _ListModel() as model:
        config = {"provider": "openai", "base_url": f"{model.url}/v1", "api_key_env": "KEY"}
        with Gateway(config, secrets={"KEY": "sk-x"}) as gateway:
            with pytest.raises(openai.APIStatusError) as raised:
                _ask(_client(gateway))
            (call,) = gateway.calls()
    assert raised.value.status_code == 502
    assert "upstream answered no JSON object: [1" in str(raised.value)
    assert call.status == 502
