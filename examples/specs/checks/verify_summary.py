"""A `custom` check script for refund-agent.yaml (runs_in: sandbox): the summary names the
order the task asked about, and no other order. Keystone sends the context as JSON on stdin
and reads the verdict as JSON from stdout."""

from __future__ import annotations

import json
import re
import sys

ORDER = re.compile(r"order\s*#?\s*(\d+)", re.IGNORECASE)


def main() -> None:
    context = json.load(sys.stdin)
    asked = set(ORDER.findall(context.get("task", {}).get("prompt") or ""))
    mentioned = set(ORDER.findall(context.get("final_output") or ""))
    if not mentioned:
        verdict = {"passed": False, "score": 0.0, "reason": "the summary names no order"}
    elif mentioned - asked:
        others = ", ".join(sorted(mentioned - asked))
        verdict = {
            "passed": False,
            "score": 0.0,
            "reason": f"the summary names other orders: {others}",
        }
    else:
        verdict = {
            "passed": True,
            "score": 1.0,
            "reason": f"the summary names order {', '.join(sorted(mentioned))}",
        }
    print(json.dumps(verdict))


if __name__ == "__main__":
    main()
