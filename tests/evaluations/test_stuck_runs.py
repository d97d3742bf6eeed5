"""Issue 20, item 2: every state a run can be in has a way out. A message that could not be
sent (the broker away) leaves no run `queued` or `finalizing` forever: the periodic sweep
sends it again; the API still answers; cancel works in every state that has not ended."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.test import Client
from django.utils import timezone
from kombu import pools as kombu_pools

from evaluations import services
from evaluations.embedded_worker import work_once
from evaluations.models import Execution, Membership, Project, Role, Run, RunStatus
from keystone_web.celery import app as celery_app

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = """\
version: 1
id: sweep-me
task: {prompt: "p"}
agent: {type: command, command: "echo hi", timeout: 30}
sandbox: {backend: local}
invariants:
  hi: {description: hi, check: {type: contains, value: hi}}
"""


def _point_celery_at(url: str) -> None:
    celery_app.conf.update(broker_url=url, task_always_eager=False)
    kombu_pools.reset()
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


@pytest.fixture
def broker(test_redis_url: str, settings: Any) -> Iterator[redis.Redis]:
    """This process's Celery app sending to a database of the tests' own Redis."""
    settings.CELERY_TASK_ALWAYS_EAGER = False  # evaluations.queue sends, not runs here
    url = test_redis_url.rsplit("/", 1)[0] + "/14"
    client = redis.Redis.from_url(url)
    client.flushdb()
    saved = {key: celery_app.conf[key] for key in ("broker_url", "task_always_eager")}
    _point_celery_at(url)
    try:
        yield client
    finally:
        _point_celery_at(saved["broker_url"])
        celery_app.conf.update(saved)
        client.flushdb()
        client.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(project: Project, status: str, *, age_seconds: float = 3600) -> Run:
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(spec_version=version, enqueue=False)
    Run.objects.filter(pk=run.pk).update(
        status=status, created=timezone.now() - timedelta(seconds=age_seconds)
    )
    return run


def test_cancel_works_in_every_state_that_has_not_ended(project: Project) -> None:
    for status in (RunStatus.QUEUED, RunStatus.PLANNING, RunStatus.RUNNING, RunStatus.FINALIZING):
        run = _run(project, status)
        services.run_cancel(run_id=run.pk)
        run.refresh_from_db()
        assert run.status == RunStatus.CANCELLED, status
    done = _run(project, RunStatus.COMPLETED)
    services.run_cancel(run_id=done.pk)
    done.refresh_from_db()
    assert done.status == RunStatus.COMPLETED


def test_a_run_whose_finalising_message_was_lost_is_finalised_by_the_sweep(
    project: Project,
) -> None:
    # Every execution done, the run `finalizing`, and the message to finalise it lost.
    run = _run(project, RunStatus.QUEUED)
    services.run_plan(run_id=run.pk)
    [execution_id] = Execution.objects.filter(run=run).values_list("id", flat=True)
    services.execution_execute(execution_id=execution_id, worker="test:1")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FINALIZING)
    Execution.objects.filter(pk=execution_id).update(finished=timezone.now() - timedelta(hours=1))
    run.refresh_from_db()
    assert run.executions_done == 1 and run.status == RunStatus.FINALIZING
    work_once("embedded:test")  # the embedded worker runs the same periodic sweep
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED and run.exit_code == 0


def test_a_queued_run_whose_message_was_lost_is_sent_again(
    project: Project, broker: redis.Redis
) -> None:
    run = _run(project, RunStatus.QUEUED)
    fresh = _run(project, RunStatus.QUEUED, age_seconds=0)  # its message may be on the way
    assert broker.llen("celery") == 0
    services.run_sweep_stuck()
    messages = [json.loads(m) for m in broker.lrange("celery", 0, -1)]
    assert [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in messages] == [
        ("evaluations.tasks.run_plan", f"({run.pk},)")
    ]
    assert fresh.pk != run.pk


def test_starting_a_run_while_the_broker_is_down_answers_and_the_sweep_sends_it_later(
    project: Project, django_user_model: Any, broker: redis.Redis, settings: Any
) -> None:
    user = django_user_model.objects.create_user(username="ci", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.EDITOR)
    _, raw = services.token_issue(project=project, user=user, name="ci")
    services.spec_version_create(project=project, source_yaml=SPEC)
    up = celery_app.conf.broker_url
    _point_celery_at(f"redis://127.0.0.1:{_closed_port()}/0")  # Redis is down
    celery_app.conf.broker_transport_options = {"max_retries": 1}
    try:
        response = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
            f"/api/projects/{project.slug}/specs/sweep-me/runs",
            "{}",
            content_type="application/json",
        )
    finally:
        celery_app.conf.broker_transport_options = {}
        _point_celery_at(up)
    assert response.status_code == 202, response.content  # accepted, never a 500
    run = Run.objects.get(pk=response.json()["id"])
    assert run.status == RunStatus.QUEUED  # committed, its message not sent
    Run.objects.filter(pk=run.pk).update(created=timezone.now() - timedelta(hours=1))
    services.run_sweep_stuck()  # Redis is back: the sweep sends it
    [message] = [json.loads(m) for m in broker.lrange("celery", 0, -1)]
    assert message["headers"]["argsrepr"] == f"({run.pk},)"
    assert Execution.objects.filter(run=run).count() == 0  # planned by a worker, from it
