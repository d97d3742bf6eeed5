"""The LLM gateway: one OpenAI-compatible endpoint per execution, in front of the agent's model.

The agent gets `OPENAI_BASE_URL=gateway.base_url` and `OPENAI_API_KEY=gateway.api_key` (a
per-execution token, useless anywhere else). The gateway answers from the scripted provider,
or forwards to the spec's upstream with the real key taken from the server's secrets, applies
the scenario's LLM faults, and records every call for the execution's trace.

Notes:
- Faults and call indexes count chat completions and responses calls; embeddings and model
  listings are forwarded and recorded but never faulted.
- A streaming request is answered by getting the whole answer first (so content faults can be
  applied to it) and then streaming it as SSE chunks.
- `request_transforms` rewrite each chat request before the model sees it (context attacks
  such as memory poisoning plug in here): `fn(body, call_index) -> body`.
"""

from __future__ import annotations

import json
import secrets as secrets_module
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from checks.artifact import LLMCall, ToolCall
from checks.json_text import loads_strict
from evaluations.runner.llm_faults import (
    CONTENT_MODES,
    LLMFault,
    apply_to_chat,
    apply_to_responses,
    fault_rng,
    parse_llm_faults,
    select_fault,
    status_fault_reply,
    timeout_delay_seconds,
)
from evaluations.runner.pricing import DEFAULT_PRICES, cost_usd
from evaluations.runner.scripted import (
    HttpReply,
    HttpRequest,
    LoopbackHTTPServer,
    ScriptedProvider,
    chat_to_responses,
    chat_to_sse,
    count_request_tokens,
    count_tokens,
    embeddings_response,
    error_body,
    message_text,
    models_response,
    responses_input_to_messages,
)

RequestTransform = Callable[[dict[str, Any], int], dict[str, Any]]
DEFAULT_UPSTREAM = "https://api.openai.com/v1"

if TYPE_CHECKING:
    # httpx2 (~100 ms to import) is imported where an upstream provider is used, not by
    # every execution: a scripted provider or an agent with no model never needs it.
    import httpx2


class GatewayConfigError(ValueError):
    """The `llm` block cannot be served (e.g. its api_key_env is not among the server's secrets)."""


class Gateway:
    def __init__(
        self,
        llm_config: Mapping[str, Any] | None,
        *,
        llm_faults: Iterable[Mapping[str, Any]] = (),
        seed: int | str = 0,
        secrets: Mapping[str, str] | None = None,
        request_transforms: Sequence[RequestTransform] = (),
    ) -> None:
        config = dict(llm_config or {"provider": "scripted", "rules": []})
        self.provider = str(config.get("provider", "scripted"))
        self.model: str | None = config.get("model")
        self.seed = seed
        self.api_key = "ks-gw-" + secrets_module.token_hex(16)
        self._faults = parse_llm_faults(llm_faults)
        self._prices = _normalise_prices(config.get("prices"))
        self._transforms = list(request_transforms)
        self._scripted: ScriptedProvider | None = None
        self._upstream: httpx2.Client | None = None
        if self.provider == "scripted":
            self._scripted = ScriptedProvider(
                list(config.get("rules") or []), model=self.model or "scripted"
            )
        else:
            self._upstream = _upstream_client(config, secrets or {})
        self._lock = threading.Lock()
        self._calls: list[LLMCall] = []
        self._next_index = 0
        self._closing = threading.Event()
        self._http = LoopbackHTTPServer(self._handle)

    # -- lifecycle

    @property
    def upstream_url(self) -> str | None:
        """The real model endpoint behind the gateway (None for the scripted provider)."""
        return None if self._upstream is None else str(self._upstream.base_url).rstrip("/")

    @property
    def base_url(self) -> str:
        return f"{self._http.url}/v1"

    def env(self) -> dict[str, str]:
        """What the agent's environment gets to reach its model through the gateway."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key}

    def __enter__(self) -> Gateway:
        self._http.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()  # wakes calls sleeping in a timeout fault
        self._http.close()
        if self._upstream is not None:
            self._upstream.close()

    def calls(self) -> list[LLMCall]:
        with self._lock:
            return list(self._calls)

    # -- HTTP

    def _handle(self, request: HttpRequest) -> HttpReply:
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return HttpReply.json(
                401,
                error_body(
                    "Unknown API key for this Keystone gateway.",
                    kind="invalid_request_error",
                    code="invalid_api_key",
                ),
            )
        path = request.path.rstrip("/")
        try:
            if request.method == "POST" and path.endswith("/chat/completions"):
                return self._chat(request.json())
            if request.method == "POST" and path.endswith("/responses"):
                return self._responses(request.json())
            if request.method == "POST" and path.endswith("/embeddings"):
                return self._embeddings(request.json())
            if request.method == "GET" and path.endswith("/models"):
                return self._models()
        except json.JSONDecodeError as exc:
            return HttpReply.json(
                400, error_body(f"request body is not JSON: {exc}", kind="invalid_request_error")
            )
        return HttpReply.json(
            404, error_body(f"no route {request.method} {path}", kind="invalid_request_error")
        )

    def _take_index(self) -> int:
        with self._lock:
            index = self._next_index
            self._next_index += 1
            return index

    def _record(self, call: LLMCall) -> None:
        with self._lock:
            self._calls.append(call)

    def _status_fault(self, fault: LLMFault, body: dict[str, Any], started: float) -> HttpReply:
        status, headers, payload = status_fault_reply(fault)
        delay = timeout_delay_seconds(fault) if fault.mode == "timeout" else 0.0
        # A timeout is recorded before sleeping, with the delay as its latency: the agent
        # usually gives up before the delay ends.
        self._record(
            LLMCall(
                model=str(body.get("model") or self.model or ""),
                request=body,
                response=payload,
                status=status,
                latency_ms=delay * 1000 if fault.mode == "timeout" else _ms_since(started),
                fault=fault.label,
                started_at=_wall_clock(started),
            )
        )
        if fault.mode == "timeout":
            self._closing.wait(delay)
            if fault.options.get("drop"):
                return HttpReply(status, drop=True)
        return HttpReply.json(status, payload, headers)

    def _chat(self, body: dict[str, Any]) -> HttpReply:
        started = time.perf_counter()
        call_index = self._take_index()
        for transform in self._transforms:
            body = transform(body, call_index)
        fault = select_fault(self._faults, seed=self.seed, call_index=call_index)
        if fault is not None and fault.mode not in CONTENT_MODES:
            return self._status_fault(fault, body, started)
        status, completion, headers = self._complete_chat(body, call_index)
        if status == 200 and fault is not None:
            completion = apply_to_chat(
                fault, completion, fault_rng(self.seed, call_index, fault.index)
            )
        usage = _chat_usage(body, completion, status)
        self._record(self._answered_call(body, completion, status, started, fault, usage))
        if status != 200:
            return HttpReply.json(status, completion, headers)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return HttpReply.sse(chat_to_sse(completion, include_usage=include_usage))
        return HttpReply.json(200, completion)

    def _complete_chat(
        self, body: dict[str, Any], call_index: int
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if self._scripted is not None:
            return 200, self._scripted.complete(body, call_index=call_index), {}
        forwarded = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        if self.model:
            forwarded["model"] = self.model
        return self._forward("POST", "chat/completions", forwarded)

    def _responses(self, body: dict[str, Any]) -> HttpReply:
        started = time.perf_counter()
        if body.get("stream"):
            return HttpReply.json(
                400,
                error_body(
                    "streaming /v1/responses is not supported by the Keystone gateway",
                    kind="invalid_request_error",
                ),
            )
        call_index = self._take_index()
        fault = select_fault(self._faults, seed=self.seed, call_index=call_index)
        if fault is not None and fault.mode not in CONTENT_MODES:
            return self._status_fault(fault, body, started)
        rng = fault_rng(self.seed, call_index, fault.index) if fault else None
        headers: dict[str, str] = {}
        if self._scripted is not None:
            chat = {"model": body.get("model"), "messages": responses_input_to_messages(body)}
            completion = self._scripted.complete(chat, call_index=call_index)
            if fault is not None and rng is not None:
                completion = apply_to_chat(fault, completion, rng)
            status, response = 200, chat_to_responses(completion)
        else:
            forwarded = dict(body)
            if self.model:
                forwarded["model"] = self.model
            status, response, headers = self._forward("POST", "responses", forwarded)
            if status == 200 and fault is not None and rng is not None:
                response = apply_to_responses(fault, response, rng)
        usage = _responses_usage(body, response, status)
        self._record(self._answered_call(body, response, status, started, fault, usage))
        return HttpReply.json(status, response, headers)

    def _embeddings(self, body: dict[str, Any]) -> HttpReply:
        started = time.perf_counter()
        headers: dict[str, str] = {}
        if self._scripted is not None:
            status, response = 200, embeddings_response(body, self.model or "scripted")
        else:
            status, response, headers = self._forward("POST", "embeddings", body)
        usage = _object(response.get("usage"))
        model = str(response.get("model") or body.get("model") or "")
        input_tokens = _count(usage.get("prompt_tokens")) or 0
        summary = (
            {
                "object": response.get("object"),
                "vectors": len(response.get("data") or []),
                "usage": usage,
            }
            if status == 200
            else response
        )
        cost = self._cost(model, input_tokens, 0)
        self._record(
            LLMCall(
                model=model,
                request=body,
                response=summary,
                status=status,
                input_tokens=input_tokens,
                latency_ms=_ms_since(started),
                cost_usd=cost or 0.0,
                priced=cost is not None,
                started_at=_wall_clock(started),
            )
        )
        return HttpReply.json(status, response, headers)

    def _models(self) -> HttpReply:
        if self._scripted is not None:
            return HttpReply.json(200, models_response([self.model or "scripted"]))
        status, response, headers = self._forward("GET", "models", None)
        if status != 200 and self.model:
            return HttpReply.json(200, models_response([self.model]))
        return HttpReply.json(status, response, headers)

    def _forward(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        import httpx2

        assert self._upstream is not None
        try:
            response = self._upstream.request(method, path, json=body)
        except httpx2.TimeoutException as exc:
            return 504, error_body(f"upstream model timed out: {exc}", kind="upstream_timeout"), {}
        except httpx2.HTTPError as exc:
            return (
                502,
                error_body(f"upstream model unreachable: {exc}", kind="upstream_unreachable"),
                {},
            )
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() in ("retry-after", "retry-after-ms", "x-request-id")
        }
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):  # what every endpoint answers is a JSON object
            payload = error_body(
                f"upstream answered no JSON object: {response.text[:200]}", kind="upstream_error"
            )
            return (response.status_code if response.status_code >= 400 else 502), payload, headers
        return response.status_code, payload, headers

    # -- recording

    def _cost(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        """The call's cost in USD; None for a model with no price, in the default table or
        the spec's `llm.prices` (recorded as $0, `priced: false`)."""
        # The scripted provider costs nothing, whatever model name the agent asked for.
        priced_as = "scripted" if self._scripted is not None else model
        return cost_usd(priced_as, input_tokens, output_tokens, self._prices)

    def _answered_call(
        self,
        body: dict[str, Any],
        answer: dict[str, Any],
        status: int,
        started: float,
        fault: LLMFault | None,
        usage: _AnswerUsage,
    ) -> LLMCall:
        """The record of a chat or responses call the model answered (possibly with a
        content fault applied); only how `usage` is read differs between the two formats."""
        model = str(answer.get("model") or body.get("model") or self.model or "")
        cost = self._cost(model, usage.input_tokens, usage.output_tokens)
        return LLMCall(
            model=model,
            request=body,
            response=answer,
            status=status,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            latency_ms=_ms_since(started),
            cost_usd=cost or 0.0,
            priced=cost is not None,
            fault=fault.label if fault else None,
            tool_calls=usage.tool_calls,
            started_at=_wall_clock(started),
        )


class _AnswerUsage(NamedTuple):
    input_tokens: int
    output_tokens: int
    tool_calls: list[ToolCall]  # the tools the model asked for


# More tokens than one call can have used: a figure beyond it is no count.
_MOST_TOKENS = 10**9


def _object(value: Any) -> dict[str, Any]:
    """A JSON object an answer has (its usage, a choice's message, a call's function), or an
    empty one where it has something else."""
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int | None:
    """A token count the model reported, or None where it gave none or something else (a
    negative or fractional number, a word): what is stored must be a whole number that a
    database's integer column takes, and the agent's answer is relayed whatever it says."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value <= _MOST_TOKENS else None


def _objects(value: Any) -> list[dict[str, Any]]:
    """The JSON objects of a list an answer has (choices, tool calls), where it has one."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _chat_usage(body: dict[str, Any], completion: dict[str, Any], status: int) -> _AnswerUsage:
    usage = _object(completion.get("usage"))
    messages = body.get("messages") or []
    input_tokens = _count(usage.get("prompt_tokens")) or (
        count_request_tokens(messages) if status == 200 else 0
    )
    # Without a count from the model, the answers' texts are counted.
    reported = _count(usage.get("completion_tokens"))
    output_tokens = reported or 0
    tool_calls: list[ToolCall] = []
    for choice in _objects(completion.get("choices")):
        message = _object(choice.get("message"))
        if reported is None:
            output_tokens += count_tokens(message_text(message))
        for call in _objects(message.get("tool_calls")):
            function = _object(call.get("function"))
            tool_calls.append(_model_tool_call(function.get("name"), function.get("arguments")))
    return _AnswerUsage(input_tokens, output_tokens, tool_calls)


def _responses_usage(body: dict[str, Any], response: dict[str, Any], status: int) -> _AnswerUsage:
    usage = _object(response.get("usage"))
    input_tokens = _count(usage.get("input_tokens")) or (
        count_request_tokens(responses_input_to_messages(body)) if status == 200 else 0
    )
    # Without a count from the model, the answer's texts are counted, as for chat: a call
    # counted as 0 tokens would cost $0, and pass a cost limit whatever it cost.
    reported = _count(usage.get("output_tokens"))
    output_tokens = reported or 0
    tool_calls: list[ToolCall] = []
    for item in _objects(response.get("output")):
        if item.get("type") == "function_call":
            tool_calls.append(_model_tool_call(item.get("name"), item.get("arguments")))
        elif reported is None and item.get("type") == "message":
            texts = [str(part.get("text") or "") for part in _objects(item.get("content"))]
            output_tokens += count_tokens("".join(texts))
    return _AnswerUsage(input_tokens, output_tokens, tool_calls)


def _model_tool_call(name: Any, arguments: Any) -> ToolCall:
    parsed: dict[str, Any]
    if isinstance(arguments, dict):
        parsed = arguments
    else:
        try:
            value = loads_strict(arguments or "{}")
            parsed = value if isinstance(value, dict) else {"_value": value}
        except (TypeError, ValueError):
            parsed = {"_raw": str(arguments)}  # e.g. arguments cut by a truncation fault
    return ToolCall(name=str(name or ""), arguments=parsed, source="model")


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _wall_clock(started: float) -> float:
    """The epoch time of a perf_counter() reading (when the call began, for the timeline)."""
    return time.time() - (time.perf_counter() - started)


def _upstream_client(config: Mapping[str, Any], secrets: Mapping[str, str]) -> httpx2.Client:
    headers = {"Content-Type": "application/json"}
    key_name = config.get("api_key_env")
    if key_name:
        if key_name not in secrets:
            raise GatewayConfigError(
                f"llm.api_key_env: secret {key_name!r} is not set on the server"
            )
        headers["Authorization"] = f"Bearer {secrets[key_name]}"
    base_url = str(config.get("base_url") or DEFAULT_UPSTREAM).rstrip("/") + "/"
    timeout = float(config.get("timeout", 600))
    import httpx2

    return httpx2.Client(base_url=base_url, headers=headers, timeout=timeout)


def _normalise_prices(table: Mapping[str, Any] | None) -> dict[str, tuple[float, float]] | None:
    """The spec's `llm.prices` ({model: {input, output}}, USD per million tokens, as the
    schema checked) on top of the default table; None (the default table) without it."""
    if not table:
        return None
    prices = dict(DEFAULT_PRICES)
    for model, price in table.items():
        prices[str(model).strip().lower()] = (float(price["input"]), float(price["output"]))
    return prices
