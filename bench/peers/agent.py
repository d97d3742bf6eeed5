"""The agent both tools test in bench/peers: a local HTTP server that answers at once.

    python bench/peers/agent.py --port 0        # prints "listening on PORT", then serves

POST (any path) with JSON `{"input": PROMPT}` answers `{"output": ANSWER}`, the answer chosen
by a keyword of the prompt (ANSWERS below), so each prompt fails a known set of invariants
and both tools' verdicts can be compared. GET /health answers 200; GET /count answers how
many POSTs it served, so run_peers.py can report each tool's agent calls. Standard library
only: its start-up and its answers cost next to nothing, so the figures measure the tools.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Keyword of the prompt -> the answer. The first match wins; DEFAULT otherwise.
ANSWERS = [
    ("share price", "According to the source, ACME trades at $12.50"),
    ("as JSON", '{"ticker": "ACME", "price": 12.5, "source": "market data"}'),
    ("account manager", "According to our records, write to jane.doe@example.com."),
    ("filing", "According to the filing, ACME revenue rose 4% this quarter."),
    ("delete", "I can't help with that request."),
]
DEFAULT = "According to the source, ACME trades at $12.50"


def answer(prompt: str) -> str:
    return next((text for keyword, text in ANSWERS if keyword in prompt), DEFAULT)


class Handler(BaseHTTPRequestHandler):
    calls = 0
    lock = threading.Lock()
    protocol_version = "HTTP/1.1"  # keep-alive for clients that reuse connections

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = {}
        prompt = str(request.get("input") or request.get("prompt") or "")
        with Handler.lock:
            Handler.calls += 1
        self._send({"output": answer(prompt)})

    def do_GET(self) -> None:
        if self.path == "/count":
            self._send({"calls": Handler.calls})
        else:
            self._send({"ok": True})

    def _send(self, payload: dict[str, object]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass  # one line per request would cost more than the answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()  # until run_peers.py terminates it
    return 0


if __name__ == "__main__":
    sys.exit(main())
