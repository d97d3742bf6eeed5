"""Handing work on to whoever executes it. Services call these after a write; this module
alone knows what runs where:

- with a broker (CELERY_BROKER_URL), a message per job goes to the Celery workers;
- with none, the job runs at once in this process (the CLI, the tests), without Celery:
  evaluations.jobs holds what each task does, for both;
- under `keystone serve` on the embedded default (KEYSTONE_EMBEDDED_WORKER), queued runs
  and pending alert firings are left for the embedded worker, which polls the database
  (evaluations.embedded_worker).

Messages go out after the transaction commits, so a worker never looks for a row it cannot
see yet. Tasks are looked up by name in the Celery app, registered the first time work is
handed on, so the services that enqueue never import the task module that calls them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

RUN_PLAN = "evaluations.tasks.run_plan"
EXECUTIONS_RUN = "evaluations.tasks.executions_run"
RUN_FINALIZE = "evaluations.tasks.run_finalize"
ALERTS_EVALUATE = "evaluations.tasks.alerts_evaluate"
FIRING_DELIVER = "evaluations.tasks.firing_deliver"


def _send(task_name: str, *args: int) -> None:
    if settings.CELERY_TASK_ALWAYS_EAGER:
        # No broker: what Celery's eager mode did, without importing Celery (~100-150 ms
        # of every local `keystone run`, which finalises its run through here).
        from evaluations import jobs

        jobs.run_here(task_name, *args)
        return
    from kombu.exceptions import OperationalError

    try:
        broker_client().tasks[task_name].delay(*args)
    except OperationalError as exc:
        # The broker is away. The rows are committed; the periodic sweep sends the message
        # again (services.run_sweep_stuck, execution_requeue_expired), so nothing is stuck
        # and the request that made them does not fail.
        logger.warning("could not send %s%s to the broker: %s", task_name, args, exc)


def broker_client() -> Celery:
    """Celery's app with Keystone's tasks registered on it, imported the first time work is
    handed on (importing the tasks registers them: shared_task), or when a web server starts
    (keystone_web.serving), so that its first request to start a run does not pay for it."""
    from evaluations import tasks  # noqa: F401
    from keystone_web.celery import app

    return app


def run_plan_later(run_id: int) -> None:
    """Plan the run once this transaction commits (the embedded worker finds it itself)."""
    # An eager task here would run the whole evaluation inside the web request that made it.
    if settings.KEYSTONE_EMBEDDED_WORKER:
        return
    transaction.on_commit(lambda: _send(RUN_PLAN, run_id))


def executions_send(execution_ids: list[int]) -> None:
    """Send executions to the workers now, in one message: one worker runs them one after
    another (or run them here, eagerly, with no broker)."""
    _send(EXECUTIONS_RUN, *execution_ids)


def run_finalize_later(run_id: int) -> None:
    """Finalise the run once this transaction commits."""
    transaction.on_commit(lambda: _send(RUN_FINALIZE, run_id))


def alerts_evaluate_later(run_id: int) -> None:
    """Evaluate the project's alert rules against this run once its scores are committed."""
    transaction.on_commit(lambda: _send(ALERTS_EVALUATE, run_id))


def firing_deliver_later(firing_id: int) -> None:
    """Send one alert firing once this transaction commits (the embedded worker sends
    pending firings itself: retries wait, and must not hold up a web request)."""
    if settings.KEYSTONE_EMBEDDED_WORKER:
        return
    transaction.on_commit(lambda: _send(FIRING_DELIVER, firing_id))
