"""Reference 001's literal `contract: {invariants: [...], chaos_matrix: [...]}` layout is an
alias of the map form (issue 12, item 17); errors still point at the author's lines."""

from __future__ import annotations

from checks.spec import parse_spec, validate_spec_text

HEAD = """\
version: 1
id: finance-contract
task: {prompt: "What is ACME's share price?"}
agent: {type: command, command: "echo according to the source, 12 dollars"}
"""

# 001's configuration block, as the document writes it (tool_faults need a declared tool,
# llm_faults the gateway: an `llm` block).
CONTRACT = """\
tools:
  - {name: market_data_api, url: "http://127.0.0.1:9/quote"}
llm: {provider: scripted, rules: [{reply: {content: "according to the source, 12 dollars"}}]}
contract:
  name: "Finance Agent Contract"
  description: "Invariants that must hold under all failure conditions"
  invariants:
    - id: always-cite-source
      type: regex
      pattern: "(?i)(source|according to|reference)"
      severity: critical
      when: always
      description: "Must always cite a data source"
    - id: never-fabricate-when-tools-fail
      type: regex
      pattern: '\\\\$[\\\\d,]+\\\\.\\\\d{2}'
      negate: true
      severity: critical
      when: tool_faults_active
      description: "Must not return dollar figures when tools are failing"
    - id: max-latency
      type: latency
      max_ms: 60000
      severity: medium
      when: always
  chaos_matrix:
    - name: "no-chaos"
      tool_faults: []
      llm_faults: []
    - name: "search-tool-down"
      tool_faults:
        - tool: market_data_api
          mode: error
          error_code: 503
    - name: "llm-degraded"
      llm_faults:
        - mode: truncated_response
          max_tokens: 20
"""

MAP_FORM = """\
tools:
  - {name: market_data_api, url: "http://127.0.0.1:9/quote"}
llm: {provider: scripted, rules: [{reply: {content: "according to the source, 12 dollars"}}]}
description: "Finance Agent Contract - Invariants that must hold under all failure conditions"
invariants:
  always-cite-source:
    description: "Must always cite a data source"
    severity: critical
    when: always
    check: {type: regex, pattern: "(?i)(source|according to|reference)"}
  never-fabricate-when-tools-fail:
    description: "Must not return dollar figures when tools are failing"
    negate: true
    severity: critical
    when: tool_faults_active
    check: {type: regex, pattern: '\\\\$[\\\\d,]+\\\\.\\\\d{2}'}
  max-latency:
    description: max-latency
    severity: medium
    when: always
    check: {type: latency, max_ms: 60000}
chaos_matrix:
  - {name: "no-chaos", tool_faults: [], llm_faults: []}
  - name: "search-tool-down"
    tool_faults: [{tool: market_data_api, mode: error, error_code: 503}]
  - name: "llm-degraded"
    llm_faults: [{mode: truncated_response, max_tokens: 20}]
"""


def test_contract_layout_reads_as_the_map_form() -> None:
    literal = parse_spec(HEAD + CONTRACT)
    mapped = parse_spec(HEAD + MAP_FORM)
    assert literal.raw == mapped.raw
    assert list(literal.invariants) == [
        "always-cite-source",
        "never-fabricate-when-tools-fail",
        "max-latency",
    ]
    assert literal.invariants["never-fabricate-when-tools-fail"].negate is True
    assert [s.name for s in literal.scenarios] == ["no-chaos", "search-tool-down", "llm-degraded"]


def test_errors_in_the_contract_layout_point_at_the_authors_lines() -> None:
    text = HEAD + CONTRACT.replace("max_ms: 60000", "max_ms: -5").replace(
        'type: regex\n      pattern: "(?i)', 'type: regexx\n      pattern: "(?i)'
    )
    _, errors = validate_spec_text(text)
    lines = text.splitlines()
    found = {e.path: (e.message, lines[e.line - 1].strip()) for e in errors}
    assert found == {
        "invariants.always-cite-source.check.type": (
            "unknown check type 'regexx' (did you mean 'regex'?)",
            "type: regexx",
        ),
        "invariants.max-latency.check.max_ms": ("must be >= 0, got -5", "max_ms: -5"),
    }


def test_contract_layout_refusals_name_the_problem() -> None:
    both = HEAD + CONTRACT + "invariants:\n  x: {description: x, check: {type: completes}}\n"
    no_id = HEAD + "contract:\n  invariants:\n    - {type: completes}\n"
    extra = HEAD + "contract:\n  owner: me\n  invariants:\n    - {id: a, type: completes}\n"
    assert [str(e) for e in validate_spec_text(both)[1]] == [
        "contract.invariants: 'invariants' is given both in contract and at the top level:"
        " write it once at line 11, col 3"
    ]
    assert [str(e) for e in validate_spec_text(no_id)[1]] == [
        "contract.invariants[0]: each contract invariant needs an id (a string) at line 7, col 7"
    ]
    assert [str(e) for e in validate_spec_text(extra)[1]] == [
        "contract.owner: unknown field 'owner' in contract (use name, description, invariants,"
        " chaos_matrix) at line 6, col 3"
    ]
