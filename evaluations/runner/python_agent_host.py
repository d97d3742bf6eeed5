"""Runs one python agent callable inside the sandbox.

Standard library only, and no Keystone imports: the runner copies this file into the
workspace's `.keystone/` and runs it by path, so it works in bwrap and docker without the
Keystone source being visible there.

stdin: {"mode": "invoke" | "reset", "callable": "pkg.module:fn", "prompt": str,
        "context": {...}, "tools": [...], "tool_registry": str | null, "reset_function": str | null}
Writes the final output to $KEYSTONE_OUTPUT and a result record to $KEYSTONE_AGENT_RESULT:
{"ok": bool, "phase": "import" | "call", "output": str, "structured": bool, "error": str,
 "traceback": str, "tool_calls": [...]}

Tools: every callable in `tools` (and every entry of the `tool_registry` dict) is replaced by
a wrapper before the agent is imported, so `from pkg.tools import fn` in the agent gets the
wrapper too; the wrappers are also handed over as `context["tools"]` ({name: callable}).
A wrapper asks Keystone's tool proxy ($KEYSTONE_PROXY_URL) before each call, which
decides the scenario's tool faults, serves replayed answers and records the call:
- error: raises KeystoneToolError (status, message); timeout: raises TimeoutError after the
  fault's delay; slow: the call is delayed; empty: returns None without calling the tool;
- malformed / malicious_response / indirect_injection: the real function runs and its value
  is rewritten (returned as the rewritten text, or the parsed JSON when it still parses).
The tool's trace (arguments, answer, fault, latency) is kept by the proxy, not here.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import os
import sys
import traceback
import urllib.request
from collections.abc import Callable
from typing import Any


class KeystoneToolError(RuntimeError):
    """A tool fault injected by Keystone (mode `error`), or a replayed failing answer."""

    def __init__(self, tool: str, status: int, message: str) -> None:
        super().__init__(f"tool {tool} failed: HTTP {status}: {message}")
        self.tool = tool
        self.status = status


def _ask_proxy(proxy_url: str, path: str, document: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{proxy_url}{path}",
        data=json.dumps(document, default=str).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    # No timeout: a `timeout` or `slow` fault holds the answer for its delay on purpose.
    with urllib.request.urlopen(request) as response:
        answer = json.loads(response.read() or b"{}")
    return answer if isinstance(answer, dict) else {}


def _decoded(text: str) -> Any:
    """What a tool returns when Keystone answers in its place: None for an empty answer,
    the JSON value when the text parses, else the text."""
    if text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    return {**({"args": list(args)} if args else {}), **kwargs}


def _jsonable(value: Any) -> Any:
    return value if isinstance(value, str) else json.loads(json.dumps(value, default=str))


class _ToolCallFlow:
    """The two questions a wrapper asks the proxy around one call of the real function."""

    def __init__(self, proxy_url: str, name: str) -> None:
        self.proxy_url = proxy_url
        self.name = name
        self.ticket: int | None = None

    def before(self, arguments: dict[str, Any]) -> tuple[bool, Any]:
        """(True, value) when the proxy answered in the tool's place; raises for errors."""
        decision = _ask_proxy(
            self.proxy_url, f"/callables/{self.name}/call", {"arguments": arguments}
        )
        action = decision.get("action")
        if action == "raise":
            message = str(decision.get("message") or "")
            if decision.get("timeout"):
                raise TimeoutError(f"tool {self.name} timed out: {message}")
            raise KeystoneToolError(self.name, int(decision.get("status") or 500), message)
        if action == "return":
            return True, _decoded(str(decision.get("text") or ""))
        self.ticket = int(decision["ticket"])
        return False, None

    def failed(self, exc: BaseException) -> None:
        _ask_proxy(
            self.proxy_url,
            f"/callables/{self.name}/result",
            {"ticket": self.ticket, "error": f"{type(exc).__name__}: {exc}"},
        )

    def after(self, value: Any) -> Any:
        reply = _ask_proxy(
            self.proxy_url,
            f"/callables/{self.name}/result",
            {"ticket": self.ticket, "value": _jsonable(value)},
        )
        if not reply.get("changed"):
            return value
        text = str(reply.get("text") or "")
        return text if isinstance(value, str) else _decoded(text)


def wrap_tool(name: str, function: Callable[..., Any], proxy_url: str) -> Callable[..., Any]:
    """The same tool, with Keystone's faults and recording around every call."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            flow = _ToolCallFlow(proxy_url, name)
            answered, value = await asyncio.to_thread(flow.before, _arguments(args, kwargs))
            if answered:
                return value
            try:
                value = await function(*args, **kwargs)
            except BaseException as exc:
                await asyncio.to_thread(flow.failed, exc)
                raise
            return await asyncio.to_thread(flow.after, value)

        async_wrapper.__keystone_wrapped__ = True  # type: ignore[attr-defined]
        return async_wrapper

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flow = _ToolCallFlow(proxy_url, name)
        answered, value = flow.before(_arguments(args, kwargs))
        if answered:
            return value
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:
            flow.failed(exc)
            raise
        return flow.after(value)

    wrapper.__keystone_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def install_tools(request: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """Wrap the listed tool callables where they live (module attributes, registry entries)
    and return them by name. Nothing is wrapped when no tool proxy runs."""
    proxy_url = os.environ.get("KEYSTONE_PROXY_URL", "")
    tools: dict[str, Callable[..., Any]] = {}
    for dotted in request.get("tools") or []:
        owner, attribute = _owner(str(dotted))
        function = getattr(owner, attribute)
        if not callable(function):
            raise TypeError(f"tool {dotted} is not callable")
        if proxy_url and not getattr(function, "__keystone_wrapped__", False):
            function = wrap_tool(attribute, function, proxy_url)
            setattr(owner, attribute, function)
        tools[attribute] = function
    registry_path = request.get("tool_registry")
    if registry_path:
        registry = load(str(registry_path))
        entries = getattr(registry, "tools", registry)
        if not (hasattr(entries, "items") and hasattr(entries, "__setitem__")):
            raise TypeError(
                f"tool_registry {registry_path} must be a dict of name -> callable "
                "(or an object whose `tools` attribute is one)"
            )
        for name, function in list(entries.items()):
            if proxy_url and not getattr(function, "__keystone_wrapped__", False):
                function = wrap_tool(str(name), function, proxy_url)
                entries[name] = function
            tools[str(name)] = function
    return tools


def _owner(dotted: str) -> tuple[Any, str]:
    """The object holding the last attribute of `pkg.module:attr.sub`, and that attribute."""
    if ":" in dotted:
        module_name, _, attribute = dotted.partition(":")
    else:
        module_name, _, attribute = dotted.rpartition(".")
    parent_path, _, name = attribute.rpartition(".")
    owner: Any = importlib.import_module(module_name)
    for part in filter(None, parent_path.split(".")):
        owner = getattr(owner, part)
    return owner, name


def load(dotted: str) -> Any:
    """`pkg.module:attr.sub` (or `pkg.module.attr`) to the object it names."""
    if ":" in dotted:
        module_name, _, attribute = dotted.partition(":")
    else:
        module_name, _, attribute = dotted.rpartition(".")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def call(function: Any, *args: Any) -> Any:
    """Call sync or async functions alike."""
    result = function(*args)
    if inspect.isawaitable(result):

        async def wait_for() -> Any:
            return await result

        result = asyncio.run(wait_for())
    return result


def run(request: dict[str, Any]) -> dict[str, Any]:
    phase = "import"
    try:
        if request.get("mode") == "reset":
            reset = load(request["reset_function"])
            phase = "call"
            call(reset)
            return {"ok": True, "phase": phase}
        # Tools first: an agent that imports its tools by name must get the wrappers.
        tools = install_tools(request)
        agent = load(request["callable"])
        # The proxy records the tool calls; the host reports none of its own.
        tool_calls: list[dict[str, Any]] = []
        context = dict(request.get("context") or {})
        if tools:
            context["tools"] = tools
        phase = "call"
        output = call(agent, request.get("prompt", ""), context)
    except BaseException as exc:  # report everything, including SystemExit from the agent
        return {
            "ok": False,
            "phase": phase,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    structured = not isinstance(output, str)
    if output is None:
        text = ""
    elif isinstance(output, str):
        text = output
    else:
        text = json.dumps(output, default=str)
    return {
        "ok": True,
        "phase": phase,
        "output": text,
        "structured": structured,
        "tool_calls": tool_calls,
    }


def main() -> int:
    request = json.loads(sys.stdin.read() or "{}")
    result = run(request)
    if result.get("ok") and "output" in result and os.environ.get("KEYSTONE_OUTPUT"):
        with open(os.environ["KEYSTONE_OUTPUT"], "w", encoding="utf-8") as handle:
            handle.write(result["output"])
    result_path = os.environ.get("KEYSTONE_AGENT_RESULT")
    if result_path:
        with open(result_path, "w", encoding="utf-8") as handle:
            json.dump(result, handle)
    else:
        print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
