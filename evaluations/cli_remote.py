"""`keystone run SPEC --remote URL --token T`: the run happens on a Keystone server's
workers, this process only drives it through the API (no Django, no database here).

Upload the spec and start the run in one request (POST .../runs with the spec's text, an
Idempotency-Key so a retried request never starts a second run), follow the run's
Server-Sent Events (reconnecting when the server closes a stream at its timeout), then
download the reports and exit with the run's exit code. Ctrl-C cancels the run on the server.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from checks.exit_codes import (
    EXIT_INTERNAL_ERROR,
    EXIT_PROVIDER_ERROR,
    EXIT_SPEC_INVALID,
)
from checks.output_files import write_whole

EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT
STREAM_READ_TIMEOUT = 60.0  # the server sends a keep-alive every 15 s
EVENTS_WINDOW = 600  # seconds per event stream; the client reconnects after each
REPORT_FILES = (("json", "json"), ("junit", "junit"), ("markdown", "md"))


class RemoteError(Exception):
    """The server refused or could not be reached; `exit_code` says how to end."""

    def __init__(self, message: str, exit_code: int = EXIT_INTERNAL_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Client:
    """The few API calls `keystone run --remote` makes, with the API's error shape read
    into one message."""

    def __init__(self, base_url: str, token: str, project: str) -> None:
        self.base = base_url
        self.token = token
        self.project = urllib.parse.quote(project, safe="")

    def url(self, path: str, **query: Any) -> str:
        tail = f"?{urllib.parse.urlencode(query)}" if query else ""
        return f"{self.base}/api/projects/{self.project}{path}{tail}"

    def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            raise _refusal(exc) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RemoteError(f"cannot reach {self.base}: {reason}", EXIT_PROVIDER_ERROR) from None

    def json(self, method: str, url: str, body: Any = None, **kwargs: Any) -> Any:
        with self.request(method, url, body, **kwargs) as response:
            return json.loads(response.read() or b"null")


def _refusal(exc: urllib.error.HTTPError) -> RemoteError:
    """The API's `{"error": {...}}` as one message (every spec error on its own line)."""
    try:
        error = json.loads(exc.read()).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    message = str(error.get("message") or exc.reason)
    details = error.get("details") if error.get("code") == "spec_invalid" else None
    if details:
        lines = [
            f"line {d.get('line') or '?'}, column {d.get('column') or '?'}: "
            f"{d.get('path') or '(root)'}: {d.get('message')}"
            for d in details
        ]
        message = "the server refused the spec:\n  " + "\n  ".join(lines)
    if exc.code == 401:
        message = f"the server refused the token ({message}); pass --token or KEYSTONE_TOKEN"
    code = EXIT_SPEC_INVALID if exc.code in (400, 404, 409, 422) else EXIT_INTERNAL_ERROR
    return RemoteError(f"HTTP {exc.code}: {message}", code)


def _events(
    client: Client, run_id: int, deadline: float | None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The run's events, one stream after another, until its final `run` event. A stream
    lasts until the deadline at most, so a `timeout` event comes when it passes."""
    seen: set[int] = set()
    while True:
        window = float(EVENTS_WINDOW)
        if deadline is not None:
            window = max(0.0, min(window, deadline - time.monotonic()))
        url = client.url(f"/runs/{run_id}/events", timeout=f"{window:.1f}")
        try:
            with client.request("GET", url, timeout=STREAM_READ_TIMEOUT) as stream:
                event, data = "", ""
                for raw in stream:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif not line and event:
                        payload = json.loads(data)
                        kind, event, data = event, "", ""
                        if kind == "execution":
                            # A reconnected stream tells again what ended before: once is enough.
                            if payload["id"] in seen:
                                continue
                            seen.add(payload["id"])
                        yield kind, payload
                        if kind == "run":
                            return
        except (TimeoutError, ConnectionError) as exc:
            print(f"keystone run: event stream interrupted ({exc}); reconnecting", file=sys.stderr)
            time.sleep(1.0)


def _selection_flags(args: argparse.Namespace) -> list[str]:
    return [
        flag
        for flag, name in (
            ("--prompt-index", "prompt_index"),
            ("--replica", "replica"),
            ("--invariant", "invariant"),
        )
        if getattr(args, name, None)
    ]


def cmd_run_remote(args: argparse.Namespace, base_url: str, token: str) -> int:
    from evaluations.cli_commands import cli_labels

    spec_path = Path(args.spec)
    if not token:
        print("keystone run: --remote needs --token or KEYSTONE_TOKEN", file=sys.stderr)
        return EXIT_SPEC_INVALID
    unsupported = _selection_flags(args)
    if unsupported:
        print(
            f"keystone run: {', '.join(unsupported)} re-run one execution locally; "
            "not with --remote",
            file=sys.stderr,
        )
        return EXIT_SPEC_INVALID
    try:
        source = spec_path.read_text(encoding="utf-8")
        labels = cli_labels(args.label or [])
    except (OSError, ValueError) as exc:
        print(f"keystone run: {exc}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    project = args.project or os.environ.get("KEYSTONE_PROJECT") or "default"
    client = Client(base_url, token, project)
    body = {
        "source_yaml": source,
        "replicas": args.replicas,
        "scenarios": args.scenario or None,
        "labels": labels,
        "seed": args.seed,
        "judge_cache": not args.no_judge_cache,
    }
    run_id: int | None = None
    try:
        created = client.json(
            "POST", client.url("/runs"), body, headers={"Idempotency-Key": str(uuid.uuid4())}
        )
        run_id = int(created["id"])
        print(f"run {run_id} queued on {base_url}: {created['web_url']}", flush=True)
        verdict = _follow(client, run_id, args)
        if verdict is None:
            client.json("POST", client.url(f"/runs/{run_id}/cancel"), {})
            print(
                f"keystone run: run {run_id} did not finish within {args.timeout:g} s; it was "
                "cancelled (--timeout sets the limit)",
                file=sys.stderr,
            )
            return EXIT_INTERNAL_ERROR
        return _finish(client, run_id, verdict, args)
    except KeyboardInterrupt:
        if run_id is not None:
            try:
                client.json("POST", client.url(f"/runs/{run_id}/cancel"), {}, timeout=15)
                print(
                    f"\nkeystone run: interrupted; run {run_id} cancelled on the server",
                    file=sys.stderr,
                )
            except RemoteError as exc:
                print(
                    f"\nkeystone run: interrupted; cancelling run {run_id} failed: {exc}",
                    file=sys.stderr,
                )
        return EXIT_INTERRUPTED
    except RemoteError as exc:
        print(f"keystone run: {exc}", file=sys.stderr)
        return exc.exit_code


def _follow(client: Client, run_id: int, args: argparse.Namespace) -> dict[str, Any] | None:
    """Print each execution as it ends; the final `run` event, or None past --timeout."""
    from evaluations.cli_commands import Progress

    progress = Progress(sys.stdout)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    for event, data in _events(client, run_id, deadline):
        if event == "timeout" and deadline is not None and time.monotonic() >= deadline:
            progress.finish()
            return None
        if event == "execution":
            fields = ("scenario", "prompt_index", "replica", "status", "passed")
            execution = SimpleNamespace(
                pillar="contract", mutation_type="", **{k: data.get(k) for k in fields}
            )
            progress.step(data["done"], data["total"] or data["done"], execution)
        elif event == "run":
            progress.finish()
            return data
    return None


def _finish(client: Client, run_id: int, verdict: dict[str, Any], args: argparse.Namespace) -> int:
    from checks.reporters import load_report, render_terminal
    from checks.scoring import score_run
    from evaluations.terminal import use_color

    if verdict.get("exit_code") is None:
        print(f"keystone run: run {run_id} ended {verdict.get('status')}", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    with client.request("GET", client.url(f"/runs/{run_id}/report", format="json")) as response:
        report = json.loads(response.read())
    loaded = load_report(report)
    summary = score_run(loaded.spec, loaded.records, kappa=loaded.kappa)
    sys.stdout.write(render_terminal(summary, color=use_color(args.color, sys.stdout)))
    for option, fmt in REPORT_FILES:
        target = getattr(args, option, None)
        if not target:
            continue
        with client.request("GET", client.url(f"/runs/{run_id}/report", format=fmt)) as response:
            write_whole(target, codecs.iterdecode(iter(lambda: response.read(65536), b""), "utf-8"))
        print(f"wrote {target}")
    exit_code = int(verdict["exit_code"])
    print(f"run {run_id}: exit code {exit_code}")
    return exit_code
