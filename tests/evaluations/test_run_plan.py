"""Planning a run (services.run_plan): its Execution rows are made and inserted a batch at a
time, so a large run never holds all of them at once (issue 18)."""

from __future__ import annotations

from typing import Any

import pytest

from evaluations import services
from evaluations.models import Execution, Project
from evaluations.services import runs
from tests.evaluations.execution_helpers import new_run

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

SPEC = """\
version: 1
id: batched
task: {prompts: ["one", "two", "three"]}
agent: {type: command, command: "true"}
sandbox: {backend: local}
replicas: 3
invariants:
  completes: {description: "it ran", check: {type: completes}}
"""


def test_a_run_larger_than_a_batch_is_planned_whole_and_once(monkeypatch: Any) -> None:
    monkeypatch.setattr(runs, "PLAN_BATCH", 4)  # 9 executions: batches of 4, 4 and 1
    run = new_run(Project.objects.create(name="Plan", slug="plan"), SPEC)
    inserted: list[int] = []
    insert = runs.statements.insert

    def recorded(model: Any, rows: Any, **options: Any) -> None:
        inserted.append(len(rows))
        insert(model, rows, **options)

    monkeypatch.setattr(runs.statements, "insert", recorded)

    ids = services.run_plan(run_id=run.pk)

    assert inserted == [4, 4, 1]
    keys = list(Execution.objects.filter(run=run).values_list("prompt", "replica"))
    assert sorted(keys) == sorted((p, r) for p in ("one", "two", "three") for r in range(3))
    run.refresh_from_db()
    assert run.execution_count == 9 and len(ids) == 9
    # Planned again (a worker retrying the task): nothing more is made.
    assert services.run_plan(run_id=run.pk) == ids
    assert Execution.objects.filter(run=run).count() == 9
