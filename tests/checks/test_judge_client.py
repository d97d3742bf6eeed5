"""The judge client against a real OpenAI-compatible HTTP server on loopback, through the real
openai SDK. The server is a small threaded http.server defined here: it answers from a script
of replies (content, status codes, Retry-After, delays) and records every request it gets.
No Django: these tests also run with `-p no:django`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

from checks.artifact import RunArtifact
from checks.context import CheckContext, JudgeError
from checks.engine import evaluate
from checks.judge_client import (
    JUDGE_PROMPT_VERSION,
    JudgeClient,
    JudgeSettings,
    MemoryJudgeCache,
)
from checks.pricing import cost_usd
from checks.registry import get_check_class
from checks.report_model import ExecutionRecord
from checks.results import FailureCode
from checks.scoring import EXIT_PROVIDER_ERROR, exit_code_for
from checks.spec.model import Invariant
from tests.http_peer import HttpPeer, PeerHandler


def verdict(score: float, reasoning: str = "fine", **extra: Any) -> dict[str, Any]:
    return {
        "content": json.dumps(
            {"score": score, "passed": score >= 0.5, "reasoning": reasoning, **extra}
        )
    }


class FakeProvider(HttpPeer):
    """An OpenAI-compatible server: chat completions from `script` (then `default`), and
    embeddings. A script entry is {content} or {status, body, headers}, with optional delay."""

    def __init__(self) -> None:
        self.script: deque[dict[str, Any]] = deque()
        self.default: dict[str, Any] = verdict(0.8)
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        provider = self

        class Handler(PeerHandler):
            def do_POST(self) -> None:
                body = json.loads(self.read_body() or b"{}")
                with provider.lock:
                    provider.requests.append(body)
                    provider.paths.append(self.path)
                    provider.in_flight += 1
                    provider.max_in_flight = max(provider.max_in_flight, provider.in_flight)
                    step = (
                        provider.script.popleft()
                        if provider.script and self.path.endswith("/chat/completions")
                        else provider.default
                    )
                try:
                    time.sleep(step.get("delay", 0.0))
                    if self.path.endswith("/embeddings"):
                        self.send_json(200, _embeddings(body))
                    elif "status" in step:
                        self.send_json(
                            step["status"], step.get("body", {}), step.get("headers", {})
                        )
                    else:
                        self.send_json(200, _completion(body, step["content"]))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): nothing to answer
                finally:
                    with provider.lock:
                        provider.in_flight -= 1

        super().__init__(Handler, poll_interval=0.05)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        return [
            r
            for r, p in zip(self.requests, self.paths, strict=True)
            if p.endswith("/chat/completions")
        ]


def _completion(request: dict[str, Any], content: str) -> dict[str, Any]:
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": request.get("model", "m"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 25,
            "total_tokens": prompt_tokens + 25,
        },
    }


def _embeddings(request: dict[str, Any]) -> dict[str, Any]:
    texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
    # Two axes: texts mentioning "refund" point one way, the others the other way.
    vectors = [[1.0, 0.0] if "refund" in str(t).lower() else [0.0, 1.0] for t in texts]
    if request.get("encoding_format") == "base64":
        import base64
        import struct

        encoded: list[Any] = [base64.b64encode(struct.pack("<2f", *v)).decode() for v in vectors]
    else:
        encoded = vectors
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)
        ],
        "model": request.get("model"),
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


class RecordingSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        time.sleep(seconds)


def make_client(
    provider: FakeProvider, cache: MemoryJudgeCache | None = None, **overrides: Any
) -> tuple[JudgeClient, RecordingSleep]:
    values: dict[str, Any] = {
        "base_url": provider.base_url,
        "api_key": "sk-test",
        "model": "gpt-4o-mini",
        "backoff_base": 0.001,
        "backoff_max": 0.01,
        "timeout": 5.0,
        "max_retries": 2,
    }
    values.update(overrides)
    sleep = RecordingSleep()
    return JudgeClient(JudgeSettings(**values), cache=cache, sleep=sleep), sleep


CONFIG = {
    "type": "llm_as_judge",
    "criteria": "The e-mail is polite and states the refund.",
    "rubric": {"pass": "Polite, refund stated", "fail": "Rude or vague"},
}


def judge_check(client: JudgeClient, output: str, **config: Any) -> Any:
    check = get_check_class("llm_as_judge")({**CONFIG, **config})
    return check.evaluate(RunArtifact(final_output=output), CheckContext(judge=client))


# --------------------------------------------------------------------------- verdicts


def test_valid_verdict_carries_model_prompt_version_reply_tokens_and_cost(
    provider: FakeProvider,
) -> None:
    provider.script.append(verdict(0.9, "Polite and states the refund", dimensions={"tone": 0.8}))
    client, _ = make_client(provider)
    answer = client.evaluate(
        config=dict(CONFIG, seed=7), judged_input="Your refund is issued.", evidence=[]
    )

    assert answer["score"] == 0.9 and answer["passed"] is True
    assert answer["reasoning"] == "Polite and states the refund"
    assert answer["model"] == "gpt-4o-mini"
    assert answer["prompt_version"] == JUDGE_PROMPT_VERSION and len(JUDGE_PROMPT_VERSION) == 12
    assert json.loads(answer["raw_reply"])["score"] == 0.9
    request = provider.requests[0]
    assert answer["input_tokens"] == sum(len(m["content"].split()) for m in request["messages"])
    assert answer["output_tokens"] == 25
    assert answer["cost_usd"] == pytest.approx(cost_usd("gpt-4o-mini", answer["input_tokens"], 25))
    assert answer["cost_usd"] > 0
    assert answer["cached"] is False and answer["spread"] == 0.0 and len(answer["samples"]) == 1
    assert answer["latency_ms"] > 0
    assert answer["dimensions"] == {"tone": 0.8}
    # What went over the wire: temperature 0, the seed, JSON output, the judged text alone
    # in the user message and the criteria and rubric in the instructions.
    assert len(provider.requests) == 1
    assert request["temperature"] == 0 and request["seed"] == 7
    assert request["response_format"] == {"type": "json_object"}
    system, user = request["messages"]
    assert user == {"role": "user", "content": "Your refund is issued."}
    assert "The e-mail is polite and states the refund." in system["content"]
    assert (
        "pass: Polite, refund stated" in system["content"]
        and "fail: Rude or vague" in system["content"]
    )


def test_family_stores_judge_details_and_threshold(provider: FakeProvider) -> None:
    provider.script.append(verdict(0.6, "Somewhat polite"))
    client, _ = make_client(provider)
    outcome = judge_check(client, "ok, refunded", pass_threshold=0.7)
    assert not outcome.passed and outcome.failure_code is FailureCode.JUDGE_BELOW_THRESHOLD
    assert outcome.score == 0.6
    judge = outcome.details["judge"]
    assert outcome.details["pass_threshold"] == 0.7
    assert judge["model"] == "gpt-4o-mini" and judge["prompt_version"] == JUDGE_PROMPT_VERSION
    assert (
        judge["score"] == 0.6
        and judge["passed"] is True
        and judge["reasoning"] == "Somewhat polite"
    )
    assert judge["spread"] == 0.0 and judge["cached"] is False and len(judge["samples"]) == 1
    assert judge["input_tokens"] > 0 and judge["output_tokens"] == 25 and judge["cost_usd"] > 0
    assert set(judge) >= {"raw_reply", "dimensions", "latency_ms"}


def test_malformed_reply_is_repaired_once(provider: FakeProvider) -> None:
    provider.script.extend([{"content": "Looks great to me, 9/10!"}, verdict(0.9, "after repair")])
    client, _ = make_client(provider)
    answer = client.evaluate(config=CONFIG, judged_input="Refund issued.", evidence=[])
    assert answer["score"] == 0.9 and answer["reasoning"] == "after repair"
    assert answer["samples"][0]["repaired"] is True
    assert answer["output_tokens"] == 50  # both calls were paid
    assert len(provider.requests) == 2
    repair = provider.requests[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": "Looks great to me, 9/10!"}
    assert repair[-1]["role"] == "user" and "not a JSON object" in repair[-1]["content"]


def test_score_out_of_range_is_also_repaired(provider: FakeProvider) -> None:
    provider.script.extend(
        [{"content": '{"score": 8, "reasoning": "on a 10 scale"}'}, verdict(0.8)]
    )
    client, _ = make_client(provider)
    answer = client.evaluate(config=CONFIG, judged_input="x", evidence=[])
    assert answer["score"] == 0.8
    assert (
        '"score" must be a number from 0.0 to 1.0, got 8'
        in provider.requests[1]["messages"][-1]["content"]
    )


def test_malformed_twice_is_a_parse_error_never_a_score(provider: FakeProvider) -> None:
    provider.script.extend([{"content": "no idea"}, {"content": '{"verdict": "good"}'}])
    client, _ = make_client(provider)
    outcome = judge_check(client, "Refund issued.")
    assert outcome.failure_code is FailureCode.JUDGE_PARSE_ERROR
    assert not outcome.passed and outcome.score == 0.0
    assert outcome.details["judge"]["error_code"] == "JUDGE_PARSE_ERROR"
    assert outcome.details["judge"]["raw_reply"] == '{"verdict": "good"}'
    assert outcome.details["judge"]["score"] is None
    assert "unusable twice" in outcome.message
    assert len(provider.requests) == 2


# --------------------------------------------------------------------------- provider failures


def test_rate_limit_is_retried_after_retry_after(provider: FakeProvider) -> None:
    provider.script.extend(
        [
            {
                "status": 429,
                "body": {"error": {"message": "Rate limit reached", "type": "rate_limit"}},
                "headers": {"Retry-After": "0.3"},
            },
            verdict(0.7),
        ]
    )
    client, sleep = make_client(provider)
    started = time.monotonic()
    answer = client.evaluate(config=CONFIG, judged_input="x", evidence=[])
    assert answer["score"] == 0.7
    assert len(provider.requests) == 2
    assert len(sleep.delays) == 1 and sleep.delays[0] >= 0.3  # backoff alone would be ~1 ms
    assert time.monotonic() - started >= 0.3


def test_server_errors_back_off_exponentially_then_give_up(provider: FakeProvider) -> None:
    provider.default = {"status": 503, "body": {"error": {"message": "overloaded"}}}
    client, sleep = make_client(provider, backoff_base=0.01, backoff_max=1.0, max_retries=3)
    answer = client.evaluate(config=CONFIG, judged_input="x", evidence=[])
    assert answer["error_code"] == "PROVIDER_ERROR"
    assert "answered 503" in answer["reasoning"] and "after 4 attempts" in answer["reasoning"]
    assert len(provider.requests) == 4
    # 0.01, 0.02, 0.04 with jitter in [50 %, 100 %]
    for attempt, delay in enumerate(sleep.delays):
        assert 0.005 * 2**attempt <= delay <= 0.01 * 2**attempt


def test_auth_failure_is_not_retried(provider: FakeProvider) -> None:
    provider.default = {
        "status": 401,
        "body": {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}},
    }
    client, sleep = make_client(provider)
    outcome = judge_check(client, "x")
    assert outcome.failure_code is FailureCode.PROVIDER_AUTH_FAILED
    assert "Incorrect API key provided" in outcome.message
    assert len(provider.requests) == 1 and sleep.delays == []


def test_timeout_is_retried_then_provider_timeout(provider: FakeProvider) -> None:
    provider.default = {**verdict(0.9), "delay": 1.0}
    client, sleep = make_client(provider, timeout=0.2, max_retries=1)
    started = time.monotonic()
    outcome = judge_check(client, "x")
    assert outcome.failure_code is FailureCode.PROVIDER_TIMEOUT
    assert "timed out after 0.2s" in outcome.message
    assert len(provider.requests) == 2 and len(sleep.delays) == 1
    assert time.monotonic() - started < 1.5


def test_unreachable_endpoint_is_a_provider_error_and_exit_code_3() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = JudgeClient(
        JudgeSettings(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=1, backoff_base=0.001
        )
    )
    invariants = [Invariant("tone", "tone", dict(CONFIG))]
    results = evaluate(RunArtifact(final_output="x"), invariants, CheckContext(judge=client))
    assert results[0].failure_code is FailureCode.PROVIDER_ERROR and results[0].source == "judge"
    assert "cannot reach" in results[0].message
    record = ExecutionRecord(id="1", scenario="no-chaos", status="error", results=results)
    assert exit_code_for([], [record]) == EXIT_PROVIDER_ERROR


def test_missing_credentials_answer_auth_failed_without_a_request(provider: FakeProvider) -> None:
    client, _ = make_client(provider, api_key=None, credentials_problem="OPENAI_API_KEY is not set")
    outcome = judge_check(client, "x")
    assert outcome.failure_code is FailureCode.PROVIDER_AUTH_FAILED
    assert "OPENAI_API_KEY is not set" in outcome.message
    assert provider.requests == []


def test_a_refused_seed_is_dropped_and_the_call_sent_again(provider: FakeProvider) -> None:
    provider.script.extend(
        [
            {
                "status": 400,
                "body": {"error": {"message": "Unrecognized request argument supplied: seed"}},
            },
            verdict(0.9),
        ]
    )
    client, _ = make_client(provider)
    assert client.evaluate(config=CONFIG, judged_input="x", evidence=[])["score"] == 0.9
    assert "seed" in provider.requests[0] and "seed" not in provider.requests[1]
    client.evaluate(config=CONFIG, judged_input="y", evidence=[])
    assert "seed" not in provider.requests[2]  # remembered for this client


def test_concurrency_is_limited_per_endpoint(provider: FakeProvider) -> None:
    provider.default = {**verdict(0.9), "delay": 0.15}
    # An endpoint no earlier test asked for: the limit is the process's, per endpoint, and an
    # earlier test's provider may have had this one's port (its limit would hold here).
    endpoint = f"judge-test-{uuid.uuid4().hex}"
    client, _ = make_client(provider, max_concurrency=2, endpoint_id=endpoint)
    # The same endpoint: the first limit holds.
    other, _ = make_client(provider, max_concurrency=10, endpoint_id=endpoint)
    answers: list[dict[str, Any]] = []
    threads = [
        threading.Thread(
            target=lambda i=i: answers.append(
                (client if i % 2 else other).evaluate(
                    config=CONFIG, judged_input=f"text {i}", evidence=[]
                )
            )
        )
        for i in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 6 and all(a["score"] == 0.9 for a in answers)
    assert provider.max_in_flight == 2


# --------------------------------------------------------------------------- cache, samples, evidence


def test_identical_call_is_answered_from_the_cache(provider: FakeProvider) -> None:
    cache = MemoryJudgeCache()
    client, _ = make_client(provider, cache=cache)
    first = client.evaluate(config=CONFIG, judged_input="Refund issued.", evidence=[])
    second = client.evaluate(config=CONFIG, judged_input="Refund issued.", evidence=[])
    assert len(provider.requests) == 1  # the second call never reached the server
    assert first["cached"] is False and second["cached"] is True
    assert second["score"] == first["score"] and second["raw_reply"] == first["raw_reply"]
    assert second["cost_usd"] == 0.0 and first["cost_usd"] > 0
    assert list(cache.hits.values()) == [1]
    # A different input, model or seed is a different call.
    client.evaluate(config=CONFIG, judged_input="Something else.", evidence=[])
    client.evaluate(config=dict(CONFIG, model="gpt-4o"), judged_input="Refund issued.", evidence=[])
    client.evaluate(config=dict(CONFIG, seed=3), judged_input="Refund issued.", evidence=[])
    assert len(provider.requests) == 4


def test_no_cache_above_temperature_zero(provider: FakeProvider) -> None:
    cache = MemoryJudgeCache()
    client, _ = make_client(provider, cache=cache)
    for _ in range(2):
        client.evaluate(config=dict(CONFIG, temperature=0.7), judged_input="x", evidence=[])
    assert len(provider.requests) == 2 and len(cache) == 0
    assert provider.requests[0]["temperature"] == 0.7


def test_errors_are_not_cached(provider: FakeProvider) -> None:
    provider.script.extend([{"content": "bad"}, {"content": "bad again"}])
    cache = MemoryJudgeCache()
    client, _ = make_client(provider, cache=cache)
    assert (
        client.evaluate(config=CONFIG, judged_input="x", evidence=[])["error_code"]
        == "JUDGE_PARSE_ERROR"
    )
    assert client.evaluate(config=CONFIG, judged_input="x", evidence=[])["score"] == 0.8
    assert len(provider.requests) == 3 and len(cache) == 1


def test_samples_keep_the_median_and_record_the_spread(provider: FakeProvider) -> None:
    provider.script.extend(
        [
            verdict(0.2, "harsh", dimensions={"tone": 0.1}),
            verdict(0.9, "generous", dimensions={"tone": 0.9}),
            verdict(0.6, "middle", dimensions={"tone": 0.5}),
        ]
    )
    client, _ = make_client(provider, cache=MemoryJudgeCache())
    outcome = judge_check(client, "Refund issued.", samples=3, seed=7)
    judge = outcome.details["judge"]
    assert outcome.score == 0.6 and judge["score"] == 0.6
    assert judge["spread"] == pytest.approx(0.7)
    assert judge["reasoning"] == "middle"  # the median sample speaks for the verdict
    assert [s["score"] for s in judge["samples"]] == [0.2, 0.9, 0.6]
    assert [s["seed"] for s in judge["samples"]] == [7, 8, 9]
    assert [r["seed"] for r in provider.requests] == [7, 8, 9]
    assert judge["dimensions"] == {"tone": 0.5}
    assert judge["passed"] is True  # two of three samples said passed


def test_deterministic_evidence_and_dimensions_reach_the_prompt(provider: FakeProvider) -> None:
    provider.script.append(verdict(0.3, "no refund stated", dimensions={"task": 0.1, "tone": 0.7}))
    client, _ = make_client(provider)
    invariants = [
        Invariant("tone", "tone", dict(CONFIG)),
        Invariant(
            "mentions_refund",
            "refund",
            {"type": "contains", "value": "refund"},
            dimensions=["task"],
        ),
        Invariant("short", "short", {"type": "max_length", "max": 500}),  # untagged: no evidence
    ]
    results = evaluate(
        RunArtifact(final_output="We are sorry."), invariants, CheckContext(judge=client)
    )
    judged = next(r for r in results if r.invariant_id == "tone")
    system = provider.requests[0]["messages"][0]["content"]
    assert "[FAIL] mentions_refund (dimensions: task):" in system
    assert "short" not in system.split("Deterministic checks")[1]
    assert 'score each of these dimensions from 0.0 to 1.0, under "dimensions": task' in system
    assert judged.source == "judge"
    assert judged.details["judge"]["dimensions"] == {"task": 0.1, "tone": 0.7}
    assert judged.failure_code is FailureCode.JUDGE_BELOW_THRESHOLD


# --------------------------------------------------------------------------- drift and embeddings


def test_drift_by_judge(provider: FakeProvider) -> None:
    provider.script.append(
        {"content": json.dumps({"drift_score": 0.4, "reasoning": "different total"})}
    )
    client, _ = make_client(provider)
    check = get_check_class("drift")({"type": "drift", "method": "judge", "max_score": 0.15})
    context = CheckContext(judge=client, baseline_output="Refunded 40 EUR.")
    outcome = check.evaluate(RunArtifact(final_output="Refunded 45 EUR."), context)
    assert outcome.failure_code is FailureCode.DRIFT_EXCEEDED
    assert outcome.score == pytest.approx(0.6) and outcome.details["reasoning"] == "different total"
    user = provider.requests[0]["messages"][1]["content"]
    assert "Refunded 40 EUR." in user and "Refunded 45 EUR." in user


def test_embeddings_feed_similarity_and_provider_errors_keep_their_code(
    provider: FakeProvider,
) -> None:
    client, _ = make_client(provider, embedding_model="text-embedding-3-small")
    assert client.embed(["Refund done", "no"]) == [[1.0, 0.0], [0.0, 1.0]]
    assert provider.requests[0]["model"] == "text-embedding-3-small"
    check = get_check_class("similarity")(
        {"type": "similarity", "expected": "Your refund is on its way", "method": "embedding"}
    )
    assert check.evaluate(
        RunArtifact(final_output="refund sent"), CheckContext(judge=client)
    ).passed
    broken, _ = make_client(provider, api_key=None, credentials_problem="no key on the server")
    with pytest.raises(JudgeError) as raised:
        broken.embed(["a"])
    assert raised.value.code == "PROVIDER_AUTH_FAILED"
    outcome = check.evaluate(RunArtifact(final_output="refund sent"), CheckContext(judge=broken))
    assert outcome.failure_code is FailureCode.PROVIDER_AUTH_FAILED
