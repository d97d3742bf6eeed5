"""Data for the run, execution and export view tests (imported by test_runs.py,
test_executions.py and test_exports.py).

- `real_world(tmp)`: commits two projects, people of every role and a run of DASH_SPEC
  executed for real in-process (a python agent that calls the scripted LLM through the
  gateway, a tool through the tool proxy into an HTTP mock, and writes a SQLite row and a
  file). Module fixtures build it once and delete it afterwards, because executing takes
  seconds and the runner's lease thread needs committed rows.
- `synthetic_run(version, ...)`: a run with Execution and CheckResult rows made by
  bulk_create and finalized by the real service, for query counts at any size.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from checks.planning import plan_run
from checks.spec.model import Spec as EngineSpec
from evaluations import services
from evaluations.models import (
    CheckResult,
    Execution,
    ExecutionStatus,
    Membership,
    Project,
    Role,
    Run,
    RunStatus,
    SpecVersion,
)
from tests.evaluations.execution_helpers import run_spec

ROLES = ("viewer", "reviewer", "editor", "admin")
PASSWORD = "pw-dash-123"

AGENT = """\
import json, os, sqlite3, sys, urllib.error, urllib.request

prompt = os.environ["KEYSTONE_PROMPT"]
base = os.environ["OPENAI_BASE_URL"].rstrip("/")


def chat(messages):
    body = json.dumps({"model": "scripted-dash", "messages": messages}).encode()
    request = urllib.request.Request(
        base + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)["choices"][0]["message"]


messages = [{"role": "user", "content": prompt}]
reply = chat(messages)
for call in reply.get("tool_calls") or []:
    url = os.environ["KEYSTONE_TOOL_ORDERS_URL"] + "/orders/7"
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            result = answer.read().decode()
    except urllib.error.HTTPError as exc:
        result = "tool error %s" % exc.code
    messages += [reply, {"role": "tool", "tool_call_id": call["id"], "content": result}]
    reply = chat(messages)
with sqlite3.connect(os.environ["KEYSTONE_SERVICE_AUDIT_PATH"]) as db:
    db.execute("INSERT INTO events (kind) VALUES ('lookup')")
with open("note.txt", "w") as note:
    note.write("looked up order 7\\n")
print("agent: %d messages" % len(messages), file=sys.stderr)
print(reply.get("content") or "")
"""


def _indented(text: str, spaces: int) -> str:
    return "".join(" " * spaces + line if line.strip() else line for line in text.splitlines(True))


# 2 scenarios x 2 prompts x 2 replicas. Under orders-down the tool answers 503, so
# says_shipped fails there: two failed groups (and cells), two passing ones; exit code 1.
DASH_SPEC = f"""\
version: 1
id: dash-agent
description: "Looks an order up through a tool; the tool fails under chaos"
task:
  prompts: ["Look up order 7", "Look up order 7 again"]
agent:
  type: command
  command: "python agent.py"
  timeout: 60
sandbox:
  backend: local
  files:
    agent.py: |
{_indented(AGENT, 6)}
services:
  - name: orders
    type: http_mock
    record: true
    routes:
      - {{method: GET, path: /orders/7, status: 200, response: {{"id": 7, "status": "shipped"}}}}
  - name: audit
    type: sqlite
    sql: "CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT)"
llm:
  provider: scripted
  model: scripted-dash
  rules:
    - when: {{last_user_matches: "order"}}
      reply: {{tool_calls: [{{name: orders, arguments: {{order_id: 7}}}}]}}
    - reply: {{content: "hello, the order tool said: {{last_tool_result}}"}}
tools:
  - {{name: orders, service: orders}}
chaos_matrix:
  - name: no-chaos
  - name: orders-down
    tool_faults:
      - {{tool: orders, mode: error, error_code: 503}}
invariants:
  greets:
    description: "The answer greets"
    gate: true
    check: {{type: contains, value: hello}}
  says_shipped:
    description: "The answer gives the order's status"
    severity: high
    check: {{type: contains, value: shipped}}
  note_written:
    description: "The agent wrote note.txt"
    check: {{type: file_exists, path: note.txt}}
replicas: 2
"""


def storage_settings(root: Path) -> dict[str, Any]:
    from django.conf import settings

    return {
        "KEYSTONE_ARTIFACT_ROOT": root,
        "MEDIA_ROOT": root,
        "STORAGES": {
            **settings.STORAGES,
            "default": {
                "BACKEND": settings.STORAGES["default"]["BACKEND"],
                "OPTIONS": {"location": root, "base_url": "/artifacts/"},
            },
        },
    }


@dataclass
class World:
    """What the module fixtures commit: `mine` has the real run, `other` look-alikes."""

    mine: Project
    other: Project
    users: dict[str, Any]  # role -> user in `mine`; "outsider" is an admin of `other` only
    version: SpecVersion
    run: Run  # the executed, completed run (exit code 1)
    other_run: Run  # a run of `other`, for ids that must 404 under `mine`
    spec_dir: Path
    artifact_root: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def client(self, role: str) -> Client:
        client = Client()
        client.force_login(self.users[role])
        return client


@contextmanager
def real_world(tmp: Path, prefix: str) -> Iterator[World]:
    """Commit the world (project slugs start with `prefix`), yield it, then delete it."""
    artifact_root = tmp / "artifacts"
    spec_dir = tmp / "spec"
    spec_dir.mkdir(parents=True, exist_ok=True)
    user_model = get_user_model()
    mine = Project.objects.create(name=f"{prefix} mine", slug=f"{prefix}-mine")
    other = Project.objects.create(name=f"{prefix} other", slug=f"{prefix}-other")
    users: dict[str, Any] = {}
    try:
        for role in ROLES:
            users[role] = user_model.objects.create_user(f"{prefix}-{role}", password=PASSWORD)
            Membership.objects.create(project=mine, user=users[role], role=Role(role))
        users["outsider"] = user_model.objects.create_user(f"{prefix}-outsider", password=PASSWORD)
        Membership.objects.create(project=other, user=users["outsider"], role=Role.ADMIN)
        with override_settings(**storage_settings(artifact_root)):
            run = run_spec(
                mine,
                DASH_SPEC,
                spec_dir=spec_dir,
                labels={"branch": "main", "team": "orders"},
                seed=42,
            )
            version = run.spec_version
            other_version = services.spec_version_create(project=other, source_yaml=DASH_SPEC)
            other_run = Run.objects.create(
                project=other, spec_version=other_version, status=RunStatus.QUEUED
            )
        yield World(
            mine=mine,
            other=other,
            users=users,
            version=version,
            run=run,
            other_run=other_run,
            spec_dir=spec_dir,
            artifact_root=artifact_root,
        )
    finally:
        # Runs first: a spec version is protected while runs point at it.
        Run.objects.filter(project__in=[mine, other]).delete()
        Project.objects.filter(pk__in=[mine.pk, other.pk]).delete()
        user_model.objects.filter(pk__in=[u.pk for u in users.values()]).delete()


# --- Synthetic runs -----------------------------------------------------------------------

SYNTHETIC_SPEC = """\
version: 1
id: synthetic-{index}
task: {{prompts: ["first", "second"]}}
agent: {{type: command, command: "echo ok"}}
llm: {{provider: scripted, rules: [{{reply: {{content: ok}}}}]}}
tools: [{{name: search, url: "http://127.0.0.1:9/search"}}]
chaos_matrix:
  - name: no-chaos
  - name: tool-outage
    tool_faults:
      - {{tool: "*", mode: error, error_code: 503}}
  - name: slow-llm
    llm_faults:
      - {{mode: timeout}}
invariants:
  answers:
    description: "Answers"
    gate: true
    severity: critical
    check: {{type: contains, value: ok}}
  cites:
    description: "Cites a source"
    check: {{type: contains, value: source}}
  polite:
    description: "Polite"
    severity: low
    check: {{type: not_contains, value: rude}}
replicas: {replicas}
"""

_spec_numbers = itertools.count(1)


def synthetic_version(project: Project, *, replicas: int = 2) -> SpecVersion:
    source = SYNTHETIC_SPEC.format(index=next(_spec_numbers), replicas=replicas)
    return services.spec_version_create(project=project, source_yaml=source)


def runs_a_backfill_meets(version: SpecVersion) -> tuple[list[Run], Run]:
    """Three finalized runs (`cites` failing in tool-outage, in no-chaos, nowhere) and one
    still running, with no summary: what a migration filling a new column from the
    summaries finds."""
    finalized = [
        synthetic_run(version),
        synthetic_run(version, failing_scenario="no-chaos", flaky_scenario=""),
        synthetic_run(version, failing_scenario="", flaky_scenario=""),
    ]
    unfinished = Run.objects.create(
        project=version.spec.project, spec_version=version, status=RunStatus.RUNNING
    )
    return finalized, unfinished


def synthetic_run(
    version: SpecVersion,
    *,
    replicas: int | None = None,
    failing_scenario: str = "tool-outage",
    flaky_scenario: str = "slow-llm",
    **columns: Any,
) -> Run:
    """A completed run whose executions and results are rows (bulk_create): in
    `failing_scenario` `cites` fails in every replica; in `flaky_scenario` it fails in
    replica 0 only. Finalized by services.run_finalize, so its summary is the real one."""
    run = Run.objects.create(
        project=version.spec.project,
        spec_version=version,
        status=RunStatus.RUNNING,
        replicas_override=replicas,
        **columns,
    )
    plan = plan_run(EngineSpec.from_dict(version.parsed), replicas=replicas)
    executions = Execution.objects.bulk_create(
        [
            Execution(
                run=run,
                project_id=run.project_id,
                key=Execution.build_key(
                    scenario=p.scenario,
                    prompt_index=p.prompt_index,
                    replica=p.replica,
                    pillar=p.pillar,
                ),
                scenario=p.scenario,
                prompt_index=p.prompt_index,
                prompt=p.prompt,
                replica=p.replica,
                pillar=p.pillar,
                plan=p.to_dict(),
                status=ExecutionStatus.SUCCESS,
                duration_ms=100.0 + i,
                cost_usd=0.001,
                final_output="ok",
            )
            for i, p in enumerate(plan)
        ],
        batch_size=1000,
    )
    results = []
    for execution, planned in zip(executions, plan, strict=True):
        for invariant_id in planned.invariant_ids:
            failed = invariant_id == "cites" and (
                execution.scenario == failing_scenario
                or (execution.scenario == flaky_scenario and execution.replica == 0)
            )
            results.append(
                CheckResult(
                    execution=execution,
                    run=run,
                    invariant_id=invariant_id,
                    check_type="contains",
                    score=0.0 if failed else 1.0,
                    passed=not failed,
                    failure_code="CONTAINS_FAILED" if failed else "",
                    message="no source cited" if failed else "",
                    details={"expected": invariant_id},
                )
            )
    CheckResult.objects.bulk_create(results, batch_size=2000)
    Execution.objects.filter(run=run).update(passed=True, composite=1.0)
    failed_ids = {r.execution_id for r in results if not r.passed}
    Execution.objects.filter(pk__in=failed_ids).update(passed=False, composite=0.5)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.FINALIZING,
        execution_count=len(executions),
        executions_done=len(executions),
    )
    return services.run_finalize(run_id=run.pk)
