"""LLM fault modes, applied by the gateway where the agent really talks to its model.

A scenario's `llm_faults` is a list of `{mode, probability, after_calls, ...}`. For each LLM
call (0-based index, per execution) the first fault that fires is applied, and only that one.
Whether a fault fires is decided by `random.Random(f"{seed}:{call_index}:{fault_index}")`, so the
same run seed gives the same faulted calls on every machine.

Status faults answer instead of the model (`error`, `rate_limit`, `timeout`); content faults
change the model's answer (`truncated_response`, `empty`, `garbage`, `response_drift`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evaluations.runner.scripted import count_tokens, error_body, split_tokens

STATUS_MODES = ("error", "rate_limit", "timeout")
CONTENT_MODES = ("truncated_response", "empty", "garbage", "response_drift")
LLM_FAULT_MODES = STATUS_MODES + CONTENT_MODES
DRIFT_TYPES = (
    "json_field_rename",
    "verbosity_shift",
    "format_change",
    "refusal_rephrase",
    "tone_shift",
)


@dataclass(frozen=True, slots=True)
class LLMFault:
    """One entry of a scenario's `llm_faults`: the mode, when it may fire (probability,
    after_calls), and the mode's own options."""

    mode: str
    index: int  # position in the scenario's list, part of the random seed
    probability: float = 1.0
    after_calls: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def fires(self, *, seed: int | str, call_index: int) -> bool:
        if call_index < self.after_calls:
            return False
        return fault_rng(seed, call_index, self.index).random() < self.probability

    @property
    def label(self) -> str:
        """What the trace records: the mode, with the drift type for response_drift."""
        if self.mode == "response_drift":
            return f"response_drift:{self.options.get('drift_type', 'json_field_rename')}"
        return self.mode


def fault_rng(seed: int | str, call_index: int, fault_index: int) -> random.Random:
    return random.Random(f"{seed}:{call_index}:{fault_index}")


def parse_llm_faults(faults: Iterable[Mapping[str, Any]]) -> list[LLMFault]:
    parsed = []
    for index, raw in enumerate(faults or ()):
        mode = str(raw.get("mode", ""))
        if mode not in LLM_FAULT_MODES:
            raise ValueError(
                f"llm_faults[{index}].mode: unknown mode {mode!r}; known: {', '.join(LLM_FAULT_MODES)}"
            )
        options = {k: v for k, v in raw.items() if k not in ("mode", "probability", "after_calls")}
        drift = options.get("drift_type", "json_field_rename")
        if mode == "response_drift" and drift not in DRIFT_TYPES:
            raise ValueError(
                f"llm_faults[{index}].drift_type: unknown {drift!r}; known: {', '.join(DRIFT_TYPES)}"
            )
        probability = float(raw.get("probability", 1.0))
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"llm_faults[{index}].probability must be between 0 and 1")
        parsed.append(
            LLMFault(
                mode=mode,
                index=index,
                probability=probability,
                after_calls=int(raw.get("after_calls", 0)),
                options=options,
            )
        )
    return parsed


def select_fault(
    faults: Iterable[LLMFault], *, seed: int | str, call_index: int
) -> LLMFault | None:
    for fault in faults:
        if fault.fires(seed=seed, call_index=call_index):
            return fault
    return None


# --------------------------------------------------------------------------- status faults


def status_fault_reply(fault: LLMFault) -> tuple[int, dict[str, str], dict[str, Any]]:
    """(status, headers, body) the gateway sends instead of the model's answer."""
    options = fault.options
    if fault.mode == "rate_limit":
        retry_after = options.get("retry_after", 1)
        message = str(
            options.get("message") or "Rate limit reached for requests (injected by Keystone)."
        )
        return (
            429,
            {"Retry-After": str(retry_after)},
            error_body(message, kind="requests", code="rate_limit_exceeded"),
        )
    if fault.mode == "timeout":
        return (
            504,
            {},
            error_body(
                "The upstream model timed out (injected by Keystone).",
                kind="timeout",
                code="timeout",
            ),
        )
    status = int(options.get("error_code", 503))
    message = str(
        options.get("message") or "The model is temporarily unavailable (injected by Keystone)."
    )
    return status, {}, error_body(message, kind="server_error", code="service_unavailable")


def timeout_delay_seconds(fault: LLMFault) -> float:
    # Longer than the usual client timeouts, so the agent's own timeout is what ends the call.
    return float(fault.options.get("delay_ms", 30_000)) / 1000.0


# --------------------------------------------------------------------------- content faults


TextMap = Callable[[str], str]


def content_fault_text_map(fault: LLMFault, rng: random.Random) -> TextMap:
    """How the fault rewrites the model's text (used for chat and responses shapes alike)."""
    options = fault.options
    if fault.mode == "truncated_response":
        limit = int(options.get("max_tokens", 20))
        return lambda text: "".join(split_tokens(text)[:limit])
    if fault.mode == "empty":
        return lambda text: ""
    if fault.mode == "garbage":
        noise = garbage_text(rng, int(options.get("length", 0)) or rng.randint(40, 200))
        return lambda text: noise
    drift = str(options.get("drift_type", "json_field_rename"))
    if drift == "json_field_rename":
        renames = dict(options.get("fields") or {})
        return lambda text: rename_json_fields(text, renames)
    if drift == "verbosity_shift":
        return verbose
    if drift == "format_change":
        return change_format
    if drift == "refusal_rephrase":
        return rephrase_refusal
    tone = str(options.get("tone", "casual"))
    return lambda text: shift_tone(text, tone)


def apply_to_chat(
    fault: LLMFault, completion: Mapping[str, Any], rng: random.Random
) -> dict[str, Any]:
    """A new chat.completion with the content fault applied."""
    result = json.loads(json.dumps(completion))
    text_map = content_fault_text_map(fault, rng)
    for choice in result.get("choices") or []:
        message = choice.setdefault("message", {"role": "assistant"})
        if fault.mode == "truncated_response":
            _truncate_message(message, int(fault.options.get("max_tokens", 20)))
            choice["finish_reason"] = "length"
            continue
        if fault.mode in ("empty", "garbage"):
            # The model "answered" but with nothing usable: no tool calls either.
            message.pop("tool_calls", None)
            message["content"] = text_map(message.get("content") or "")
            choice["finish_reason"] = "stop"
            continue
        if message.get("content"):
            message["content"] = text_map(message["content"])
    _recount_completion_tokens(result)
    return result


def apply_to_responses(
    fault: LLMFault, response: Mapping[str, Any], rng: random.Random
) -> dict[str, Any]:
    """A new /v1/responses object with the content fault applied to its output text."""
    result = json.loads(json.dumps(response))
    text_map = content_fault_text_map(fault, rng)
    if fault.mode in ("empty", "garbage"):
        result["output"] = [
            item for item in result.get("output") or [] if item.get("type") == "message"
        ]
    for item in result.get("output") or []:
        for part in item.get("content") or []:
            if part.get("type") == "output_text":
                part["text"] = text_map(part.get("text") or "")
    if fault.mode == "truncated_response":
        result["status"] = "incomplete"
        result["incomplete_details"] = {"reason": "max_output_tokens"}
    return result


def _truncate_message(message: dict[str, Any], limit: int) -> None:
    budget = limit
    content = message.get("content")
    if isinstance(content, str):
        tokens = split_tokens(content)
        message["content"] = "".join(tokens[:budget])
        budget = max(0, budget - len(tokens))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        tokens = split_tokens(str(function.get("arguments", "")))
        function["arguments"] = "".join(tokens[:budget])
        budget = max(0, budget - len(tokens))


def _recount_completion_tokens(completion: dict[str, Any]) -> None:
    usage = completion.get("usage")
    if not isinstance(usage, dict):
        return
    produced = 0
    for choice in completion.get("choices") or []:
        message = choice.get("message") or {}
        produced += count_tokens(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            produced += count_tokens(str((call.get("function") or {}).get("arguments", "")))
    usage["completion_tokens"] = produced
    prompt = usage.get("prompt_tokens")  # as the model sent it: not always a number
    usage["total_tokens"] = (prompt if isinstance(prompt, int) else 0) + produced


def garbage_text(rng: random.Random, length: int) -> str:
    # Random bytes read as UTF-8: mojibake, replacement characters and stray control codes.
    return rng.randbytes(length).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- drift rewrites

_SYNONYMS = {
    "status": "state",
    "amount": "total",
    "id": "identifier",
    "name": "title",
    "message": "msg",
    "error": "err",
    "result": "outcome",
    "items": "entries",
    "count": "total_count",
    "price": "cost",
    "email": "email_address",
    "date": "timestamp",
    "answer": "response",
    "reason": "explanation",
}


def _rename_key(key: str, renames: Mapping[str, str]) -> str:
    if key in renames:
        return str(renames[key])
    if key in _SYNONYMS:
        return _SYNONYMS[key]
    if "_" in key:  # snake_case -> camelCase
        head, *rest = key.split("_")
        return head + "".join(part.capitalize() for part in rest)
    if re.search(r"[a-z][A-Z]", key):  # camelCase -> snake_case
        return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), key)
    return key[:1].upper() + key[1:]


def _rename_all(value: Any, renames: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {_rename_key(str(k), renames): _rename_all(v, renames) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename_all(item, renames) for item in value]
    return value


def _find_json(text: str) -> tuple[Any, int, int] | None:
    """The JSON value in `text` (whole text or a fenced block) and its span."""
    try:
        return json.loads(text), 0, len(text)
    except ValueError:
        pass
    match = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if match:
        try:
            return json.loads(match.group(1)), match.start(1), match.end(1)
        except ValueError:
            return None
    return None


def rename_json_fields(text: str, renames: Mapping[str, str] | None = None) -> str:
    found = _find_json(text)
    if found is None:
        return text
    value, start, end = found
    return text[:start] + json.dumps(_rename_all(value, renames or {})) + text[end:]


def verbose(text: str) -> str:
    return (
        "Certainly! That is a great question, and I am more than happy to walk you through it "
        "in as much detail as possible so that nothing is left unclear.\n\n"
        f"{text}\n\n"
        "To summarise, the points above should cover everything you need. If anything is still "
        "unclear, or if you would like me to elaborate further on any part of this answer, please "
        "do not hesitate to ask. I hope this helps, and have a wonderful day!"
    )


_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(.*)$")


def change_format(text: str) -> str:
    """JSON becomes a markdown list; a markdown list becomes JSON; prose becomes a list."""
    found = _find_json(text)
    if found is not None:
        value = found[0]
        if isinstance(value, dict):
            return "\n".join(f"- **{key}**: {_plain(item)}" for key, item in value.items())
        if isinstance(value, list):
            return "\n".join(f"- {_plain(item)}" for item in value)
        return f"- {_plain(value)}"
    lines = [line for line in text.splitlines() if line.strip()]
    bullets = [_BULLET.match(line) for line in lines]
    if lines and all(bullets):
        return json.dumps([match.group(1) for match in bullets if match])
    sentences = [part.strip() for part in re.split(r"(?<=[.!?])\s+", text) if part.strip()]
    return "\n".join(f"- {sentence}" for sentence in sentences)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


_REFUSAL = re.compile(r"\b(can(?:no|')t|cannot|unable|won't|not able|sorry|apolog)", re.IGNORECASE)


def rephrase_refusal(text: str) -> str:
    """Refusals worded unlike the usual phrases; other answers get a hedged partial refusal."""
    if _REFUSAL.search(text):
        return "That falls outside what I'm in a position to assist with here, so I'll pass on this one."
    return f"I'd rather not go into all of that, but here is what I can share: {text}"


def shift_tone(text: str, tone: str) -> str:
    if tone == "formal":
        return f"Dear user, with the utmost respect, please find the requested information below.\n\n{text}\n\nYours faithfully."
    if tone == "curt":
        first = re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)[0]
        return first
    return f"Hey there!! 😎 So, like, here's the deal: {text} lol. Cheers!!"
