"""What one execution costs the database: a fixed number of statements, whatever the
spec's size or the run's history, so throughput does not fall as runs grow (issue 18).
The statements are counted, not timed: the count does not depend on the machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evaluations import services
from evaluations.models import CheckResult, Execution, ExecutionStatus, Project, Trigger

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

# Claim (1), read the execution with its run and spec (1), then record it in one transaction:
# BEGIN, the conditional UPDATE of the execution, the results, the artifact rows, the run's
# counter and its completion check, COMMIT (7). No row lock read, no savepoint, no re-read.
STATEMENTS_PER_EXECUTION = 9


def test_an_execution_costs_a_fixed_number_of_statements(tmp_path: Path) -> None:
    project = Project.objects.create(name="queries", slug="queries")
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(
        spec_version=version, trigger=Trigger.CLI, enqueue=False, spec_dir=str(tmp_path)
    )
    ids = services.run_plan(run_id=run.pk)
    counts = []
    for execution_id in ids[:-1]:  # the last one also hands the run to finalising
        with CaptureQueriesContext(connection) as queries:
            services.execution_execute(execution_id=execution_id, worker="queries:1")
        counts.append(len(queries))
    executions = Execution.objects.filter(pk__in=ids[:-1])
    assert all(e.status == ExecutionStatus.SUCCESS and e.passed for e in executions)
    assert CheckResult.objects.filter(execution__in=ids[:-1]).count() == 2 * len(ids[:-1])
    # The first one may also add the run's warnings (the sandbox's), once for the run.
    assert counts[1:] == [STATEMENTS_PER_EXECUTION] * len(counts[1:]), [
        q["sql"][:100] for q in queries.captured_queries
    ]
