"""sql against real SQLite and PostgreSQL databases; http_mock_assertions against a real HTTP
server on 127.0.0.1 that records what it receives."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.request
import uuid
from urllib.parse import urlsplit

import psycopg
import pytest

from checks.context import CheckContext
from checks.results import FailureCode
from tests.http_peer import HttpPeer, PeerHandler

# --- SQL -----------------------------------------------------------------------------------


class SqliteService:
    type = "sqlite"

    def __init__(self, name, path):
        self.name = name
        self.path = path

    def query(self, sql):
        with sqlite3.connect(self.path) as conn:
            return conn.execute(sql).fetchall()

    def recorded_requests(self):
        return []

    def describe(self):
        return {"type": self.type, "path": str(self.path)}


class PostgresService:
    type = "postgres"

    def __init__(self, name, dsn):
        self.name = name
        self.dsn = dsn

    def query(self, sql):
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(sql).fetchall()

    def recorded_requests(self):
        return []

    def describe(self):
        return {"type": self.type, "dsn": self.dsn}


@pytest.fixture
def sqlite_db(tmp_path):
    path = tmp_path / "db.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            """
            CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id INTEGER, amount REAL, status TEXT);
            INSERT INTO refunds (order_id, amount, status) VALUES (1042, 12.5, 'issued');
            """
        )
    return CheckContext(services={"db": SqliteService("db", path)})


@pytest.fixture
def postgres_db():
    name = f"keystone_checks_{uuid.uuid4().hex[:10]}"
    admin = "host=127.0.0.1 user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = f"host=127.0.0.1 user=postgres dbname={name}"
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE refunds (id serial PRIMARY KEY, order_id int, amount numeric(10,2), status text, ok boolean)"
        )
        conn.execute(
            "INSERT INTO refunds (order_id, amount, status, ok) VALUES (1042, 12.50, 'issued', true)"
        )
    try:
        yield CheckContext(services={"db": PostgresService("db", dsn)})
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _sql(query, equals):
    return {"type": "sql", "service": "db", "query": query, "equals": equals}


def test_sqlite_count_equals(run_check, sqlite_db):
    assert run_check(
        _sql("SELECT count(*) FROM refunds WHERE order_id = 1042", 1), context=sqlite_db
    ).passed


def test_sqlite_mismatch_names_both_values(run_check, sqlite_db):
    outcome = run_check(_sql("SELECT count(*) FROM refunds", 0), context=sqlite_db)
    assert outcome.failure_code is FailureCode.SQL_MISMATCH
    assert outcome.message == "query on 'db' returned 1, expected 0"
    assert outcome.details["actual"] == 1


def test_sqlite_numbers_compare_numerically_and_text_as_text(run_check, sqlite_db):
    assert run_check(_sql("SELECT amount FROM refunds", "12.50"), context=sqlite_db).passed
    assert run_check(_sql("SELECT amount FROM refunds", 12.5), context=sqlite_db).passed
    assert run_check(_sql("SELECT status FROM refunds", "issued"), context=sqlite_db).passed
    assert not run_check(_sql("SELECT status FROM refunds", "Issued"), context=sqlite_db).passed


def test_sqlite_no_rows_is_mismatch(run_check, sqlite_db):
    outcome = run_check(_sql("SELECT id FROM refunds WHERE order_id = 1", 1), context=sqlite_db)
    assert outcome.failure_code is FailureCode.SQL_MISMATCH
    assert "no rows" in outcome.message


def test_sql_error_and_missing_service_are_check_errors(run_check, sqlite_db):
    outcome = run_check(_sql("SELECT nope FROM missing_table", 1), context=sqlite_db)
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "no such table" in outcome.message
    outcome = run_check({**_sql("SELECT 1", 1), "service": "warehouse"}, context=sqlite_db)
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "service 'warehouse' is not defined" in outcome.message
    outcome = run_check({"type": "sql", "service": "db", "query": "SELECT 1"}, context=sqlite_db)
    assert outcome.failure_code is FailureCode.CHECK_ERROR


def test_postgres_numeric_boolean_and_text(run_check, postgres_db):
    assert run_check(
        _sql("SELECT amount FROM refunds", 12.5), context=postgres_db
    ).passed  # Decimal('12.50')
    assert run_check(_sql("SELECT count(*) FROM refunds", "1"), context=postgres_db).passed
    assert run_check(_sql("SELECT ok FROM refunds", True), context=postgres_db).passed
    assert run_check(_sql("SELECT NULL", None), context=postgres_db).passed
    outcome = run_check(_sql("SELECT status FROM refunds", "pending"), context=postgres_db)
    assert outcome.failure_code is FailureCode.SQL_MISMATCH
    assert outcome.message == "query on 'db' returned 'issued', expected 'pending'"


def test_postgres_query_error_is_check_error(run_check, postgres_db):
    outcome = run_check(_sql("SELECT * FROM no_such_table", 0), context=postgres_db)
    assert outcome.failure_code is FailureCode.CHECK_ERROR
    assert "no_such_table" in outcome.message


# --- HTTP mock -----------------------------------------------------------------------------


class RecordingMock(HttpPeer):
    """A real HTTP server on 127.0.0.1 that answers 202 and records every request."""

    type = "http_mock"

    def __init__(self, name):
        self.name = name
        self.requests = []
        recorder = self

        class Handler(PeerHandler):
            def _record(self):
                parts = urlsplit(self.path)
                recorder.requests.append(
                    {
                        "method": self.command,
                        "path": parts.path,
                        "query": parts.query,
                        "headers": dict(self.headers.items()),
                        "body": self.read_body().decode(),
                        "time": time.time(),
                    }
                )
                self.send_response(202)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = do_PUT = _record

        super().__init__(Handler)

    def send(self, method, path, body=None, headers=None):
        data = (
            json.dumps(body).encode()
            if isinstance(body, dict)
            else (body.encode() if body else None)
        )
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers=headers or {}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 202

    def query(self, sql):
        raise NotImplementedError

    def recorded_requests(self):
        return list(self.requests)

    def describe(self):
        return {"type": self.type, "url": self.url}


@pytest.fixture
def smtp():
    with RecordingMock("smtp") as mock:
        yield mock


def _http(*assertions):
    return {"type": "http_mock_assertions", "service": "smtp", "assertions": list(assertions)}


def test_request_count_with_filters_and_body_contains(run_check, smtp):
    smtp.send("GET", "/health")
    smtp.send(
        "POST",
        "/api/messages",
        {"to": "finance@co", "subject": "Your renewal"},
        {"Content-Type": "application/json", "X-Api-Key": "k1"},
    )
    context = CheckContext(services={"smtp": smtp})
    config = _http(
        {
            "field": "request_count",
            "filters": {"method": "post", "path": "/api/messages"},
            "equals": 1,
        },
        {"field": "last_request.body", "contains": "renewal"},
        {"field": "last_request.headers", "contains": {"x-api-key": "k1"}},
        {"field": "request_count", "filters": {"headers": {"x-api-key": "k1"}}, "equals": 1},
        {"field": "request_count", "filters": {"to": "finance@co"}, "equals": 1},
        {"field": "requests[0].body", "equals": ""},
        {"field": "requests[1].body", "equals": {"subject": "Your renewal", "to": "finance@co"}},
        {"field": "requests[1].body", "contains": {"to": "finance@co"}},
        {"field": "requests[1]", "contains": {"method": "POST", "path": "/api/messages"}},
    )
    outcome = run_check(config, context=context)
    assert outcome.passed, outcome.message
    assert outcome.details["recorded_requests"] == 2


def test_json_body_equals_ignores_formatting(run_check, smtp):
    smtp.send("POST", "/api/messages", '{"a":1,"b":[1,2]}', {"Content-Type": "application/json"})
    context = CheckContext(services={"smtp": smtp})
    assert run_check(
        _http({"field": "last_request.body", "equals": '{"b": [1, 2], "a": 1}'}), context=context
    ).passed
    assert not run_check(
        _http({"field": "last_request.body", "equals": {"a": 2, "b": [1, 2]}}), context=context
    ).passed


def test_failed_assertion_message_names_field_and_values(run_check, smtp):
    smtp.send("POST", "/api/messages", {"to": "a@b"})
    smtp.send("POST", "/api/messages", {"to": "c@d"})
    context = CheckContext(services={"smtp": smtp})
    outcome = run_check(
        _http({"field": "request_count", "filters": {"method": "POST"}, "equals": 1}),
        context=context,
    )
    assert outcome.failure_code is FailureCode.HTTP_ASSERTION_FAILED
    assert outcome.message == 'smtp: request_count {"method": "POST"} is 2, expected 1'
    assert outcome.score == 0.0


def test_missing_request_index_is_a_failure_not_a_crash(run_check, smtp):
    context = CheckContext(services={"smtp": smtp})
    outcome = run_check(_http({"field": "requests[3].body", "contains": "x"}), context=context)
    assert outcome.failure_code is FailureCode.HTTP_ASSERTION_FAILED
    assert "no matching request" in outcome.message
    smtp.send("POST", "/x", "hi")
    outcome = run_check(_http({"field": "requests[3].body", "contains": "x"}), context=context)
    assert "requests[3] does not exist: 1 matching request(s)" in outcome.message


def test_header_name_case_insensitive_in_equals_and_filters(run_check, smtp):
    smtp.send("POST", "/x", "hi", {"X-Trace": "abc"})
    context = CheckContext(services={"smtp": smtp})
    assert run_check(
        _http({"field": "request_count", "filters": {"headers": {"X-TRACE": "abc"}}, "equals": 1}),
        context=context,
    ).passed
    assert run_check(
        _http({"field": "last_request.headers", "contains": {"X-Trace": "abc"}}), context=context
    ).passed
    # Issue 12, item 17: a header *name* as a string, as examples/specs/refund-agent.yaml
    # writes it ("Content-Type"), whatever case the client sent it in.
    for field in ("last_request.headers", "requests[0].headers"):
        for name in ("X-Trace", "x-trace", "X-TRACE"):
            outcome = run_check(_http({"field": field, "contains": name}), context=context)
            assert outcome.passed, outcome.message
    assert not run_check(
        _http({"field": "last_request.headers", "contains": "X-Other"}), context=context
    ).passed


def test_http_bad_configuration(run_check, smtp):
    context = CheckContext(services={"smtp": smtp})
    cases = [
        _http({"field": "response_code", "equals": 1}),
        _http({"field": "request_count"}),
        _http({"field": "request_count", "equals": 1, "contains": 1}),
        {"type": "http_mock_assertions", "service": "smtp", "assertions": []},
        {
            "type": "http_mock_assertions",
            "service": "mailer",
            "assertions": [{"field": "request_count", "equals": 0}],
        },
    ]
    for config in cases:
        outcome = run_check(config, context=context)
        assert outcome.failure_code is FailureCode.CHECK_ERROR, config
