"""The UPDATEs every execution runs, their SQL built once.

Each execution is claimed, recorded and counted by a handful of UPDATEs. The ORM compiles
each one again on every call, 0.1-0.5 ms of Python apiece: about a fifth of Keystone's own
CPU time per no-op execution, all of it holding the GIL (issue 18). `update` runs the
statement the ORM would: the model's table and column names, its text cached by the fields
it sets and tests, and each value adapted by its field's `get_db_prep_save`, as the ORM's
UPDATE compiler does (datetimes for SQLite, JSON for each backend). Only tests of equality
and a fixed SQL condition; any other UPDATE stays with the ORM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db import connections, router
from django.db.models import Field, Model


@dataclass(frozen=True, slots=True)
class Add:
    """A value that adds to the column's own (`F(column) + amount` in the ORM)."""

    amount: int


def update(
    model: type[Model],
    *,
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    condition: str = "",
    condition_params: Sequence[Any] = (),
) -> int:
    """UPDATE the rows of `model` whose fields equal `where` (and meet the SQL `condition`,
    column names as written, `%s` for its parameters), setting `values`. Returns the number
    of rows changed."""
    connection = connections[router.db_for_write(model)]
    sql, fields = _statement(
        model,
        connection.alias,
        tuple((name, isinstance(value, Add)) for name, value in values.items()),
        tuple(where),
        condition,
    )
    params = [
        value.amount if isinstance(value, Add) else field.get_db_prep_save(value, connection)
        for field, value in zip(fields, values.values(), strict=True)
    ]
    params += [where[name] for name in where]
    params += list(condition_params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


@cache
def _statement(
    model: type[Model],
    alias: str,
    assigned: tuple[tuple[str, bool], ...],
    tested: tuple[str, ...],
    condition: str,
) -> tuple[str, tuple[Field[Any, Any], ...]]:
    """The UPDATE's text, and the fields of the columns it sets (in order)."""
    quote = connections[alias].ops.quote_name

    def field(name: str) -> Field[Any, Any]:
        found = model._meta.get_field(name)
        assert isinstance(found, Field), name  # a column, not the other end of a relation
        return found

    sets = ", ".join(
        f"{quote(field(name).column)} = {quote(field(name).column)} + %s"
        if adds
        else f"{quote(field(name).column)} = %s"
        for name, adds in assigned
    )
    tests = [f"{quote(field(name).column)} = %s" for name in tested]
    if condition:
        tests.append(f"({condition})")
    sql = f"UPDATE {quote(model._meta.db_table)} SET {sets} WHERE {' AND '.join(tests)}"
    return sql, tuple(field(name) for name, _ in assigned)
