"""Issue 20, item 4: `keystone run` on the workers never hangs a CI job: with no worker to
take the run, it gives up at --timeout, cancels the run and exits 4 saying so."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

from evaluations.models import Run, RunStatus
from tests.cli_helpers import run_keystone

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SPEC = """\
version: 1
id: nobody-takes-it
task: {prompt: "p"}
agent: {type: command, command: "echo hi", timeout: 30}
sandbox: {backend: local}
invariants:
  hi: {description: hi, check: {type: contains, value: hi}}
"""


def test_keystone_run_gives_up_at_its_timeout_and_cancels_the_run(
    tmp_path: Path, test_redis_url: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.fail("this test shares the test database with a subprocess: run it on PostgreSQL")
    database = urlsplit(os.environ["DATABASE_URL"])
    database_url = urlunsplit(database._replace(path="/" + settings.DATABASES["default"]["NAME"]))
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=test_redis_url.rsplit("/", 1)[0] + "/13",  # no worker listens
        KEYSTONE_HOME=str(tmp_path / "home"),
        NO_COLOR="1",
    )
    done = run_keystone("run", str(spec), "--timeout", "3", env=env, timeout=120)
    assert done.returncode == 4, done.stderr
    assert "did not finish within 3 s; it was cancelled" in done.stderr
    assert Run.objects.get().status == RunStatus.CANCELLED
