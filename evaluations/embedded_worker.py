"""The embedded worker: with no broker, a loop that polls the database for queued runs and
pending executions and runs them through the same services the Celery tasks call."""

from __future__ import annotations

import logging
import os
import threading

from django.db import close_old_connections, connections

from evaluations import services
from evaluations.models import Execution, ExecutionStatus, Run, RunStatus

logger = logging.getLogger(__name__)


def work_once(worker: str) -> bool:
    """Plan one queued run or execute one pending execution. False when there was nothing."""
    queued = (
        Run.objects.filter(status=RunStatus.QUEUED)
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    if queued is not None:
        services.run_plan(run_id=queued)
        services.run_finalize_if_done(run_id=queued)
        return True
    pending = (
        Execution.objects.filter(status=ExecutionStatus.PENDING, run__status=RunStatus.RUNNING)
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    if pending is not None:
        services.execution_execute(execution_id=pending, worker=worker)
        return True
    expired = services.execution_requeue_expired(enqueue=False)
    for execution_id in expired:
        services.execution_execute(execution_id=execution_id, worker=worker)
    return bool(expired)


def poll_forever(stop: threading.Event, interval: float = 1.0) -> None:
    worker = f"embedded:{os.getpid()}"
    while not stop.is_set():
        close_old_connections()
        try:
            busy = work_once(worker)
        except Exception:  # keep serving: one bad run must not stop the worker
            logger.exception("embedded worker step failed")
            busy = False
        if not busy:
            stop.wait(interval)
    connections.close_all()  # this thread's connections: nothing left open after a stop
