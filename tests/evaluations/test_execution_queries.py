"""What one execution costs the database: a fixed number of statements, whatever the
spec's size or the run's history, so throughput does not fall as runs grow (issue 18).
The statements are counted, not timed: the count does not depend on the machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evaluations import services
from evaluations.models import CheckResult, Execution, ExecutionStatus, Project, Run
from tests.evaluations.execution_helpers import planned_run

pytestmark = [pytest.mark.django_db(transaction=True)]

SPEC = """\
version: 1
id: queries
task: {prompts: ["a", "b"]}
agent: {type: command, command: "echo done"}
sandbox: {backend: local}
replicas: 2
invariants:
  answers: {description: answers, check: {type: contains, value: done}}
  completes: {description: it ran, check: {type: completes}}
"""

# Claim, the row coming back with it (1), then record it in one transaction: BEGIN, the
# conditional UPDATE of the execution, the results, the artifact rows, the run's counter
# (which reads back whether the plan is complete: a second UPDATE only for the last one),
# COMMIT (6). No row lock read, no savepoint, no re-read. A worker reads the execution's run
# too (1); `keystone run` reads it once per thread and passes it.
STATEMENTS_PER_EXECUTION = 8


@pytest.mark.parametrize("caller_has_the_run", [False, True], ids=["worker", "keystone-run"])
def test_an_execution_costs_a_fixed_number_of_statements(
    tmp_path: Path, caller_has_the_run: bool
) -> None:
    project = Project.objects.create(name="queries", slug="queries")
    run, ids = planned_run(project, SPEC, spec_dir=str(tmp_path))
    given = (
        Run.objects.select_related("spec_version").get(pk=run.pk) if caller_has_the_run else None
    )
    counts = []
    for execution_id in ids[:-1]:  # the last one also hands the run to finalising
        with CaptureQueriesContext(connection) as queries:
            services.execution_execute(execution_id=execution_id, worker="queries:1", run=given)
        counts.append(len(queries))
    executions = Execution.objects.filter(pk__in=ids[:-1])
    assert all(e.status == ExecutionStatus.SUCCESS and e.passed for e in executions)
    assert CheckResult.objects.filter(execution__in=ids[:-1]).count() == 2 * len(ids[:-1])
    # The first one may also add the run's warnings (the sandbox's), once for the run: the
    # run passed in learns them, so the next executions do not read them again.
    expected = STATEMENTS_PER_EXECUTION - caller_has_the_run
    assert counts[1:] == [expected] * len(counts[1:]), [
        q["sql"][:100] for q in queries.captured_queries
    ]


def test_a_claim_returns_the_row_as_a_read_of_it_loads_it_with_or_without_returning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's UPDATE brings the row back (RETURNING); a database without RETURNING
    (SQLite before 3.35) reads it after the UPDATE. Either way the row is what the ORM loads,
    every field converted (datetimes, JSON), and a claimed execution cannot be claimed again."""
    project = Project.objects.create(name="claims", slug="claims")
    run, ids = planned_run(project, SPEC, spec_dir=str(tmp_path))
    returned = services.execution_claim(execution_id=ids[0], worker="claims:1")
    monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)
    with CaptureQueriesContext(connection) as queries:
        read_after = services.execution_claim(execution_id=ids[1], worker="claims:1")
    assert len(queries) == 2  # the UPDATE, then the row
    fields = [field.attname for field in Execution._meta.concrete_fields]
    for claimed, execution_id in ((returned, ids[0]), (read_after, ids[1])):
        assert claimed is not None
        loaded = Execution.objects.get(pk=execution_id)
        assert [getattr(claimed, name) for name in fields] == [
            getattr(loaded, name) for name in fields
        ]
        assert claimed.status == ExecutionStatus.RUNNING and claimed.claimed_by == "claims:1"
        assert claimed.started is not None and claimed.plan == loaded.plan != {}
    monkeypatch.undo()
    assert services.execution_claim(execution_id=ids[0], worker="claims:2") is None
