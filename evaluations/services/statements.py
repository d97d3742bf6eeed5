"""The reads and writes every execution makes, their SQL built once.

Each execution is claimed (its row coming back with the claim), recorded and counted by a
handful of UPDATEs and INSERTs. The ORM compiles each one again on every call, 0.1-0.5 ms of
Python apiece: together about a fifth of Keystone's own CPU time per no-op execution, all of
it holding the GIL (issue 18). `row`, `update`, `update_reading`, `update_row` and `insert`
run the statement the ORM would: the model's table and column names, the text cached by its
shape, and each value adapted by its field's `pre_save` (inserts) and `get_db_prep_save`, or
read back through the converters the ORM's compiler applies (datetimes for SQLite, JSON for
each backend). Updates test equality and a fixed SQL condition only; any other read or write
stays with the ORM.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from django.db import connections, router
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)


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
    sql, params = _update(connection, model, where, values, condition, condition_params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def update_reading(
    model: type[Model],
    *,
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    read: str,
) -> tuple[Any, ...] | None:
    """`update` of one row (`where` names its primary key as "id") that reads back the SQL
    expressions `read` (comma-separated, column names as written) as the UPDATE left the
    row, in the same statement (UPDATE ... RETURNING). None when no row was changed, or
    where the database cannot return them (SQLite before 3.35): the caller then reads what
    it needs by a statement of its own."""
    connection = connections[router.db_for_write(model)]
    if not connection.features.can_return_columns_from_insert:
        update(model, where=where, values=values)
        return None
    found = _update_returning(connection, model, where, values, "", (), returning=read)
    return None if found is None else tuple(found)


def update_row(
    model: type[M],
    *,
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    condition: str = "",
    condition_params: Sequence[Any] = (),
) -> M | None:
    """`update` of one row (`where` names its primary key as "id"), and the row as it left
    it, as `row` loads it: one statement (UPDATE ... RETURNING) where the database has it,
    or None when nothing was changed."""
    connection = connections[router.db_for_write(model)]
    if not connection.features.can_return_columns_from_insert:  # SQLite before 3.35
        changed = update(
            model,
            where=where,
            values=values,
            condition=condition,
            condition_params=condition_params,
        )
        return row(model, where["id"]) if changed else None
    names, columns, attnames = _selection(model, connection.alias)
    found = _update_returning(
        connection, model, where, values, condition, condition_params, returning=names
    )
    return None if found is None else _loaded(model, connection, found, columns, attnames)


def _update_returning(
    connection: Any,
    model: type[Model],
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    condition: str,
    condition_params: Sequence[Any],
    *,
    returning: str,
) -> Sequence[Any] | None:
    """The UPDATE with `RETURNING returning`: the changed row's values, None if none was."""
    sql, params = _update(connection, model, where, values, condition, condition_params)
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {returning}", params)
        return cursor.fetchone()


def _update(
    connection: Any,
    model: type[Model],
    where: Mapping[str, Any],
    values: Mapping[str, Any],
    condition: str,
    condition_params: Sequence[Any],
) -> tuple[str, list[Any]]:
    """The UPDATE's text (built once per shape) and its parameters."""
    sql, assigned, tested = _statement(
        model,
        connection.alias,
        tuple((name, isinstance(value, Add)) for name, value in values.items()),
        tuple(where),
        condition,
    )
    params = [
        value.amount if isinstance(value, Add) else field.get_db_prep_save(value, connection)
        for field, value in zip(assigned, values.values(), strict=True)
    ]
    params += [
        field.get_db_prep_value(value, connection)
        for field, value in zip(tested, where.values(), strict=True)
    ]
    params += list(condition_params)
    return sql, params


def row(model: type[M], pk: Any) -> M | None:
    """The row of `model` whose primary key is `pk`, as `model.objects.get(pk=pk)` loads it
    (every concrete field, converted as the ORM's compiler would), or None."""
    connection = connections[router.db_for_read(model)]
    _, columns, attnames = _selection(model, connection.alias)
    with connection.cursor() as cursor:
        cursor.execute(_by_primary_key(model, connection.alias), [pk])
        found = cursor.fetchone()
    return None if found is None else _loaded(model, connection, found, columns, attnames)


def _loaded(
    model: type[M],
    connection: Any,
    found: Sequence[Any],
    columns: tuple[tuple[Any, tuple[Any, ...]], ...],
    attnames: tuple[str, ...],
) -> M:
    """A model instance from a row of _selection's columns, converted as the ORM would."""
    values = []
    for value, (column, converters) in zip(found, columns, strict=True):
        for converter in converters:
            value = converter(value, column, connection)
        values.append(value)
    return model.from_db(connection.alias, attnames, values)


@cache
def _selection(
    model: type[Model], alias: str
) -> tuple[str, tuple[tuple[Any, tuple[Any, ...]], ...], tuple[str, ...]]:
    """Every concrete column of `model`, as a SELECT or RETURNING lists them; each with the
    converters the compiler applies to it (the backend's, then the field's); the fields'
    attribute names."""
    connection = connections[alias]
    table = model._meta.db_table
    fields = model._meta.concrete_fields
    columns = []
    for field in fields:
        column = field.get_col(table)
        converters = connection.ops.get_db_converters(column)
        converters += column.get_db_converters(connection)
        columns.append((column, tuple(converters)))
    names = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    return names, tuple(columns), tuple(field.attname for field in fields)


@cache
def _by_primary_key(model: type[Model], alias: str) -> str:
    """The SELECT of one row, every column of _selection, by its primary key."""
    quote = connections[alias].ops.quote_name
    names = _selection(model, alias)[0]
    return (
        f"SELECT {names} FROM {quote(model._meta.db_table)} "
        f"WHERE {quote(model._meta.pk.column)} = %s"
    )


# psycopg parses a statement's text at every call once it has more parameters than this (it
# keeps the parsing of shorter ones): a run's plan of 1,000 executions, 22,000 of them, spent
# 0.15 s in that parsing alone. COPY sends the rows with no statement to parse.
PARSED_EVERY_TIME_ABOVE = 50


def insert(model: type[Model], rows: Sequence[Model]) -> None:
    """INSERT `rows` (instances of `model`, primary keys left to the database), as many to
    a statement as the database takes (as `bulk_create` would), without reading the new
    keys back. On PostgreSQL, rows with more values than PARSED_EVERY_TIME_ABOVE go in by
    COPY: the same rows, columns and errors (a unique constraint's as an IntegrityError)."""
    if not rows:
        return
    connection = connections[router.db_for_write(model)]
    fields = _inserted_fields(model)
    if connection.vendor == "postgresql" and len(rows) * len(fields) > PARSED_EVERY_TIME_ABOVE:
        _copy(connection, model, fields, rows)
        return
    size = max(1, connection.ops.bulk_batch_size(list(fields), list(rows)))
    for start in range(0, len(rows), size):
        batch = rows[start : start + size]
        with connection.cursor() as cursor:
            cursor.execute(
                _insertion(model, connection.alias, len(batch)),
                [value for row in batch for value in _inserted_values(connection, fields, row)],
            )


def _copy(
    connection: Any, model: type[Model], fields: tuple[Field[Any, Any], ...], rows: Sequence[Model]
) -> None:
    sql = _copying(model, connection.alias)
    with (
        connection.cursor() as cursor,
        # Timed and logged as Django's debug cursor does every statement it runs.
        cursor.debug_sql(sql) if connection.queries_logged else contextlib.nullcontext(),
        connection.wrap_database_errors,  # psycopg's errors raised as Django's
        cursor.cursor.copy(sql) as copy,
    ):
        for row in rows:
            copy.write_row(_inserted_values(connection, fields, row))


def _inserted_values(connection: Any, fields: tuple[Field[Any, Any], ...], row: Model) -> list[Any]:
    return [field.get_db_prep_save(field.pre_save(row, True), connection) for field in fields]


@cache
def _inserted_fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    return tuple(field for field in model._meta.concrete_fields if not field.primary_key)


@cache
def _insertion(model: type[Model], alias: str, count: int) -> str:
    """The INSERT of `count` rows."""
    table = connections[alias].ops.quote_name(model._meta.db_table)
    row = "(" + ", ".join(["%s"] * len(_inserted_fields(model))) + ")"
    values = ", ".join([row] * count)
    return f"INSERT INTO {table} ({_inserted_columns(model, alias)}) VALUES {values}"


@cache
def _copying(model: type[Model], alias: str) -> str:
    table = connections[alias].ops.quote_name(model._meta.db_table)
    return f"COPY {table} ({_inserted_columns(model, alias)}) FROM STDIN"


def _inserted_columns(model: type[Model], alias: str) -> str:
    quote = connections[alias].ops.quote_name
    return ", ".join(quote(field.column) for field in _inserted_fields(model))


@cache
def _statement(
    model: type[Model],
    alias: str,
    assigned: tuple[tuple[str, bool], ...],
    tested: tuple[str, ...],
    condition: str,
) -> tuple[str, tuple[Field[Any, Any], ...], tuple[Field[Any, Any], ...]]:
    """The UPDATE's text, and the fields of the columns it sets and tests (in order)."""
    quote = connections[alias].ops.quote_name

    def field(name: str) -> Field[Any, Any]:
        found = model._meta.get_field(name)
        assert isinstance(found, Field), name  # a column, not the other end of a relation
        return found

    def column(name: str) -> str:
        return quote(field(name).column)

    sets = ", ".join(
        f"{column(name)} = {column(name)} + %s" if adds else f"{column(name)} = %s"
        for name, adds in assigned
    )
    tests = [f"{column(name)} = %s" for name in tested]
    if condition:
        tests.append(f"({condition})")
    sql = f"UPDATE {quote(model._meta.db_table)} SET {sets} WHERE {' AND '.join(tests)}"
    return sql, tuple(field(name) for name, _ in assigned), tuple(field(name) for name in tested)
