"""The throwaway PostgreSQL cluster of a Keystone with no KEYSTONE_POSTGRES_URL (issue 19)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from evaluations.runner import local_postgres

pytestmark = pytest.mark.slow

# A process that starts its cluster and is SIGKILLed: its exit handlers never run.
KILLED = """
import os, signal
from evaluations.runner.local_postgres import local_postgres_url
print(local_postgres_url(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_process_cluster_is_stopped_and_deleted_by_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", KILLED], capture_output=True, text=True, timeout=120
    )
    orphan_url = child.stdout.strip()
    assert orphan_url.startswith("postgresql://"), child.stderr
    with psycopg.connect(orphan_url, connect_timeout=5) as connection:  # still running
        assert connection.execute("SELECT 1").fetchone() == (1,)
    port = orphan_url.rsplit(":", 1)[1].split("/")[0]
    root = Path(local_postgres.tempfile.gettempdir())
    (orphan,) = [d for d in root.glob("keystone-pg-*") if (d / f".s.PGSQL.{port}").exists()]

    monkeypatch.setattr(local_postgres, "_url", None)
    url = local_postgres.local_postgres_url()
    try:
        with psycopg.connect(url, connect_timeout=5, autocommit=True) as connection:
            connection.execute("CREATE DATABASE ks_probe")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(orphan_url, connect_timeout=3)
        assert not orphan.exists()
    finally:
        monkeypatch.setattr(local_postgres, "_url", None)


def test_a_directory_another_user_planted_is_not_taken_for_a_dead_process_cluster(
    tmp_path: Path,
) -> None:
    """Anyone may write in the temporary directory: a `keystone-pg-*` directory of another
    user's, naming a dead process, was chowned, "stopped" with `pg_ctl` (which signals the
    pid in the directory's postmaster.pid, as the cluster user) and deleted, as root."""
    if os.getuid() != 0:
        pytest.skip("only root can give the planted directory to another user")
    binaries = local_postgres.postgres_bin()
    assert binaries is not None, "this machine has PostgreSQL's binaries (CI installs them)"
    ended = subprocess.Popen(["true"])
    ended.wait()
    planted = Path(tempfile.mkdtemp(prefix=local_postgres.PREFIX))
    try:
        (planted / local_postgres.OWNER_FILE).write_text(str(ended.pid))
        for path in (planted, planted / local_postgres.OWNER_FILE):
            os.chown(path, 65534, 65534)
        local_postgres._sweep_orphans(binaries)
        assert planted.exists() and planted.stat().st_uid == 65534
    finally:
        shutil.rmtree(planted, ignore_errors=True)
