"""Runs through real Celery worker processes on Redis and the test's PostgreSQL database.

Each test starts `celery worker --pool prefork --concurrency 2 -B` processes (each in its
own session, so a whole worker can be killed with one signal) whose DATABASE_URL points at
the database pytest-django created for this session. The test commits its rows
(transaction=True) so the workers see them, and sends the tasks to Redis through the same
Celery app the services use. Worker logs are written to files and shown on failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from django.db import connection
from kombu import pools as kombu_pools

from evaluations import services
from evaluations.cli_commands import celery_worker_command
from evaluations.models import CheckResult, Execution, ExecutionStatus, Run, RunStatus, Trigger
from keystone_web.celery import app as celery_app

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 4
LOCK_KEY = "keystone-tests:in-use"
TERMINAL = {
    ExecutionStatus.SUCCESS,
    ExecutionStatus.FAILED,
    ExecutionStatus.TIMED_OUT,
    ExecutionStatus.INVALID,
    ExecutionStatus.PROVIDER_ERROR,
    ExecutionStatus.ERROR,
}

# 1 scenario x 5 prompts x 10 replicas = 50 executions of a fast shell agent; three
# invariants pass and one (not a gate) fails on prompts that do not mention "bonus".
FAST_SPEC = """\
version: 1
id: celery-fast
description: "50 quick executions"
task:
  prompts: ["one", "two", "three", "four", "bonus five"]
agent:
  type: command
  command: "sh -c 'echo \\"answer to: $KEYSTONE_PROMPT\\"'"
  timeout: 30
sandbox: {backend: local}
invariants:
  answers:
    description: "Answers"
    gate: true
    check: {type: contains, value: "answer to"}
  short:
    description: "Short"
    check: {type: max_length, max: 200}
  no_secret:
    description: "No secret"
    check: {type: not_contains, value: secret}
  bonus:
    description: "Mentions the bonus"
    weight: 0.1
    check: {type: contains, value: bonus}
replicas: 10
scoring:
  pass_threshold: 0.5
"""
FAST_INVARIANTS = 4

# 12 executions of two seconds each: long enough to kill a worker in the middle.
SLOW_SPEC = """\
version: 1
id: celery-slow
description: "12 executions of 2 s"
task:
  prompts: ["first", "second"]
agent:
  type: command
  command: "sh -c 'sleep 2; echo finished'"
  timeout: 30
sandbox: {backend: local}
invariants:
  finished:
    description: "Finishes"
    gate: true
    check: {type: contains, value: finished}
  not_empty:
    description: "Says something"
    check: {type: output_not_empty}
replicas: 6
"""
SLOW_INVARIANTS = 2


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else "(no log)"


def _test_database_url() -> str:
    """DATABASE_URL with the database pytest-django created for this session."""
    assert connection.vendor == "postgresql", (
        "the Celery worker tests need DATABASE_URL=postgresql://... "
        "(worker processes must share the test database)"
    )
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + settings.DATABASES["default"]["NAME"]))


def _claim_redis_database(base_url: str) -> tuple[redis.Redis, str]:
    """A Redis database no other test session is using (two sessions sharing one would
    consume each other's tasks), held with an expiring lock key."""
    base = urlsplit(base_url)
    first = int(base.path.strip("/") or 0)
    token = f"{os.getpid()}-{time.time()}"
    for number in range(first, 16):
        url = urlunsplit(base._replace(path=f"/{number}"))
        client = redis.Redis.from_url(url)
        if client.set(LOCK_KEY, token, nx=True, ex=900):
            return client, url
        client.close()
    raise AssertionError(f"every Redis database from {base_url} on is in use by other tests")


def _reset_connections() -> None:
    """Forget the broker connections and producers made for the previous configuration
    (the eager default has an in-memory transport), so the next send uses the new one."""
    kombu_pools.reset()  # kombu's process-wide producer pools, keyed by broker URL
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


@pytest.fixture
def broker(test_redis_url: str, settings: Any) -> Iterator[str]:
    """An empty Redis database, and this process's Celery app sending to it."""
    settings.CELERY_TASK_ALWAYS_EAGER = False  # evaluations.queue sends, not runs here
    client, url = _claim_redis_database(test_redis_url)
    for key in client.keys("*"):
        if key != LOCK_KEY.encode():
            client.delete(key)
    saved = {
        key: celery_app.conf[key]
        for key in ("broker_url", "task_always_eager", "broker_transport_options")
    }
    celery_app.conf.update(broker_url=url, task_always_eager=False)
    _reset_connections()
    try:
        yield url
    finally:
        celery_app.conf.update(saved)
        _reset_connections()
        client.flushdb()  # the lock key too: the database is free again
        client.close()


@pytest.fixture
def start_worker(broker: str, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start real worker processes; every one is killed (whole process group) afterwards."""
    database_url = _test_database_url()
    workers: list[Worker] = []
    sessions_before = _other_sessions()

    def start(
        name: str, lease_seconds: int = LEASE_SECONDS, slots: int = 64, **settings: str
    ) -> Worker:
        """`settings`: more environment for the worker (its settings' variables)."""
        home = tmp_path / f"home-{name}"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(
            DATABASE_URL=database_url,
            CELERY_BROKER_URL=broker,
            KEYSTONE_HOME=str(home),
            KEYSTONE_EXECUTION_LEASE_SECONDS=str(lease_seconds),
            KEYSTONE_EXECUTION_SLOTS=str(slots),
            DEBUG="true",
            PYTHONUNBUFFERED="1",
            **settings,
        )
        log = tmp_path / f"worker-{name}.log"
        command = celery_worker_command(
            concurrency=2,
            loglevel="INFO",
            beat_schedule=home / "celerybeat-schedule",
            hostname=f"{name}@%h",
        )
        # Short-lived workers started together: no start-up sync with the others (mingle)
        # and no gossip between them, so each is ready at once.
        command += ["--pool", "prefork", "--without-gossip", "--without-mingle"]
        with log.open("wb") as handle:
            process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(name, process, log)
        workers.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in workers:
            _kill(worker)
        _wait_sessions_closed(sessions_before)


def _other_sessions() -> set[int]:
    """The backend pids of the test database's sessions other than this connection's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return {pid for (pid,) in cursor.fetchall()}


def _wait_sessions_closed(sessions_before: set[int], timeout: float = 15) -> None:
    """Killed workers' database sessions end a moment after the processes; wait, so the
    flush after the test and the test database's removal are not refused. Sessions that
    were open before the workers started are not theirs (earlier tests' threads may keep
    one until the end), so they are not waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _other_sessions() <= sessions_before:
            return
        time.sleep(0.1)


def _kill(worker: Worker) -> None:
    if worker.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.process.pid, signal.SIGKILL)
    worker.process.wait(timeout=30)


def _wait_ready(workers: list[Worker], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker in workers:
            if worker.process.poll() is not None:
                raise AssertionError(
                    f"worker {worker.name} exited with {worker.process.returncode}:\n"
                    + worker.log_text()
                )
        if all(" ready." in w.log_text() for w in workers):
            return
        time.sleep(0.2)
    raise AssertionError("workers not ready in time:\n" + _logs(workers))


def _logs(workers: list[Worker]) -> str:
    return "\n".join(f"--- worker {w.name} ---\n{w.log_text()[-6000:]}" for w in workers)


def _wait_run(run_id: int, workers: list[Worker], timeout: float) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED):
            return run
        time.sleep(0.25)
    run = Run.objects.get(pk=run_id)
    statuses = Counter(Execution.objects.filter(run_id=run_id).values_list("status", flat=True))
    raise AssertionError(
        f"run {run_id} still {run.status} after {timeout} s "
        f"({run.executions_done}/{run.execution_count} done, executions {dict(statuses)})\n"
        + _logs(workers)
    )


def _queue_run(source: str) -> Run:
    version = services.spec_version_create(project=services.project_default(), source_yaml=source)
    # Autocommit (transaction=True): the on_commit hook sends run_plan to Redis at once.
    return services.run_create(spec_version=version, trigger=Trigger.API, enqueue=True)


def _results_per_execution(run: Run) -> Counter[int]:
    return Counter(CheckResult.objects.filter(run=run).values_list("execution_id", flat=True))


def test_two_workers_complete_a_50_execution_run_with_results_once(
    start_worker: Callable[..., Worker],
) -> None:
    # Four slots in all: the run's 50 executions go out in 5 messages (12, 12, 12, 12, 2).
    workers = [start_worker("alpha", slots=4), start_worker("beta", slots=4)]
    _wait_ready(workers)

    started = time.monotonic()
    run = _queue_run(FAST_SPEC)
    run = _wait_run(run.pk, workers, timeout=120)
    elapsed = time.monotonic() - started

    logs = _logs(workers)
    assert run.status == RunStatus.COMPLETED, logs
    assert (run.execution_count, run.executions_done) == (50, 50), logs
    executions = list(Execution.objects.filter(run=run))
    assert len(executions) == 50
    assert Counter(e.status for e in executions) == {ExecutionStatus.SUCCESS: 50}, logs
    assert all(e.status in TERMINAL and e.finished is not None for e in executions)
    # Both workers took part (prefork x 2 each, prefetch 1).
    claimed_by = {e.claimed_by.split("@", 1)[0] for e in executions}
    assert claimed_by == {"alpha", "beta"}, claimed_by
    # A few executions per message: the worker name ends with the message's task id.
    tasks = Counter(e.claimed_by for e in executions)
    assert len(tasks) == 5 and sorted(tasks.values()) == [2, 12, 12, 12, 12], tasks

    assert CheckResult.objects.filter(run=run).count() == 50 * FAST_INVARIANTS
    per_execution = _results_per_execution(run)
    assert set(per_execution.values()) == {FAST_INVARIANTS}
    assert len(per_execution) == 50
    failing = Counter(
        CheckResult.objects.filter(run=run, passed=False).values_list("invariant_id", flat=True)
    )
    assert failing == {"bonus": 40}  # 4 of the 5 prompts x 10 replicas
    assert run.exit_code == 0, run.summary
    assert run.gate_passed is True
    print(f"50 executions on two workers in {elapsed:.1f} s")


def test_run_completes_after_a_worker_is_killed_with_sigkill(
    start_worker: Callable[..., Worker],
) -> None:
    # Four slots: the 12 executions go out 3 per message, so the victim dies holding
    # messages with executions it has not started yet; they are sent again too.
    victim, survivor = start_worker("victim", slots=4), start_worker("survivor", slots=4)
    workers = [victim, survivor]
    _wait_ready(workers)

    run = _queue_run(SLOW_SPEC)
    # Kill the victim while it holds executions in the middle of their agent's sleep.
    deadline = time.monotonic() + 60
    held: list[int] = []
    while time.monotonic() < deadline and not held:
        held = list(
            Execution.objects.filter(
                run=run, status=ExecutionStatus.RUNNING, claimed_by__startswith="victim@"
            ).values_list("id", flat=True)
        )
        time.sleep(0.1)
    assert held, "the victim worker never claimed an execution:\n" + _logs(workers)
    os.killpg(victim.process.pid, signal.SIGKILL)
    victim.process.wait(timeout=30)

    run = _wait_run(run.pk, workers, timeout=120)
    logs = _logs(workers)
    assert run.status == RunStatus.COMPLETED, logs
    assert (run.execution_count, run.executions_done) == (12, 12), logs
    executions = {e.pk: e for e in Execution.objects.filter(run=run)}
    assert Counter(e.status for e in executions.values()) == {ExecutionStatus.SUCCESS: 12}, logs
    # Every execution's results exactly once, including those the victim had started.
    per_execution = _results_per_execution(run)
    assert per_execution == dict.fromkeys(executions, SLOW_INVARIANTS)
    for execution_id in held:
        rerun = executions[execution_id]
        assert rerun.attempt >= 2, (execution_id, rerun.attempt, rerun.claimed_by)
        assert rerun.claimed_by.startswith("survivor@")
    assert run.exit_code == 0, run.summary


ONE_SLOW_SPEC = SLOW_SPEC.replace("id: celery-slow", "id: celery-one-slow").replace(
    'prompts: ["first", "second"]', 'prompts: ["only"]'
)


def _pool_children(pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(entry.name))
    return children


def test_a_killed_pool_child_hands_its_execution_over_at_once(
    start_worker: Callable[..., Worker],
) -> None:
    """Issue 20, item 6: the OOM killer takes the pool child running an execution. Celery
    redelivers its task at once, and the same task id takes the execution over without
    waiting out the lease (300 s here)."""
    worker = start_worker("solo", lease_seconds=300)
    _wait_ready([worker])
    run = _queue_run(ONE_SLOW_SPEC.replace("replicas: 6", "replicas: 1"))
    deadline = time.monotonic() + 60
    while (
        time.monotonic() < deadline
        and not Execution.objects.filter(run=run, status=ExecutionStatus.RUNNING).exists()
    ):
        time.sleep(0.1)
    children = _pool_children(worker.process.pid)
    assert children, "no pool child:\n" + _logs([worker])
    killed = time.monotonic()
    for child in children:
        os.kill(child, signal.SIGKILL)
    run = _wait_run(run.pk, [worker], timeout=120)
    logs = _logs([worker])
    assert run.status == RunStatus.COMPLETED, logs
    assert time.monotonic() - killed < 90, logs  # not the 300 s lease
    executions = list(Execution.objects.filter(run=run))
    assert all(e.status == ExecutionStatus.SUCCESS for e in executions), logs
    assert max(e.attempt for e in executions) >= 2, logs


def test_a_pool_process_above_the_memory_limit_is_replaced_after_its_task(
    start_worker: Callable[..., Worker],
) -> None:
    """A pool process whose peak memory went above CELERY_WORKER_MAX_MEMORY_PER_CHILD during
    a task (finalising a large run, say) is replaced by a fresh one once the task is done,
    and the run completes as usual. A limit of 1 MB, below any Python process: every pool
    process is replaced after every task."""
    worker = start_worker("recycled", slots=4, CELERY_WORKER_MAX_MEMORY_PER_CHILD="1024")
    _wait_ready([worker])
    first_children = set(_pool_children(worker.process.pid))  # two pool processes and beat
    assert len(first_children) == 3, _logs([worker])

    run = _wait_run(_queue_run(FAST_SPEC).pk, [worker], timeout=120)

    logs = _logs([worker])
    assert run.status == RunStatus.COMPLETED and run.exit_code == 0, logs
    assert Counter(Execution.objects.filter(run=run).values_list("status", flat=True)) == {
        ExecutionStatus.SUCCESS: 50
    }, logs
    assert set(_results_per_execution(run).values()) == {FAST_INVARIANTS}
    # The plan, four messages of executions and the finalisation: a fresh process each
    # (Celery numbers each pool process it starts: ForkPoolWorker-1, -2, ...).
    pool_processes = set(re.findall(r"ForkPoolWorker-(\d+)\] Task evaluations", logs))
    assert len(pool_processes) >= 6, logs
    # Both pool processes of the start are gone; beat, which runs no task, stays.
    assert len(first_children - set(_pool_children(worker.process.pid))) == 2, logs


def _sessions_opened() -> int:
    """How many sessions the test database has had (PostgreSQL counts them at connection;
    a session reports at its end at the latest)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def test_a_pool_process_keeps_its_database_connection_from_task_to_task(
    start_worker: Callable[..., Worker],
) -> None:
    """Celery's Django fix-up closes the database connections after every task, so each
    message paid a new PostgreSQL session (a server process forked, 5 ms of connecting
    here). A pool process now keeps its connection as DATABASE_CONN_MAX_AGE says, as
    Django's request cycle does; one that died between tasks (the server restarted, an
    administrator ended it) does not stop the next run."""
    sessions_before = _other_sessions()
    worker = start_worker("steady", slots=64)  # 64 slots: one execution per message
    _wait_ready([worker])
    before = _sessions_opened()
    first = _wait_run(_queue_run(FAST_SPEC).pk, [worker], timeout=120)
    assert first.status == RunStatus.COMPLETED and first.exit_code == 0, _logs([worker])
    tasks = Counter(Execution.objects.filter(run=first).values_list("claimed_by", flat=True))
    assert len(tasks) == 50, tasks  # 50 messages

    kept = _other_sessions() - sessions_before
    assert kept, "the worker keeps no session between tasks"
    with connection.cursor() as cursor:
        for pid in kept:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and kept & _other_sessions():
        time.sleep(0.1)  # an ended session has reported its count
    opened = _sessions_opened() - before
    # Two pool processes, beat, and the lease thread's rounds (it closes its connection
    # after each): far fewer than one per message.
    assert opened <= 12, (opened, _logs([worker]))

    second = _wait_run(_queue_run(FAST_SPEC).pk, [worker], timeout=120)
    logs = _logs([worker])
    assert second.status == RunStatus.COMPLETED and second.exit_code == 0, logs
    assert Counter(Execution.objects.filter(run=second).values_list("status", flat=True)) == {
        ExecutionStatus.SUCCESS: 50
    }, logs
