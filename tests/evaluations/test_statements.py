"""The prepared statements of the per-execution path write what the ORM's own UPDATE and
INSERT write, and read what its SELECT reads: datetimes, JSON, NULL and increments come back
the same, on PostgreSQL and on SQLite."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from evaluations.models import (
    CheckResult,
    Execution,
    ExecutionStatus,
    Project,
    Run,
    RunStatus,
)
from evaluations.services import statements
from tests.evaluations.execution_helpers import planned_run

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

SPEC = """\
version: 1
id: statements
task: {prompts: ["a", "b"]}
agent: {type: command, command: "true"}
sandbox: {backend: local}
invariants:
  completes: {description: it ran, check: {type: completes}}
"""


def planned(tmp_path) -> Run:
    project = Project.objects.create(name="statements", slug="statements")
    run, _ = planned_run(project, SPEC, spec_dir=str(tmp_path))
    run.refresh_from_db()
    return run


def test_values_read_back_as_the_orm_writes_them(tmp_path) -> None:
    run = planned(tmp_path)
    execution = run.executions.order_by("id").first()
    finished = datetime(2026, 11, 25, 23, 59, 58, 123456, tzinfo=UTC)
    sequence = [{"name": "lookup", "arguments": {"q": "é\u2603", "n": [1, 2.5, None]}}]
    changed = statements.update(
        Execution,
        where={"id": execution.pk, "status": ExecutionStatus.PENDING},
        values={
            "status": ExecutionStatus.SUCCESS,
            "finished": finished,
            "tool_sequence": sequence,
            "composite": 0.25,
            "passed": True,
            "lease_expires": None,
            "final_output": 'it\'s done; 100% "quoted"',
        },
    )
    assert changed == 1
    stored = Execution.objects.get(pk=execution.pk)
    assert stored.status == ExecutionStatus.SUCCESS
    assert stored.finished == finished
    assert stored.tool_sequence == sequence
    assert (stored.composite, stored.passed, stored.lease_expires) == (0.25, True, None)
    assert stored.final_output == 'it\'s done; 100% "quoted"'
    # A datetime in the test is adapted as the ORM adapts it (text, on SQLite).
    assert statements.update(
        Execution, where={"id": execution.pk, "finished": finished}, values={"composite": 0.5}
    )
    assert Execution.objects.get(pk=execution.pk).composite == 0.5


def test_a_row_that_fails_a_test_is_not_changed(tmp_path) -> None:
    run = planned(tmp_path)
    execution = run.executions.order_by("id").first()
    assert not statements.update(
        Execution,
        where={"id": execution.pk, "status": ExecutionStatus.RUNNING},
        values={"status": ExecutionStatus.ERROR},
    )
    assert not statements.update(
        Execution,
        where={"id": execution.pk},
        values={"status": ExecutionStatus.ERROR},
        condition="run_id IN (SELECT id FROM evaluations_run WHERE status = %s)",
        condition_params=[RunStatus.CANCELLED],
    )
    assert Execution.objects.get(pk=execution.pk).status == ExecutionStatus.PENDING


def test_add_increments_the_column_and_conditions_compare_columns(tmp_path) -> None:
    run = planned(tmp_path)
    assert run.execution_count > 1
    for _ in range(run.execution_count - 1):
        statements.update(Run, where={"id": run.pk}, values={"executions_done": statements.Add(1)})
    reached = {
        "where": {"id": run.pk, "status": RunStatus.RUNNING},
        "values": {"status": RunStatus.FINALIZING},
        "condition": "executions_done >= execution_count",
    }
    assert statements.update(Run, **reached) == 0  # one short of the plan
    statements.update(Run, where={"id": run.pk}, values={"executions_done": statements.Add(1)})
    assert statements.update(Run, **reached) == 1
    run.refresh_from_db()
    assert (run.executions_done, run.status) == (run.execution_count, RunStatus.FINALIZING)


def test_update_reading_reads_the_row_back_as_the_update_left_it(tmp_path) -> None:
    run = planned(tmp_path)
    assert run.execution_count == 2
    count = {
        "where": {"id": run.pk},
        "values": {"executions_done": statements.Add(1)},
        "read": "executions_done, executions_done >= execution_count",
    }
    done, reached = statements.update_reading(Run, **count)
    assert (done, bool(reached)) == (1, False)
    done, reached = statements.update_reading(Run, **count)
    assert (done, bool(reached)) == (2, True)
    assert statements.update_reading(Run, **{**count, "where": {"id": run.pk + 1000}}) is None
    run.refresh_from_db()
    assert run.executions_done == 2


def test_counting_an_execution_takes_one_statement_and_the_last_one_two(
    tmp_path, django_assert_num_queries
) -> None:
    """Every execution's commit counts it; only the one that completes the plan also moves
    the run on, to finalising."""
    from evaluations.services.recording import _count_done

    run = planned(tmp_path)
    with django_assert_num_queries(1):
        _count_done(run.pk)
    run.refresh_from_db()
    assert (run.executions_done, run.status) == (1, RunStatus.RUNNING)
    with django_assert_num_queries(2):
        _count_done(run.pk)
    run.refresh_from_db()
    assert (run.executions_done, run.status) == (2, RunStatus.FINALIZING)


def test_without_returning_the_count_is_read_by_the_second_statement(
    tmp_path, monkeypatch, django_assert_num_queries
) -> None:
    """SQLite before 3.35 has no RETURNING: every count then takes both statements, and the
    run still moves on only once the plan is complete."""
    from django.db import connection

    from evaluations.services.recording import _count_done

    run = planned(tmp_path)
    monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)
    with django_assert_num_queries(2):
        _count_done(run.pk)
    run.refresh_from_db()
    assert (run.executions_done, run.status) == (1, RunStatus.RUNNING)
    _count_done(run.pk)
    run.refresh_from_db()
    assert (run.executions_done, run.status) == (2, RunStatus.FINALIZING)


def test_inserted_rows_read_back_as_bulk_create_writes_them(tmp_path) -> None:
    """More rows than one statement takes on SQLite (66 of these), and than PostgreSQL's
    INSERT is used for (COPY), with JSON, text that neither may misread and the defaults
    filled in."""
    run = planned(tmp_path)
    first, second = run.executions.order_by("id")[:2]

    def results(execution: Execution) -> list[CheckResult]:
        return [
            CheckResult(
                execution=execution,
                run=run,
                invariant_id=f"invariant_{index}",
                check_type="contains",
                score=index / 150,
                passed=index % 2 == 0,
                # What COPY's text format must escape: tab, newline, backslash, its NULL.
                message=f'it\'s %s {index}; "quoted" é\t\\N\nback\\slash',
                details={"expected": ["a", None, 1.5, "tab\there"], "index": index},
                dimensions=["x"] if index % 3 else [],
            )
            for index in range(150)
        ]

    statements.insert(CheckResult, results(first))
    CheckResult.objects.bulk_create(results(second))

    def stored(execution: Execution) -> list[tuple]:
        fields = ["invariant_id", "check_type", "score", "passed", "failure_code", "message"]
        fields += ["details", "severity", "weight", "gate", "dimensions", "source", "run_id"]
        return list(execution.check_results.order_by("invariant_id").values_list(*fields))

    assert len(stored(first)) == 150
    assert stored(first) == stored(second)
    assert all(row.created is not None for row in first.check_results.all())
    statements.insert(CheckResult, [])  # nothing to insert: no statement, no error


@pytest.mark.parametrize("count", [1, 40], ids=["one-row", "many-rows"])
def test_a_row_a_unique_constraint_refuses_fails_the_whole_insert_as_the_orm_s_error(
    tmp_path, count: int
) -> None:
    """By INSERT or by COPY: Django's IntegrityError, and none of the rows inserted."""
    from django.db import IntegrityError, transaction

    run = planned(tmp_path)
    existing = run.executions.order_by("id").first()

    def execution(key: str) -> Execution:
        return Execution(
            run=run, project_id=run.project_id, key=key, scenario=existing.scenario,
            prompt=existing.prompt, plan={"again": True},
        )  # fmt: skip

    rows = [execution(f"new-{index}") for index in range(count - 1)] + [execution(existing.key)]
    with pytest.raises(IntegrityError), transaction.atomic():
        statements.insert(Execution, rows)
    assert run.executions.count() == 2
    assert run.executions.get(key=existing.key).plan != {"again": True}


def test_many_rows_go_in_by_copy_on_postgresql_and_are_logged_as_one_statement(
    tmp_path,
) -> None:
    """psycopg parses an INSERT's text at every call once it has more than 50 parameters;
    COPY has none to parse. A few rows stay one INSERT; SQLite takes INSERTs only."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run = planned(tmp_path)
    execution = run.executions.order_by("id").first()

    def results(count: int, prefix: str) -> list[CheckResult]:
        return [
            CheckResult(
                execution=execution,
                run=run,
                invariant_id=f"{prefix}{index}",
                check_type="contains",
                score=1.0,
                passed=True,
            )
            for index in range(count)
        ]

    fields = len(statements._inserted_fields(CheckResult))
    few = statements.PARSED_EVERY_TIME_ABOVE // fields
    with CaptureQueriesContext(connection) as queries:
        statements.insert(CheckResult, results(few, "few"))
        statements.insert(CheckResult, results(few + 1, "more"))
    verbs = [query["sql"].split()[0] for query in queries.captured_queries]
    assert verbs == (["INSERT", "COPY"] if connection.vendor == "postgresql" else ["INSERT"] * 2)
    assert execution.check_results.count() == 2 * few + 1


def test_a_row_reads_every_field_as_the_orm_loads_it(tmp_path) -> None:
    run = planned(tmp_path)
    execution = run.executions.order_by("id").first()
    Execution.objects.filter(pk=execution.pk).update(
        status=ExecutionStatus.SUCCESS,
        finished=datetime(2026, 11, 25, 23, 59, 58, 123456, tzinfo=UTC),
        tool_sequence=[{"name": "lookup", "arguments": {"q": "é\u2603", "n": [1, 2.5, None]}}],
        composite=0.25,
        passed=True,
        lease_expires=None,
    )
    expected = Execution.objects.get(pk=execution.pk)
    read = statements.row(Execution, execution.pk)
    assert read is not None and type(read) is Execution
    fields = Execution._meta.concrete_fields
    assert {f.attname: getattr(read, f.attname) for f in fields} == {
        f.attname: getattr(expected, f.attname) for f in fields
    }
    assert isinstance(read.plan, dict) and read.finished == expected.finished
    assert not read._state.adding and read._state.db == "default"  # as loaded, not new
    assert statements.row(Execution, execution.pk + 1000) is None
