"""Server time of the dashboard's pages with a large history in PostgreSQL.

Seeds (once; kept between invocations) a project with 2,000 runs of 100 executions each
(200,000 executions) and 10 check results per execution (2,000,000 results), loaded with
COPY, plus one small run executed for real so the execution page has real artifacts. Then
requests each page through Django's test client (URL routing, middleware, views, queries
and templates: everything the server does for a request but the socket) and prints the
median and 95th percentile per page.

    /work/venv/bin/python bench/bench_pages.py [--requests 40] [--reseed]
        [--database-url postgresql://postgres@127.0.0.1:5432/keystone_bench]

Target: every page under 150 ms at the 95th percentile.
"""

from __future__ import annotations

import argparse
import html
import os
import random
import re
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUNS = 2_000
EXECUTIONS_PER_RUN = 100
RESULTS_PER_EXECUTION = 10
SCENARIOS = ["no-chaos", "api-outage", "slow-llm", "hostile-tools", "injection"]
PROMPTS = 2
REPLICAS = EXECUTIONS_PER_RUN // (len(SCENARIOS) * PROMPTS)
INVARIANTS = [f"invariant_{i}" for i in range(RESULTS_PER_EXECUTION)]
SEVERITIES = ["critical", "high", "medium", "low"]

SMALL_SPEC = """\
version: 1
id: bench-small
task: {prompts: ["Say hello"]}
agent: {type: command, command: "sh -c 'echo hello; echo note > note.txt'"}
sandbox: {backend: local}
invariants:
  greets: {description: greets, gate: true, check: {type: contains, value: hello}}
  says_goodbye: {description: goodbye, check: {type: contains, value: goodbye}}
replicas: 2
"""


def bench_spec_source(index: int) -> str:
    scenarios = "\n".join(f"  - name: {name}" for name in SCENARIOS)
    invariants = "\n".join(
        f"  {name}:\n    description: check {name}\n    severity: {SEVERITIES[i % 4]}\n"
        f"    check: {{type: contains, value: ok{i}}}"
        for i, name in enumerate(INVARIANTS)
    )
    return (
        f"version: 1\nid: bench-spec-{index}\n"
        f'task: {{prompts: ["first prompt", "second prompt"]}}\n'
        f'agent: {{type: command, command: "echo ok"}}\n'
        f"chaos_matrix:\n{scenarios}\ninvariants:\n{invariants}\nreplicas: {REPLICAS}\n"
    )


def create_database(database_url: str, *, fresh: bool) -> None:
    """The bench has a database of its own; `fresh` drops what an earlier seed left."""
    import psycopg

    name = database_url.rsplit("/", 1)[1]
    admin_url = database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django(database_url: str, *, fresh: bool) -> None:
    create_database(database_url, fresh=fresh)
    os.environ["DATABASE_URL"] = database_url
    os.environ.pop("CELERY_BROKER_URL", None)
    os.environ["ALLOWED_HOSTS"] = "testserver"  # the Host header of Django's test client
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keystone_web.settings")
    os.environ.setdefault("KEYSTONE_HOME", str(Path(__file__).resolve().parents[1] / "var/bench"))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed() -> None:
    from django.contrib.auth import get_user_model

    from evaluations.models import Membership, Project, Role

    existing = Project.objects.filter(slug="bench").first()
    # A finished seed ends with the small real run; anything less was interrupted.
    complete = existing is not None and existing.specs.filter(slug="bench-small").exists()
    if complete:
        return
    if existing is not None:
        sys.exit("an earlier seed was interrupted: run again with --reseed")
    started = time.perf_counter()
    project = Project.objects.create(name="Bench", slug="bench")
    user, _ = get_user_model().objects.get_or_create(username="bench-viewer")
    Membership.objects.create(project=project, user=user, role=Role.VIEWER)
    _seed_history(project)
    _seed_real_run(project, user)
    print(f"seeded in {time.perf_counter() - started:.0f} s", flush=True)


def _synthetic_summary(spec: Any, rng: random.Random) -> dict[str, Any]:
    """A realistic stored summary: the engine scores synthetic records of one run."""
    from checks.report_model import ExecutionRecord
    from checks.results import CheckResult as EngineResult
    from checks.results import FailureCode
    from checks.scoring import score_run

    records = []
    for index, (scenario, prompt, replica) in enumerate(_cells()):
        results = [
            EngineResult(
                invariant_id=name,
                check_type="contains",
                passed=(ok := rng.random() > 0.08),
                score=1.0 if ok else 0.0,
                failure_code=None if ok else FailureCode.CONTAINS_FAILED,
                severity=SEVERITIES[i % 4],
            )
            for i, name in enumerate(INVARIANTS)
        ]
        records.append(
            ExecutionRecord(
                id=str(index),
                scenario=scenario,
                prompt_index=prompt,
                replica=replica,
                status="success",
                duration_ms=rng.uniform(200, 4000),
                cost_usd=rng.uniform(0.0001, 0.01),
                results=results,
            )
        )
    return score_run(spec, records).to_dict()


def _cells() -> list[tuple[str, int, int]]:
    return [(s, p, r) for s in SCENARIOS for p in range(PROMPTS) for r in range(REPLICAS)]


def _seed_history(project: Any) -> None:
    from django.db import connection, transaction
    from django.utils import timezone
    from psycopg.types.json import Jsonb

    from checks.spec.model import Spec as EngineSpec
    from evaluations import services
    from evaluations.models import Execution, Run

    rng = random.Random(7)
    versions = [
        services.spec_version_create(project=project, source_yaml=bench_spec_source(i))
        for i in range(5)
    ]
    summaries = {
        v.pk: [_synthetic_summary(EngineSpec.from_dict(v.parsed), rng) for _ in range(3)]
        for v in versions
    }
    now = timezone.now()
    runs = []
    for index in range(RUNS):
        version = versions[index % len(versions)]
        summary = summaries[version.pk][index % 3]
        metrics = summary["metrics"]
        runs.append(
            Run(
                project=project,
                spec_id=version.spec_id,
                spec_version=version,
                status="completed",
                trigger="cli",
                labels={"branch": "main" if index % 3 else "feature"},
                branch="main" if index % 3 else "feature",
                summary=summary,
                composite=rng.uniform(0.6, 1.0),
                pass_rate=summary["pass_rate"],
                resilience=summary["resilience"]["score"],
                overall=summary["overall"],
                gate_passed=summary["exit_code"] == 0,
                exit_code=summary["exit_code"],
                cost_usd=metrics["total_cost_usd"],
                p95_duration_ms=metrics["p95_duration_ms"],
                execution_count=EXECUTIONS_PER_RUN,
                executions_done=EXECUTIONS_PER_RUN,
                created=now - timedelta(hours=RUNS - index),
                started=now - timedelta(hours=RUNS - index),
                finished=now - timedelta(hours=RUNS - index) + timedelta(minutes=5),
            )
        )
    with transaction.atomic():
        Run.objects.bulk_create(runs, batch_size=500)
    print(f"  {len(runs)} runs", flush=True)

    execution_columns = [
        "run_id", "project_id", "key", "scenario", "prompt_index", "prompt", "replica",
        "attempt", "pillar", "mutation_type", "status", "composite", "passed", "claimed_by",
        "started", "finished", "duration_ms", "cost_usd", "input_tokens", "output_tokens",
        "tool_call_count", "tool_error_count", "final_output", "error", "plan",
        "forbidden_violations", "tool_sequence", "created",
    ]  # fmt: skip
    table = Execution._meta.db_table
    with connection.cursor() as cursor, transaction.atomic():
        copy_sql = f"COPY {table} ({', '.join(execution_columns)}) FROM STDIN"
        with cursor.connection.cursor().copy(copy_sql) as copy:
            for run in runs:
                for scenario, prompt, replica in _cells():
                    passed = rng.random() > 0.1
                    copy.write_row(
                        (
                            run.pk, project.pk,
                            Execution.build_key(scenario=scenario, prompt_index=prompt, replica=replica),
                            scenario, prompt, f"prompt {prompt}", replica, 1, "contract", "",
                            "success", 1.0 if passed else 0.4, passed, "",
                            run.started, run.finished, rng.uniform(200, 4000),
                            rng.uniform(0.0001, 0.01), 900, 120, 3, 0,
                            "ok " * 20, "", Jsonb({}), Jsonb([]), Jsonb([]), run.created,
                        )
                    )  # fmt: skip
    print(f"  {len(runs) * EXECUTIONS_PER_RUN} executions", flush=True)

    from evaluations.models import CheckResult

    result_columns = [
        "execution_id", "run_id", "invariant_id", "check_type", "score", "passed",
        "failure_code", "message", "details", "severity", "weight", "gate", "dimensions",
        "source", "created",
    ]  # fmt: skip
    with connection.cursor() as cursor, transaction.atomic():
        cursor.execute(
            f"SELECT id, run_id, created FROM {table} WHERE project_id = %s ORDER BY id",
            [project.pk],
        )
        executions = cursor.fetchall()
        copy_sql = f"COPY {CheckResult._meta.db_table} ({', '.join(result_columns)}) FROM STDIN"
        with cursor.connection.cursor().copy(copy_sql) as copy:
            for execution_id, run_id, created in executions:
                for i, name in enumerate(INVARIANTS):
                    passed = rng.random() > 0.08
                    copy.write_row(
                        (
                            execution_id, run_id, name, "contains", 1.0 if passed else 0.0,
                            passed, "" if passed else "CONTAINS_FAILED",
                            "ok" if passed else f"expected ok{i}", Jsonb({}),
                            SEVERITIES[i % 4], 1.0, False, Jsonb([]), "engine", created,
                        )
                    )  # fmt: skip
        cursor.execute("ANALYZE")
    print(f"  {len(executions) * RESULTS_PER_EXECUTION} check results", flush=True)


def _seed_real_run(project: Any, user: Any) -> None:
    """A small run executed for real: its executions have stored artifacts to show."""
    from evaluations import services

    version = services.spec_version_create(project=project, source_yaml=SMALL_SPEC)
    services.run_create(spec_version=version, created_by=user)  # eager tasks run it now


def measure(requests: int) -> int:
    from django.test import Client
    from django.urls import reverse

    from evaluations.models import Execution, Project, Run

    project = Project.objects.get(slug="bench")
    user = project.memberships.get().user
    client = Client()
    client.force_login(user)
    slug = project.slug
    big_run = Run.objects.filter(project=project, execution_count=EXECUTIONS_PER_RUN).first()
    real_run = Run.objects.filter(project=project).order_by("-created", "-id").first()
    assert big_run is not None and real_run is not None
    failing = Execution.objects.filter(run=real_run).order_by("id").first()
    synthetic = Execution.objects.filter(run=big_run).order_by("id").first()
    assert failing is not None and synthetic is not None
    # The next page's link as a browser finds it, in the page itself: a case that cannot
    # be built fails the benchmark instead of vanishing from it.
    first_page = client.get(reverse("run_list", args=[slug])).content.decode()
    found = re.search(r'href="([^"]*[?&]after=[^"]*)"', first_page)
    if found is None:
        raise SystemExit("the run list has no link to a next page: 'run list (page 2)' cannot run")
    next_url = html.unescape(found.group(1))
    if next_url.startswith("?"):
        next_url = reverse("run_list", args=[slug]) + next_url
    pages = {
        "overview": reverse("overview", args=[slug]),
        "run list": reverse("run_list", args=[slug]),
        "run list (filtered)": reverse("run_list", args=[slug]) + "?status=completed&branch=main",
        "run detail": reverse("run_detail", args=[slug, big_run.pk]),
        "run cell": reverse("run_cell", args=[slug, big_run.pk])
        + f"?scenario={SCENARIOS[1]}&invariant={INVARIANTS[0]}",
        "execution detail (synthetic)": reverse("execution_detail", args=[slug, synthetic.pk]),
        "execution detail (real)": reverse("execution_detail", args=[slug, failing.pk]),
        "spec trends": reverse("spec_trends", args=[slug, big_run.spec.slug]),
    }
    pages["run list (page 2)"] = next_url
    print(f"\n{'page':32} {'median ms':>10} {'p95 ms':>8}  (n={requests})")
    worst = 0.0
    for name, url in pages.items():
        client.get(url)  # warm caches (templates, connection)
        timings = []
        for _ in range(requests):
            started = time.perf_counter()
            response = client.get(url)
            timings.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                print(f"{name}: HTTP {response.status_code} for {url}")
                return 1
        timings.sort()
        p95 = timings[max(0, int(round(0.95 * len(timings))) - 1)]
        worst = max(worst, p95)
        print(f"{name:32} {statistics.median(timings):10.1f} {p95:8.1f}")
    print(f"\nworst p95: {worst:.1f} ms (target 150 ms)")
    return 0 if worst < 150 else 1


def main() -> int:
    global RUNS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default="postgresql://postgres@127.0.0.1:5432/keystone_bench"
    )
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument("--seed-only", action="store_true", help="seed, do not measure")
    parser.add_argument(
        "--runs",
        type=int,
        default=RUNS,
        help="runs of 100 executions to seed (more than a page of the run list: > 50)",
    )
    args = parser.parse_args()
    RUNS = args.runs
    setup_django(args.database_url, fresh=args.reseed)
    seed()
    return 0 if args.seed_only else measure(args.requests)


if __name__ == "__main__":
    sys.exit(main())
