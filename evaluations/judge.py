"""The judge of a run: a checks.judge_client.JudgeClient built from the spec's `judge:` block
(or the server's KEYSTONE_JUDGE_* settings), with its replies cached in the database.

- `provider: openai` (any OpenAI-compatible endpoint): the API key is read from the server's
  environment (`api_key_env`) in the worker and never reaches the agent. The server's own key
  is only sent to the server's own judge endpoint: a spec whose `judge.base_url` points
  elsewhere names its own `api_key_env` (or gets no key, e.g. for a local model server).
- `provider: scripted` (offline, deterministic): the spec's rules are served by Keystone's
  scripted OpenAI-compatible server on loopback, so the judge path (SDK, parsing, cache) is
  the same as with a real model. `output_matches` is searched in the judged text (the user
  message), `criteria_matches` in the judge's instructions (the system message, which holds
  the criteria and rubric). A rule answers {"score", "passed": score >= 0.5, "reasoning",
  "drift_score": 1 - score}.
- `Run.options["judge_cache"] is False` (`keystone run --no-judge-cache`) runs without the
  cache: nothing is read from it or written to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import F

from checks.results import JUDGE_CHECK_TYPES
from checks.spec.semantics import JUDGE_MODEL_MAX
from evaluations.models import JudgeCacheEntry, Run

if TYPE_CHECKING:
    # Imported where a judge is built: most runs have none, and a `keystone run` without
    # one need not load the client (statistics, its retry and cost code).
    from checks.judge_client import JudgeClient, JudgeSettings

JUDGE_METHODS = frozenset({"judge", "embedding"})  # drift / similarity methods that need it


class DatabaseJudgeCache:
    """checks.judge_client.JudgeCache on JudgeCacheEntry rows (shared by every worker)."""

    def get(self, key: str) -> dict[str, Any] | None:
        entry = JudgeCacheEntry.objects.filter(key=key).values("pk", "reply").first()
        if entry is None:
            return None
        JudgeCacheEntry.objects.filter(pk=entry["pk"]).update(hits=F("hits") + 1)
        reply = entry["reply"]
        return dict(reply) if isinstance(reply, dict) else None

    def put(self, key: str, model: str, reply: dict[str, Any]) -> None:
        # Two workers may judge the same thing at once: the first row wins, quietly.
        JudgeCacheEntry.objects.bulk_create(
            [JudgeCacheEntry(key=key, model=model[:JUDGE_MODEL_MAX], reply=reply)],
            ignore_conflicts=True,
        )


def spec_uses_judge(parsed: Mapping[str, Any]) -> bool:
    """Whether any invariant needs the judge (so runs without one start no server, need no key)."""
    for invariant in (parsed.get("invariants") or {}).values():
        check = (invariant or {}).get("check") or {}
        if check.get("type") in JUDGE_CHECK_TYPES or check.get("method") in JUDGE_METHODS:
            return True
    return False


def judge_block(parsed: Mapping[str, Any]) -> dict[str, Any]:
    """The effective judge configuration: the spec's `judge:` over the server's settings."""
    server: dict[str, Any] = {
        "provider": settings.KEYSTONE_JUDGE_PROVIDER or "openai",
        "model": settings.KEYSTONE_JUDGE_MODEL,
        "base_url": settings.KEYSTONE_JUDGE_BASE_URL or None,
        "api_key_env": settings.KEYSTONE_JUDGE_API_KEY_ENV or None,
        "temperature": settings.KEYSTONE_JUDGE_TEMPERATURE,
        "timeout": settings.KEYSTONE_JUDGE_TIMEOUT,
    }
    spec = {k: v for k, v in dict(parsed.get("judge") or {}).items() if v is not None}
    if not spec:
        return server
    if spec.get("provider") == "scripted":
        return {
            "provider": "scripted",
            "model": spec.get("model") or "scripted",
            "rules": list(spec.get("rules") or []),
            "temperature": 0.0,
            "timeout": server["timeout"],
        }
    merged = {**server, **spec}
    if (
        spec.get("base_url")
        and spec["base_url"] != server["base_url"]
        and not spec.get("api_key_env")
    ):
        merged["api_key_env"] = None  # the server's key is not sent to a spec's own endpoint
    return merged


def scripted_rules(rules: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The spec's judge rules as rules of the scripted OpenAI-compatible provider."""
    translated = []
    for rule in rules:
        when = rule.get("when") or {}
        provider_when: dict[str, Any] = {}
        if when.get("output_matches"):
            provider_when["last_user_matches"] = when["output_matches"]
        if when.get("criteria_matches"):
            provider_when["system_matches"] = when["criteria_matches"]
        score = float(rule.get("score", 0.0))
        content = json.dumps(
            {
                "score": score,
                "passed": score >= 0.5,
                "reasoning": str(rule.get("reason") or ""),
                "drift_score": round(1.0 - score, 6),
            }
        )
        translated.append({"when": provider_when, "reply": {"content": content}})
    return translated


def _client_settings(block: Mapping[str, Any], **overrides: Any) -> JudgeSettings:
    from checks.judge_client import JudgeSettings

    values: dict[str, Any] = {
        "model": str(block.get("model") or settings.KEYSTONE_JUDGE_MODEL),
        "temperature": float(block.get("temperature") or 0.0),
        "timeout": float(block.get("timeout") or settings.KEYSTONE_JUDGE_TIMEOUT),
        "max_retries": settings.KEYSTONE_JUDGE_MAX_RETRIES,
        "backoff_base": settings.KEYSTONE_JUDGE_BACKOFF,
        "max_concurrency": settings.KEYSTONE_JUDGE_CONCURRENCY,
        "embedding_model": settings.KEYSTONE_JUDGE_EMBEDDING_MODEL,
    }
    values.update(overrides)
    return JudgeSettings(**values)


def _api_key(block: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(key, problem): the key from the server's environment, or why there is none."""
    name = block.get("api_key_env")
    if not name:
        return None, None
    value = os.environ.get(str(name), "")
    if not value:
        return None, f"the judge's API key variable {name} is not set on the server"
    return value, None


@contextlib.contextmanager
def judge_for_run(run: Run) -> Iterator[JudgeClient | None]:
    """The run's judge for as long as the block lasts (None when no invariant needs one)."""
    parsed = run.spec_version.parsed
    if not spec_uses_judge(parsed):
        yield None
        return
    block = judge_block(parsed)
    cache = None if run.options.get("judge_cache") is False else DatabaseJudgeCache()
    with contextlib.ExitStack() as stack:
        if block["provider"] == "scripted":
            from evaluations.runner.scripted import ScriptedServer

            rules = scripted_rules(block["rules"])
            server = stack.enter_context(ScriptedServer(rules, model=block["model"]))
            # Each server has a fresh port; the cache and the concurrency limit key on the
            # rules instead, so identical scripted verdicts are still found again.
            fingerprint = hashlib.sha256(json.dumps(rules, sort_keys=True).encode()).hexdigest()
            client_settings = _client_settings(
                block,
                base_url=server.base_url,
                api_key="keystone-scripted",
                endpoint_id=f"scripted:{fingerprint[:16]}",
            )
        else:
            key, problem = _api_key(block)
            client_settings = _client_settings(
                block,
                base_url=block.get("base_url") or None,
                api_key=key,
                credentials_problem=problem,
            )
        from checks.judge_client import JudgeClient

        client = JudgeClient(client_settings, cache=cache)
        stack.callback(client.close)
        yield client
