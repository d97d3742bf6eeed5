"""Two requests taking one name at the same moment, made to happen in the one order that
used to break: request B's row is inserted by a second database connection and left
uncommitted, so request A's "is the name free?" finds nothing; A's own insert then waits on
the unique index, and only once it waits does B commit, so A's insert breaks the
constraint. Nothing of the code under test is patched: this is what PostgreSQL does when
two requests race. Needs PostgreSQL and `django_db(transaction=True)` (the second
connection must see the committed project and users, and A must see B's commit)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections, transaction

WAIT_SECONDS = 20.0

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a real race needs PostgreSQL's row locks"
)


def _someone_waits_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        (count,) = cursor.fetchone()
    return bool(count)


@contextmanager
def inserted_by_a_concurrent_request(insert: Callable[[], object]) -> Iterator[None]:
    """Run the body (request A) while another connection inserts with `insert` (request
    B), committing only once the body waits on B's row."""
    inserted = threading.Event()
    body_done = threading.Event()
    errors: list[BaseException] = []

    def request_b() -> None:
        try:
            with transaction.atomic():
                insert()
                inserted.set()
                deadline = time.monotonic() + WAIT_SECONDS
                while not body_done.is_set() and time.monotonic() < deadline:
                    if _someone_waits_for_a_lock():
                        break
                    time.sleep(0.02)
                else:
                    raise AssertionError("request A never waited on request B's row")
        except BaseException as exc:
            errors.append(exc)
        finally:
            inserted.set()
            connections.close_all()  # this thread's connections only

    thread = threading.Thread(target=request_b)
    thread.start()
    assert inserted.wait(WAIT_SECONDS)
    try:
        yield
    finally:
        body_done.set()
        thread.join(WAIT_SECONDS)
    assert not errors, errors
