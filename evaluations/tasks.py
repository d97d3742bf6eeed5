"""Celery tasks: thin interfaces over the jobs (evaluations.jobs) and services. They take
ids, never objects, and are idempotent, so a redelivered message (acks_late) does no harm."""

from __future__ import annotations

import socket

from celery import shared_task

from evaluations import jobs, services


@shared_task(acks_late=True)
def run_plan(run_id: int) -> int:
    return jobs.run_plan(run_id)


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
    return jobs.execution_run(execution_id, worker)


@shared_task(acks_late=True)
def run_finalize(run_id: int) -> int | None:
    return jobs.run_finalize(run_id)


@shared_task
def requeue_expired_executions() -> int:
    """The periodic sweep: executions of dead workers, and runs and alert firings whose
    message was lost."""
    services.run_sweep_stuck()
    services.firings_send_stale()
    return len(services.execution_requeue_expired())


@shared_task(acks_late=True)
def alerts_evaluate(run_id: int) -> int:
    return jobs.alerts_evaluate(run_id)


@shared_task(acks_late=True)
def firing_deliver(firing_id: int) -> str:
    return jobs.firing_deliver(firing_id)


@shared_task
def digests_send_due() -> int:
    return len(services.digests_send_due())
