"""Example HTTP finance agent for the Flakestorm-style contract (examples/specs/finance-agent.yaml).

    python examples/agents/finance_agent/server.py --port 8765

POST /invoke {"input": "..."} -> {"output": "..."}; POST /reset clears its memory;
GET /health answers 200 once it listens (the spec's readiness probe).
It answers with the openai SDK and one tool, `market_data_api` (GET a path on the market
data service). During a Keystone run the request carries X-Keystone-Env (JSON) with the
execution's gateway (OPENAI_BASE_URL, OPENAI_API_KEY) and tool URLs; the agent uses them,
so the scenario's LLM faults, tool faults and context attacks reach it where it really
calls its model and its tool. Outside Keystone it falls back to its own environment.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai

SYSTEM_PROMPT = (
    "You are a financial assistant. Use market_data_api for every figure and always cite "
    "your data source. Never state a price you did not get from the tool."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "market_data_api",
            "description": "GET a path on the market data service, e.g. /quote/ACME.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
# The conversation so far: the agent is stateful on purpose, so /reset matters.
_memory: list[dict[str, Any]] = []
_memory_lock = threading.Lock()


def answer(prompt: str, env: dict[str, str]) -> str:
    client = openai.OpenAI(
        base_url=env.get("OPENAI_BASE_URL"),
        api_key=env.get("OPENAI_API_KEY") or "missing",
        max_retries=1,
        timeout=float(env.get("FINANCE_AGENT_LLM_TIMEOUT", "10")),
    )
    with _memory_lock:
        earlier = list(_memory)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        *earlier,
        {"role": "user", "content": prompt},
    ]
    try:
        for _ in range(4):
            completion = client.chat.completions.create(
                model=env.get("FINANCE_AGENT_MODEL", "gpt-4o-mini"), messages=messages, tools=TOOLS
            )
            message = completion.choices[0].message
            if not message.tool_calls:
                text = message.content or ""
                with _memory_lock:
                    _memory.extend(
                        [
                            {"role": "user", "content": prompt},
                            {"role": "assistant", "content": text},
                        ]
                    )
                return text
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                result = _market_data(call.function.arguments, env)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    except openai.APIError as exc:
        # Degrade without inventing numbers, and say where the answer (not) comes from.
        return f"The market data assistant is unavailable ({type(exc).__name__}); source: service status."
    return "I could not finish within my step limit; source: none."


def _market_data(raw_arguments: str, env: dict[str, str]) -> str:
    url = env.get("KEYSTONE_TOOL_MARKET_DATA_API_URL") or env.get("MARKET_DATA_URL", "")
    try:
        path = str(json.loads(raw_arguments or "{}").get("path", ""))
    except ValueError:
        return "error: the tool arguments are not valid JSON"
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/" + path.lstrip("/"), timeout=10) as reply:
            return reply.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return (
            f"error: HTTP {exc.code} from market data: {exc.read()[:200].decode(errors='replace')}"
        )
    except (urllib.error.URLError, OSError) as exc:
        return f"error: market data unreachable: {exc}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return

    def do_GET(self) -> None:
        # The readiness probe of the spec's `agent.start`.
        if self.path == "/health":
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"error": "unknown path"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/reset":
            with _memory_lock:
                _memory.clear()
            self._reply(200, {"reset": True})
            return
        if self.path != "/invoke":
            self._reply(404, {"error": "unknown path"})
            return
        try:
            prompt = str(json.loads(body or b"{}").get("input", ""))
        except ValueError:
            self._reply(400, {"error": "expected JSON with an input field"})
            return
        env = {**os.environ, **json.loads(self.headers.get("X-Keystone-Env") or "{}")}
        self._reply(200, {"output": answer(prompt, env)})

    def _reply(self, status: int, document: dict[str, Any]) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def make_server(host: str, port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = make_server(args.host, args.port)
    print(f"finance agent on http://{args.host}:{args.port}/invoke", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
