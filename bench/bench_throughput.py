"""Throughput of a run on real Celery workers: executions per second, end to end.

A 1,000-execution run (10 prompts x 100 replicas) of a trivial command agent (`echo ok`)
with one deterministic invariant, on two `celery worker` processes (prefork, --concurrency
each) over Redis and PostgreSQL. The clock starts when run_plan is sent to the broker and
stops when the run is finalised; every execution is claimed, run in the local sandbox,
checked, stored (results and artifacts) and counted, exactly as in production.

    /work/venv/bin/python bench/bench_throughput.py [--executions 1000] [--concurrency 2]
        [--database-url postgresql://postgres@127.0.0.1:5432/keystone_bench_throughput]
        [--broker-url redis://127.0.0.1:6379/3]

The database is dropped and created afresh (its name must contain "bench"); the Redis
database is flushed. It also reports each worker's peak resident memory (its whole process
tree's proportional set size, every 2 s and once the run has ended; its largest process's
RSS and the sum of the tree's RSS, every 0.2 s) and checks that every execution's result
is stored exactly once. Targets (issue 18): at least 150 executions/s, each worker at most
150 MB (its tree's PSS and its largest process's RSS). Exit codes: 0 targets met, 1 a target
missed (the figures are still printed), 2 the run did not complete with each result stored
once, or its agents ran as root rather than as their executions' own uids (bench/home.py).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from home import RAN_AS_ROOT, traversable_tmpdir  # noqa: E402
from rss import pss, trees  # noqa: E402

TARGET_PER_SECOND = 150.0
TARGET_WORKER_MB = 150.0
# Memory is sampled every 0.2 s: reading every process's /proc entry every 50 ms took the
# sampler ~15% of a core, from the workers it measures. The workers' memory is flat after start.
SAMPLE_SECONDS = 0.2
# Their PSS every 2 s, and once more when the run has ended: the kernel walks a process's
# page tables under its memory lock to count it, which every 0.2 s cost the workers 5-15% of
# their throughput (measured with and without it).
PSS_SAMPLE_SECONDS = 2.0
SPEC = """\
version: 1
id: bench-throughput
task:
  prompts: [p0, p1, p2, p3, p4, p5, p6, p7, p8, p9]
agent: {{type: command, command: "echo ok", timeout: 30}}
sandbox: {{backend: local}}
invariants:
  says_ok: {{description: "says ok", check: {{type: contains, value: ok}}}}
replicas: {replicas}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=1000, help="a multiple of 10")
    parser.add_argument("--concurrency", type=int, default=2, help="per worker process")
    parser.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/keystone_bench_throughput",
    )
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if "bench" not in urlsplit(args.database_url).path:
        parser.error("the database name must contain 'bench': it is dropped and re-created")

    _fresh_database(args.database_url)
    import redis

    broker = redis.Redis.from_url(args.broker_url)
    broker.flushdb()
    home = traversable_tmpdir("keystone-bench-")  # see bench/home.py
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "DATABASE_URL": args.database_url,
        "CELERY_BROKER_URL": args.broker_url,
        "KEYSTONE_HOME": str(home),
        "LOG_LEVEL": "WARNING",
        # The benchmark's agent runs in the local sandbox: the platform is what is measured.
        "KEYSTONE_POLICY_MIN_BACKEND": "local",
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT, env=env, check=True
    )
    os.environ.update(
        {
            k: env[k]
            for k in (
                "DATABASE_URL",
                "CELERY_BROKER_URL",
                "KEYSTONE_HOME",
                "KEYSTONE_POLICY_MIN_BACKEND",
            )
        }
    )
    os.environ["DJANGO_SETTINGS_MODULE"] = "keystone_web.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from keystone_web.serving import app_loaded

    # As a web server's process is when it starts a run (keystone_web/wsgi.py): Celery's
    # client is loaded, so the clock does not count its import in this process.
    app_loaded()
    from evaluations import services
    from evaluations.models import CheckResult, Execution, Run, RunStatus, Trigger

    workers = [_start_worker(name, args.concurrency, env, home) for name in ("one", "two")]
    # pid -> [tree's RSS, largest process's RSS, tree's PSS]
    peaks = {worker.pid: [0, 0, 0] for worker, _ in workers}
    sampling = threading.Event()

    def sample(proportional: bool) -> None:
        for pid, members in trees(list(peaks)).items():
            peak = peaks[pid]
            peak[0] = max(peak[0], sum(size for _, size in members))
            peak[1] = max([peak[1], *(size for _, size in members)])
            if proportional:
                peak[2] = max(peak[2], sum(pss(member) for member, _ in members))

    def sample_until_stopped() -> None:
        last_pss = -math.inf
        while not sampling.wait(SAMPLE_SECONDS):
            proportional = time.monotonic() - last_pss >= PSS_SAMPLE_SECONDS
            sample(proportional)
            if proportional:
                last_pss = time.monotonic()

    sampler = threading.Thread(target=sample_until_stopped, daemon=True)
    try:
        _wait_ready(workers)
        sampler.start()
        version = services.spec_version_create(
            project=services.project_default(),
            source_yaml=SPEC.format(replicas=args.executions // 10),
        )
        started = time.perf_counter()
        run = services.run_create(spec_version=version, trigger=Trigger.API, enqueue=True)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            status = Run.objects.values_list("status", flat=True).get(pk=run.pk)
            if status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
                break
            time.sleep(0.1)
        elapsed = time.perf_counter() - started
        sample(proportional=True)  # the workers as the run left them
        run.refresh_from_db()
        done = Execution.objects.filter(run=run, passed=True).count()
        by_worker = {
            name: Execution.objects.filter(run=run, claimed_by__startswith=f"{name}@").count()
            for name in ("one", "two")
        }
        results = CheckResult.objects.filter(run=run)
        stored, distinct = results.count(), results.values("execution_id").distinct().count()
    finally:
        sampling.set()
        for worker, _ in workers:
            os.killpg(worker.pid, signal.SIGTERM)
        for worker, _ in workers:
            worker.wait(timeout=60)
        broker.flushdb()
    rate = run.execution_count / elapsed if elapsed else 0.0
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"run {run.pk}: {run.status}, {run.execution_count} executions "
        f"({done} passed; worker one {by_worker['one']}, worker two {by_worker['two']}) "
        f"in {elapsed:.1f} s"
    )
    print(
        f"throughput: {rate:.1f} executions/s on 2 workers x concurrency {args.concurrency} "
        f"(target >= {TARGET_PER_SECOND:.0f}) {'OK' if rate >= TARGET_PER_SECOND else 'BELOW TARGET'}"
    )
    memory_ok = True
    for (worker, _), name in zip(workers, ("one", "two"), strict=True):
        whole, largest, proportional = (size / 1e6 for size in peaks[worker.pid])
        memory_ok = memory_ok and max(largest, proportional) <= TARGET_WORKER_MB
        print(
            f"worker {name}: peak PSS {proportional:.1f} MB (process tree, shared pages "
            f"counted once), largest process's RSS {largest:.1f} MB (target <= "
            f"{TARGET_WORKER_MB:.0f} MB per worker); the tree's RSS summed {whole:.1f} MB"
        )
    once = stored == distinct == run.execution_count
    print(
        f"results stored: {stored} for {distinct} executions of {run.execution_count} "
        f"({'each once' if once else 'NOT EACH ONCE'})"
    )
    print(f"machine: {os.cpu_count()} CPU(s); worker logs in {home}")
    completed = run.status == RunStatus.COMPLETED and done == run.execution_count
    as_root = [warning for warning in run.warnings if RAN_AS_ROOT in warning]
    for warning in as_root:
        print(f"not the default isolation: {warning}")
    if not (completed and once) or as_root:
        return 2  # wrong results, or a weaker isolation: no figure above counts
    return 0 if rate >= TARGET_PER_SECOND and memory_ok else 1


def _fresh_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def _start_worker(
    name: str, concurrency: int, env: dict[str, str], home: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    from evaluations.cli_commands import celery_worker_command  # ROOT is on sys.path by now

    log = home / f"worker-{name}.log"
    command = celery_worker_command(
        concurrency=concurrency, loglevel="WARNING", hostname=f"{name}@%h"
    )
    # No beat: nothing dies during the measurement. No mingle, gossip or heartbeat: the
    # broker carries the run's tasks only.
    command += ["--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    with log.open("wb") as handle:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log


def _wait_ready(workers: list[tuple[subprocess.Popen[bytes], Path]], timeout: float = 60) -> None:
    """Ready when each worker answers a ping over the broker."""
    from keystone_web.celery import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process, log in workers:
            if process.poll() is not None:
                raise SystemExit(f"a worker exited early:\n{log.read_text(errors='replace')}")
        replies = app.control.ping(timeout=1.0) or []
        if len(replies) >= len(workers):
            return
    raise SystemExit("workers not ready in time")


if __name__ == "__main__":
    sys.exit(main())
