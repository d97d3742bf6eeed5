"""Celery tasks: thin interfaces over the jobs (evaluations.jobs) and services. They take
ids, never objects, and are idempotent, so a redelivered message (acks_late) does no harm."""

from __future__ import annotations

import socket

from celery import shared_task
from celery.utils.time import get_exponential_backoff_interval

from evaluations import jobs, services


@shared_task(acks_late=True)
def run_plan(run_id: int) -> int:
    return jobs.run_plan(run_id)


# A message holds several executions (services.execution_enqueue): Celery's own work for a
# message (the broker's round trips, the prefork pool's hand-over, the ack) was most of the
# cost of a short execution. A worker takes no new execution of a message after this long:
# the rest go back to the queue in a new message, so a message is never on a worker for
# much longer than one execution, and another worker can take what is left.
BATCH_SECONDS = 20.0


@shared_task(bind=True, acks_late=True, max_retries=5)
def executions_run(self, *execution_ids: int) -> int:  # noqa: ANN001
    """Run the executions one after another; returns how many it started."""
    worker = f"{self.request.hostname or socket.gethostname()}:{self.request.id}"
    batch = jobs.executions_run(execution_ids, worker, seconds=BATCH_SECONDS)
    if batch.left:
        services.execution_enqueue(execution_ids=batch.left)
    if batch.retry:
        # Only infrastructure errors (a database server or the Docker engine away) are
        # retried, with a backoff; an agent that fails is a result, not an error.
        countdown = get_exponential_backoff_interval(
            factor=2, retries=self.request.retries, maximum=60, full_jitter=True
        )
        raise self.retry(args=batch.retry, countdown=countdown)
    return len(execution_ids) - len(batch.left)


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
