"""Server time of every dashboard page with a large history in PostgreSQL.

Seeds (once; kept between invocations, so measuring again reuses it) a project with 2,000
runs of 100 executions each (200,000 executions) and 10 check results per execution
(2,000,000 results), loaded with COPY; baselines promoted along the history; 100,000
review items (7 in 10 open, 1 waiting for adjudication, 2 complete, with their grades);
and one small run executed for real so the execution page has real artifacts. Runs
VACUUM ANALYZE (what autovacuum does to a database in use). Then, as a project admin (who
sees every page and control), requests each page through Django's test client (URL
routing, middleware, views, queries and templates: everything the server does for a
request but the socket) and prints the median and 95th percentile per page, the
median CPU time of this process per request (Python's share: the database's work is not in
it; on a machine shared with other work it moves far less than wall time does), and the
page's first request, which warms the caches and is in no figure (what the first visitor
after a restart waits for, a library the page alone imports included). A page
whose case cannot be built (no next page to follow, no review item to open) stops the
benchmark with a message instead of vanishing from it.

    .venv/bin/python bench/bench_pages.py [--requests 40] [--reseed] [--only review]
        [--database-url postgresql://postgres@127.0.0.1:5432/keystone_bench]
    .venv/bin/python bench/bench_pages.py --explain 3    # the slowest statements, with plans

Target: every page at most 50 ms at the 95th percentile. Exit codes: 0 met, 1 missed (the
figures are printed), 2 a page answered with an error.
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
REVIEW_ITEMS = 100_000
ADMIN = "bench-admin"
BASELINE_PROMOTIONS = 3
TARGET_MS = 50

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
    # The small real run uses the local backend (no bwrap needed on the bench machine).
    os.environ["KEYSTONE_POLICY_MIN_BACKEND"] = "local"
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
        assert existing is not None
        if not existing.review_items.exists():  # seeded before review items were
            _seed_extras(existing)
        return
    if existing is not None:
        sys.exit("an earlier seed was interrupted: run again with --reseed")
    started = time.perf_counter()
    project = Project.objects.create(name="Bench", slug="bench")
    user, _ = get_user_model().objects.get_or_create(username="bench-viewer")
    Membership.objects.create(project=project, user=user, role=Role.VIEWER)
    _seed_history(project)
    _seed_extras(project)
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
    return score_run(spec, records).to_dict(per_execution=False)


def _cells() -> list[tuple[str, int, int]]:
    return [(s, p, r) for s in SCENARIOS for p in range(PROMPTS) for r in range(REPLICAS)]


def _seed_history(project: Any) -> None:
    from django.db import connection, transaction
    from django.utils import timezone
    from psycopg.types.json import Jsonb

    from checks.spec.model import Spec as EngineSpec
    from evaluations import services
    from evaluations.models import Execution, Run, summary_invariant_counts
    from evaluations.selectors.regressions import compared_verdicts, summary_failing_keys

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
                invariant_counts=summary_invariant_counts(summary),
                failing_keys=summary_failing_keys(summary),
                verdicts=compared_verdicts(summary),
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
        "forbidden_violations", "tool_sequence", "unpriced_models", "created",
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
                            "ok " * 20, "", Jsonb({}), Jsonb([]), Jsonb([]), Jsonb([]),
                            run.created,
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


def _seed_extras(project: Any) -> None:
    """The bench admin (who requests every page, settings included), baselines promoted
    over the history (BASELINE_PROMOTIONS per spec, on main), then REVIEW_ITEMS review
    items over one invariant's results spread over every run: 7 in 10 open (some claimed by
    someone else), 1 waiting for adjudication (two verdicts), 2 complete (one verdict by the
    admin), as a queue that has been worked on for a while. Review items come last: they
    mark this step done."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from evaluations import services
    from evaluations.models import (
        CheckResult,
        Membership,
        ReviewAgreementDay,
        ReviewItem,
        ReviewVerdict,
        Role,
        Run,
    )

    users = get_user_model().objects
    reviewer, _ = users.get_or_create(username=ADMIN)
    second, _ = users.get_or_create(username="bench-second-reviewer")
    Membership.objects.get_or_create(project=project, user=reviewer, defaults={"role": Role.ADMIN})
    Membership.objects.get_or_create(project=project, user=second, defaults={"role": Role.REVIEWER})
    for spec in project.specs.all():
        main_runs = Run.objects.filter(spec=spec, branch="main").order_by("created", "id")
        step = max(1, main_runs.count() // (BASELINE_PROMOTIONS + 1))
        for index in range(1, BASELINE_PROMOTIONS + 1):
            run = main_runs[index * step - 1]
            services.baseline_promote(run_id=run.pk, user=reviewer, reason="bench")
    print("  baselines", flush=True)
    items, verdicts = ReviewItem._meta.db_table, ReviewVerdict._meta.db_table
    # One result in every other execution: REVIEW_ITEMS of the 200,000 executions' results.
    insert_items = f"""
        INSERT INTO {items} (project_id, spec_id, run_id, execution_id, check_result_id,
            invariant_id, criteria, judge_model, prompt_version, judge_score, judge_passed,
            reason, status, reviews_required, blind, claimed_by_id, claim_expires,
            final_passed, final_score, created, completed)
        SELECT run.project_id, run.spec_id, result.run_id, result.execution_id, result.id,
            result.invariant_id, 'Is the answer polite?',
            CASE WHEN result.id %% 3 = 0 THEN 'judge-small' ELSE 'judge-large' END, 'v1',
            result.score, result.passed, 'sample',
            CASE WHEN n %% 10 = 0 THEN 'adjudication' WHEN n %% 10 < 3 THEN 'complete'
                 ELSE 'open' END,
            CASE WHEN n %% 10 = 0 THEN 2 ELSE 1 END, false,
            CASE WHEN n %% 10 = 9 THEN %s END,
            CASE WHEN n %% 10 = 9 THEN now() + interval '1 hour' END,
            CASE WHEN n %% 10 IN (1, 2) THEN result.passed END,
            CASE WHEN n %% 10 IN (1, 2) THEN result.score END,
            result.created,
            CASE WHEN n %% 10 IN (1, 2) THEN result.created + interval '1 day' END
        FROM (
            SELECT r.*, row_number() OVER (ORDER BY r.id) AS n
            FROM {CheckResult._meta.db_table} AS r
            WHERE r.invariant_id = %s AND r.execution_id %% 2 = 0
            ORDER BY r.id LIMIT %s
        ) AS result
        JOIN {Run._meta.db_table} AS run ON run.id = result.run_id
    """  # noqa: S608 (table names from the models)
    insert_verdicts = f"""
        INSERT INTO {verdicts} (item_id, reviewer_id, slot, slots_total, passed, score, note,
            created)
        SELECT item.id, %s, 1, item.reviews_required, item.judge_passed, item.judge_score,
            '', item.created + interval '1 hour'
        FROM {items} AS item WHERE item.project_id = %s AND item.status <> 'open'
        UNION ALL
        SELECT item.id, %s, 2, 2, NOT item.judge_passed, 1 - item.judge_score, '',
            item.created + interval '2 hours'
        FROM {items} AS item WHERE item.project_id = %s AND item.status = 'adjudication'
    """  # noqa: S608
    with connection.cursor() as cursor, transaction.atomic():
        cursor.execute(insert_items, [second.pk, INVARIANTS[1], REVIEW_ITEMS])
        cursor.execute(insert_verdicts, [reviewer.pk, project.pk, second.pk, project.pk])
        cursor.execute(f"ANALYZE {items}")
        cursor.execute(f"ANALYZE {verdicts}")
    # The items were inserted without the review services, which keep agreement's tallies.
    ReviewAgreementDay.recount(project)
    print(f"  {project.review_items.count()} review items", flush=True)


def vacuum() -> None:
    """VACUUM ANALYZE: the state autovacuum keeps a database in (the seed's bulk loads
    leave no visibility map, so index-only scans read the table), and so that autovacuum
    starting in the middle of a measurement does not change it. Quick once done."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def _seed_real_run(project: Any, user: Any) -> None:
    """A small run executed for real: its executions have stored artifacts to show."""
    from evaluations import services

    version = services.spec_version_create(project=project, source_yaml=SMALL_SPEC)
    services.run_create(spec_version=version, created_by=user)  # eager tasks run it now


def _page_two(client: Any, list_url: str) -> str:
    """The next page's link as a browser finds it, in the page itself: a case that cannot
    be built fails the benchmark instead of vanishing from it."""
    first_page = client.get(list_url).content.decode()
    found = re.search(r'href="([^"]*[?;]after=[^"]*)"', first_page)
    if found is None:
        raise SystemExit(f"{list_url} has no link to a next page: its page 2 cannot run")
    next_url = html.unescape(found.group(1))
    return list_url + next_url if next_url.startswith("?") else next_url


def _required(value: Any, what: str) -> Any:
    if value is None:
        raise SystemExit(f"the seed has no {what}: reseed (--reseed)")
    return value


def bench_pages(client: Any) -> dict[str, str]:
    """Every page of the dashboard, by name, with the seeded rows it shows."""
    from django.urls import reverse

    from evaluations.models import Execution, Project, ReviewItem, Run

    project = Project.objects.get(slug="bench")
    slug = project.slug
    runs = Run.objects.filter(project=project, execution_count=EXECUTIONS_PER_RUN)
    # The newest run of a spec, on main: compared with that spec's active baseline.
    big_run = _required(runs.filter(branch="main").order_by("-created", "-id").first(), "run")
    older = _required(runs.filter(spec=big_run.spec).exclude(pk=big_run.pk).first(), "run")
    real_run = _required(
        Run.objects.filter(project=project).order_by("-created", "-id").first(), "run"
    )
    failing = _required(Execution.objects.filter(run=real_run).order_by("id").first(), "execution")
    synthetic = _required(Execution.objects.filter(run=big_run).order_by("id").first(), "execution")
    items = ReviewItem.objects.filter(project=project)
    open_item = _required(items.filter(status="open").order_by("created", "id").first(), "item")
    done_item = _required(items.filter(status="complete").order_by("-id").first(), "item")
    spec = big_run.spec.slug
    run_list = reverse("run_list", args=[slug])
    queue = reverse("review_queue", args=[slug])
    compare = reverse("run_compare", args=[slug, big_run.pk])
    return {
        "project list": reverse("project_list"),
        "overview": reverse("overview", args=[slug]),
        "spec list": reverse("spec_list", args=[slug]),
        "spec detail": reverse("spec_detail", args=[slug, spec]),
        "spec edit": reverse("spec_edit", args=[slug, spec]),
        "spec diff": reverse("spec_diff", args=[slug, spec]),
        "spec trends": reverse("spec_trends", args=[slug, spec]),
        "spec baselines": reverse("spec_baselines", args=[slug, spec]),
        "regressions": reverse("regressions", args=[slug]),
        "run list": run_list,
        "run list (filtered)": run_list + "?status=completed&branch=main",
        "run list (page 2)": _page_two(client, run_list),
        "run detail": reverse("run_detail", args=[slug, big_run.pk]),
        "run cell": reverse("run_cell", args=[slug, big_run.pk])
        + f"?scenario={SCENARIOS[1]}&invariant={INVARIANTS[0]}",
        "compare (baseline)": compare,
        "compare (two runs)": compare + f"?against={older.pk}",
        "compare: an opened pair": reverse(
            "run_compare_pair", args=[slug, big_run.pk, synthetic.pk]
        )
        + f"?against={older.pk}",
        "execution detail (synthetic)": reverse("execution_detail", args=[slug, synthetic.pk]),
        "execution detail (real)": reverse("execution_detail", args=[slug, failing.pk]),
        "review queue": queue,
        "review queue (page 2)": _page_two(client, queue),
        "review queue (complete)": queue + "?status=complete",
        "review queue (filtered)": queue + f"?spec={spec}&criteria={INVARIANTS[1]}",
        "review item (open)": reverse("review_item", args=[slug, open_item.pk]),
        "review item (complete)": reverse("review_item", args=[slug, done_item.pk]),
        "review agreement": reverse("review_agreement", args=[slug]),
        "members": reverse("members", args=[slug]),
        "settings": reverse("project_settings", args=[slug]),
        "settings: digest": reverse("project_digest_preview", args=[slug]),
    }


def signed_in_pages(only: str) -> tuple[Any, dict[str, str]]:
    """A test client signed in as the bench admin, in a process loaded as the web server's
    is when it serves (keystone_web/wsgi.py), and the pages whose name has `only`."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from keystone_web.serving import app_loaded

    app_loaded()
    client = Client()
    # An admin sees every page and every control on it (the most work a page does).
    client.force_login(get_user_model().objects.get(username=ADMIN))
    return client, {name: url for name, url in bench_pages(client).items() if only in name}


def measure(requests: int, only: str = "") -> int:
    client, pages = signed_in_pages(only)
    print(
        f"\n{'page':32} {'median ms':>10} {'p95 ms':>8} {'cpu ms':>8} {'first ms':>9}"
        f"  (n={requests})"
    )
    worst = 0.0
    for name, url in pages.items():
        # Not in the figures: it warms the caches (templates, connection). Printed, for what
        # a page alone loads on its first request after a restart (a library imported
        # lazily: scipy's 0.65 s on the regressions page, before the thirty-fifth session).
        started = time.perf_counter()
        client.get(url)
        first = (time.perf_counter() - started) * 1000
        timings, cpu = [], []
        for _ in range(requests):
            started, cpu_started = time.perf_counter(), time.process_time()
            response = client.get(url)
            timings.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu_started) * 1000)
            if response.status_code != 200:  # a page that fails is no figure
                print(f"{name}: HTTP {response.status_code} for {url}")
                return 2
        timings.sort()
        p95 = timings[max(0, int(round(0.95 * len(timings))) - 1)]
        worst = max(worst, p95)
        print(
            f"{name:32} {statistics.median(timings):10.1f} {p95:8.1f} "
            f"{statistics.median(cpu):8.1f} {first:9.1f}",
            flush=True,
        )
    print(f"\nworst p95: {worst:.1f} ms (target {TARGET_MS} ms)")
    return 0 if worst <= TARGET_MS else 1


def explain_slowest(count: int, only: str = "", requests: int = 5) -> int:
    """The `count` slowest statements over every page (each page requested `requests` times
    after a warm-up; a statement's time is its best over them, taken where Django runs it),
    each with its page, its time in the page, and the best of 5 `EXPLAIN (ANALYZE, COSTS
    OFF)` runs of the same statement with the same parameters: what docs/performance.md
    shows of the pages' queries."""
    from django.db import connection

    client, pages = signed_in_pages(only)
    best: dict[tuple[str, str], tuple[float, Any]] = {}  # (page, sql) -> (ms, params)

    def timed(page: str) -> Any:
        def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            started = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                elapsed = (time.perf_counter() - started) * 1000
                key = (page, sql)
                if not many and (key not in best or elapsed < best[key][0]):
                    best[key] = (elapsed, params)

        return wrapper

    for name, url in pages.items():
        client.get(url)
        with connection.execute_wrapper(timed(name)):
            for _ in range(requests):
                if client.get(url).status_code != 200:
                    print(f"{name}: HTTP error for {url}")
                    return 2
    slowest = sorted(best.items(), key=lambda item: -item[1][0])
    shown: set[str] = set()
    for (page, sql), (ms, params) in slowest:
        if sql in shown:
            continue  # the same statement on another page: shown once, at its slowest
        shown.add(sql)
        with connection.cursor() as cursor:
            plans = []
            for _ in range(5):
                cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)
                plans.append([row[0] for row in cursor.fetchall()])
        plan = min(plans, key=_execution_ms)
        print(
            f"\n{len(shown)}. {page}: {ms:.2f} ms in the page, "
            f"{_execution_ms(plan):.2f} ms in the server\n{sql}\n"
        )
        print("\n".join(plan))
        if len(shown) == count:
            break
    return 0


def _execution_ms(plan: list[str]) -> float:
    found = re.search(r"Execution Time: ([\d.]+) ms", plan[-1])
    if found is None:
        raise ValueError(f"no execution time in the plan's last line: {plan[-1]!r}")
    return float(found.group(1))


def main() -> int:
    global RUNS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default="postgresql://postgres@127.0.0.1:5432/keystone_bench"
    )
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--reseed", action="store_true")
    parser.add_argument("--only", default="", help="measure the pages whose name has this")
    parser.add_argument("--seed-only", action="store_true", help="seed, do not measure")
    parser.add_argument(
        "--explain",
        type=int,
        default=0,
        metavar="N",
        help="instead of timing the pages: the N slowest statements over them, with plans",
    )
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
    vacuum()
    if args.seed_only:
        return 0
    if args.explain:
        return explain_slowest(args.explain, args.only)
    return measure(args.requests, args.only)


if __name__ == "__main__":
    sys.exit(main())
