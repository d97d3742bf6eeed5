"""The jobs evaluations.queue hands on, as plain functions of ids. On the workers the Celery
tasks (evaluations.tasks) run them; with no broker the queue calls them in this process, as
Celery's eager mode did, so the CLI and the tests never import Celery (~100-150 ms)."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evaluations import queue, services


def run_plan(run_id: int) -> int:
    execution_ids = services.run_plan(run_id=run_id)
    services.execution_enqueue(execution_ids=execution_ids)
    if not execution_ids:
        services.run_finalize_if_done(run_id=run_id)
    return len(execution_ids)


@dataclass
class Batch:
    """What executions_run could not do: the executions given back after an infrastructure
    error (for a later attempt), and those it did not start because its time ran out."""

    retry: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)


def executions_run(
    execution_ids: Sequence[int], worker: str, *, seconds: float | None = None
) -> Batch:
    """Run executions one after another under one worker name, reading their run once (the
    executions of a message are usually all of one run). After the first, none is started
    once `seconds` have passed: a message's time on a worker stays near one execution's, so
    the broker never takes it for lost and hands it to a second worker, and the others can
    take what is left."""
    batch = Batch()
    started = time.monotonic()
    run = None
    for index, execution_id in enumerate(execution_ids):
        if index and seconds is not None and time.monotonic() - started > seconds:
            batch.left = list(execution_ids[index:])
            break
        try:
            recorded = services.execution_execute(execution_id=execution_id, worker=worker, run=run)
        except services.InfrastructureError:
            batch.retry.append(execution_id)
            continue
        if recorded is not None:
            run = recorded.run
    return batch


def run_finalize(run_id: int) -> int | None:
    return services.run_finalize(run_id=run_id).exit_code


def alerts_evaluate(run_id: int) -> int:
    # One message per firing: each channel is retried on its own, and in parallel.
    firing_ids = services.alerts_evaluate(run_id=run_id)
    for firing_id in firing_ids:
        queue.firing_deliver_later(firing_id)
    return len(firing_ids)


def firing_deliver(firing_id: int) -> str:
    return services.firing_deliver(firing_id=firing_id)


def executions_run_here(*execution_ids: int) -> None:
    """executions_run in this process, as Celery's eager mode ran the task: under a worker
    name of the task's form (host:task id), and an infrastructure error raised after one
    attempt at each (the eager task raised Celery's Retry, and did not retry). Those
    executions have been given back by then (services.execution_release) for a later try."""
    batch = executions_run(execution_ids, f"{socket.gethostname()}:{uuid.uuid4()}")
    if batch.retry:
        raise services.InfrastructureError(
            f"executions {batch.retry} could not start; given back for a later attempt"
        )


def run_here(task_name: str, *args: int) -> None:
    """Run the job a task name stands for, here and now (no broker)."""
    job = HERE[task_name]
    job(*args)


HERE: dict[str, Callable[..., object]] = {
    queue.RUN_PLAN: run_plan,
    queue.EXECUTIONS_RUN: executions_run_here,
    queue.RUN_FINALIZE: run_finalize,
    queue.ALERTS_EVALUATE: alerts_evaluate,
    queue.FIRING_DELIVER: firing_deliver,
}
