"""`keystone` against a server's database the operator has not migrated: a clear message that
names the database and the command to run, exit 4, and no schema change behind the
operator's back (the SQLite file of the embedded default is migrated by the command itself:
tests/test_cli_startup.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from checks.exit_codes import EXIT_INTERNAL_ERROR
from tests.cli_helpers import embedded_env, run_keystone

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def empty_database() -> Iterator[str]:
    name = f"ks_unmigrated_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_run_against_an_unmigrated_server_database_says_how_to_set_it_up(
    empty_database: str, tmp_path: Path
) -> None:
    spec = tmp_path / "one.yaml"
    spec.write_text(
        "version: 1\nid: one\ntask: {prompts: [p]}\nagent: {type: command, command: 'true'}\n"
        "invariants:\n  completes: {description: it ran, check: {type: completes}}\n"
    )
    url = f"postgresql://postgres@127.0.0.1:5432/{empty_database}"
    done = run_keystone("run", str(spec), env=embedded_env(tmp_path, DATABASE_URL=url))
    assert done.returncode == EXIT_INTERNAL_ERROR, done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert f"the database '{empty_database}' on 127.0.0.1 is not set up" in done.stderr
    assert "admin.0001_initial" in done.stderr and "manage.py migrate" in done.stderr
    with psycopg.connect(url) as connection:  # nothing was created behind the operator
        tables = connection.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
    assert tables == (0,)
