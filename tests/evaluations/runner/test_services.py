"""ServiceSet as the harness uses it: the agent's environment, errors, the audit, and the
`sql` / `http_mock_assertions` checks run on the real handles."""

from __future__ import annotations

import json
import threading
import time
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
from evaluations.runner.databases import database_created_at, database_name, sweep_stale_databases
from evaluations.runner.services import ServiceError, ServiceSet, env_prefix

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MYSQL_URL = "mysql://root@127.0.0.1:3306/"

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


def test_stale_databases_left_by_a_killed_worker_are_swept(tmp_path: Path) -> None:
    key = "sweep" + uuid.uuid4().hex[:8]
    old = database_name(key, "db", now=time.time() - 2 * 86400)
    assert database_created_at(old) == pytest.approx(time.time() - 2 * 86400, abs=2)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{old}"')
    mysql = pymysql.connect(host="127.0.0.1", user="root", autocommit=True)
    with mysql.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE `{old}`")
    try:
        with _service_set([{"name": "db", "type": "postgres"}], tmp_path, key) as live:
            dropped = sweep_stale_databases(
                postgres_url=PG_URL, mysql_url=MYSQL_URL, older_than=3600
            )
            assert dropped.count(old) == 2  # once on each server
            assert live.handles["db"].query("SELECT 1") == [(1,)]  # the fresh one survives
            with mysql.cursor() as cursor:
                cursor.execute("SHOW DATABASES LIKE %s", (f"%{key}%",))
                assert cursor.fetchall() == ()
    finally:
        mysql.close()
    assert database_created_at("ks_someone_elses") is None
