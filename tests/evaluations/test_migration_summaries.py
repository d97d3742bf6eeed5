"""Migration 0021 takes each execution's score out of the summaries of runs finished before
(run_finalize no longer stores them): its SQL is each backend's own, so the test runs on
PostgreSQL and again on the embedded SQLite."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps
from django.db import connection

from evaluations.models import Run

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

MIGRATION = importlib.import_module("evaluations.migrations.0021_run_summary_without_executions")


def test_the_migration_strips_the_per_execution_list_and_keeps_everything_else(
    run: Run, spec_version: Any
) -> None:
    old, new = run, Run.objects.create(project=run.project, spec_version=spec_version)
    kept = {
        "verdict": "fail",
        "groups": [{"key": "no-chaos/0", "passed": False}],
        "matrix": [{"invariant_id": "says_hi", "scenario": "no-chaos", "passed": 0}],
        "why_failed": [{"status": "fail", "where": "no-chaos / prompt 1", "reason": "r"}],
    }
    executions = [{"execution_id": "1", "composite": 0.0, "passed": False}]
    Run.objects.filter(pk=old.pk).update(summary={**kept, "executions": executions})
    Run.objects.filter(pk=new.pk).update(summary=kept)

    # The migration's own function, given what RunPython gives it (a schema editor's
    # connection); not a schema editor itself, which SQLite refuses inside the test's
    # transaction.
    MIGRATION.strip_executions(apps, SimpleNamespace(connection=connection))

    old.refresh_from_db()
    new.refresh_from_db()
    assert old.summary == kept
    assert new.summary == kept
