"""The `http_mock` service: a real HTTP server on a loopback port that answers the declared
routes and records every request it gets.

Every request goes into the log (the audit and the `forbidden` rules need all of them);
`recorded_requests()`, which the `http_mock_assertions` check reads, is only available when
the spec asked for `record: true`, so that a spec cannot assert on traffic it did not declare
it wanted to keep.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from checks.artifact import HttpCall
from evaluations.runner.loopback import LoopbackServer, ServerThread

DEFAULT_RESPONSE: dict[str, Any] = {"status": 404, "response": {"error": "no route"}}

# Request bodies beyond this are cut, so that a runaway agent cannot fill the server's memory.
MAX_RECORDED_BODY = 1024 * 1024


class ServiceTypeError(TypeError):
    """A check asked a service for something its type does not have (SQL on a mock...)."""


@dataclass(frozen=True, slots=True)
class Route:
    """One route of an `http_mock`, compiled: the requests it matches and the reply it sends."""

    method: str  # upper-case, or "*" for any
    path_pattern: re.Pattern[str]
    matches_query: bool  # the declared path has a "?...": match it against path + query
    status: int
    body: bytes
    headers: dict[str, str]
    delay_ms: float

    def matches(self, method: str, path: str, query: str) -> bool:
        if self.method not in ("*", method):
            return False
        target = f"{path}?{query}" if self.matches_query and query else path
        return self.path_pattern.fullmatch(target) is not None


@dataclass(frozen=True, slots=True)
class MockConfig:
    """An `http_mock` service as the spec declares it: its routes, the reply to any other
    request, and whether the checks may read its requests (`record`)."""

    name: str
    record: bool
    routes: list[Route]
    default: Route

    @classmethod
    def from_dict(cls, service: dict[str, Any]) -> MockConfig:
        default = dict(service.get("default_response") or DEFAULT_RESPONSE)
        default.setdefault("path", "*")
        return cls(
            name=str(service["name"]),
            record=bool(service.get("record", False)),
            routes=[_route(route) for route in service.get("routes") or []],
            default=_route(default),
        )


def _route(route: dict[str, Any]) -> Route:
    declared_path = str(route.get("path", "*"))
    body, content_type = _encode_body(route.get("response"))
    headers = {"Content-Type": content_type} if content_type else {}
    headers.update({str(k): str(v) for k, v in (route.get("headers") or {}).items()})
    return Route(
        method=str(route.get("method") or "*").upper(),
        path_pattern=_glob_to_regex(declared_path),
        matches_query="?" in declared_path,
        status=int(route.get("status", 200)),
        body=body,
        headers=headers,
        delay_ms=float(route.get("delay_ms", 0) or 0),
    )


def _glob_to_regex(pattern: str) -> re.Pattern[str]:
    # Only `*` is special (any run of characters, '/' included); everything else is literal.
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def _encode_body(response: Any) -> tuple[bytes, str | None]:
    if response is None:
        return b"", None
    if isinstance(response, str):
        return response.encode(), "text/plain; charset=utf-8"
    return json.dumps(response).encode(), "application/json"


@dataclass(slots=True)
class _Log:
    """Requests in arrival order; handler threads append concurrently."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def append(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.entries.append(entry)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(entry, headers=dict(entry["headers"])) for entry in self.entries]


class _MockServer(LoopbackServer):
    allow_reuse_address = True
    # socketserver's default backlog of 5 resets connections when an agent fans out requests.
    request_queue_size = 128

    def __init__(self, config: MockConfig, log: _Log) -> None:
        self.config = config
        self.log = log
        super().__init__(_Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-answer (an agent timing out) is not the mock's fault


class _Handler(BaseHTTPRequestHandler):
    server: _MockServer
    # HTTP/1.0: one request per connection, so no handler thread outlives the mock.
    protocol_version = "HTTP/1.0"

    def _handle(self) -> None:
        received = time.time()
        split = urlsplit(self.path)
        method = self.command.upper()
        body = self._read_body()
        config = self.server.config
        route = next(
            (r for r in config.routes if r.matches(method, split.path, split.query)), config.default
        )
        # Logged before the delay: a request the agent gave up waiting for still happened.
        self.server.log.append(
            {
                "method": method,
                "path": split.path,
                "query": split.query,
                "headers": _headers(self),
                "body": body.decode("utf-8", errors="replace"),
                "time": received,
                "status": route.status,
                "response_body": route.body.decode("utf-8", errors="replace"),
            }
        )
        if route.delay_ms:
            time.sleep(route.delay_ms / 1000)
        self.send_response(route.status)
        for name, value in route.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(route.body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(route.body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length > 0 else b""
        return data[:MAX_RECORDED_BODY]

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                # Trailers end with an empty line.
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            chunk = self.rfile.read(size)
            self.rfile.readline()  # CRLF after each chunk
            if total < MAX_RECORDED_BODY:
                chunks.append(chunk)
            total += size
        return b"".join(chunks)[:MAX_RECORDED_BODY]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log above is the record; stderr chatter would only be noise


def _headers(handler: BaseHTTPRequestHandler) -> dict[str, str]:
    merged: dict[str, str] = {}
    for name, value in handler.headers.items():
        merged[name] = f"{merged[name]}, {value}" if name in merged else value
    return merged


class HttpMockService:
    """One `http_mock` of one execution; also its ServiceHandle for the checks."""

    type = "http_mock"

    def __init__(self, service: dict[str, Any]) -> None:
        self.config = MockConfig.from_dict(service)
        self.name = self.config.name
        self._log = _Log()
        self._server: _MockServer | None = None
        self._thread: ServerThread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"http_mock '{self.name}' is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = _MockServer(self.config, self._log)
        self._thread = ServerThread(self._server)
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        if self._thread is not None:
            self._thread.stop()
        self._server.server_close()
        self._server = None
        self._thread = None

    def env(self) -> dict[str, str]:
        return {"URL": self.url}

    # --- ServiceHandle -------------------------------------------------------------------

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        raise ServiceTypeError(
            f"service '{self.name}' is an http_mock; SQL needs a database service"
        )

    def recorded_requests(self) -> list[dict[str, Any]]:
        if not self.config.record:
            raise ServiceTypeError(
                f"http_mock '{self.name}' does not record requests; set `record: true` on it "
                "to assert on them"
            )
        return self._log.snapshot()

    def describe(self) -> dict[str, Any]:
        running = self._server is not None
        return {
            "name": self.name,
            "type": self.type,
            "host": "127.0.0.1",
            "port": self.port if running else None,
            "url": self.url if running else None,
            "record": self.config.record,
        }

    # --- audit ---------------------------------------------------------------------------

    def http_log(self) -> list[HttpCall]:
        return [
            HttpCall(
                service=self.name,
                method=entry["method"],
                path=entry["path"],
                headers=entry["headers"],
                body=entry["body"],
                status=entry["status"],
                response_body=entry["response_body"],
                time=entry["time"],
                query=entry["query"],
            )
            for entry in self._log.snapshot()
        ]
