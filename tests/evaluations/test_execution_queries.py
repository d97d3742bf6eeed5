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

# Claim (1), read the execution (1), then record it in one transaction: BEGIN, the
# conditional UPDATE of the execution, the results, the artifact rows, the run's counter and
# its completion check, COMMIT (7). No row lock read, no savepoint, no re-read. A worker
# reads the execution's run too (1); `keystone run` reads it once per thread and passes it.
STATEMENTS_PER_EXECUTION = 10


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
