"""A peer of Keystone's for tests (an agent, a judge, a model, a tool, a webhook receiver): a
real HTTP server on a free loopback port, served on a daemon thread, always shut down and
closed at the end.

    with HttpPeer(Handler) as peer:
        ...peer.url...  # "http://127.0.0.1:<port>", no trailing slash

A class that is a peer with state of its own subclasses HttpPeer: define the handler in its
`__init__`, then `super().__init__(Handler)`; `close()` (or the `with` block's end) stops it.
PeerHandler is a handler base for the usual bits: no log lines, the request's body, a JSON
answer. No Django here: the judge client's tests also run with `-p no:django`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Any, Self


class HttpPeer:
    """Serves a handler class (on a new ThreadingHTTPServer at 127.0.0.1, port 0, whose
    request threads are daemons) or an HTTP server made elsewhere, until `close()`."""

    def __init__(
        self,
        handler_or_server: type[BaseHTTPRequestHandler] | HTTPServer,
        *,
        poll_interval: float = 0.5,
    ) -> None:
        if isinstance(handler_or_server, HTTPServer):
            self.server = handler_or_server
        else:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler_or_server)
        self.port: int = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": poll_interval}, daemon=True
        ).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PeerHandler(BaseHTTPRequestHandler):
    """A request handler that writes no log lines, with helpers to read and to answer."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def read_body(self) -> bytes:
        """The request's body (empty without a Content-Length)."""
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send_json(
        self,
        status: int,
        payload: Any,
        headers: dict[str, str] | None = None,
        *,
        content_type: str = "application/json",
    ) -> None:
        """Answer `status` with `payload`: bytes as they are, anything else as JSON."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
