"""Execution lifecycle details: the requeue beat does not flood the broker, behavior_unchanged
(baseline: auto) does not depend on the order executions finish in, cancelling a run
stops the agent's processes, and an execution whose run is deleted after its claim runs
nothing.

Rows are committed (transaction=True): the lease watcher thread and the canceller thread use
their own database connections. The requeue test sends real messages to a Redis database of
its own and counts them there.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.db import connection
from django.utils import timezone
from kombu import pools as kombu_pools

from checks.families._common import lexical_similarity
from evaluations import services
from evaluations.models import (
    CheckResult,
    Execution,
    ExecutionStatus,
    Project,
    Run,
    RunStatus,
)
from keystone_web.celery import app as celery_app
from tests.evaluations.execution_helpers import planned_run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = "lifecycle-test:1"
LOCK_KEY = "keystone-tests:in-use"  # the same lock as tests/evaluations/test_celery_workers.py


@pytest.fixture
def project() -> Project:
    return services.project_default()


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout} s")


# --- requeue: Execution.enqueued_at ------------------------------------------------------


@pytest.fixture
def broker_queue(test_redis_url: str, settings: Any) -> Iterator[redis.Redis]:
    """An empty Redis database of this test's own, with this process's Celery app sending
    to it; yields the client to count the messages in the default queue."""
    settings.CELERY_TASK_ALWAYS_EAGER = False  # evaluations.queue sends, not runs here
    base = urlsplit(test_redis_url)
    token = f"{os.getpid()}-{time.time()}"
    client = url = None
    for number in range(int(base.path.strip("/") or 0), 16):
        url = urlunsplit(base._replace(path=f"/{number}"))
        candidate = redis.Redis.from_url(url)
        if candidate.set(LOCK_KEY, token, nx=True, ex=900):
            client = candidate
            break
        candidate.close()
    assert client is not None and url is not None, "no free Redis database for the test"
    saved = {key: celery_app.conf[key] for key in ("broker_url", "task_always_eager")}
    celery_app.conf.update(broker_url=url, task_always_eager=False)
    kombu_pools.reset()
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    try:
        client.delete("celery")
        yield client
    finally:
        celery_app.conf.update(saved)
        kombu_pools.reset()
        celery_app._pool = None
        celery_app.amqp._producer_pool = None
        client.flushdb()
        client.close()


SHORT_SPEC = """\
version: 1
id: requeue-five
task: {prompts: ["a", "b", "c", "d", "e"]}
agent: {type: command, command: "echo hi"}
sandbox: {backend: local}
invariants:
  says_hi: {description: "says hi", check: {type: contains, value: hi}}
"""


def test_requeue_resends_only_executions_not_sent_within_the_lease(
    project: Project, broker_queue: redis.Redis, settings: Any
) -> None:
    settings.KEYSTONE_EXECUTION_LEASE_SECONDS = 60
    run, ids = planned_run(project, SHORT_SPEC)
    assert len(ids) == 5
    services.execution_enqueue(execution_ids=ids)  # what the run_plan task does
    assert broker_queue.llen("celery") == 5
    sent = dict(Execution.objects.filter(run=run).values_list("id", "enqueued_at"))
    assert all(value is not None for value in sent.values())

    # Every beat tick within the lease: nothing is sent again.
    for _ in range(3):
        assert services.execution_requeue_expired() == []
    assert broker_queue.llen("celery") == 5

    now = timezone.now()
    old = now - timedelta(seconds=120)
    pending_old, pending_never, running_dead, running_resent, running_alive = ids
    Execution.objects.filter(pk=pending_old).update(enqueued_at=old)
    # Never sent (planned by a task that died before sending): judged by its creation time.
    Execution.objects.filter(pk=pending_never).update(enqueued_at=None, created=old)
    # A worker died (lease ran out) long after the message was sent.
    Execution.objects.filter(pk=running_dead).update(
        status=ExecutionStatus.RUNNING, lease_expires=now - timedelta(seconds=5), enqueued_at=old
    )
    # Its lease ran out too, but it was resent a moment ago: the message is on its way.
    Execution.objects.filter(pk=running_resent).update(
        status=ExecutionStatus.RUNNING, lease_expires=now - timedelta(seconds=5)
    )
    Execution.objects.filter(pk=running_alive).update(
        status=ExecutionStatus.RUNNING, lease_expires=now + timedelta(seconds=30), enqueued_at=old
    )

    resent = services.execution_requeue_expired()
    assert sorted(resent) == sorted([pending_old, pending_never, running_dead])
    assert broker_queue.llen("celery") == 5 + 3
    refreshed = dict(Execution.objects.filter(run=run).values_list("id", "enqueued_at"))
    assert all(refreshed[i] is not None and refreshed[i] >= now for i in resent)

    # The next ticks find them recently sent: no flood while they wait in the queue.
    for _ in range(3):
        assert services.execution_requeue_expired() == []
    assert broker_queue.llen("celery") == 8


# --- behavior_unchanged with baseline: auto ------------------------------------------------

# The agent answers differently when the prompt's scenario has its tool down; the baseline
# comparison is with the no-chaos answer of the same prompt.
BEHAVIOUR_SPEC = """\
version: 1
id: behaviour-order
task: {prompts: ["Refund order 1042", "Cancel order 7"]}
agent:
  type: command
  command: >-
    sh -c 'if [ "$KEYSTONE_SCENARIO" = "tool-down" ]; then
    echo "Sorry: $KEYSTONE_PROMPT could not be processed now";
    else echo "Done: $KEYSTONE_PROMPT was processed"; fi'
sandbox: {backend: local}
# What the faulted scenarios need to be valid: a gateway and a tool proxy.
llm: {provider: scripted, rules: [{reply: {content: done}}]}
tools: [{name: orders, url: "http://127.0.0.1:9/orders"}]
invariants:
  unchanged:
    description: "Behaves as without chaos"
    when: any_chaos_active
    check: {type: behavior_unchanged, baseline: auto, similarity_threshold: 0.75}
  calm:
    description: "Answers calmly"
    check: {type: not_contains, value: "!!!"}
  polite_drift:
    description: "Close to the no-chaos answer, loosely"
    when: any_chaos_active
    check: {type: behavior_unchanged, similarity_threshold: 0.1}
chaos_matrix:
  - name: no-chaos
  - name: slow-llm
    llm_faults: [{mode: error, probability: 0.0}]
  - name: tool-down
    tool_faults: [{tool: "*", mode: error}]
"""


def _run_in_order(project: Project, order: Callable[[list[Execution]], list[Execution]]) -> Run:
    run, _ = planned_run(project, BEHAVIOUR_SPEC)
    executions = list(Execution.objects.filter(run=run))
    for execution in order(executions):
        # Nothing about the deferred invariants is written while executions finish (the
        # last one hands the run to run_finalize, which writes them).
        assert not CheckResult.objects.filter(run=run, invariant_id="unchanged").exists()
        services.execution_execute(execution_id=execution.pk, worker=WORKER)
    services.run_finalize_if_done(run_id=run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    return run


def _verdicts(run: Run) -> dict[tuple[str, int, str], tuple[bool, float]]:
    rows = CheckResult.objects.filter(run=run).select_related("execution")
    return {
        (r.execution.scenario, r.execution.prompt_index, r.invariant_id): (r.passed, r.score)
        for r in rows
    }


def test_behavior_unchanged_is_the_same_whatever_order_executions_finish_in(
    project: Project,
) -> None:
    def chaos_first(rows: list[Execution]) -> list[Execution]:
        return sorted(rows, key=lambda e: (e.pillar != "chaos", -e.pk))

    def calm_first(rows: list[Execution]) -> list[Execution]:
        return sorted(rows, key=lambda e: (e.pillar != "contract", e.pk))

    wrong, right = _run_in_order(project, chaos_first), _run_in_order(project, calm_first)
    assert _verdicts(wrong) == _verdicts(right)

    verdicts = _verdicts(wrong)
    # The slow-llm scenario answers exactly as without chaos: similarity 1.0.
    assert verdicts[("slow-llm", 0, "unchanged")] == (True, 1.0)
    assert verdicts[("slow-llm", 1, "unchanged")] == (True, 1.0)
    # tool-down apologises instead: below 0.75, but above the loose 0.1.
    calm = "Done: Refund order 1042 was processed"
    apology = "Sorry: Refund order 1042 could not be processed now"
    similarity = lexical_similarity(apology, calm)
    assert 0.1 <= similarity < 0.75
    assert verdicts[("tool-down", 0, "unchanged")] == (False, 0.0)
    assert verdicts[("tool-down", 0, "polite_drift")] == (True, 1.0)
    # Not active without chaos, and only the always-on invariant runs there.
    assert ("no-chaos", 0, "unchanged") not in verdicts
    assert verdicts[("no-chaos", 0, "calm")] == (True, 1.0)

    # The executions' stored verdicts and the run's matrix include the deferred results.
    down = Execution.objects.get(run=wrong, scenario="tool-down", prompt_index=0)
    assert down.passed is False
    assert down.composite == pytest.approx(2 / 3)  # calm and polite_drift pass, unchanged fails
    cells = {(c["invariant_id"], c["scenario"]): c["passed"] for c in wrong.summary["matrix"]}
    assert cells[("unchanged", "tool-down")] is False
    assert cells[("unchanged", "slow-llm")] is True
    # 3 invariants: calm in 3 scenarios, unchanged and polite_drift in the 2 chaotic ones.
    assert len(cells) == 3 + 2 + 2
    assert wrong.resilience == pytest.approx(6 / 7 * 100)

    # Finalising again writes nothing twice (unique results) and changes nothing.
    before = CheckResult.objects.filter(run=wrong).count()
    services.run_finalize(run_id=wrong.pk)
    assert CheckResult.objects.filter(run=wrong).count() == before


# --- cancel stops a running sandbox --------------------------------------------------------


def test_cancel_kills_the_running_agent_process_tree(
    project: Project, settings: Any, tmp_path: Path
) -> None:
    settings.KEYSTONE_EXECUTION_LEASE_SECONDS = 3  # the watcher looks every second
    pid_file = tmp_path / "pids"
    source = f"""\
version: 1
id: cancel-me
task: {{prompt: "Wait"}}
agent:
  type: command
  command: "echo $$ > {pid_file}; sleep 120 & echo $! >> {pid_file}; wait"
  timeout: 300
sandbox: {{backend: local}}
invariants:
  done: {{description: "done", check: {{type: output_not_empty}}}}
"""
    run, [execution_id] = planned_run(project, source)
    returned: list[bool] = []

    def execute() -> None:
        try:
            ran = services.execution_execute(execution_id=execution_id, worker=WORKER)
            returned.append(ran is not None)
        finally:
            connection.close()

    thread = threading.Thread(target=execute)
    thread.start()
    _wait_for(lambda: pid_file.exists() and len(pid_file.read_text().split()) == 2, 20)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert all(_alive(pid) for pid in pids)

    def cancel() -> None:
        try:
            services.run_cancel(run_id=run.pk)
        finally:
            connection.close()

    cancelled_at = time.monotonic()
    canceller = threading.Thread(target=cancel)
    canceller.start()
    canceller.join(timeout=10)
    _wait_for(lambda: not any(_alive(pid) for pid in pids), 5)
    gone_after = time.monotonic() - cancelled_at
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert returned == [True]
    assert gone_after < 5, f"the agent's processes lived {gone_after:.1f} s after the cancel"
    execution = Execution.objects.get(pk=execution_id)
    assert (execution.status, execution.error) == (ExecutionStatus.ERROR, "cancelled")
    assert execution.lease_expires is None and execution.finished is not None
    assert not CheckResult.objects.filter(execution=execution).exists()
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting for its parent."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False


def test_an_execution_whose_run_is_deleted_after_its_claim_runs_nothing(
    project: Project, monkeypatch: Any, tmp_path: Path
) -> None:
    """Its row is gone between the claim and the read (the run was deleted): nothing is run
    and nothing is recorded, instead of an error from a row that is not there."""
    marker = tmp_path / "ran"
    run, [execution_id] = planned_run(
        project,
        f"""\
version: 1
id: deleted-run
task: {{prompts: ["p"]}}
agent: {{type: command, command: "touch {marker}"}}
sandbox: {{backend: local}}
invariants:
  completes: {{description: "it ran", check: {{type: completes}}}}
""",
    )
    from evaluations.services import executions

    claim = executions.execution_claim

    def claim_then_delete_the_run(*, execution_id: int, worker: str) -> bool:
        claimed = claim(execution_id=execution_id, worker=worker)
        Run.objects.filter(pk=run.pk).delete()
        return claimed

    monkeypatch.setattr(executions, "execution_claim", claim_then_delete_the_run)
    assert services.execution_execute(execution_id=execution_id, worker=WORKER) is None
    assert not marker.exists()
    assert not Execution.objects.filter(pk=execution_id).exists()


def test_results_the_database_refuses_end_the_execution_as_an_error_that_says_so(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only refusal that means "stored already" is the one after another worker took
    the execution over. Any other (here each result twice, which the unique constraint on
    an execution's results refuses) was taken for it: the results were dropped without a
    word and the execution stayed `running` until its lease expired, on every attempt."""
    from django.conf import settings

    from evaluations.models import Artifact
    from evaluations.runner import harness

    run, [execution_id] = planned_run(
        project,
        """\
version: 1
id: refused-results
task: {prompts: ["p"]}
agent: {type: command, command: "echo hello"}
sandbox: {backend: local}
invariants:
  completes: {description: "it ran", check: {type: completes}}
""",
    )
    real = harness.run_execution

    def results_twice(*args: Any, **kwargs: Any) -> Any:
        outcome = real(*args, **kwargs)
        outcome.results = outcome.results * 2
        return outcome

    monkeypatch.setattr(harness, "run_execution", results_twice)
    services.execution_execute(execution_id=execution_id, worker=WORKER)
    execution = Execution.objects.get(pk=execution_id)
    assert execution.status == ExecutionStatus.ERROR
    assert execution.error.startswith("Keystone internal error: the results could not be stored")
    assert not CheckResult.objects.filter(execution_id=execution_id).exists()
    assert not Artifact.objects.filter(execution_id=execution_id).exists()
    folder = Path(settings.MEDIA_ROOT) / f"runs/{run.pk}/executions/{execution_id}"
    assert not [p for p in folder.rglob("*") if p.is_file()]  # no file without its row
    services.run_finalize_if_done(run_id=run.pk)
    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED
