"""The embedded worker: with no broker, a loop that polls the database for queued runs,
pending executions and pending alert firings, and handles them through the same services
the Celery tasks call."""

from __future__ import annotations

import logging
import os
import threading
import time

from django.db import close_old_connections, connections
from django.db.models import Q
from django.utils import timezone

from evaluations import services
from evaluations.models import (
    AlertFiring,
    Execution,
    ExecutionStatus,
    FiringStatus,
    Run,
    RunStatus,
)

logger = logging.getLogger(__name__)


def work_once(worker: str, *, after_run: int = 0) -> int | None:
    """Plan one queued run, execute one pending execution or send one pending alert
    firing; the id of the run worked on, or None when there was nothing. Executions are
    taken round-robin over runs (the first run after `after_run` with one ready), so one
    slow or stuck run never holds the others; an execution waiting out its retry backoff
    is not ready."""
    queued = (
        Run.objects.filter(status=RunStatus.QUEUED)
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    if queued is not None:
        services.run_plan(run_id=queued)
        services.run_finalize_if_done(run_id=queued)
        return queued
    ready = Execution.objects.filter(
        Q(retry_at__isnull=True) | Q(retry_at__lte=timezone.now()),
        status=ExecutionStatus.PENDING,
        run__status=RunStatus.RUNNING,
    ).order_by("run_id", "id")
    pending = (
        ready.filter(run_id__gt=after_run).values_list("id", "run_id").first()
        or ready.values_list("id", "run_id").first()
    )
    if pending is not None:
        execution_id, run_id = pending
        try:
            services.execution_execute(execution_id=execution_id, worker=worker)
        except services.InfrastructureError:
            logger.warning("execution %s could not start; it will be retried", execution_id)
        return run_id
    firing = (
        AlertFiring.objects.filter(status=FiringStatus.PENDING)
        .order_by("id")
        .values_list("id", "run_id")
        .first()
    )
    if firing is not None:
        services.firing_deliver(firing_id=firing[0])
        return firing[1]
    # The same periodic jobs as Celery beat: runs whose finalising was lost, dead leases.
    for run_id in services.run_sweep_stuck(enqueue=False):
        services.run_finalize_if_done(run_id=run_id)
    expired = services.execution_requeue_expired(enqueue=False)
    for execution_id in expired:
        services.execution_execute(execution_id=execution_id, worker=worker)
    if not expired:
        return None
    return Execution.objects.values_list("run_id", flat=True).get(pk=expired[-1])


# The periodic jobs Celery beat runs with a broker; the embedded worker runs them itself.
PERIODIC_SECONDS = 60.0


def periodic_once() -> None:
    services.firings_send_stale()  # lost alert evaluations, firings a dead worker was sending
    services.digests_send_due()


def poll_forever(stop: threading.Event, interval: float = 1.0, *, periodic: bool = True) -> None:
    """Work until `stop` is set. Several of these may poll one database at once: every
    execution is claimed before it runs and a run is planned once (services), so they never
    do the same job twice; only the one with `periodic` runs the periodic jobs."""
    worker = f"embedded:{os.getpid()}:{threading.get_ident()}"
    last_run = 0
    next_periodic = 0.0 if periodic else float("inf")
    while not stop.is_set():
        close_old_connections()
        try:
            if time.monotonic() >= next_periodic:
                next_periodic = time.monotonic() + PERIODIC_SECONDS
                periodic_once()
            served = work_once(worker, after_run=last_run)
        except Exception:  # keep serving: one bad run must not stop the worker
            logger.exception("embedded worker step failed")
            served = None
        if served is None:
            stop.wait(interval)
        else:
            last_run = served
    connections.close_all()  # this thread's connections: nothing left open after a stop


def start_pollers(stop: threading.Event, threads: int) -> list[threading.Thread]:
    """`threads` pollers, so that many executions run at once (an execution mostly waits on
    its agent); the first also runs the periodic jobs."""
    pollers = [
        threading.Thread(
            target=poll_forever,
            args=(stop,),
            kwargs={"periodic": index == 0},
            daemon=True,
            name=f"keystone-worker-{index}",
        )
        for index in range(max(1, threads))
    ]
    for poller in pollers:
        poller.start()
    return pollers
