"""Database services of one execution: a fresh PostgreSQL or MariaDB/MySQL database on the
configured server, or a fresh SQLite file; seeded, handed to the agent as a DSN, and dropped
afterwards.

Each service also keeps a fingerprint of every table (row count + content hash) taken right
after the seed, so that the audit can say which tables the agent wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import shutil
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from evaluations.runner import owners
from evaluations.runner.http_mock import ServiceTypeError

# The database drivers are imported where a service of their kind is used: most specs
# have none, and importing both costs every `keystone run` a tenth of a second.
if TYPE_CHECKING:
    import psycopg
    import pymysql  # type: ignore[import-untyped, unused-ignore]  # no types-PyMySQL stubs

logger = logging.getLogger(__name__)

DATABASE_TYPES = ("postgres", "mysql", "sqlite")
MAX_NAME_LENGTH = 63  # PostgreSQL's identifier limit (MySQL allows 64)
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(slots=True)
class Seed:
    """What to load into a fresh database: SQL scripts in order, or (sqlite only) a file to copy."""

    scripts: list[str] = field(default_factory=list)
    sqlite_file: Path | None = None


@dataclass(frozen=True, slots=True)
class TableState:
    """A table's fingerprint: its row count and an order-independent checksum of its rows."""

    rows: int
    checksum: str


def database_name(execution_key: str, service_name: str, *, now: float | None = None) -> str:
    """`ks_<execution>_<service>_<created><random>`: readable in `\\l`, unique even when two
    workers run the same execution key, at most 63 characters. Only names of this shape are
    ever dropped by `drop_orphaned_databases` (a server may hold others' databases)."""
    suffix = _base36(int(time.time() if now is None else now)).rjust(7, "0") + secrets.token_hex(3)
    key = _sanitise(execution_key)
    service = _sanitise(service_name)[:16]
    room = MAX_NAME_LENGTH - len("ks___") - len(service) - len(suffix)
    return f"ks_{key[:room]}_{service}_{suffix}"


def _base36(number: int) -> str:
    digits = ""
    while True:
        number, digit = divmod(number, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + digits
        if number == 0:
            return digits


# The names `database_name` makes, and MySQL's logins made from them (`user_for`): the
# unique suffix is the creation time in base 36 and a random part.
_UNIQUE = r"[0-9a-z]{7}[0-9a-f]{6}"
_DATABASE_NAME = re.compile(rf"^ks_.+_{_UNIQUE}$")
_MYSQL_USER = re.compile(rf"^ks_u_{_UNIQUE}$")


def _sanitise(text: str) -> str:
    cleaned = "".join(c if c.isascii() and c.isalnum() else "_" for c in text.lower())
    return cleaned.strip("_") or "x"


def table_changes(
    service: str, before: dict[str, TableState], after: dict[str, TableState]
) -> list[dict[str, Any]]:
    """Tables whose contents differ between two fingerprints, one dict per table."""
    changes = []
    for table in sorted(before.keys() | after.keys()):
        old, new = before.get(table), after.get(table)
        if old == new:
            continue
        if old is None:
            change = "created"
        elif new is None:
            change = "dropped"
        elif new.rows > old.rows:
            change = "inserted"
        elif new.rows < old.rows:
            change = "deleted"
        else:
            change = "updated"
        changes.append(
            {
                "service": service,
                "table": table,
                "before_rows": old.rows if old else 0,
                "after_rows": new.rows if new else 0,
                "change": change,
            }
        )
    return changes


class DatabaseService(ABC):
    """One database service of one execution; also its ServiceHandle for the checks."""

    type: str

    def __init__(self, name: str, seed: Seed) -> None:
        self.name = name
        self.seed = seed
        self._baseline: dict[str, TableState] = {}
        self.created = False  # the database (or file) exists and stop() must remove it
        self._lock = threading.Lock()  # checks and the audit may share the query connection

    @property
    @abstractmethod
    def dsn(self) -> str: ...

    @abstractmethod
    def start(self) -> None:
        """Create and seed; on failure leave enough state for stop() to clean up."""

    @abstractmethod
    def stop(self) -> None:
        """Drop everything start() created. Safe to call after a partial start, and twice."""

    @abstractmethod
    def query(self, sql: str) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def snapshot(self) -> dict[str, TableState]: ...

    @abstractmethod
    def describe(self) -> dict[str, Any]: ...

    def recorded_requests(self) -> list[dict[str, Any]]:
        raise ServiceTypeError(
            f"service '{self.name}' is a {self.type} database; recorded requests need an http_mock"
        )

    def env(self) -> dict[str, str]:
        return {"URL": self.dsn, "DSN": self.dsn}

    def take_baseline(self) -> None:
        self._baseline = self.snapshot()

    def db_writes(self) -> list[dict[str, Any]]:
        return table_changes(self.name, self._baseline, self.snapshot())


class _Closable(Protocol):
    def close(self) -> None: ...


class _ServerDatabaseService(DatabaseService):
    """A database of its own on a shared server (PostgreSQL, MySQL), with a login of its own
    that has rights on that database only: created and dropped through an admin connection to
    `server_url` (whose credentials never reach the agent), queried through one kept
    connection as the execution's own user."""

    default_port: int

    def __init__(self, name: str, seed: Seed, *, server_url: str, database: str) -> None:
        super().__init__(name, seed)
        self.server_url = server_url
        self.database = database
        self.user = self.user_for(database)
        self.password = secrets.token_urlsafe(18)
        self._parts = urlsplit(server_url)
        self._conn: _Closable | None = None  # each server type narrows it to its driver's
        self._held = False  # this process's lock on the database is taken (_hold)

    @staticmethod
    def user_for(database: str) -> str:
        return database

    @property
    def dsn(self) -> str:
        host = self._parts.hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        port = f":{self._parts.port}" if self._parts.port else ""
        netloc = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}@{host}{port}"
        return urlunsplit(self._parts._replace(netloc=netloc, path="/" + quote(self.database)))

    @abstractmethod
    def drop(self) -> None:
        """Drop the database, even while sessions (an agent's leftovers) still use it."""

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.created:
            self.drop()
            self.created = False
        if self._held:
            _KEEPERS.let_go(self)
            self._held = False

    def _hold(self) -> None:
        """Before the database and its login are made: this process's lock on them, which
        tells every other process that they are in use (drop_orphaned_databases); and, at
        this process's first database on the server and every owners.LOOK_SECONDS after, the
        databases of processes that died dropped."""
        if _looks.due((self.type, self.server_url)):
            try:
                self.drop_orphaned(self.server_url)
            except Exception:  # noqa: BLE001 - another's leftovers never fail this execution
                logger.warning("could not drop the orphaned databases", exc_info=True)
        _KEEPERS.hold(self)
        self._held = True

    @property
    def lock_name(self) -> str:
        """What this database's lock is named on its server: its login's name, which is
        unique to it (made, like it, from its creation time and a random part)."""
        return self.user

    @staticmethod
    @abstractmethod
    def take_lock(session: Any, name: str, *, wait: bool) -> bool:
        """Take the server's lock `name` in `session`: waiting for it, or only if no other
        session holds it now (False if one does)."""

    @staticmethod
    @abstractmethod
    def release_lock(session: Any, name: str) -> None: ...

    @abstractmethod
    def keeper_session(self) -> Any:
        """A new admin session to hold this process's locks on the server, for its life."""

    @staticmethod
    @abstractmethod
    def drop_orphaned(server_url: str) -> list[str]:
        """Drop the databases and logins on the server, of Keystone's naming, whose lock no
        session holds: their process died before it could drop them. Returns the databases
        (PostgreSQL: and roles) dropped."""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "host": self._parts.hostname,
            "port": self._parts.port or self.default_port,
            "url": self.dsn,
            "dsn": self.dsn,
            "database": self.database,
            "user": self.user,
        }


# --- PostgreSQL -----------------------------------------------------------------------------


def _drop_postgres_database(admin: psycopg.Connection[tuple[Any, ...]], database: str) -> None:
    """Drop the database and its login role (of the same name)."""
    from psycopg import sql as pgsql

    # FORCE: an agent that left a connection open must not keep its database alive.
    admin.execute(
        pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(database))
    )
    admin.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(database)))


class PostgresService(_ServerDatabaseService):
    type = "postgres"
    default_port = 5432
    _conn: psycopg.Connection[tuple[Any, ...]] | None

    def _admin_connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        return psycopg.connect(self.server_url, autocommit=True, connect_timeout=10)

    @staticmethod
    def take_lock(session: Any, name: str, *, wait: bool) -> bool:
        key = _postgres_lock_key(name)
        if wait:
            session.execute("SELECT pg_advisory_lock(%s)", (key,))
            return True
        return bool(session.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0])

    @staticmethod
    def release_lock(session: Any, name: str) -> None:
        session.execute("SELECT pg_advisory_unlock(%s)", (_postgres_lock_key(name),))

    def keeper_session(self) -> psycopg.Connection[tuple[Any, ...]]:
        return self._admin_connection()

    @staticmethod
    def drop_orphaned(server_url: str) -> list[str]:
        import psycopg

        dropped: list[str] = []
        with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as admin:
            # With the roles: one whose database was never made (its process died in between).
            names = admin.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'ks\\_%'"
                " UNION SELECT rolname FROM pg_roles WHERE rolname LIKE 'ks\\_%'"
            ).fetchall()
            for name in sorted(str(row[0]) for row in names if _DATABASE_NAME.match(str(row[0]))):
                if not PostgresService.take_lock(admin, name, wait=False):
                    continue  # its process lives
                try:
                    _drop_postgres_database(admin, name)
                finally:
                    PostgresService.release_lock(admin, name)
                dropped.append(name)
        return dropped

    def start(self) -> None:
        from psycopg import sql as pgsql

        role, database = pgsql.Identifier(self.user), pgsql.Identifier(self.database)
        self._hold()
        with self._admin_connection() as admin:
            admin.execute(
                pgsql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD {}"
                ).format(role, pgsql.Literal(self.password))
            )
            self.created = True  # from here on, stop() drops what exists
            admin.execute(pgsql.SQL("CREATE DATABASE {} OWNER {}").format(database, role))
            admin.execute(pgsql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(database))
        conn = self._connection()
        for script in self.seed.scripts:
            # Without parameters psycopg sends the simple query protocol, which runs a
            # multi-statement script as it is.
            conn.execute(script.encode())
        self.take_baseline()

    def drop(self) -> None:
        with self._admin_connection() as admin:
            _drop_postgres_database(admin, self.database)

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        return self._conn

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self._lock:
            cursor = self._connection().execute(sql.encode())
            return list(cursor.fetchall()) if cursor.description else []

    def snapshot(self) -> dict[str, TableState]:
        from psycopg import sql as pgsql

        with self._lock:
            conn = self._connection()
            tables = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
                " AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%'"
            ).fetchall()
            states = {}
            for schema, table in tables:
                # An order-independent sum of row hashes: no sort, no giant string on big tables.
                row = conn.execute(
                    pgsql.SQL(
                        "SELECT count(*), coalesce(sum(hashtextextended(t::text, 0)), 0)::text"
                        " FROM {}.{} t"
                    ).format(pgsql.Identifier(schema), pgsql.Identifier(table))
                ).fetchone()
                assert row is not None
                label = table if schema == "public" else f"{schema}.{table}"
                states[label] = TableState(int(row[0]), str(row[1]))
            return states


# --- MySQL / MariaDB ------------------------------------------------------------------------


# A TCP login from 127.0.0.1 matches 'localhost' on some servers and '%' on others.
_MYSQL_USER_HOSTS = ("%", "localhost")


class MysqlService(_ServerDatabaseService):
    type = "mysql"
    default_port = 3306
    _conn: pymysql.connections.Connection[Any] | None

    @staticmethod
    def user_for(database: str) -> str:
        # MySQL allows 32 characters in a user name: `ks_u_` and the database's unique suffix
        # (creation time and random), which also names the database's lock (`lock_name`).
        return "ks_u_" + database[-13:]

    def _connect(
        self, database: str | None, multi: bool = False, *, as_admin: bool = True
    ) -> pymysql.connections.Connection[Any]:
        import pymysql  # type: ignore[import-untyped, unused-ignore]
        from pymysql.constants import CLIENT  # type: ignore[import-untyped, unused-ignore]

        query = dict(pair.split("=", 1) for pair in self._parts.query.split("&") if "=" in pair)
        return pymysql.connect(
            host=self._parts.hostname or "127.0.0.1",
            port=self._parts.port or 3306,
            user=unquote(self._parts.username or "root") if as_admin else self.user,
            password=unquote(self._parts.password or "") if as_admin else self.password,
            database=database,
            unix_socket=query.get("unix_socket"),
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=10,
            client_flag=CLIENT.MULTI_STATEMENTS if multi else 0,
        )

    @staticmethod
    def take_lock(session: Any, name: str, *, wait: bool) -> bool:
        with session.cursor() as cursor:
            # A name no other session asks for but the sweep, for as long as one look takes.
            cursor.execute("SELECT GET_LOCK(%s, %s)", (name, 60 if wait else 0))
            taken = cursor.fetchone()[0] == 1
        if wait and not taken:
            raise RuntimeError(f"the server's lock {name} is held by another session")
        return taken

    @staticmethod
    def release_lock(session: Any, name: str) -> None:
        with session.cursor() as cursor:
            cursor.execute("SELECT RELEASE_LOCK(%s)", (name,))

    def keeper_session(self) -> pymysql.connections.Connection[Any]:
        session = self._connect(None)
        with session.cursor() as cursor:
            # Idle between executions for as long as it likes: the server's default
            # (8 hours) would end it, and its locks with it.
            cursor.execute("SET SESSION wait_timeout = 31536000")
        return session

    @staticmethod
    def drop_orphaned(server_url: str) -> list[str]:
        dropped: list[str] = []
        admin = MysqlService("sweep", Seed(), server_url=server_url, database="")._connect(None)
        try:
            with admin.cursor() as cursor:
                cursor.execute("SHOW DATABASES LIKE 'ks\\_%'")
                databases = sorted(str(row[0]) for row in cursor.fetchall())
                cursor.execute("SELECT DISTINCT user FROM mysql.user WHERE user LIKE 'ks\\_u\\_%'")
                users = {str(row[0]) for row in cursor.fetchall()}
            for name in filter(_DATABASE_NAME.match, databases):
                lock = MysqlService.user_for(name)
                users.discard(lock)  # dropped with its database, or in use with it
                if not MysqlService.take_lock(admin, lock, wait=False):
                    continue  # its process lives
                try:
                    # Its process's own path: end the sessions left, drop it and its login.
                    MysqlService("sweep", Seed(), server_url=server_url, database=name).drop()
                finally:
                    MysqlService.release_lock(admin, lock)
                dropped.append(name)
            # A login whose database was never made (its process died in between).
            for user in sorted(filter(_MYSQL_USER.match, users)):
                if not MysqlService.take_lock(admin, user, wait=False):
                    continue
                try:
                    with admin.cursor() as cursor:
                        for host in _MYSQL_USER_HOSTS:
                            cursor.execute("DROP USER IF EXISTS %s@%s", (user, host))
                finally:
                    MysqlService.release_lock(admin, user)
        finally:
            admin.close()
        return dropped

    def start(self) -> None:
        self._hold()
        admin = self._connect(None)
        try:
            with admin.cursor() as cursor:
                for host in _MYSQL_USER_HOSTS:
                    cursor.execute(
                        "CREATE USER %s@%s IDENTIFIED BY %s", (self.user, host, self.password)
                    )
                self.created = True  # from here on, stop() drops what exists
                cursor.execute(f"CREATE DATABASE `{self.database}` CHARACTER SET utf8mb4")
                for host in _MYSQL_USER_HOSTS:
                    cursor.execute(
                        f"GRANT ALL PRIVILEGES ON `{self.database}`.* TO %s@%s", (self.user, host)
                    )
        finally:
            admin.close()
        if self.seed.scripts:
            seeder = self._connect(self.database, multi=True, as_admin=False)
            try:
                with seeder.cursor() as cursor:
                    for script in self.seed.scripts:
                        cursor.execute(script)
                        # Each statement's result must be read; an error in a later
                        # statement surfaces here.
                        while cursor.nextset():
                            pass
            finally:
                seeder.close()
        self.take_baseline()

    def drop(self) -> None:
        import pymysql  # type: ignore[import-untyped, unused-ignore]

        admin = self._connect(None)
        try:
            with admin.cursor() as cursor:
                # MySQL has no DROP ... FORCE: end the sessions still using the database
                # (an agent's leftover connection would otherwise block the drop).
                cursor.execute(
                    "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
                    (self.database,),
                )
                for (session,) in cursor.fetchall():
                    with contextlib.suppress(pymysql.MySQLError):  # it ended by itself meanwhile
                        cursor.execute(f"KILL {int(session)}")
                cursor.execute("SET SESSION lock_wait_timeout = 30")
                cursor.execute(f"DROP DATABASE IF EXISTS `{self.database}`")
                for host in _MYSQL_USER_HOSTS:
                    cursor.execute("DROP USER IF EXISTS %s@%s", (self.user, host))
        finally:
            admin.close()

    def _connection(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None or not self._conn.open:
            self._conn = self._connect(self.database, as_admin=False)
        return self._conn

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self._lock, self._connection().cursor() as cursor:
            cursor.execute(sql)
            return [tuple(row) for row in cursor.fetchall()] if cursor.description else []

    def snapshot(self) -> dict[str, TableState]:
        with self._lock, self._connection().cursor() as cursor:
            cursor.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = %s AND table_type = 'BASE TABLE'",
                (self.database,),
            )
            tables = [str(row[0]) for row in cursor.fetchall()]
            states = {}
            for table in tables:
                quoted = "`" + table.replace("`", "``") + "`"
                cursor.execute(f"SELECT COUNT(*) FROM {quoted}")
                (count,) = cursor.fetchone()
                cursor.execute(f"CHECKSUM TABLE {quoted}")
                checksum = cursor.fetchone()[1]
                states[table] = TableState(int(count), str(checksum))
            return states


# --- SQLite ---------------------------------------------------------------------------------


class SqliteService(DatabaseService):
    type = "sqlite"

    def __init__(self, name: str, seed: Seed, *, directory: Path, database: str) -> None:
        super().__init__(name, seed)
        self.database = database
        self.path = (directory / f"{database}.sqlite3").resolve()

    @property
    def dsn(self) -> str:
        # sqlite:/// + an absolute path: the four-slash form SQLAlchemy and dj-database-url read.
        return f"sqlite:///{self.path.as_posix()}"

    def env(self) -> dict[str, str]:
        return {**super().env(), "PATH": str(self.path)}

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            raise FileExistsError(f"{self.path} already exists")
        self.created = True
        if self.seed.sqlite_file is not None:
            shutil.copyfile(self.seed.sqlite_file, self.path)
        conn = self._connect()
        try:
            for script in self.seed.scripts:
                conn.executescript(script)
            conn.commit()
        finally:
            conn.close()
        self.take_baseline()

    def stop(self) -> None:
        if not self.created:
            return
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        self.created = False

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with self._lock:
            conn = self._connect()
            try:
                cursor = conn.execute(sql)
                rows = [tuple(row) for row in cursor.fetchall()] if cursor.description else []
                conn.commit()
                return rows
            finally:
                conn.close()

    def snapshot(self) -> dict[str, TableState]:
        with self._lock:
            conn = self._connect()
            try:
                tables = [
                    str(row[0])
                    for row in conn.execute(
                        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                    )
                ]
                states = {}
                for table in tables:
                    quoted = '"' + table.replace('"', '""') + '"'
                    count, total = 0, 0
                    # Order-independent: a sum of row digests, streamed row by row.
                    for row in conn.execute(f"SELECT * FROM {quoted}"):
                        digest = hashlib.blake2b(repr(row).encode(), digest_size=8).digest()
                        total = (total + int.from_bytes(digest, "big")) % (1 << 64)
                        count += 1
                    states[table] = TableState(count, str(total))
                return states
            finally:
                conn.close()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "host": None,
            "port": None,
            "url": self.dsn,
            "dsn": self.dsn,
            "database": self.database,
            "path": str(self.path),
        }


def load_seed(service: dict[str, Any], spec_dir: Path) -> Seed:
    """The seed of a database service: `seed` (a file under the spec's directory) then `sql`."""
    seed = Seed()
    if service.get("seed"):
        base = spec_dir.resolve()
        path = (base / str(service["seed"])).resolve()
        # The seed ends up where the agent can read it: it must not reach outside the spec.
        if not path.is_relative_to(base):
            raise ValueError(f"seed file {service['seed']!r} is outside the spec's directory")
        if not path.is_file():
            raise FileNotFoundError(f"seed file {service['seed']!r} not found in {base}")
        head = path.read_bytes()[: len(SQLITE_MAGIC)]
        if head == SQLITE_MAGIC:
            if service.get("type") != "sqlite":
                raise ValueError(f"seed file {service['seed']!r} is a SQLite database, not SQL")
            seed.sqlite_file = path
        else:
            seed.scripts.append(path.read_text(encoding="utf-8"))
    if service.get("sql"):
        seed.scripts.append(str(service["sql"]))
    return seed


# --- What a process killed mid-execution leaves on the servers ---------------------------


def _postgres_lock_key(name: str) -> int:
    """The advisory lock (a signed 64-bit key) that stands for a database and its role."""
    digest = hashlib.blake2b(name.encode(), digest_size=8, person=b"keystone-db").digest()
    return int.from_bytes(digest, "big", signed=True)


class _Keepers:
    """One admin session per server and process, kept for the process's life, holding a lock
    for each database this process has on that server (PostgreSQL: an advisory lock, MySQL:
    GET_LOCK). The server lets a session's locks go when the session ends, however its
    process ended and on whichever host it ran: a database of Keystone's whose lock another
    session can take is one that its process could not drop before it died
    (drop_orphaned_databases)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._sessions: dict[tuple[str, str], Any] = {}  # (type, server url) -> session
        self._names: dict[tuple[str, str], set[str]] = {}  # the locks each one holds
        # A forked child must not use its parent's sessions, nor end them (that would let
        # the parent's locks go): it keeps them, unused, and opens its own.
        self._inherited: list[Any] = []
        os.register_at_fork(after_in_child=self._forget)

    def hold(self, service: _ServerDatabaseService) -> None:
        place = (service.type, service.server_url)
        with self._guard:
            names = self._names.setdefault(place, set())
            session = self._sessions.pop(place, None)
            if session is not None:
                try:
                    service.take_lock(session, service.lock_name, wait=True)
                    self._sessions[place] = session
                    names.add(service.lock_name)
                    return
                except Exception:  # noqa: BLE001 - the session ended (a restart, a timeout)
                    logger.warning("the session holding this process's database locks ended")
                    with contextlib.suppress(Exception):
                        session.close()
            # A new session takes every lock again: those the ended one held went with it.
            session = service.keeper_session()
            try:
                for name in sorted(names | {service.lock_name}):
                    service.take_lock(session, name, wait=True)
            except BaseException:
                with contextlib.suppress(Exception):
                    session.close()
                raise
            self._sessions[place] = session
            names.add(service.lock_name)

    def let_go(self, service: _ServerDatabaseService) -> None:
        place = (service.type, service.server_url)
        with self._guard:
            self._names.get(place, set()).discard(service.lock_name)
            session = self._sessions.get(place)
            if session is None:
                return
            try:
                service.release_lock(session, service.lock_name)
            except Exception:  # noqa: BLE001 - the session ended, and the lock with it
                self._sessions.pop(place, None)

    def _forget(self) -> None:
        self._inherited.extend(self._sessions.values())
        self._sessions = {}
        self._names = {}
        self._guard = threading.Lock()


_KEEPERS = _Keepers()
# When this process last looked for the databases of processes that died, per server.
_looks = owners.Looks()


def drop_orphaned_databases(*, postgres_url: str | None, mysql_url: str | None) -> list[str]:
    """Drop the per-execution databases, and their logins, of every process that died (a
    SIGKILL, the OOM killer, a host lost) before it could: those whose lock no session
    holds. Only names of Keystone's shape (`database_name`): a server may hold others'
    databases. Returns the names dropped."""
    dropped: list[str] = []
    if postgres_url:
        dropped += PostgresService.drop_orphaned(postgres_url)
    if mysql_url:
        dropped += MysqlService.drop_orphaned(mysql_url)
    return dropped
