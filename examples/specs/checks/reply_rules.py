"""A rule for the support agent's replies, loaded by path as a Keystone `python_hook`
(`path: checks/reply_rules.py`, `callable_name: check_reply`): the text the customer reads
agrees with the status the reply sets."""

from __future__ import annotations

import json
from typing import Any

WORDS_FOR_STATUS = {
    "closed": ("closed", "resolved"),
    "escalated": ("escalated",),
    "open": ("open", "follow up"),
}


def check_reply(artifact: Any, context: Any) -> dict[str, Any]:
    try:
        reply = json.loads(artifact.final_output)
    except ValueError:
        return {"passed": False, "score": 0.0, "reason": "the reply is not JSON"}
    if not isinstance(reply, dict):
        return {"passed": False, "score": 0.0, "reason": "the reply is not a JSON object"}
    status, text = reply.get("status"), str(reply.get("reply", "")).lower()
    words = WORDS_FOR_STATUS.get(str(status), ())
    if any(word in text for word in words):
        return {"passed": True, "score": 1.0, "reason": f"the reply says the ticket is {status}"}
    return {
        "passed": False,
        "score": 0.0,
        "reason": f"status {status!r}, but the reply text does not say so",
    }
