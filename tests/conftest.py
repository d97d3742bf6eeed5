"""Fixtures shared by every test package.

The database is PostgreSQL when DATABASE_URL is set (CI and `tests/run.sh`) and the
embedded SQLite file otherwise; tests marked `embedded` run on both (see tests/run.sh).
Pure engine tests (tests/checks/) use none of this and also run with `-p no:django`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

# Time per example is not what any property test here is about, and CI shares two cores: on
# a loaded machine Hypothesis's default deadline (200 ms an example) and its too-slow health
# check failed property tests that pass.
hypothesis_settings.register_profile(
    "keystone", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("keystone")

# The tests are this server's operator: many of their specs run the agent as a plain local
# process, which the default policy refuses where bubblewrap works (evaluations/policy.py).
# The environment is for the `keystone` subprocesses; the settings already read it.
os.environ.setdefault("KEYSTONE_POLICY_MIN_BACKEND", "local")


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings as django_settings

    if django_settings.configured:
        django_settings.KEYSTONE_POLICY_MIN_BACKEND = os.environ["KEYSTONE_POLICY_MIN_BACKEND"]
        # The production hasher (PBKDF2, 1,000,000 rounds: ~0.3 s a password on this machine)
        # would cost minutes over the suite's users and logins, and no test is about its
        # strength. Servers the tests start as subprocesses keep the production hasher.
        django_settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _artifacts_in_tmp(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """Keep artifact blobs written by a test out of the developer's var/ directory."""
    if not request.config.pluginmanager.hasplugin("django"):
        yield
        return
    from django.conf import settings as django_settings

    if not django_settings.configured:
        yield
        return
    settings = request.getfixturevalue("settings")
    root = tmp_path / "artifacts"
    settings.KEYSTONE_ARTIFACT_ROOT = root
    settings.MEDIA_ROOT = root
    settings.STORAGES = {
        **django_settings.STORAGES,
        "default": {
            "BACKEND": django_settings.STORAGES["default"]["BACKEND"],
            "OPTIONS": {"location": root, "base_url": "/artifacts/"},
        },
    }
    yield


@pytest.fixture(scope="session")
def test_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis server of this test session's own, so the Celery tests never touch anyone
    else's data: redis-server on a free port, nothing kept on disk, stopped at the end.
    KEYSTONE_TEST_BROKER_URL names an explicit server instead."""
    explicit = os.environ.get("KEYSTONE_TEST_BROKER_URL")
    if explicit:
        yield explicit
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "the Celery tests need redis-server (Debian's redis-server package) "
            "or KEYSTONE_TEST_BROKER_URL pointing at a Redis they may use"
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    directory = tmp_path_factory.mktemp("redis")
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--dir", str(directory), "--logfile", str(directory / "redis.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
                connection.sendall(b"PING\r\n")
                if connection.recv(16).startswith(b"+PONG"):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            pytest.fail(f"redis-server did not start on port {port} (see {directory}/redis.log)")
        time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="alice", password="pw-alice-123")


@pytest.fixture
def other_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="bob", password="pw-bob-123")


@pytest.fixture
def project(db: None) -> Any:
    from evaluations.models import Project

    return Project.objects.create(name="Demo", slug="demo")


SPEC_SOURCE = """\
version: 1
id: refund-agent
task: {prompt: "Refund order 1042"}
agent: {type: command, command: "echo refunded"}
invariants:
  says_refunded:
    description: mentions the refund
    check: {type: contains, value: refunded}
"""


@pytest.fixture
def spec_version(project: Any, user: Any) -> Any:
    from evaluations.models import Spec, SpecVersion

    spec = Spec.objects.create(project=project, slug="refund-agent", name="Refund agent")
    return SpecVersion.objects.create(
        spec=spec,
        number=1,
        source_yaml=SPEC_SOURCE,
        parsed={"id": "refund-agent"},
        author=user,
    )


@pytest.fixture
def run(spec_version: Any, user: Any) -> Any:
    from evaluations.models import Run

    return Run.objects.create(
        project=spec_version.spec.project, spec_version=spec_version, created_by=user
    )


@pytest.fixture
def execution(run: Any) -> Any:
    from evaluations.models import Execution

    return Execution.objects.create(
        run=run, scenario="no-chaos", prompt_index=0, prompt="Refund order 1042", replica=0
    )
