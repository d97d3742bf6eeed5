"""Database services against the real PostgreSQL and MariaDB of this machine, and SQLite files."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
import pymysql
import pytest

from evaluations.runner.databases import database_name
from evaluations.runner.services import ServiceError, ServiceSet, ServiceTypeError

PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MYSQL_URL = "mysql://root@127.0.0.1:3306/"

SEED = """
CREATE TABLE customers (id int PRIMARY KEY, name varchar(50));
INSERT INTO customers VALUES (1, 'Ada'), (2, 'Grace');
CREATE TABLE orders (id int PRIMARY KEY, customer_id int, total int);
INSERT INTO orders VALUES (10, 1, 100);
CREATE TABLE audit (id int);
"""


def _key() -> str:
    return "t" + uuid.uuid4().hex[:12]


def _service_set(
    services: list[dict[str, Any]], tmp_path: Path, key: str | None = None
) -> ServiceSet:
    return ServiceSet(
        services,
        spec_dir=tmp_path,
        execution_key=key or _key(),
        postgres_url=PG_URL,
        mysql_url=MYSQL_URL,
        sqlite_dir=tmp_path / ".keystone",
    )


def _pg_databases(fragment: str) -> list[str]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"%{fragment}%",)
        ).fetchall()
    return [row[0] for row in rows]


def _mysql_connect(database: str | None = None) -> pymysql.connections.Connection[Any]:
    return pymysql.connect(
        host="127.0.0.1", port=3306, user="root", database=database, autocommit=True
    )


def _mysql_databases(fragment: str) -> list[str]:
    conn = _mysql_connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW DATABASES LIKE %s", (f"%{fragment}%",))
            return [row[0] for row in cursor.fetchall()]
    finally:
        conn.close()


def _mysql_agent(dsn: str) -> pymysql.connections.Connection[Any]:
    """Connect the way an agent would: from the DSN it was given."""
    rest = dsn.removeprefix("mysql://")
    credentials, location = rest.split("@", 1)
    hostport, database = location.split("/", 1)
    host, port = hostport.split(":")
    user, password = (unquote(part) for part in credentials.split(":", 1))
    return pymysql.connect(
        host=host, port=int(port), user=user, password=password, database=database, autocommit=True
    )


# --- PostgreSQL -----------------------------------------------------------------------------


def test_postgres_database_is_created_seeded_written_and_dropped(tmp_path: Path) -> None:
    key = _key()
    with _service_set([{"name": "db", "type": "postgres", "sql": SEED}], tmp_path, key) as services:
        dsn = services.env["KEYSTONE_SERVICE_DB_DSN"]
        database = services.handles["db"].describe()["database"]
        assert _pg_databases(key) == [database]
        assert services.env["DATABASE_URL"] == dsn
        assert services.env["KEYSTONE_SERVICE_DB_URL"] == dsn
        assert services.handles["db"].query("SELECT name FROM customers ORDER BY id") == [
            ("Ada",),
            ("Grace",),
        ]

        # The agent: its own connection, from the DSN it was given.
        with psycopg.connect(dsn, autocommit=True) as agent:
            agent.execute("INSERT INTO orders VALUES (11, 2, 250)")

        assert services.handles["db"].query("SELECT count(*) FROM orders") == [(2,)]
        assert services.db_writes() == [
            {
                "service": "db",
                "table": "orders",
                "before_rows": 1,
                "after_rows": 2,
                "change": "inserted",
            }
        ]
    assert _pg_databases(key) == []


def _pg_roles(name: str) -> list[str]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        rows = conn.execute("SELECT rolname FROM pg_roles WHERE rolname = %s", (name,)).fetchall()
    return [row[0] for row in rows]


def test_postgres_agent_logs_in_as_its_own_role_with_rights_on_its_database_only(
    tmp_path: Path,
) -> None:
    with _service_set([{"name": "db", "type": "postgres", "sql": SEED}], tmp_path) as services:
        described = services.handles["db"].describe()
        dsn = services.env["KEYSTONE_SERVICE_DB_DSN"]
        assert urlsplit(dsn).username == described["user"] != "postgres"
        with psycopg.connect(dsn, autocommit=True) as agent:
            role = agent.execute(
                "SELECT current_user, rolsuper, rolcreaterole, rolcreatedb"
                " FROM pg_roles WHERE rolname = current_user"
            ).fetchone()
            assert role == (described["user"], False, False, False)
            # Its own tables: it owns them (the seed ran as that role).
            agent.execute("DELETE FROM audit")
        # The server's other databases: the role's password does not open them for anything
        # but the catalogue, and it cannot read a table another role owns.
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute("CREATE TABLE IF NOT EXISTS keystone_secret_probe (v text)")
        other = urlsplit(dsn)._replace(path="/postgres").geturl()
        with (
            psycopg.connect(other, autocommit=True) as agent,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            agent.execute("SELECT * FROM keystone_secret_probe")
        # Another execution's database refuses it outright.
        with _service_set([{"name": "db", "type": "postgres", "sql": SEED}], tmp_path) as second:
            theirs = second.handles["db"].describe()["database"]
            with pytest.raises(psycopg.OperationalError, match="permission denied"):
                psycopg.connect(urlsplit(dsn)._replace(path="/" + theirs).geturl())
    assert _pg_roles(described["user"]) == []  # dropped with the database


def test_postgres_seed_file_is_read_relative_to_the_spec_directory(tmp_path: Path) -> None:
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "seed.sql").write_text(SEED)
    service = {
        "name": "db",
        "type": "postgres",
        "seed": "fixtures/seed.sql",
        "sql": "INSERT INTO audit VALUES (7)",
    }
    with _service_set([service], tmp_path) as services:
        assert services.handles["db"].query("SELECT count(*) FROM customers") == [(2,)]
        assert services.handles["db"].query("SELECT id FROM audit") == [(7,)]


def test_postgres_db_writes_names_each_kind_of_change(tmp_path: Path) -> None:
    with _service_set([{"name": "db", "type": "postgres", "sql": SEED}], tmp_path) as services:
        with psycopg.connect(services.env["KEYSTONE_SERVICE_DB_DSN"], autocommit=True) as agent:
            agent.execute("UPDATE customers SET name = 'Ada L.' WHERE id = 1")
            agent.execute("DELETE FROM orders")
            agent.execute("DROP TABLE audit")
            agent.execute("CREATE SCHEMA extra")
            agent.execute("CREATE TABLE extra.notes (body text)")
            agent.execute("INSERT INTO extra.notes VALUES ('hi')")
        writes = {
            w["table"]: (w["change"], w["before_rows"], w["after_rows"])
            for w in services.db_writes()
        }
    assert writes == {
        "customers": ("updated", 2, 2),
        "orders": ("deleted", 1, 0),
        "audit": ("dropped", 0, 0),
        "extra.notes": ("created", 0, 1),
    }


def test_postgres_untouched_database_reports_no_writes(tmp_path: Path) -> None:
    with _service_set([{"name": "db", "type": "postgres", "sql": SEED}], tmp_path) as services:
        services.handles["db"].query("SELECT * FROM customers")
        assert services.db_writes() == []


def test_postgres_bad_seed_names_the_service_and_error_and_leaves_no_database(
    tmp_path: Path,
) -> None:
    key = _key()
    bad = {
        "name": "db",
        "type": "postgres",
        "sql": "CREATE TABLE ok (id int); INSERT INTO nowhere VALUES (1);",
    }
    with pytest.raises(ServiceError) as caught, _service_set([bad], tmp_path, key):
        pytest.fail("the body must not run when a service cannot start")
    assert caught.value.service == "db"
    assert 'relation "nowhere" does not exist' in caught.value.message
    assert "'db'" in str(caught.value)
    assert _pg_databases(key) == []


def test_postgres_database_is_dropped_even_with_an_agent_connection_still_open(
    tmp_path: Path,
) -> None:
    key = _key()
    with _service_set([{"name": "db", "type": "postgres", "sql": SEED}], tmp_path, key) as services:
        leftover = psycopg.connect(services.env["KEYSTONE_SERVICE_DB_DSN"])
        leftover.execute("SELECT * FROM customers FOR UPDATE")  # an open transaction holding locks
    try:
        assert _pg_databases(key) == []
    finally:
        leftover.close()


def test_postgres_database_is_dropped_when_the_agent_step_raises(tmp_path: Path) -> None:
    key = _key()
    with (
        pytest.raises(RuntimeError),
        _service_set([{"name": "db", "type": "postgres", "sql": SEED}], tmp_path, key),
    ):
        raise RuntimeError("agent crashed")
    assert _pg_databases(key) == []


def test_two_service_sets_at_once_get_separate_postgres_databases(tmp_path: Path) -> None:
    key = _key()  # the same execution key twice: a retried execution racing its first attempt
    service = [{"name": "db", "type": "postgres", "sql": SEED}]
    with (
        _service_set(service, tmp_path, key) as first,
        _service_set(service, tmp_path, key) as second,
    ):
        first_db = first.handles["db"].describe()["database"]
        second_db = second.handles["db"].describe()["database"]
        assert first_db != second_db
        assert sorted(_pg_databases(key)) == sorted([first_db, second_db])
        with psycopg.connect(first.env["DATABASE_URL"], autocommit=True) as agent:
            agent.execute("DELETE FROM customers")
        assert first.handles["db"].query("SELECT count(*) FROM customers") == [(0,)]
        assert second.handles["db"].query("SELECT count(*) FROM customers") == [(2,)]
        assert second.db_writes() == []
    assert _pg_databases(key) == []


def test_postgres_without_a_configured_server_is_a_clear_service_error(tmp_path: Path) -> None:
    services = ServiceSet(
        [{"name": "db", "type": "postgres", "sql": SEED}],
        spec_dir=tmp_path,
        execution_key=_key(),
        postgres_url=None,
        mysql_url=MYSQL_URL,
        sqlite_dir=tmp_path,
    )
    with pytest.raises(ServiceError) as caught, services:
        pass
    assert caught.value.message == (
        "the spec needs a postgres server and this Keystone has none: set "
        "KEYSTONE_POSTGRES_URL to a server where it may create a database per execution"
    )


def test_mysql_agent_user_has_rights_on_its_database_only(tmp_path: Path) -> None:
    with _service_set([{"name": "shop", "type": "mysql", "sql": SEED}], tmp_path) as services:
        described = services.handles["shop"].describe()
        agent = _mysql_agent(services.env["KEYSTONE_SERVICE_SHOP_DSN"])
        try:
            with agent.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM customers")
                assert cursor.fetchone() == (2,)
                cursor.execute("SHOW DATABASES")
                visible = {row[0] for row in cursor.fetchall()}
                assert visible == {"information_schema", described["database"]}
                with pytest.raises(pymysql.err.OperationalError, match="denied"):
                    cursor.execute("SELECT user FROM mysql.user")
        finally:
            agent.close()
    conn = _mysql_connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM mysql.user WHERE user = %s", (described["user"],))
            assert cursor.fetchone() == (0,)  # dropped with the database
    finally:
        conn.close()


def test_a_later_failure_drops_the_databases_already_created(tmp_path: Path) -> None:
    key = _key()
    services = [
        {"name": "main", "type": "postgres", "sql": SEED},
        {"name": "legacy", "type": "mysql", "sql": "CREATE TABLE t (id int); THIS IS NOT SQL;"},
    ]
    with pytest.raises(ServiceError) as caught, _service_set(services, tmp_path, key):
        pass
    assert caught.value.service == "legacy"
    assert "1064" in caught.value.message  # MariaDB's syntax error code
    assert _pg_databases(key) == []
    assert _mysql_databases(key) == []


# --- MariaDB / MySQL ------------------------------------------------------------------------


def test_mysql_database_is_created_seeded_written_and_dropped(tmp_path: Path) -> None:
    key = _key()
    with _service_set([{"name": "shop", "type": "mysql", "sql": SEED}], tmp_path, key) as services:
        dsn = services.env["KEYSTONE_SERVICE_SHOP_DSN"]
        database = services.handles["shop"].describe()["database"]
        user = services.handles["shop"].describe()["user"]
        assert urlsplit(dsn).username == user != "root"  # never the server's admin login
        assert urlsplit(dsn)._replace(netloc="").geturl() == f"mysql:///{database}"
        assert _mysql_databases(key) == [database]
        assert services.handles["shop"].query("SELECT name FROM customers ORDER BY id") == [
            ("Ada",),
            ("Grace",),
        ]

        agent = _mysql_agent(dsn)
        try:
            with agent.cursor() as cursor:
                cursor.execute("UPDATE customers SET name = 'Grace H.' WHERE id = 2")
                cursor.execute("INSERT INTO audit VALUES (1), (2)")
        finally:
            agent.close()

        assert services.handles["shop"].query("SELECT name FROM customers WHERE id = 2") == [
            ("Grace H.",)
        ]
        writes = {
            w["table"]: (w["change"], w["before_rows"], w["after_rows"])
            for w in services.db_writes()
        }
        assert writes == {"customers": ("updated", 2, 2), "audit": ("inserted", 0, 2)}
    assert _mysql_databases(key) == []


def test_mysql_error_in_a_later_seed_statement_leaves_no_database(tmp_path: Path) -> None:
    key = _key()
    bad = {"name": "shop", "type": "mysql", "sql": SEED + "INSERT INTO missing VALUES (1);"}
    with pytest.raises(ServiceError) as caught, _service_set([bad], tmp_path, key):
        pass
    assert caught.value.service == "shop"
    assert "missing" in caught.value.message and "doesn't exist" in caught.value.message
    assert _mysql_databases(key) == []


def test_mysql_database_is_dropped_despite_an_agent_holding_a_lock(tmp_path: Path) -> None:
    key = _key()
    with _service_set([{"name": "shop", "type": "mysql", "sql": SEED}], tmp_path, key) as services:
        leftover = _mysql_agent(services.env["KEYSTONE_SERVICE_SHOP_DSN"])
        with leftover.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT * FROM customers FOR UPDATE")
    try:
        assert _mysql_databases(key) == []
    finally:
        leftover.close()


def test_two_service_sets_at_once_get_separate_mysql_databases(tmp_path: Path) -> None:
    key = _key()
    service = [{"name": "shop", "type": "mysql", "sql": SEED}]
    with (
        _service_set(service, tmp_path, key) as first,
        _service_set(service, tmp_path, key) as second,
    ):
        assert first.env["DATABASE_URL"] != second.env["DATABASE_URL"]
        first.handles["shop"].query("DELETE FROM orders")
        assert second.handles["shop"].query("SELECT count(*) FROM orders") == [(1,)]
    assert _mysql_databases(key) == []


# --- SQLite ---------------------------------------------------------------------------------


def test_sqlite_file_is_created_seeded_written_and_deleted(tmp_path: Path) -> None:
    with _service_set([{"name": "local", "type": "sqlite", "sql": SEED}], tmp_path) as services:
        path = Path(services.env["KEYSTONE_SERVICE_LOCAL_PATH"])
        assert path.parent == (tmp_path / ".keystone").resolve()
        assert path.is_file()
        assert services.env["DATABASE_URL"] == f"sqlite:///{path}"
        assert services.env["DATABASE_URL"].startswith("sqlite:////")

        agent = sqlite3.connect(path)
        agent.execute("INSERT INTO customers VALUES (3, 'Linus')")
        agent.commit()
        agent.close()

        assert services.handles["local"].query("SELECT count(*) FROM customers") == [(3,)]
        assert services.db_writes() == [
            {
                "service": "local",
                "table": "customers",
                "before_rows": 2,
                "after_rows": 3,
                "change": "inserted",
            }
        ]
    assert not path.exists()


def test_sqlite_seed_may_be_a_database_file(tmp_path: Path) -> None:
    template = tmp_path / "fixtures.db"
    conn = sqlite3.connect(template)
    conn.executescript(SEED)
    conn.close()
    with _service_set(
        [{"name": "local", "type": "sqlite", "seed": "fixtures.db"}], tmp_path
    ) as services:
        services.handles["local"].query("DELETE FROM customers")
        assert services.db_writes()[0]["change"] == "deleted"
    # The template itself is never written.
    assert sqlite3.connect(template).execute("SELECT count(*) FROM customers").fetchone() == (2,)


def test_sqlite_bad_seed_removes_the_file(tmp_path: Path) -> None:
    with (
        pytest.raises(ServiceError) as caught,
        _service_set(
            [{"name": "local", "type": "sqlite", "sql": "CREATE TABLE x (id int); SELEC 1;"}],
            tmp_path,
        ),
    ):
        pass
    assert "syntax error" in caught.value.message
    assert list((tmp_path / ".keystone").iterdir()) == []


# --- shared behaviour -----------------------------------------------------------------------


def test_database_names_fit_postgres_limit_and_are_sanitised() -> None:
    name = database_name("Run 42 / Execution-" + "x" * 100, "Customer_DB")
    assert len(name) <= 63
    assert name.startswith("ks_run_42___execution_")
    assert "_customer_db_" in name
    assert name == name.lower() and all(c.isalnum() or c == "_" for c in name)
    assert database_name("k", "db") != database_name("k", "db")


def test_seed_outside_the_spec_directory_is_refused(tmp_path: Path) -> None:
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (tmp_path / "secret.sql").write_text("CREATE TABLE secrets (v text);")
    with (
        pytest.raises(ServiceError) as caught,
        _service_set([{"name": "db", "type": "postgres", "seed": "../secret.sql"}], spec_dir),
    ):
        pass
    assert "outside the spec's directory" in caught.value.message


def test_missing_seed_file_is_a_service_error(tmp_path: Path) -> None:
    with (
        pytest.raises(ServiceError) as caught,
        _service_set([{"name": "db", "type": "sqlite", "seed": "nope.sql"}], tmp_path),
    ):
        pass
    assert caught.value.service == "db" and "not found" in caught.value.message


def test_database_handles_refuse_recorded_requests(tmp_path: Path) -> None:
    with (
        _service_set([{"name": "db", "type": "sqlite", "sql": SEED}], tmp_path) as services,
        pytest.raises(ServiceTypeError, match="'db' is a sqlite database"),
    ):
        services.handles["db"].recorded_requests()


def test_database_url_is_only_set_when_there_is_exactly_one_database(tmp_path: Path) -> None:
    services = [
        {"name": "a", "type": "sqlite", "sql": SEED},
        {"name": "b", "type": "postgres", "sql": SEED},
    ]
    with _service_set(services, tmp_path) as started:
        assert "DATABASE_URL" not in started.env
        assert started.env["KEYSTONE_SERVICE_A_DSN"].startswith("sqlite:///")
        assert started.env["KEYSTONE_SERVICE_B_DSN"].startswith("postgresql://")
