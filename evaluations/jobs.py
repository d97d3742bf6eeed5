"""The jobs evaluations.queue hands on, as plain functions of ids. On the workers the Celery
tasks (evaluations.tasks) run them; with no broker the queue calls them in this process, as
Celery's eager mode did, so the CLI and the tests never import Celery (~100-150 ms)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable

from evaluations import queue, services


def run_plan(run_id: int) -> int:
    execution_ids = services.run_plan(run_id=run_id)
    services.execution_enqueue(execution_ids=execution_ids)
    if not execution_ids:
        services.run_finalize_if_done(run_id=run_id)
    return len(execution_ids)


def execution_run(execution_id: int, worker: str) -> bool:
    """True when this worker ran the execution (False: another had it, or it was done)."""
    return services.execution_execute(execution_id=execution_id, worker=worker) is not None


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


def execution_run_here(execution_id: int) -> bool:
    """execution_run in this process, as Celery's eager mode ran the task: under a worker
    name of the task's form (host:task id), and an infrastructure error raised after the one
    attempt (the eager task raised Celery's Retry for it, and did not retry). The execution
    has been given back by then (services.execution_release) for a later attempt."""
    return execution_run(execution_id, f"{socket.gethostname()}:{uuid.uuid4()}")


def run_here(task_name: str, *args: int) -> None:
    """Run the job a task name stands for, here and now (no broker)."""
    job = HERE[task_name]
    job(*args)


HERE: dict[str, Callable[[int], object]] = {
    queue.RUN_PLAN: run_plan,
    queue.EXECUTION_RUN: execution_run_here,
    queue.RUN_FINALIZE: run_finalize,
    queue.ALERTS_EVALUATE: alerts_evaluate,
    queue.FIRING_DELIVER: firing_deliver,
}
