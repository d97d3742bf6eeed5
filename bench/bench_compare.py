"""Server time of the compare page for two runs of 1,000 executions each (issue 14).

Seeds (fresh each time) a spec of 5 scenarios x 2 prompts x 100 replicas with 5 invariants,
and two completed runs of it whose Execution and CheckResult rows are bulk-created and then
finalized by the real service; in the second run one scenario's answers changed (so 200
cells differ, the first page of them diffed on the page). Then, with the app loaded as a
server's process has it (keystone_web.serving.app_loaded), requests the compare page through
Django's test client and prints the median and 95th percentile, and the median CPU time of
this process per request (steadier than wall time on a shared machine).

    .venv/bin/python bench/bench_compare.py [--requests 20]
        [--database-url postgresql://postgres@127.0.0.1:5432/keystone_bench_compare]

Target: at most 50 ms at the 95th percentile (issue 18: every page, the compare page of two
1,000-execution runs included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCENARIOS = ["no-chaos", "api-outage", "slow-llm", "hostile-tools", "injection"]
REPLICAS = 100
INVARIANTS = [f"invariant_{i}" for i in range(5)]
TARGET_MS = 50


def spec_source() -> str:
    scenarios = "\n".join(f"  - name: {name}" for name in SCENARIOS)
    invariants = "\n".join(
        f"  {name}:\n    description: check {name}\n    check: {{type: contains, value: ok}}"
        for name in INVARIANTS
    )
    return (
        "version: 1\nid: bench-compare\n"
        'task: {prompts: ["first prompt", "second prompt"]}\n'
        'agent: {type: command, command: "echo ok"}\n'
        f"chaos_matrix:\n{scenarios}\ninvariants:\n{invariants}\nreplicas: {REPLICAS}\n"
    )


def setup(database_url: str) -> None:
    import psycopg

    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = database_url
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ["ALLOWED_HOSTS"] = "testserver"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keystone_web.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed_run(version, changed_scenario: str | None):  # type: ignore[no-untyped-def]
    from checks.planning import plan_run
    from checks.spec.model import Spec as EngineSpec
    from evaluations import services
    from evaluations.models import CheckResult, Execution, Run, RunStatus

    run = Run.objects.create(
        project=version.spec.project, spec_version=version, status=RunStatus.FINALIZING
    )
    plan = plan_run(EngineSpec.from_dict(version.parsed))
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
                replica=p.replica,
                pillar=p.pillar,
                status="success",
                passed=p.scenario != changed_scenario,
                composite=1.0,
                duration_ms=1000.0 + p.replica,
                cost_usd=0.001,
                final_output=(
                    "Sorry, the refund service did not answer in time."
                    if p.scenario == changed_scenario
                    else "The refund of $12.50 for order 1042 was issued to the card."
                ),
                tool_sequence=[
                    {"name": "lookup_order", "arguments": {"order": 1042}},
                    {"name": "refund", "arguments": {"amount": 12.5}},
                ],
                plan={"invariant_ids": list(p.invariant_ids)},
            )
            for p in plan
        ],
        batch_size=500,
    )
    CheckResult.objects.bulk_create(
        [
            CheckResult(
                execution=e,
                run=run,
                invariant_id=name,
                check_type="contains",
                score=0.0 if e.scenario == changed_scenario else 1.0,
                passed=e.scenario != changed_scenario,
                failure_code="CONTAINS_FAILED" if e.scenario == changed_scenario else "",
            )
            for e in executions
            for name in INVARIANTS
        ],
        batch_size=2000,
    )
    Run.objects.filter(pk=run.pk).update(
        execution_count=len(executions), executions_done=len(executions)
    )
    return services.run_finalize(run_id=run.pk)


def main() -> int:
    global REPLICAS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default="postgresql://postgres@127.0.0.1:5432/keystone_bench_compare"
    )
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument(
        "--replicas", type=int, default=REPLICAS, help="per cell: runs of 10 x REPLICAS executions"
    )
    args = parser.parse_args()
    REPLICAS = args.replicas
    setup(args.database_url)

    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from evaluations import services
    from evaluations.models import Membership, Project, Role
    from evaluations.selectors.compare import EXECUTION_PAIRS_PAGE
    from keystone_web.serving import app_loaded

    project = Project.objects.create(name="Bench", slug="bench")
    user = get_user_model().objects.create_user(username="bench-viewer")
    Membership.objects.create(project=project, user=user, role=Role.VIEWER)
    version = services.spec_version_create(project=project, source_yaml=spec_source())
    before = seed_run(version, None)
    after = seed_run(version, "api-outage")
    assert before.execution_count == after.execution_count == 10 * REPLICAS
    client = Client()
    client.force_login(user)
    url = reverse("run_compare", args=[project.slug, after.pk]) + f"?against={before.pk}"
    first = client.get(url)
    assert first.status_code == 200 and b"<strong>Regressed</strong>" in first.content
    shown = first.content.count(b'<details class="execution-pair"')
    assert shown == min(2 * REPLICAS, EXECUTION_PAIRS_PAGE), shown
    app_loaded()
    timings, cpu = [], []
    for _ in range(args.requests):
        started, cpu_started = time.perf_counter(), time.process_time()
        client.get(url)
        timings.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
    timings.sort()
    p95 = timings[max(0, int(round(0.95 * len(timings))) - 1)]
    print(
        f"compare page, 2 x {10 * REPLICAS} executions: median {statistics.median(timings):.1f} ms, "
        f"p95 {p95:.1f} ms (n={args.requests}, target {TARGET_MS} ms); this process's CPU time "
        f"per request, median {statistics.median(cpu):.1f} ms (the database's is not in it)"
    )
    return 0 if p95 <= TARGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
