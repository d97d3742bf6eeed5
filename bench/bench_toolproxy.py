"""Overhead of one tool call through the tool proxy versus calling the tool directly.

Run: python bench/bench_toolproxy.py [calls]   (from the project root)
Both paths use a fresh http.client connection per call, as a typical agent HTTP client
without pooling would; the difference of the medians is the proxy's cost per call.
Target (issue 18): at most 3 ms; exit code 1 when it is over.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from evaluations.runner.toolproxy import ToolProxy

TARGET_MS = 3.0
BODY = json.dumps({"order_id": 1042, "state": "paid", "items": ["lamp", "desk"]}).encode()


class ToolHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


def timed_calls(url: str, calls: int) -> list[float]:
    parts = urlsplit(url)
    payload = json.dumps({"order_id": 1042}).encode()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        connection = http.client.HTTPConnection(parts.netloc, timeout=10)
        connection.request(
            "POST",
            parts.path + "/lookup",
            body=payload,
            headers={"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        response.read()
        connection.close()
        assert response.status == 200
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main(calls: int = 500) -> int:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ToolHandler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    tool_url = f"http://127.0.0.1:{server.server_address[1]}"
    tools = [{"name": "orders", "url": tool_url}]
    with ToolProxy(tools, service_urls={}, tool_faults=[], context_attacks=[], seed=1) as proxy:
        timed_calls(tool_url, 50)  # warm up both paths
        timed_calls(proxy.url_for("orders"), 50)
        direct = statistics.median(timed_calls(tool_url, calls))
        proxied = statistics.median(timed_calls(proxy.url_for("orders"), calls))
        assert len(proxy.calls()) == calls + 50
    server.shutdown()
    server.server_close()
    print(f"tool call, direct:        median {direct:.3f} ms over {calls} calls")
    print(f"tool call, through proxy: median {proxied:.3f} ms over {calls} calls")
    overhead = proxied - direct
    verdict = "OK" if overhead <= TARGET_MS else "ABOVE TARGET"
    print(
        f"proxy overhead per call:  median {overhead:.3f} ms (target <= {TARGET_MS} ms) {verdict}"
    )
    return 0 if overhead <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 500))
