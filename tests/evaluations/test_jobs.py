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


def test_an_execution_runs_here_under_a_task_name_and_its_infrastructure_error_is_raised(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    calls: list[tuple[int, str]] = []

    def execution_execute(*, execution_id: int, worker: str) -> bool:
        calls.append((execution_id, worker))
        raise services.InfrastructureError("the database server is away")

    monkeypatch.setattr(services, "execution_execute", execution_execute)
    with pytest.raises(services.InfrastructureError):
        queue.execution_send(7)
    [(execution_id, worker)] = calls
    assert execution_id == 7 and TASK_WORKER.fullmatch(worker), worker


def test_every_task_the_queue_sends_has_a_job() -> None:
    from evaluations import tasks

    sent = [queue.RUN_PLAN, queue.EXECUTION_RUN, queue.RUN_FINALIZE, queue.ALERTS_EVALUATE]
    sent.append(queue.FIRING_DELIVER)
    assert sorted(jobs.HERE) == sorted(sent)
    for name in sent:  # each is a task of that name, for the workers
        assert getattr(tasks, name.rpartition(".")[2]).name == name
