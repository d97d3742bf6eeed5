"""The project's configuration: what the environment selects, checked in a fresh interpreter
(settings are read once per process), plus the health endpoint and the local static files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

PRINT_SETTINGS = """
import json
from django.conf import settings
from keystone_web.celery import app
db = settings.DATABASES["default"]
print(json.dumps({
    "engine": db["ENGINE"],
    "name": str(db["NAME"]),
    "host": db.get("HOST", ""),
    "debug": settings.DEBUG,
    "eager": settings.CELERY_TASK_ALWAYS_EAGER,
    "celery_eager": app.conf.task_always_eager,
    "acks_late": app.conf.task_acks_late,
    "prefetch": app.conf.worker_prefetch_multiplier,
    "soft_limit": app.conf.task_soft_time_limit,
    "hard_limit": app.conf.task_time_limit,
    "visibility": app.conf.broker_transport_options["visibility_timeout"],
    "artifacts": str(settings.STORAGES["default"]["OPTIONS"]["location"]),
    "allow_hooks": settings.KEYSTONE_ALLOW_PYTHON_HOOKS,
    "allow_host_scripts": settings.KEYSTONE_ALLOW_HOST_SCRIPTS,
}))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    # Only what a fresh shell has: no DATABASE_URL, broker, KEYSTONE_* from the test run.
    env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    env["DJANGO_SETTINGS_MODULE"] = "keystone_web.settings"
    env.update(extra)
    return env


def _settings_in_fresh_process(
    code: str = PRINT_SETTINGS, **env: str
) -> subprocess.CompletedProcess[str]:
    boot = "import django; django.setup()\n" + code
    return subprocess.run(
        [sys.executable, "-c", boot],
        cwd=REPO,
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _settings(**env: str) -> dict[str, Any]:
    done = _settings_in_fresh_process(**env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_no_environment_gives_the_embedded_default_sqlite_under_var() -> None:
    found = _settings()
    assert found["engine"] == "django.db.backends.sqlite3"
    assert Path(found["name"]) == REPO / "var" / "keystone.sqlite3"
    assert Path(found["artifacts"]) == REPO / "var" / "artifacts"
    assert found["debug"] is False  # production-grade unless asked for
    assert (REPO / "var").is_dir()


def test_no_broker_runs_tasks_in_process() -> None:
    found = _settings()
    assert found["eager"] is True
    assert found["celery_eager"] is True


def test_keystone_home_moves_database_and_artifacts(tmp_path: Path) -> None:
    home = tmp_path / "ks-home"
    found = _settings(KEYSTONE_HOME=str(home))
    assert Path(found["name"]) == home / "keystone.sqlite3"
    assert Path(found["artifacts"]) == home / "artifacts"
    assert home.is_dir()


def test_database_url_selects_postgresql(tmp_path: Path) -> None:
    found = _settings(
        KEYSTONE_HOME=str(tmp_path),
        DATABASE_URL="postgresql://postgres@127.0.0.1:5432/keystone",
    )
    assert found["engine"] == "django.db.backends.postgresql"
    assert found["name"] == "keystone"
    assert found["host"] == "127.0.0.1"


def test_broker_url_sends_tasks_to_workers_with_safe_delivery(tmp_path: Path) -> None:
    found = _settings(KEYSTONE_HOME=str(tmp_path), CELERY_BROKER_URL="redis://127.0.0.1:6379/15")
    assert found["eager"] is False
    assert found["celery_eager"] is False
    assert found["acks_late"] is True
    assert found["prefetch"] == 1
    assert found["soft_limit"] < found["hard_limit"] < found["visibility"]


def test_configured_redis_broker_is_reachable(tmp_path: Path) -> None:
    code = (
        "from keystone_web.celery import app\n"
        "with app.connection_for_write() as conn:\n"
        "    conn.ensure_connection(max_retries=1)\n"
        "    print(conn.transport_cls)\n"
    )
    done = _settings_in_fresh_process(
        code, KEYSTONE_HOME=str(tmp_path), CELERY_BROKER_URL="redis://127.0.0.1:6379/15"
    )
    assert done.returncode == 0, done.stderr
    assert "redis" in done.stdout


def test_security_switches_are_off_unless_enabled(tmp_path: Path) -> None:
    assert _settings(KEYSTONE_HOME=str(tmp_path))["allow_hooks"] is False
    enabled = _settings(
        KEYSTONE_HOME=str(tmp_path),
        KEYSTONE_ALLOW_PYTHON_HOOKS="true",
        KEYSTONE_ALLOW_HOST_SCRIPTS="1",
    )
    assert enabled["allow_hooks"] is True
    assert enabled["allow_host_scripts"] is True


def test_without_secret_key_one_is_made_once_per_home_and_kept(tmp_path: Path) -> None:
    code = "import django; from django.conf import settings; print(settings.SECRET_KEY)"
    first = _settings_in_fresh_process(code.split("; ", 1)[1], KEYSTONE_HOME=str(tmp_path))
    second = _settings_in_fresh_process(code.split("; ", 1)[1], KEYSTONE_HOME=str(tmp_path))
    assert first.returncode == 0, first.stderr
    key = first.stdout.strip().splitlines()[-1]
    assert len(key) >= 50 and "insecure" not in key
    assert second.stdout.strip().splitlines()[-1] == key  # sessions survive a restart
    stored = tmp_path / "secret_key"
    assert stored.read_text() == key and stored.stat().st_mode & 0o777 == 0o600
    other = _settings_in_fresh_process(code.split("; ", 1)[1], KEYSTONE_HOME=str(tmp_path / "b"))
    assert other.stdout.strip().splitlines()[-1] != key
    given = _settings(KEYSTONE_HOME=str(tmp_path), DEBUG="true", SECRET_KEY="s3cret-" * 8)
    assert given["debug"] is True


def test_malformed_boolean_is_reported_not_guessed(tmp_path: Path) -> None:
    done = _settings_in_fresh_process(KEYSTONE_HOME=str(tmp_path), DEBUG="maybe")
    assert done.returncode != 0
    assert "DEBUG='maybe' is not a boolean" in done.stderr


def test_a_negative_memory_limit_for_pool_processes_is_refused(tmp_path: Path) -> None:
    done = _settings_in_fresh_process(
        KEYSTONE_HOME=str(tmp_path), CELERY_WORKER_MAX_MEMORY_PER_CHILD="-5"
    )
    assert done.returncode != 0
    assert "CELERY_WORKER_MAX_MEMORY_PER_CHILD must be 0 (off) or more KiB" in done.stderr


@pytest.mark.embedded
@pytest.mark.django_db
def test_health_endpoint_reaches_the_database(client: Any) -> None:
    from django.db import connection

    response = client.get("/api/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": connection.vendor, "tasks": "in-process"}


@pytest.mark.django_db
def test_home_page_loads_htmx_from_this_server(client: Any) -> None:
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<script src="/static/vendor/htmx.min.js"' in html
    assert "X-CSRFToken" in html
    assert "unpkg.com" not in html and "cdn" not in html.lower()


@pytest.mark.parametrize("name", ["vendor/htmx.min.js", "vendor/plotly.min.js", "css/keystone.css"])
def test_front_end_libraries_are_served_locally(client: Any, name: str) -> None:
    response = client.get(f"/static/{name}")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert len(body) > 1000


PROBE_TASKS = """
from pathlib import Path

from celery import shared_task


@shared_task(name="keystone_probe.write")
def write(path, text):
    Path(path).write_text(text)
"""


@pytest.mark.slow
def test_real_worker_process_runs_a_task_sent_through_the_redis_broker(tmp_path: Path) -> None:
    (tmp_path / "keystone_probe.py").write_text(PROBE_TASKS)
    queue = f"probe-{tmp_path.name}"
    env = _clean_env(
        KEYSTONE_HOME=str(tmp_path / "home"),
        CELERY_BROKER_URL="redis://127.0.0.1:6379/15",
        PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}",
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "keystone_web", "worker", "-I", "keystone_probe"]
        + ["--pool=solo", "-Q", queue, "--without-mingle", "--without-gossip", "-l", "WARNING"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        target = tmp_path / "done.txt"
        send = (
            "from keystone_web.celery import app\n"
            f"app.send_task('keystone_probe.write', args=[{str(target)!r}, 'hello'], queue={queue!r})\n"
        )
        sent = subprocess.run(
            [sys.executable, "-c", "import django; django.setup()\n" + send],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sent.returncode == 0, sent.stderr
        deadline = time.monotonic() + 60
        while not target.exists() and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.2)
        assert worker.poll() is None, worker.stderr.read() if worker.stderr else ""
        assert target.read_text() == "hello"
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


@pytest.mark.django_db
def test_login_page_logs_a_user_in_and_out(client: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_user(username="carol", password="pw-carol-123")
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert 'name="password"' in page.content.decode()
    wrong = client.post("/accounts/login/", {"username": "carol", "password": "nope"})
    assert "didn't match" in wrong.content.decode()
    done = client.post("/accounts/login/", {"username": "carol", "password": "pw-carol-123"})
    assert done.status_code == 302
    # Signed in with no project yet: home sends carol to her (empty) project list.
    assert client.get("/")["Location"] == "/p/"
    client.post("/accounts/logout/")
    assert "Log in" in client.get("/").content.decode()


def test_a_key_file_left_empty_is_an_error_naming_it(tmp_path: Path) -> None:
    """What a process stopped between creating the key file and writing it left behind (the
    key file is now linked into place whole, so a new one never looks like this)."""
    (tmp_path / "secret_key").write_text("\n")
    done = _settings_in_fresh_process(
        "from django.conf import settings; print(settings.SECRET_KEY)", KEYSTONE_HOME=str(tmp_path)
    )
    assert done.returncode != 0
    assert f"{tmp_path / 'secret_key'} holds no key: delete it" in done.stderr


def test_processes_of_a_fresh_install_starting_together_share_one_key(tmp_path: Path) -> None:
    boot = "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
    starting = [
        subprocess.Popen(
            [sys.executable, "-c", boot],
            cwd=REPO,
            env=_clean_env(KEYSTONE_HOME=str(tmp_path)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    keys = {process.communicate(timeout=60)[0].strip().splitlines()[-1] for process in starting}
    assert len(keys) == 1
    key = keys.pop()
    assert len(key) >= 50 and (tmp_path / "secret_key").read_text() == key
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".secret_key")]
