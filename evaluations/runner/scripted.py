"""Keystone's offline, deterministic OpenAI-compatible provider, and a small HTTP server for it.

`ScriptedProvider` answers chat requests from the spec's rules (first matching rule wins).
`ScriptedServer` serves it over real HTTP on a loopback port, for tests, the demo and as the
"real" upstream of the gateway. `LoopbackHTTPServer` is the shared HTTP plumbing (keep-alive
HTTP/1.1, one thread per connection), also used by the gateway.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from evaluations.runner.loopback import LoopbackServer, ServerThread

# A fixed creation time keeps scripted responses byte-for-byte reproducible.
SCRIPTED_CREATED = 1_700_000_000

_TOKEN_RE = re.compile(r"\s*(?:\w+|[^\w\s])")
_WHEN_KEYS = {
    "last_user_matches",
    "last_user_contains",  # case-insensitive substring
    "turn",  # 1-based number of the model call (call_index + 1)
    "last_message_role",
    "last_message_matches",
    "tool_result_matches",
    "system_matches",
    "call_index",
    "model",
}


# --------------------------------------------------------------------------- tokens and text


def split_tokens(text: str) -> list[str]:
    """Words and punctuation marks with their leading whitespace: joining them gives the text back."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return len(split_tokens(text))


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(str(part.get("text") or ""))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return ""


def count_request_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    total = 0
    for message in messages:
        total += 2 + count_tokens(message_text(message))  # 2: role and separators
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            total += count_tokens(str(function.get("name", ""))) + count_tokens(
                str(function.get("arguments", ""))
            )
    return total


def _digest(*parts: object) -> str:
    raw = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()


# --------------------------------------------------------------------------- provider


@dataclass(slots=True)
class _Rule:
    """A rule of the scripted provider, checked: its `when` (the regexes compiled) and reply."""

    when: dict[str, Any]
    reply: dict[str, Any]
    patterns: dict[str, re.Pattern[str]] = field(default_factory=dict)


class ScriptedProvider:
    """Answers chat requests from rules matched on the conversation.

    `when` keys: last_user_matches, last_message_matches, tool_result_matches, system_matches
    (regexes, case-insensitive), last_user_contains (substring, case-insensitive),
    last_message_role, call_index (0-based, per provider), turn (call_index + 1), model.
    A rule with no `when` always matches. A rule that replies with tool calls and does not say
    `last_message_role` only matches when the last message is the user's, so that the usual
    "call a tool, then answer" pair of rules ends instead of calling the tool forever.
    Reply content may use {last_user} and {last_tool_result}.
    """

    def __init__(self, rules: list[dict[str, Any]], *, model: str = "scripted") -> None:
        self.model = model
        self._rules = [self._compile(index, rule) for index, rule in enumerate(rules or [])]
        self._lock = threading.Lock()
        self._calls = 0

    @staticmethod
    def _compile(index: int, rule: Mapping[str, Any]) -> _Rule:
        when = dict(rule.get("when") or {})
        reply = dict(rule.get("reply") or {})
        unknown = set(when) - _WHEN_KEYS
        if unknown:
            raise ValueError(
                f"llm.rules[{index}].when: unknown key(s) {sorted(unknown)}; "
                f"known: {sorted(_WHEN_KEYS)}"
            )
        if "content" not in reply and "tool_calls" not in reply:
            raise ValueError(f"llm.rules[{index}].reply needs `content` or `tool_calls`")
        patterns = {
            key: re.compile(str(value), re.IGNORECASE)
            for key, value in when.items()
            if key.endswith("_matches")
        }
        if reply.get("tool_calls") and "last_message_role" not in when:
            when["last_message_role"] = "user"
        return _Rule(when=when, reply=reply, patterns=patterns)

    def next_call_index(self) -> int:
        with self._lock:
            index = self._calls
            self._calls += 1
            return index

    def complete(self, request: dict[str, Any], *, call_index: int | None = None) -> dict[str, Any]:
        """An OpenAI chat.completion dict for `request` (a chat.completions body)."""
        if call_index is None:
            call_index = self.next_call_index()
        messages = list(request.get("messages") or [])
        facts = _conversation_facts(messages)
        model = str(request.get("model") or self.model)
        rule = self._match(facts, call_index, model)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish_reason = "stop"
        if rule is None:
            message["content"] = "[scripted] no rule matched this conversation"
        else:
            if "content" in rule.reply and rule.reply["content"] is not None:
                message["content"] = _fill(str(rule.reply["content"]), facts)
            tool_calls = _tool_calls(rule.reply.get("tool_calls") or [], call_index)
            if tool_calls:
                message["tool_calls"] = tool_calls
                finish_reason = "tool_calls"
            elif message["content"] is None:
                message["content"] = ""
        prompt_tokens = count_request_tokens(messages)
        completion_tokens = count_tokens(message["content"] or "") + sum(
            count_tokens(call["function"]["name"]) + count_tokens(call["function"]["arguments"])
            for call in message.get("tool_calls", [])
        )
        return {
            "id": "chatcmpl-" + _digest(messages, call_index, model)[:24],
            "object": "chat.completion",
            "created": SCRIPTED_CREATED,
            "model": model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "system_fingerprint": "keystone-scripted",
        }

    def _match(self, facts: dict[str, str], call_index: int, model: str) -> _Rule | None:
        for rule in self._rules:
            if _rule_matches(rule, facts, call_index, model):
                return rule
        return None


def _conversation_facts(messages: list[Mapping[str, Any]]) -> dict[str, str]:
    facts = {
        "last_user": "",
        "last_tool_result": "",
        "system": "",
        "last_message": "",
        "last_role": "",
    }
    for message in messages:
        role = str(message.get("role", ""))
        text = message_text(message)
        if role == "user":
            facts["last_user"] = text
        elif role == "tool":
            facts["last_tool_result"] = text
        elif role in ("system", "developer"):
            facts["system"] = (facts["system"] + "\n" + text).strip()
    if messages:
        facts["last_message"] = message_text(messages[-1])
        facts["last_role"] = str(messages[-1].get("role", ""))
    return facts


def _rule_matches(rule: _Rule, facts: dict[str, str], call_index: int, model: str) -> bool:
    subjects = {
        "last_user_matches": facts["last_user"],
        "last_message_matches": facts["last_message"],
        "tool_result_matches": facts["last_tool_result"],
        "system_matches": facts["system"],
    }
    for key, pattern in rule.patterns.items():
        if not pattern.search(subjects[key]):
            return False
    when = rule.when
    if "last_message_role" in when and facts["last_role"] != str(when["last_message_role"]):
        return False
    if "last_user_contains" in when and (
        str(when["last_user_contains"]).casefold() not in facts["last_user"].casefold()
    ):
        return False
    if "turn" in when and int(when["turn"]) != call_index + 1:
        return False
    if "call_index" in when and int(when["call_index"]) != call_index:
        return False
    return not ("model" in when and str(when["model"]) != model)


def _fill(template: str, facts: Mapping[str, str]) -> str:
    # str.replace, not str.format: replies are often JSON full of braces.
    return template.replace("{last_user}", facts["last_user"]).replace(
        "{last_tool_result}", facts["last_tool_result"]
    )


def _tool_calls(specs: list[Mapping[str, Any]], call_index: int) -> list[dict[str, Any]]:
    calls = []
    for position, spec in enumerate(specs):
        arguments = spec.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        name = str(spec["name"])
        calls.append(
            {
                "id": "call_" + _digest(call_index, position, name, arguments)[:24],
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    return calls


# --------------------------------------------------------------------------- shapes shared with the gateway


def chat_to_sse(completion: Mapping[str, Any], *, include_usage: bool = False) -> Iterator[bytes]:
    """The chunks an OpenAI server streams for `completion`, as SSE lines."""
    base = {
        "id": completion.get("id", "chatcmpl-keystone"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", SCRIPTED_CREATED),
        "model": completion.get("model", ""),
    }
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**base, "choices": choices, **extra}).encode() + b"\n\n"

    yield event(
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    )
    content = message.get("content") or ""
    tokens = split_tokens(content)
    # A few tokens per chunk: realistic enough for SDK stream parsers, cheap to produce.
    for start in range(0, len(tokens), 4):
        piece = "".join(tokens[start : start + 4])
        yield event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
    for index, call in enumerate(message.get("tool_calls") or []):
        delta_call = {
            "index": index,
            "id": call.get("id"),
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
            },
        }
        yield event([{"index": 0, "delta": {"tool_calls": [delta_call]}, "finish_reason": None}])
    yield event([{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason", "stop")}])
    if include_usage:
        yield event([], usage=completion.get("usage"))
    yield b"data: [DONE]\n\n"


def responses_input_to_messages(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Chat messages for a /v1/responses request (string input or a list of input items)."""
    messages: list[dict[str, Any]] = []
    if request.get("instructions"):
        messages.append({"role": "system", "content": str(request["instructions"])})
    given = request.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return messages
    for item in given or []:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = "".join(
                    str(part.get("text", "")) for part in content if isinstance(part, Mapping)
                )
            messages.append({"role": item.get("role", "user"), "content": content or ""})
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": str(item.get("output", "")),
                }
            )
        elif kind == "function_call":
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": item.get("call_id"),
                            "type": "function",
                            "function": {
                                "name": item.get("name"),
                                "arguments": item.get("arguments", "{}"),
                            },
                        }
                    ],
                }
            )
    return messages


def chat_to_responses(completion: Mapping[str, Any]) -> dict[str, Any]:
    """A /v1/responses `response` object carrying the same answer as a chat completion."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    identifier = str(completion.get("id", "keystone")).replace("chatcmpl-", "")
    output: list[dict[str, Any]] = []
    for call in message.get("tool_calls") or []:
        output.append(
            {
                "type": "function_call",
                "id": "fc_" + str(call.get("id", "")).replace("call_", ""),
                "call_id": call.get("id"),
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    if message.get("content") is not None or not output:
        output.append(
            {
                "type": "message",
                "id": "msg_" + identifier,
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": message.get("content") or "", "annotations": []}
                ],
            }
        )
    usage = completion.get("usage") or {}
    truncated = choice.get("finish_reason") == "length"
    return {
        "id": "resp_" + identifier,
        "object": "response",
        "created_at": completion.get("created", SCRIPTED_CREATED),
        "model": completion.get("model", ""),
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def hash_embedding(text: str, dimensions: int = 64) -> list[float]:
    """A deterministic bag-of-words vector: texts sharing words get a high cosine similarity."""
    vector = [0.0] * dimensions
    for token in re.findall(r"\w+", text.lower()):
        digest = hashlib.sha256(token.encode()).digest()
        bucket = int.from_bytes(digest[:4], "little") % dimensions
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = sum(value * value for value in vector) ** 0.5
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [value / norm for value in vector]


def embeddings_response(request: Mapping[str, Any], model: str) -> dict[str, Any]:
    given = request.get("input", "")
    texts = [given] if isinstance(given, str) else [str(item) for item in given]
    dimensions = int(request.get("dimensions") or 64)
    as_base64 = request.get("encoding_format") == "base64"
    data = []
    for index, text in enumerate(texts):
        vector = hash_embedding(text, dimensions)
        encoded: Any = vector
        if as_base64:
            encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(count_tokens(text) for text in texts)
    return {
        "object": "list",
        "data": data,
        "model": str(request.get("model") or model),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def models_response(names: Iterable[str]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": SCRIPTED_CREATED, "owned_by": "keystone"}
            for name in names
        ],
    }


def error_body(message: str, *, kind: str, code: str | None = None) -> dict[str, Any]:
    """The error JSON OpenAI servers send, which the SDK puts on its exceptions."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# --------------------------------------------------------------------------- HTTP plumbing


@dataclass(slots=True)
class HttpRequest:
    """A request to a LoopbackHTTPServer, read whole, as its handler gets it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        if not self.body:
            return {}
        return json.loads(self.body)


@dataclass(slots=True)
class HttpReply:
    """What a handler answers: status, body (bytes, or chunks to stream) and headers."""

    status: int
    body: bytes | Iterable[bytes] = b""
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without answering (a dead upstream)

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> HttpReply:
        return cls(
            status,
            json.dumps(payload).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )

    @classmethod
    def sse(cls, chunks: Iterable[bytes]) -> HttpReply:
        return cls(200, chunks, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})


Handler = Callable[[HttpRequest], HttpReply]


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the SDK reuses one connection per call
    timeout = 120  # an idle keep-alive connection's thread ends after this
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Without this, Nagle + delayed ACK add ~40 ms to small request/response pairs.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, opened=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, opened=False)

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = HttpRequest(
            method=self.command,
            path=self.path.split("?", 1)[0],
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
        )
        try:
            reply = self.server.handler(request)
        except Exception as exc:  # a bug in a handler must not hang the client
            reply = HttpReply.json(500, error_body(f"internal error: {exc}", kind="server_error"))
        if reply.drop:
            self.close_connection = True
            return
        self._write(reply)

    def _write(self, reply: HttpReply) -> None:
        head = [f"HTTP/1.1 {reply.status} {_reason(reply.status)}"]
        head += [f"{name}: {value}" for name, value in reply.headers.items()]
        if isinstance(reply.body, bytes | bytearray):
            head.append(f"Content-Length: {len(reply.body)}")
            # One write for head and body: fewer syscalls, no partial packets.
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + bytes(reply.body))
            return
        head.append("Transfer-Encoding: chunked")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode())
        for chunk in reply.body:
            if chunk:
                self.wfile.write(f"{len(chunk):X}\r\n".encode() + chunk + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Status"


class _Server(LoopbackServer):
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(_RequestHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up (e.g. after its own timeout) is normal here, not an error.
        return

    def track(self, connection: socket.socket, *, opened: bool) -> None:
        with self._open_lock:
            if opened:
                self._open.add(connection)
            else:
                self._open.discard(connection)

    def close_connections(self) -> None:
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class LoopbackHTTPServer:
    """A threaded HTTP/1.1 server on 127.0.0.1 with an OS-chosen port; a context manager."""

    def __init__(self, handler: Handler) -> None:
        self._server = _Server(handler)
        self._thread = ServerThread(self._server)
        self._started = False

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LoopbackHTTPServer:
        if not self._started:
            self._thread.start()
            self._started = True
        return self

    def close(self) -> None:
        if self._started:
            self._thread.stop()
            self._started = False
        self._server.close_connections()
        self._server.server_close()

    def __enter__(self) -> LoopbackHTTPServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --------------------------------------------------------------------------- standalone server


class ScriptedServer:
    """A standalone OpenAI-compatible server answering from a ScriptedProvider.

    `api_key`, when given, is required as the bearer token (401 otherwise), so tests can see
    which key reached an upstream. `requests` keeps every received body, in order.
    """

    def __init__(
        self,
        rules: list[dict[str, Any]],
        *,
        model: str = "scripted",
        api_key: str | None = None,
    ) -> None:
        self.provider = ScriptedProvider(rules, model=model)
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self.authorizations: list[str] = []
        self._lock = threading.Lock()
        self._http = LoopbackHTTPServer(self._handle)

    @property
    def base_url(self) -> str:
        return f"{self._http.url}/v1"

    def __enter__(self) -> ScriptedServer:
        self._http.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._http.close()

    def _handle(self, request: HttpRequest) -> HttpReply:
        authorization = request.headers.get("authorization", "")
        body = request.json() if request.method == "POST" else {}
        with self._lock:
            self.authorizations.append(authorization)
            if request.method == "POST":
                self.requests.append(body)
        if self.api_key is not None and authorization != f"Bearer {self.api_key}":
            return HttpReply.json(
                401,
                error_body(
                    "Incorrect API key provided.",
                    kind="invalid_request_error",
                    code="invalid_api_key",
                ),
            )
        path = request.path.rstrip("/")
        if path.endswith("/chat/completions") and request.method == "POST":
            completion = self.provider.complete(body)
            if body.get("stream"):
                options = body.get("stream_options") or {}
                return HttpReply.sse(
                    chat_to_sse(completion, include_usage=bool(options.get("include_usage")))
                )
            return HttpReply.json(200, completion)
        if path.endswith("/responses") and request.method == "POST":
            chat = {"model": body.get("model"), "messages": responses_input_to_messages(body)}
            return HttpReply.json(200, chat_to_responses(self.provider.complete(chat)))
        if path.endswith("/embeddings") and request.method == "POST":
            return HttpReply.json(200, embeddings_response(body, self.provider.model))
        if path.endswith("/models"):
            return HttpReply.json(200, models_response([self.provider.model]))
        return HttpReply.json(
            404, error_body(f"no route {request.method} {path}", kind="invalid_request_error")
        )
