"""ServiceSet as the harness uses it: the agent's environment, errors, the audit, and the
`sql` / `http_mock_assertions` checks run on the real handles."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from checks.artifact import RunArtifact
from checks.context import CheckContext
from checks.engine import evaluate_invariant
from checks.forbidden import evaluate_forbidden
from checks.results import FailureCode
from checks.spec.model import Invariant
from evaluations.runner import databases
from evaluations.runner.databases import (
    MysqlService,
    PostgresService,
    Seed,
    database_name,
    drop_orphaned_databases,
)
from evaluations.runner.services import ServiceError, ServiceSet, env_prefix

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MYSQL_URL = "mysql://root@127.0.0.1:3306/"
REPO_ROOT = Path(__file__).resolve().parents[3]

SPEC_SERVICES: list[dict[str, Any]] = [
    {
        "name": "db",
        "type": "postgres",
        "sql": "CREATE TABLE refunds (order_id int, amount numeric(8,2), status text);"
        " CREATE TABLE customers (id int, email text); INSERT INTO customers VALUES (1042, 'a@b.c');",
    },
    {
        "name": "smtp",
        "type": "http_mock",
        "record": True,
        "routes": [
            {"method": "POST", "path": "/api/messages", "status": 202, "response": {"id": "m1"}}
        ],
    },
]


def _service_set(services: list[dict[str, Any]], tmp_path: Path, key: str = "exec") -> ServiceSet:
    return ServiceSet(
        services,
        spec_dir=tmp_path,
        execution_key=key,
        postgres_url=PG_URL,
        mysql_url=MYSQL_URL,
        sqlite_dir=tmp_path / ".keystone",
    )


def _agent_refunds_and_mails(env: dict[str, str]) -> None:
    """What a well-behaved refund agent does with the addresses it was given."""
    with psycopg.connect(env["KEYSTONE_SERVICE_DB_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO refunds VALUES (1042, 19.99, 'issued')")
    body = json.dumps({"to": "a@b.c", "subject": "Refund issued", "order": 1042}).encode()
    request = urllib.request.Request(
        env["KEYSTONE_SERVICE_SMTP_URL"] + "/api/messages",
        data=body,
        headers={"Content-Type": "application/json", "X-Api-Key": "test"},
    )
    urllib.request.urlopen(request, timeout=5).read()


def _invariant(check: dict[str, Any]) -> Invariant:
    return Invariant.from_dict("inv", {"description": "d", "check": check})


def test_env_names_every_service_for_the_agent(tmp_path: Path) -> None:
    services = [
        *SPEC_SERVICES,
        {"name": "cache-db", "type": "sqlite", "sql": "CREATE TABLE k (v text);"},
    ]
    with _service_set(services, tmp_path) as started:
        env = started.env
        assert set(env) == {
            "KEYSTONE_SERVICE_DB_URL",
            "KEYSTONE_SERVICE_DB_DSN",
            "KEYSTONE_SERVICE_SMTP_URL",
            "KEYSTONE_SERVICE_CACHE_DB_URL",
            "KEYSTONE_SERVICE_CACHE_DB_DSN",
            "KEYSTONE_SERVICE_CACHE_DB_PATH",
        }
        assert env["KEYSTONE_SERVICE_SMTP_URL"].startswith("http://127.0.0.1:")
        assert set(started.handles) == {"db", "smtp", "cache-db"}
        assert started.handles["db"].describe()["dsn"] == env["KEYSTONE_SERVICE_DB_DSN"]
    assert env_prefix("my-mock") == "KEYSTONE_SERVICE_MY_MOCK_"


def test_unknown_type_and_duplicate_names_fail_before_anything_starts(tmp_path: Path) -> None:
    with (
        pytest.raises(ServiceError) as unknown,
        _service_set([{"name": "q", "type": "redis"}], tmp_path),
    ):
        pass
    assert unknown.value.service == "q" and "unknown service type 'redis'" in unknown.value.message

    twice = [{"name": "db", "type": "sqlite"}, {"name": "db", "type": "http_mock"}]
    with (
        pytest.raises(ServiceError, match="two services have this name"),
        _service_set(twice, tmp_path),
    ):
        pass


def test_mysql_without_a_configured_server_is_a_clear_service_error(tmp_path: Path) -> None:
    services = ServiceSet(
        [{"name": "legacy", "type": "mysql"}],
        spec_dir=tmp_path,
        execution_key="k",
        postgres_url=PG_URL,
        mysql_url=None,
        sqlite_dir=tmp_path,
    )
    with pytest.raises(ServiceError) as caught, services:
        pass
    assert "set KEYSTONE_MYSQL_URL" in caught.value.message


def test_unreachable_server_is_a_service_error_and_stops_the_mock_already_started(
    tmp_path: Path,
) -> None:
    services = ServiceSet(
        [SPEC_SERVICES[1], {"name": "db", "type": "postgres"}],
        spec_dir=tmp_path,
        execution_key="k",
        postgres_url="postgresql://postgres@127.0.0.1:1/postgres",  # nothing listens on port 1
        mysql_url=None,
        sqlite_dir=tmp_path,
    )
    with pytest.raises(ServiceError) as caught, services:
        pass
    assert caught.value.service == "db"
    assert "postgres could not start" in caught.value.message
    # The mock started before the database failed is stopped again: no server thread is left.
    assert not [t for t in threading.enumerate() if t.name == "http_mock-smtp" and t.is_alive()]


def test_sql_and_http_mock_checks_pass_on_what_the_agent_really_did(tmp_path: Path) -> None:
    with _service_set(SPEC_SERVICES, tmp_path) as services:
        _agent_refunds_and_mails(services.env)
        context = CheckContext(workspace=tmp_path, services=services.handles)
        artifact = RunArtifact(final_output="Refund issued.")
        results = [
            evaluate_invariant(
                _invariant(
                    {
                        "type": "sql",
                        "service": "db",
                        "query": "SELECT amount FROM refunds WHERE order_id = 1042",
                        "equals": 19.99,
                    }
                ),
                artifact,
                context,
            ),
            evaluate_invariant(
                _invariant(
                    {
                        "type": "http_mock_assertions",
                        "service": "smtp",
                        "assertions": [
                            {
                                "field": "request_count",
                                "filters": {"method": "POST", "path": "/api/*"},
                                "equals": 1,
                            },
                            {
                                "field": "last_request.body",
                                "contains": {"to": "a@b.c", "order": 1042},
                            },
                            {"field": "last_request.headers", "contains": {"x-api-key": "test"}},
                            {"field": "requests[0].body", "contains": "Refund issued"},
                        ],
                    }
                ),
                artifact,
                context,
            ),
        ]
    assert [(r.passed, r.failure_code) for r in results] == [(True, None), (True, None)], [
        r.message for r in results
    ]


def test_sql_and_http_mock_checks_fail_when_the_agent_did_nothing(tmp_path: Path) -> None:
    with _service_set(SPEC_SERVICES, tmp_path) as services:
        context = CheckContext(workspace=tmp_path, services=services.handles)
        artifact = RunArtifact()
        sql = evaluate_invariant(
            _invariant(
                {
                    "type": "sql",
                    "service": "db",
                    "query": "SELECT count(*) FROM refunds",
                    "equals": 1,
                }
            ),
            artifact,
            context,
        )
        http = evaluate_invariant(
            _invariant(
                {
                    "type": "http_mock_assertions",
                    "service": "smtp",
                    "assertions": [{"field": "request_count", "equals": 1}],
                }
            ),
            artifact,
            context,
        )
    assert (sql.passed, sql.failure_code) == (False, FailureCode.SQL_MISMATCH)
    assert (http.passed, http.failure_code) == (False, FailureCode.HTTP_ASSERTION_FAILED)


def test_http_mock_assertions_on_a_mock_without_record_is_a_check_error(tmp_path: Path) -> None:
    quiet = {**SPEC_SERVICES[1], "record": False}
    with _service_set([quiet], tmp_path) as services:
        result = evaluate_invariant(
            _invariant(
                {
                    "type": "http_mock_assertions",
                    "service": "smtp",
                    "assertions": [{"field": "request_count", "equals": 0}],
                }
            ),
            RunArtifact(),
            CheckContext(services=services.handles),
        )
    assert result.failure_code == FailureCode.CHECK_ERROR
    assert "record: true" in result.message


def test_audit_feeds_the_forbidden_rules(tmp_path: Path) -> None:
    with _service_set(SPEC_SERVICES, tmp_path) as services:
        _agent_refunds_and_mails(services.env)
        with psycopg.connect(services.env["DATABASE_URL"], autocommit=True) as conn:
            conn.execute("DELETE FROM customers")  # the agent overreaches
        artifact = RunArtifact(http_calls=services.http_log(), db_writes=services.db_writes())
    assert [(c.service, c.method, c.path) for c in artifact.http_calls] == [
        ("smtp", "POST", "/api/messages")
    ]
    assert {w["table"]: w["change"] for w in artifact.db_writes} == {
        "refunds": "inserted",
        "customers": "deleted",
    }
    violations = evaluate_forbidden(
        {"db_writes_outside": ["refunds"], "http_except": ["smtp"]}, artifact
    )
    assert [v["rule"] for v in violations] == ["db_writes_outside"]
    assert "customers" in violations[0]["message"]


# Makes a database on each server, as an execution does, prints their names, then waits to
# be killed; with "fork", a forked child of it ends first (its copy of the sessions must not
# end the parent's, whose locks would go with them).
HOLDER = f"""
import os, sys, time
from evaluations.runner.databases import MysqlService, PostgresService, Seed, database_name
key = sys.argv[1]
services = [
    PostgresService("db", Seed(), server_url="{PG_URL}", database=database_name(key, "db")),
    MysqlService("db", Seed(), server_url="{MYSQL_URL}", database=database_name(key, "db")),
]
for service in services:
    service.start()
if sys.argv[2] == "fork":
    if os.fork() == 0:
        sys.exit(0)
    os.wait()
print(" ".join(service.database for service in services), flush=True)
time.sleep(600)
"""


def _holder(key: str, how: str) -> tuple[subprocess.Popen[str], list[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, key, how],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    return process, process.stdout.readline().split()


def _mysql(statement: str, *args: str) -> tuple[Any, ...]:
    mysql = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    try:
        with mysql.cursor() as cursor:
            cursor.execute(statement, args or None)
            return tuple(cursor.fetchall())
    finally:
        mysql.close()


def _on_the_servers(key: str) -> list[str]:
    """The databases and logins named after `key` on both servers, and the MySQL logins of
    those databases."""
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        found = [
            f"pg:{kind}:{name}"
            for kind, name in admin.execute(
                "SELECT 'db', datname FROM pg_database WHERE datname LIKE %s"
                " UNION SELECT 'role', rolname FROM pg_roles WHERE rolname LIKE %s",
                (f"%{key}%", f"%{key}%"),
            ).fetchall()
        ]
    databases = [str(row[0]) for row in _mysql("SHOW DATABASES LIKE %s", f"%{key}%")]
    users = {str(row[0]) for row in _mysql("SELECT user FROM mysql.user")}
    found += [f"mysql:db:{name}" for name in databases]
    found += [f"mysql:user:{name}" for name in databases if "ks_u_" + name[-13:] in users]
    return sorted(found)


def _names_of(live: ServiceSet) -> set[str]:
    return {handle.database for handle in live.handles.values()}


def test_the_databases_of_a_process_that_was_killed_are_dropped(tmp_path: Path) -> None:
    """A worker killed mid-execution (kill -9, the OOM killer) left its databases and logins
    on the shared servers for good: the sweep meant for them was never called, and it went by
    age, which would have dropped a long execution's database under it. Each process now
    holds a lock per database in a session of its own, which the server lets go when the
    process dies; the next process to make a database drops those whose lock is free, and
    only those of Keystone's naming."""
    dead_key, live_key, own_key = ("held" + uuid.uuid4().hex[:8] for _ in range(3))
    killed, killed_databases = _holder(dead_key, "wait")
    living, living_databases = _holder(live_key, "fork")
    # A role and a MySQL login whose database was never made: their process died between.
    half_made = database_name(dead_key, "half")
    half_made_login = MysqlService.user_for(half_made)
    foreign = "ks_someone_elses_" + uuid.uuid4().hex[:8]
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{half_made}"')
        admin.execute(f'CREATE DATABASE "{foreign}"')
    _mysql(f"CREATE USER '{half_made_login}'@'%'")
    try:
        assert len(_on_the_servers(dead_key)) == 5  # two databases, two logins, the role
        killed.kill()
        killed.wait()
        # This test process may have made databases in the last 30 s: its next look is due.
        databases._looks.forget()
        own = [{"name": "db", "type": "postgres"}, {"name": "my", "type": "mysql"}]
        with _service_set(own, tmp_path, own_key) as live:
            # Its first database on each server dropped the killed process's.
            assert _on_the_servers(dead_key) == []
            assert _mysql("SELECT user FROM mysql.user WHERE user = %s", half_made_login) == ()
            assert len(_on_the_servers(live_key)) == 4
            dropped = drop_orphaned_databases(postgres_url=PG_URL, mysql_url=MYSQL_URL)
            assert not set(dropped) & {*living_databases, *_names_of(live)}
            assert live.handles["db"].query("SELECT 1") == [(1,)]
            assert live.handles["my"].query("SELECT 1") == [(1,)]
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            assert admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (foreign,)
            ).fetchall() == [(1,)]
        living.kill()
        living.wait()
        dropped = drop_orphaned_databases(postgres_url=PG_URL, mysql_url=MYSQL_URL)
        assert set(living_databases) <= set(dropped)
        assert _on_the_servers(live_key) == []
    finally:
        for process in (killed, living):
            process.kill()
            process.wait()
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{foreign}"')
            admin.execute(f'DROP ROLE IF EXISTS "{half_made}"')
        _mysql(f"DROP USER IF EXISTS '{half_made_login}'@'%'")


def test_a_process_whose_lock_session_ended_takes_its_locks_again(tmp_path: Path) -> None:
    """The server ended the session holding this process's locks (a restart, an operator's
    pg_terminate_backend): the locks went with it, and another process would have dropped
    this one's databases in use. The next database takes them all again, in a new session."""
    key = "again" + uuid.uuid4().hex[:8]
    first = PostgresService("db", Seed(), server_url=PG_URL, database=database_name(key, "a"))
    second = PostgresService("db", Seed(), server_url=PG_URL, database=database_name(key, "b"))
    try:
        first.start()
        keeper = databases._KEEPERS._sessions[("postgres", PG_URL)]
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (keeper.info.backend_pid,))
        second.start()
        assert not set(drop_orphaned_databases(postgres_url=PG_URL, mysql_url=None)) & {
            first.database,
            second.database,
        }
        assert first.query("SELECT 1") == [(1,)] and second.query("SELECT 1") == [(1,)]
    finally:
        first.stop()
        second.stop()
