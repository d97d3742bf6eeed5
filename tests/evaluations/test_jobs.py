"""With no broker, evaluations.queue runs each job in this process (evaluations.jobs) the way
Celery's eager mode ran the task: an execution under a worker name of the task's form, and an
infrastructure error raised to the caller after the one attempt (the eager task raised
Celery's Retry for it, without retrying)."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest

from evaluations import jobs, queue, services

pytestmark = [pytest.mark.embedded]

TASK_WORKER = re.compile(
    re.escape(socket.gethostname()) + r":[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
)


def test_executions_run_here_under_a_task_name_and_an_infrastructure_error_is_raised(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    calls: list[tuple[int, str]] = []

    def execution_execute(*, execution_id: int, worker: str, run: Any) -> None:
        calls.append((execution_id, worker))
        if execution_id == 7:
            raise services.InfrastructureError("the database server is away")

    monkeypatch.setattr(services, "execution_execute", execution_execute)
    with pytest.raises(services.InfrastructureError, match=r"executions \[7\] could not start"):
        queue.executions_send([7, 8])
    # The one after the error still ran, in the same task, under the same worker name.
    assert [execution_id for execution_id, _ in calls] == [7, 8]
    assert calls[0][1] == calls[1][1] and TASK_WORKER.fullmatch(calls[0][1]), calls


def test_every_task_the_queue_sends_has_a_job() -> None:
    from evaluations import tasks

    sent = [queue.RUN_PLAN, queue.EXECUTIONS_RUN, queue.RUN_FINALIZE, queue.ALERTS_EVALUATE]
    sent.append(queue.FIRING_DELIVER)
    assert sorted(jobs.HERE) == sorted(sent)
    for name in sent:  # each is a task of that name, for the workers
        assert getattr(tasks, name.rpartition(".")[2]).name == name


class _Recorded:
    def __init__(self, run: object) -> None:
        self.run = run


def test_a_message_reads_its_run_once_and_starts_nothing_after_its_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs_given: list[object] = []
    the_run = object()

    def execution_execute(*, execution_id: int, worker: str, run: object) -> _Recorded:
        runs_given.append(run)
        return _Recorded(the_run)

    monkeypatch.setattr(services, "execution_execute", execution_execute)
    batch = jobs.executions_run([1, 2, 3], "w:1")
    # The first reads the run; the others get it from the execution before them.
    assert runs_given == [None, the_run, the_run]
    assert batch == jobs.Batch(retry=[], left=[])
    # Out of time: the first always runs (a message always moves on), the rest go back.
    runs_given.clear()
    assert jobs.executions_run([4, 5, 6], "w:1", seconds=0.0) == jobs.Batch(retry=[], left=[5, 6])
    assert runs_given == [None]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("slots", "executions", "largest", "messages"),
    [(64, 1000, 15, 68), (4, 50, 12, 5), (64, 40, 1, 40), (2, 1000, 16, 64)],
)
def test_executions_go_out_a_few_per_message_but_to_every_slot(
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    slots: int,
    executions: int,
    largest: int,
    messages: int,
) -> None:
    settings.KEYSTONE_EXECUTION_SLOTS = slots
    sent: list[list[int]] = []
    monkeypatch.setattr(queue, "executions_send", sent.append)
    services.execution_enqueue(execution_ids=list(range(1, executions + 1)))
    assert [i for message in sent for i in message] == list(range(1, executions + 1))
    assert max(len(message) for message in sent) == largest
    assert len(sent) == messages


def test_the_task_sends_back_what_it_had_no_time_for_and_retries_what_could_not_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from evaluations import tasks

    given: list[tuple[tuple[int, ...], str, float | None]] = []

    def executions_run(ids: tuple[int, ...], worker: str, *, seconds: float) -> jobs.Batch:
        given.append((ids, worker, seconds))
        return jobs.Batch(retry=[3], left=[4, 5]) if len(given) == 1 else jobs.Batch()

    enqueued: list[list[int]] = []
    monkeypatch.setattr(jobs, "executions_run", executions_run)
    monkeypatch.setattr(
        services, "execution_enqueue", lambda *, execution_ids: enqueued.append(execution_ids)
    )
    # apply() runs the task here, and its retry too, at once (throw=False: the retry is
    # applied, not raised, whatever task_eager_propagates says).
    outcome = tasks.executions_run.apply(args=(1, 2, 3, 4, 5), task_id="t-1", throw=False)
    assert outcome.successful(), outcome.result
    assert enqueued == [[4, 5]]  # back to the queue, for any worker
    # The retry takes only the execution given back, under the same task id.
    assert [ids for ids, _, _ in given] == [(1, 2, 3, 4, 5), (3,)]
    assert all(worker.endswith(":t-1") for _, worker, _ in given)
    assert {seconds for _, _, seconds in given} == {tasks.BATCH_SECONDS}
