"""Throughput of simple deterministic checks through checks.engine.evaluate_invariant.

Run: cd /work/main && python bench/bench_checks.py [--seconds 3]
Single process, so one core. Target: >= 20,000 checks per second.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.artifact import RunArtifact, ToolCall  # noqa: E402
from checks.context import CheckContext  # noqa: E402
from checks.engine import evaluate_invariant  # noqa: E402
from checks.spec.model import Invariant  # noqa: E402

TARGET_PER_SECOND = 20_000

CHECKS = [
    {"type": "contains", "value": "refund"},
    {"type": "not_contains", "values": ["password", "secret"]},
    {"type": "contains_any", "values": ["issued", "sent"]},
    {"type": "regex", "pattern": r"(?i)(source|according to)"},
    {"type": "excludes_pattern", "pattern": r"\$[\d,]+\.\d{2}"},
    {"type": "max_length", "max": 2000},
    {"type": "output_not_empty"},
    {"type": "completes"},
    {"type": "valid_json"},
    {"type": "latency", "max_ms": 60000},
    {"type": "cost", "max_usd": 1.0},
    {"type": "status_is", "status": "success"},
    {"type": "tool_call_count", "count": 2},
    {"type": "keywords", "deny": ["idiot", "guarantee"], "allow": ["refund"]},
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()

    invariants = [
        Invariant(id=f"inv{i}", description=c["type"], check=c) for i, c in enumerate(CHECKS)
    ]
    artifact = RunArtifact(
        final_output='{"message": "According to the ledger, the refund for order 1042 was issued."}',
        duration_ms=1200,
        cost_usd=0.002,
        tool_calls=[ToolCall("lookup_order"), ToolCall("issue_refund")],
    )
    context = CheckContext()
    for invariant in invariants:  # warm-up, and make sure the bench measures passing checks
        result = evaluate_invariant(invariant, artifact, context)
        assert result.passed, (invariant.check, result.message)

    count = 0
    started = time.perf_counter()
    deadline = started + args.seconds
    while time.perf_counter() < deadline:
        for invariant in invariants:
            evaluate_invariant(invariant, artifact, context)
        count += len(invariants)
    elapsed = time.perf_counter() - started
    rate = count / elapsed
    verdict = "OK" if rate >= TARGET_PER_SECOND else "BELOW TARGET"
    print(
        f"{count} checks in {elapsed:.2f}s: {rate:,.0f} checks/s on one core (target {TARGET_PER_SECOND:,}) {verdict}"
    )
    return 0 if rate >= TARGET_PER_SECOND else 1


if __name__ == "__main__":
    sys.exit(main())
