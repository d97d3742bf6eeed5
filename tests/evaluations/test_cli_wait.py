"""Issue 20, item 4: `keystone run` on the workers never hangs a CI job: with no worker to
take the run, it gives up at --timeout, cancels the run and exits 4 saying so."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.db import connection

from evaluations.models import Run, RunStatus
from tests.cli_helpers import REPO_ROOT, run_keystone

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


def _spec_with_no_worker(tmp_path: Path, redis_url: str) -> tuple[Path, dict[str, str]]:
    """SPEC's file, and an environment whose `keystone run` hands it to workers sharing the
    test database, on a broker no worker listens to."""
    if connection.vendor != "postgresql":
        pytest.fail("this test shares the test database with a subprocess: run it on PostgreSQL")
    database = urlsplit(os.environ["DATABASE_URL"])
    database_url = urlunsplit(database._replace(path="/" + settings.DATABASES["default"]["NAME"]))
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=redis_url.rsplit("/", 1)[0] + "/13",  # no worker listens
        KEYSTONE_HOME=str(tmp_path / "home"),
        NO_COLOR="1",
    )
    return spec, env


def test_keystone_run_gives_up_at_its_timeout_and_cancels_the_run(
    tmp_path: Path, test_redis_url: str
) -> None:
    spec, env = _spec_with_no_worker(tmp_path, test_redis_url)
    done = run_keystone("run", str(spec), "--timeout", "3", env=env, timeout=120)
    assert done.returncode == 4, done.stderr
    assert "did not finish within 3 s; it was cancelled" in done.stderr
    assert Run.objects.get().status == RunStatus.CANCELLED


def test_ctrl_c_while_keystone_run_follows_the_workers_cancels_the_run(
    tmp_path: Path, test_redis_url: str
) -> None:
    """Ctrl-C cancels the run when it runs in `keystone run`'s own processes, and with
    --remote; handed to the workers, it left the run to go on (here: pending for good)."""
    import signal
    import subprocess
    import sys
    import time

    spec, env = _spec_with_no_worker(tmp_path, test_redis_url)
    process = subprocess.Popen(
        [sys.executable, "-m", "evaluations.cli", "run", str(spec), "--timeout", "300"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not Run.objects.exists():  # handed to the workers: the command now follows it
        assert time.monotonic() < deadline and process.poll() is None, "no run was made"
        time.sleep(0.2)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 4 and "interrupted" in err, err
    assert Run.objects.get().status == RunStatus.CANCELLED


def _throwaway_postgres(directory: Path) -> tuple[list[str], str]:
    """initdb + pg_ctl on a free port, owned by `postgres` when this runs as root; the
    pg_ctl command prefix and the server's URL."""
    import socket
    import subprocess

    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not binaries:
        pytest.fail("this test starts a PostgreSQL of its own: install Debian's postgresql")
    bin_dir = binaries[-1].parent
    owner = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    if owner:
        shutil.chown(directory, "postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = directory / "data"
    subprocess.run([*owner, bin_dir / "initdb", "-D", data, "-U", "postgres", "-A", "trust"],
                   check=True, capture_output=True)  # fmt: skip
    pg_ctl = [*owner, str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-l", str(directory / "log")]
    options = f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run([*pg_ctl, "-o", options, "start"], check=True, capture_output=True)
    return [*pg_ctl, "-o", options], f"postgresql://postgres@127.0.0.1:{port}/postgres"


def _run_rows(url: str) -> int:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM evaluations_run").fetchone()
            return int(row[0]) if row else 0
    except psycopg.Error:
        return 0


def test_keystone_run_waits_out_a_database_restart(tmp_path: Path, test_redis_url: str) -> None:
    """The database restarted while `keystone run` follows its run: it says it waits and goes
    on (here until its --timeout, as no worker takes the run), never 'internal error'."""
    import subprocess
    import sys
    import time

    # Not under tmp_path: its parents are root's alone, and the server runs as `postgres`.
    cluster = Path(tempfile.mkdtemp(prefix="keystone-pg-"))
    pg_ctl, url = _throwaway_postgres(cluster)
    try:
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC)
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env.update(
            DATABASE_URL=url,
            CELERY_BROKER_URL=test_redis_url.rsplit("/", 1)[0] + "/12",
            KEYSTONE_HOME=str(tmp_path / "home"),
            NO_COLOR="1",
        )
        root = Path(__file__).resolve().parents[2]
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=root, env=env,
                       check=True, capture_output=True)  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "evaluations.cli", "run", str(spec), "--timeout", "25"],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Restart only once the run exists (the command then follows it, polling every
        # 0.5 s), and stay down for longer than a poll: on a loaded machine the command
        # may take seconds to start, and a quicker restart could go unseen.
        deadline = time.monotonic() + 60
        while not _run_rows(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        subprocess.run([*pg_ctl, "-m", "fast", "stop"], check=True, capture_output=True)
        time.sleep(3)
        subprocess.run([*pg_ctl, "start"], check=True, capture_output=True)
        out, err = process.communicate(timeout=120)
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], check=False, capture_output=True)
        shutil.rmtree(cluster, ignore_errors=True)
    assert "internal error" not in err, err
    assert "database unavailable" in err and "; waiting" in err  # the restart was seen
    assert process.returncode == 4, err
    assert "did not finish within 25 s; it was cancelled" in err
