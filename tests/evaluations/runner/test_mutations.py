"""Rule-based mutations, their score, and LLM generation against a real local HTTP server."""

from __future__ import annotations

import base64
import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import checks
from evaluations.runner.mutations import (
    DEFAULT_WEIGHTS,
    MUTATION_TYPES,
    Mutation,
    MutationError,
    generate_mutations,
    generate_with_llm,
    mutate,
    mutation_score,
)
from tests.http_peer import HttpPeer, PeerHandler

PROMPT = "Please refund order 1042 and send the customer an email about it"


def variants(mutation_type: str, seeds: range = range(20), prompt: str = PROMPT) -> list[str]:
    return [mutate(prompt, mutation_type, seed) for seed in seeds]


# -- generation --------------------------------------------------------------------------------


def test_mutation_types_are_the_24_names_the_spec_schema_accepts() -> None:
    schema = json.loads((Path(checks.__file__).parent / "schema" / "spec.schema.json").read_text())
    accepted = schema["$defs"]["mutations"]["properties"]["types"]["items"]["enum"]
    assert list(MUTATION_TYPES) == accepted
    assert set(DEFAULT_WEIGHTS) == set(MUTATION_TYPES)


def test_generate_mutations_makes_count_per_type_and_is_deterministic() -> None:
    types = ["paraphrase", "noise", "prompt_injection"]
    first = generate_mutations(PROMPT, types, count=3, seed=42)
    assert first == generate_mutations(PROMPT, types, count=3, seed=42)
    assert [m.type for m in first] == ["paraphrase"] * 3 + ["noise"] * 3 + ["prompt_injection"] * 3
    assert all(isinstance(m, Mutation) for m in first)
    assert len({m.seed for m in first}) == 9
    assert first != generate_mutations(PROMPT, types, count=3, seed=43)


def test_adding_a_type_leaves_the_other_types_mutations_unchanged() -> None:
    alone = generate_mutations(PROMPT, ["noise"], count=4, seed=1)
    together = generate_mutations(PROMPT, ["paraphrase", "noise"], count=4, seed=1)
    assert [m for m in together if m.type == "noise"] == alone


def test_each_mutation_is_reproducible_from_its_own_seed() -> None:
    for mutation in generate_mutations(PROMPT, list(MUTATION_TYPES), count=2, seed=5):
        assert mutate(PROMPT, mutation.type, mutation.seed) == mutation.prompt


def test_unknown_types_are_rejected_naming_the_field() -> None:
    with pytest.raises(MutationError, match="mutations.types: unknown mutation type 'typo'"):
        generate_mutations(PROMPT, ["noise", "typo"], count=2, seed=1)


def test_every_type_changes_the_prompt() -> None:
    for mutation_type in MUTATION_TYPES:
        for text in variants(mutation_type, range(10)):
            assert text != PROMPT, mutation_type


# -- each type's characteristic change ----------------------------------------------------------


def test_paraphrase_keeps_the_facts_and_rewords() -> None:
    for text in variants("paraphrase"):
        assert "1042" in text
        assert text.lower() != PROMPT.lower()
    assert any(word in " ".join(variants("paraphrase")) for word in ("client", "kindly", "e-mail"))


def test_noise_makes_a_few_small_typos() -> None:
    for text in variants("noise"):
        assert abs(len(text) - len(PROMPT)) <= 6
        differing = sum(a != b for a, b in zip(text, PROMPT, strict=False))
        assert differing > 0 or len(text) != len(PROMPT)


def test_tone_shift_wraps_the_request_in_a_tone() -> None:
    texts = variants("tone_shift")
    assert any("!!!" in t and PROMPT.upper().rstrip(".") in t for t in texts)  # angry
    assert any(t.startswith("hey so like") for t in texts)  # casual
    assert any(t.startswith("Dear Assistant") for t in texts)  # formal


def test_prompt_injection_appends_an_injection_after_the_original() -> None:
    for text in variants("prompt_injection"):
        assert text.startswith(PROMPT + "\n\n")
        assert len(text) > len(PROMPT) + 10


def test_encoding_attacks_encode_the_prompt_in_a_recoverable_way() -> None:
    texts = variants("encoding_attacks", range(40))
    decoded = set()
    for text in texts:
        if text.startswith("Decode this base64"):
            decoded.add(base64.b64decode(text.rsplit(" ", 1)[1]).decode())
        elif text.startswith("The following is ROT13"):
            decoded.add(codecs.decode(text.split(": ", 1)[1], "rot13"))
    assert decoded == {PROMPT}
    assert any("r3fund" in t for t in texts)  # leetspeak
    assert any("\u0430" in t or "\u0435" in t for t in texts)  # Cyrillic homoglyphs


def test_length_extremes_make_the_prompt_very_short_or_very_long() -> None:
    lengths = {len(t) for t in variants("length_extremes")}
    assert min(lengths) < len(PROMPT) // 3
    assert max(lengths) > 10 * len(PROMPT)


def test_context_manipulation_prepends_irrelevant_context() -> None:
    for text in variants("context_manipulation"):
        assert text.endswith(PROMPT[0].lower() + PROMPT[1:])
        assert "Anyway," in text


def test_language_mixing_swaps_some_words_into_other_languages() -> None:
    foreign = (
        "pedido",
        "commande",
        "Bestellung",
        "cliente",
        "Kunde",
        "por favor",
        "bitte",
        "und",
        "et",
    )
    for text in variants("language_mixing"):
        assert any(word in text for word in foreign)
    unknown_words = mutate("Zyx qwv", "language_mixing", 1)
    assert unknown_words.startswith("Zyx qwv, ")


def test_custom_mutation_uses_the_given_templates() -> None:
    text = mutate("hi", "custom", 1, custom_templates=["<<{prompt}>> {not a field}"])
    assert text == "<<hi>> {not a field}"


def test_semantic_similarity_attack_changes_a_number_or_flips_a_word() -> None:
    for text in variants("semantic_similarity_attack"):
        assert "1042" not in text and len(text) == len(PROMPT)
    assert mutate("Always check the box", "semantic_similarity_attack", 1) == "Never check the box"


def test_system_level_attacks_carry_their_marker() -> None:
    markers = {
        "http_header_injection": "\r\n",
        "query_parameter_poisoning": "?",
        "request_method_attack": " HTTP/1.1",
        "concurrent_request_pattern": "[request 3]",
        "multi_turn_attack": "Assistant:",
    }
    for mutation_type, marker in markers.items():
        for text in variants(mutation_type, range(5)):
            assert marker in text and PROMPT in text, mutation_type
    assert all(len(t) >= 10_000 for t in variants("payload_size_attack", range(5)))


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.text(), st.sampled_from(MUTATION_TYPES), st.integers())
def test_mutations_never_raise_and_are_deterministic(prompt: str, kind: str, seed: int) -> None:
    first = mutate(prompt, kind, seed)
    assert isinstance(first, str)
    assert first == mutate(prompt, kind, seed)


@settings(max_examples=30, deadline=None)
@given(st.text(min_size=1), st.integers(min_value=0, max_value=2**32))
def test_generate_mutations_is_deterministic_for_any_unicode_prompt(prompt: str, seed: int) -> None:
    types = list(MUTATION_TYPES)
    assert generate_mutations(prompt, types, count=1, seed=seed) == generate_mutations(
        prompt, types, count=1, seed=seed
    )


# -- score -------------------------------------------------------------------------------------


def test_mutation_score_weights_adversarial_types_higher() -> None:
    results = [("noise", True), ("prompt_injection", False)]
    assert mutation_score(results) == pytest.approx(0.8 / (0.8 + 1.5))
    flipped = [("noise", False), ("prompt_injection", True)]
    assert mutation_score(flipped) == pytest.approx(1.5 / 2.3)


def test_mutation_score_takes_weight_overrides_and_handles_no_results() -> None:
    results = [("noise", True), ("paraphrase", False)]
    assert mutation_score(results, {"noise": 3.0}) == pytest.approx(3.0 / 4.0)
    assert mutation_score([]) == 1.0
    assert mutation_score([("noise", True), ("noise", True)]) == 1.0


# -- LLM generation ----------------------------------------------------------------------------


class FakeOpenAI(HttpPeer):
    """A real HTTP server speaking the OpenAI chat-completions JSON."""

    def __init__(self, reply: str) -> None:
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(PeerHandler):
            def do_POST(self) -> None:
                fake.requests.append({"path": self.path, "body": json.loads(self.read_body())})
                self.send_json(
                    200,
                    {
                        "id": "cmpl-1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "test-model",
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": reply},
                            }
                        ],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
                    },
                )

        super().__init__(Handler, poll_interval=0.05)
        self.base_url = f"{self.url}/v1"


@pytest.fixture
def fake_openai(request: pytest.FixtureRequest) -> Iterator[FakeOpenAI]:
    with FakeOpenAI(getattr(request, "param", '"Could you refund order 1042?"')) as server:
        yield server


def test_generate_with_llm_asks_the_configured_endpoint_for_the_type(
    fake_openai: FakeOpenAI,
) -> None:
    import openai

    def client_factory() -> openai.OpenAI:
        return openai.OpenAI(base_url=fake_openai.base_url, api_key="test", max_retries=0)

    text = generate_with_llm("Refund order 1042", "paraphrase", client_factory, model="m1")
    assert text == "Could you refund order 1042?"  # surrounding quotes stripped
    [sent] = fake_openai.requests
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["model"] == "m1"
    assert sent["body"]["temperature"] == 0.0
    assert "'paraphrase' mutation" in sent["body"]["messages"][0]["content"]
    assert sent["body"]["messages"][1] == {"role": "user", "content": "Refund order 1042"}


@pytest.mark.parametrize("fake_openai", ["   "], indirect=True)
def test_generate_with_llm_rejects_an_empty_answer(fake_openai: FakeOpenAI) -> None:
    import openai

    def client_factory() -> openai.OpenAI:
        return openai.OpenAI(base_url=fake_openai.base_url, api_key="test", max_retries=0)

    with pytest.raises(MutationError, match="empty 'noise' mutation"):
        generate_with_llm("Refund order 1042", "noise", client_factory)
