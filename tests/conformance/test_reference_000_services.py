"""Reference 000's "SQL state + HTTP mock assertion" pattern, its invariants verbatim
(re-indented), on a real PostgreSQL database and a real recording HTTP mock, judged by the
scripted judge: "end-state correctness (SQL), behavior correctness (HTTP), subjective
quality (LLM-judge)".

The document leaves out the services, the agent and the judge's provider; they are added.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_helpers import embedded_env, run_keystone

PG_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"

SPEC = """\
version: 1
id: reconcile
task: {prompt: "Reconcile customers_a with customers_b and email finance a summary"}
agent: {type: command, command: "sh agent.sh"}
sandbox: {backend: local, workspace: "."}
services:
  - name: db
    type: postgres
    sql: |
      CREATE TABLE customers_a (id int, email text);
      CREATE TABLE customers_b (id int, email text);
      INSERT INTO customers_a VALUES (1, 'a@x.co'), (2, 'b@x.co');
      INSERT INTO customers_b VALUES (1, 'a@x.co'), (2, 'OLD@x.co');
  - name: smtp
    type: http_mock
    record: true
    routes: [{method: POST, path: /send, status: 202, response: {queued: true}}]
judge:
  provider: scripted
  rules:
    - {when: {output_matches: "(?i)1 mismatch fixed"}, score: 0.9, reason: "clear numbers"}
    - {score: 0.2, reason: "vague"}
invariants:
  reconciliation_clean:
    description: "No mismatches"
    weight: 0.5
    gate: true
    check:
      type: sql
      service: db
      query: "SELECT count(*) FROM customers_a a LEFT JOIN customers_b b USING (id) WHERE a.email != b.email"
      equals: 0
  email_sent_once:
    description: "Exactly one summary email"
    weight: 0.3
    check:
      type: http_mock_assertions
      service: smtp
      assertions:
        - field: request_count
          filters: { to: "finance@co" }
          equals: 1
  email_quality:
    description: "Email is well-written"
    weight: 0.2
    check:
      type: llm_as_judge
      model: paragon-fast
      criteria: "Professional, accurate, actionable"
      input_from: smtp.last_request.body
      pass_threshold: 0.7
"""

GOOD_AGENT = """\
psql "$DATABASE_URL" -qc "UPDATE customers_b SET email = 'b@x.co' WHERE id = 2"
python3 - <<'EOF'
import json, os, urllib.request
body = json.dumps({"to": "finance@co", "text": "Reconciled: 1 mismatch fixed, 2 customers"})
request = urllib.request.Request(os.environ["KEYSTONE_SERVICE_SMTP_URL"] + "/send",
    data=body.encode(), method="POST", headers={"Content-Type": "application/json"})
urllib.request.urlopen(request).read()
EOF
echo done
"""


@pytest.mark.skipif(shutil.which("psql") is None, reason="the agent uses psql (CI installs it)")
@pytest.mark.parametrize(
    ("agent", "exit_code", "failed"),
    [
        (GOOD_AGENT, 0, set()),
        # Emails the wrong address and leaves the mismatch: the gate forces 0.
        (
            GOOD_AGENT.replace("finance@co", "ops@co").replace("psql", ": psql"),
            1,
            {"reconciliation_clean", "email_sent_once"},
        ),
    ],
)
def test_sql_state_and_http_mock_and_judge_pattern(
    tmp_path: Path, agent: str, exit_code: int, failed: set[str]
) -> None:
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "spec.yaml").write_text(SPEC)
    (spec_dir / "agent.sh").write_text(agent)
    report = tmp_path / "report.json"
    env = embedded_env(tmp_path / "home", KEYSTONE_POSTGRES_URL=PG_SERVER)
    done = run_keystone("run", str(spec_dir / "spec.yaml"), "--json", str(report), env=env)
    assert done.returncode == exit_code, done.stdout + done.stderr
    summary = json.loads(report.read_text())["summary"]
    assert {c["invariant_id"] for c in summary["matrix"] if not c["passed"]} == failed
    [execution] = summary["executions"]
    if failed:
        assert execution["composite"] == 0.0
        assert "gate `reconciliation_clean`" in execution["reason"]
    else:
        # 0.5 x 1 + 0.3 x 1 + 0.2 x 0.9 over 1.0
        assert execution["composite"] == pytest.approx(0.98)
