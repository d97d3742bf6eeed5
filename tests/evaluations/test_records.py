"""A run's results as the engine's records (selectors.records.run_records), which finalising a
run, the report `keystone run` prints and the compare page read: the rows are read in chunks,
so a large run's result rows are never all in memory at once (issue 18)."""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import pytest

from evaluations.models import CheckResult, Project
from evaluations.selectors.records import run_records, run_records_with_rows
from tests.evaluations.views.run_data import synthetic_run, synthetic_version

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def test_a_runs_result_rows_are_never_all_in_memory_at_once(monkeypatch: Any) -> None:
    project = Project.objects.create(name="Records", slug="records")
    run = synthetic_run(synthetic_version(project, replicas=5))
    per_execution = Counter(
        CheckResult.objects.filter(run=run).values_list("execution_id", flat=True)
    )
    assert len(per_execution) > 10  # enough executions for "all at once" to differ from one's

    alive: set[int] = set()
    most = 0
    from_db = CheckResult.from_db.__func__  # type: ignore[attr-defined]

    def counted(cls: Any, db: Any, field_names: Any, values: Any) -> CheckResult:
        nonlocal most
        row = from_db(cls, db, field_names, values)
        alive.add(id(row))
        weakref.finalize(row, alive.discard, id(row))
        most = max(most, len(alive))
        return row

    monkeypatch.setattr(CheckResult, "from_db", classmethod(counted))
    records = run_records(run)

    # At most the rows of the execution being read, of the one before it (the caller's until
    # the next is handed over) and the first row of the next one: not the run's 90.
    assert most <= 2 * max(per_execution.values()) + 1, (most, sum(per_execution.values()))
    # The same records as made from every row read at once.
    monkeypatch.undo()
    assert records == [record for record, _ in run_records_with_rows(run)]
    assert sum(len(record.results) for record in records) == sum(per_execution.values())


def test_a_text_that_repeats_across_a_runs_rows_is_kept_once() -> None:
    """The database hands over a new string for every column of every row; a run's records
    keep one copy of each text that repeats (a 10,000-execution run's records took 84 MB
    with a copy per row, 48 MB with one)."""
    project = Project.objects.create(name="Once", slug="once")
    run = synthetic_run(synthetic_version(project, replicas=3))
    records = run_records(run)
    results = [result for record in records for result in record.results]
    assert len(results) > 20

    def copies(texts: list[str]) -> int:
        return len({id(text) for text in texts})

    for field in ("invariant_id", "check_type", "severity", "source", "message"):
        texts = [getattr(result, field) for result in results]
        assert copies(texts) == len(set(texts)), field
    # The details' keys and texts too: one "expected" key and one "cites" text.
    assert copies([key for result in results for key in result.details]) == 1
    assert copies([r.details["expected"] for r in results if r.invariant_id == "cites"]) == 1
    for field in ("scenario", "prompt", "status", "pillar"):
        texts = [getattr(record, field) for record in records]
        assert copies(texts) == len(set(texts)), field
    # The same values as each row on its own gives.
    rows = CheckResult.objects.filter(run=run)
    assert sorted((r.invariant_id, r.message, r.details["expected"]) for r in results) == sorted(
        (row.invariant_id, row.message, row.details["expected"])
        for row in rows
        if row.source == "engine"
    )
