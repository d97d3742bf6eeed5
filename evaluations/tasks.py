"""Celery tasks: thin interfaces over services. They take ids, never objects, and are
idempotent, so a redelivered message (acks_late) does no harm."""

from __future__ import annotations

import socket

from celery import shared_task

from evaluations import queue, services


@shared_task(acks_late=True)
def run_plan(run_id: int) -> int:
    execution_ids = services.run_plan(run_id=run_id)
    services.execution_enqueue(execution_ids=execution_ids)
    if not execution_ids:
        services.run_finalize_if_done(run_id=run_id)
    return len(execution_ids)


@shared_task(
    bind=True,
    acks_late=True,
    # Only infrastructure errors (a database server or the Docker engine away) are retried;
    # an agent that fails is a result, not an error.
    autoretry_for=(services.InfrastructureError,),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=5,
)
def execution_run(self, execution_id: int) -> bool:  # noqa: ANN001
    worker = f"{self.request.hostname or socket.gethostname()}:{self.request.id}"
    return services.execution_execute(execution_id=execution_id, worker=worker)


@shared_task(acks_late=True)
def run_finalize(run_id: int) -> int | None:
    return services.run_finalize(run_id=run_id).exit_code


@shared_task
def requeue_expired_executions() -> int:
    """The periodic sweep: executions of dead workers, and runs and alert firings whose
    message was lost."""
    services.run_sweep_stuck()
    services.firings_send_stale()
    return len(services.execution_requeue_expired())


@shared_task(acks_late=True)
def alerts_evaluate(run_id: int) -> int:
    # One message per firing: each channel is retried on its own, and in parallel.
    firing_ids = services.alerts_evaluate(run_id=run_id)
    for firing_id in firing_ids:
        queue.firing_deliver_later(firing_id)
    return len(firing_ids)


@shared_task(acks_late=True)
def firing_deliver(firing_id: int) -> str:
    return services.firing_deliver(firing_id=firing_id)


@shared_task
def digests_send_due() -> int:
    return len(services.digests_send_due())
