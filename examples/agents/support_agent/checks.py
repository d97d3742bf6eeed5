"""A project-specific rule for the support agent's replies, as a Keystone `python_hook`
(`import_path: support_agent.checks`, `callable_name: check_reply`): the reply names a real
ticket, or says plainly that it does not know which one."""

from __future__ import annotations

import json
import re
from typing import Any

TICKET_ID = re.compile(r"^T-\d+$")


def check_reply(artifact: Any, context: Any) -> dict[str, Any]:
    try:
        reply = json.loads(artifact.final_output)
    except ValueError:
        return {"passed": False, "score": 0.0, "reason": "the reply is not JSON"}
    ticket_id = reply.get("ticket_id") if isinstance(reply, dict) else None
    if ticket_id == "unknown" or (isinstance(ticket_id, str) and TICKET_ID.match(ticket_id)):
        return {"passed": True, "score": 1.0, "reason": f"ticket_id {ticket_id!r}"}
    return {"passed": False, "score": 0.0, "reason": f"ticket_id {ticket_id!r} is not a ticket"}
