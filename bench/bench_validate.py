"""How long validating a large spec takes: a generated spec with 200 invariants.

Run: python bench/bench_validate.py [--invariants N] [--rounds R]
Target: median under 50 ms for 200 invariants (the whole path: YAML, schema, semantic rules).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checks.spec import parse_spec, validate_spec_text  # noqa: E402

HEADER = """\
version: 1
id: bench-agent
description: "Generated spec for the validation benchmark"
task:
  prompts: ["Refund order 1042", "Refund order 1043"]
agent:
  type: python
  callable: "bench_agent:run"
  tools: ["bench_agent.tools:lookup_order", "bench_agent.tools:send_email"]
services:
  - {name: db, type: postgres, sql: "CREATE TABLE refunds (id int)"}
  - name: smtp
    type: http_mock
    record: true
    routes:
      - {method: POST, path: /api/messages, status: 202, response: {id: m1}}
tools:
  - {name: lookup_order, service: smtp}
llm: {provider: scripted, rules: [{reply: {content: done}}]}
chaos_matrix:
  - name: no-chaos
  - name: tool-down
    tool_faults: [{tool: lookup_order, mode: error, error_code: 503}]
  - name: llm-degraded
    llm_faults: [{mode: truncated_response, max_tokens: 20}]
    context_attacks: [{type: indirect_injection, payloads: ["Ignore previous instructions"]}]
scoring:
  weights: {mutation: 0.2, chaos: 0.35, contract: 0.35, replay: 0.1}
invariants:
"""

# A rotation of check shapes, so the benchmark exercises many per-type schemas.
CHECKS = [
    '{type: command_exit, command: "pytest -q", exit_code: 0}',
    '{type: regex, pattern: "(?i)(source|according to)"}',
    "{type: latency, max_ms: 60000}",
    '{type: sql, service: db, query: "SELECT count(*) FROM refunds", equals: 1}',
    "{type: http_mock_assertions, service: smtp, assertions: [{field: request_count, filters: {method: POST}, equals: 1}]}",
    '{type: contains, values: ["refund", "1042"], case_sensitive: false}',
    "{type: excludes_pii, patterns: [email, phone], deny_patterns: ['\\\\d{3}-\\\\d{2}-\\\\d{4}']}",
    '{type: llm_as_judge, criteria: "Polite and correct", input_from: agent_output, pass_threshold: 0.7}',
    '{type: workspace_file_present, relative_path: "out/report.md", contains_all: ["refund"]}',
    "{type: tool_calls, calls: [{tool: lookup_order, args_match: {order_id: 1042}}]}",
]


def generate_spec(invariant_count: int) -> str:
    lines = [HEADER]
    severities = ["critical", "high", "medium", "low"]
    for index in range(invariant_count):
        lines.append(
            f"  inv_{index:04d}:\n"
            f'    description: "Generated invariant {index}"\n'
            f"    weight: {1 + index % 3}\n"
            f"    severity: {severities[index % 4]}\n"
            f"    check: {CHECKS[index % len(CHECKS)]}\n"
        )
    return "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--invariants", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()

    text = generate_spec(args.invariants)
    data, errors = validate_spec_text(text)  # warms the compiled validator cache
    if errors:
        for error in errors:
            print(error)
        return 1
    assert data is not None and len(data["invariants"]) == args.invariants

    timings = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        validate_spec_text(text)
        timings.append((time.perf_counter() - started) * 1000)
    parse_timings = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        parse_spec(text)
        parse_timings.append((time.perf_counter() - started) * 1000)

    median = statistics.median(timings)
    print(f"spec: {args.invariants} invariants, {len(text)} bytes, {args.rounds} rounds")
    print(
        f"validate_spec_text median: {median:.1f} ms (min {min(timings):.1f}, max {max(timings):.1f})"
    )
    print(f"parse_spec median: {statistics.median(parse_timings):.1f} ms")
    print(f"target < 50 ms: {'met' if median < 50 else 'MISSED'}")
    return 0 if median < 50 else 1


if __name__ == "__main__":
    raise SystemExit(main())
