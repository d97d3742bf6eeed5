"""What the regressions comparison reads (issue 18): each run's groups and cells that did
not pass (Run.failing_keys) and the compared parts of each group and cell (Run.verdicts,
Baseline.verdicts) are stored when it is finalized or promoted, and backfilled by
migration 0015; the comparison on those finds what the whole summaries give, the report
finds since which run a regression has lasted from the keys, and it reads every
regression's first failing executions in one query per kind, not one per row."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evaluations import services
from evaluations.models import Baseline, CheckResult, Execution, Run
from evaluations.selectors.regressions import (
    cells_by_key,
    compared_verdicts,
    group_passed,
    groups_by_key,
    project_group_changes,
    summary_failing_keys,
)
from evaluations.selectors.reports import SINCE_FIRST_READ
from tests.evaluations.views.run_data import (
    runs_a_backfill_meets,
    synthetic_run,
    synthetic_version,
)

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

backfill_migration = importlib.import_module(
    "evaluations.migrations.0015_regression_keys_and_verdicts"
)


def test_finalize_stores_the_groups_and_cells_that_did_not_pass(two_projects: Any) -> None:
    version = synthetic_version(two_projects.mine)  # 3 scenarios x 2 prompts x 2 replicas

    run = synthetic_run(version)  # `cites` fails in tool-outage, flaky in slow-llm

    run.refresh_from_db()
    assert run.failing_keys == {
        "groups": [
            "slow-llm / prompt 0",
            "slow-llm / prompt 1",
            "tool-outage / prompt 0",
            "tool-outage / prompt 1",
        ],
        "cells": ["cites @ slow-llm", "cites @ tool-outage"],
    }
    passing = synthetic_run(version, failing_scenario="", flaky_scenario="")
    passing.refresh_from_db()
    assert passing.failing_keys == {"groups": [], "cells": []}


def test_the_backfill_stores_what_finalize_and_promote_do_batch_after_batch(
    two_projects: Any, member: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = synthetic_version(two_projects.mine)
    finalized, unfinished = runs_a_backfill_meets(version)
    admin = member("admin")
    baselines = [
        services.baseline_promote(run_id=run.pk, user=admin, reason="r") for run in finalized
    ]
    stored = {run.pk: Run.objects.get(pk=run.pk) for run in finalized}
    stored_baselines = dict(Baseline.objects.values_list("pk", "verdicts"))
    # As before migration 0015: nothing stored.
    Run.objects.update(failing_keys={}, verdicts={})
    Baseline.objects.update(verdicts={})
    monkeypatch.setattr(backfill_migration, "BATCH", 2)  # two batches for three rows

    backfill_migration.backfill(apps, None)

    after = {run.pk: run for run in Run.objects.all()}
    for pk, run in stored.items():
        assert after[pk].failing_keys == run.failing_keys == summary_failing_keys(run.summary)
        assert after[pk].verdicts == run.verdicts == compared_verdicts(run.summary)
    assert (after[unfinished.pk].failing_keys, after[unfinished.pk].verdicts) == ({}, {})
    assert after[finalized[1].pk].failing_keys["cells"] == ["cites @ no-chaos"]
    assert dict(Baseline.objects.values_list("pk", "verdicts")) == stored_baselines
    for baseline in baselines:
        assert stored_baselines[baseline.pk] == compared_verdicts(baseline.data)


def changes_from_full_json(project: Any) -> list[tuple[str, str, bool, Any, Any, str, Any]]:
    """The regressions and improvements compared on the baselines' data and the runs' whole
    summaries (groups and matrix), as the comparison did before Run.verdicts."""
    changes = []
    for baseline in Baseline.objects.filter(project=project, active=True):
        run = Run.objects.filter(spec=baseline.spec, status="completed").latest("id")
        if run.pk == baseline.run_id:
            continue
        for by_key, part in ((groups_by_key, "groups"), (cells_by_key, "matrix")):
            before, after = by_key(baseline.data.get(part)), by_key(run.summary.get(part))
            for key, old in before.items():
                new = after.get(key)
                if new is not None and group_passed(old) != group_passed(new):
                    rate = new.get("pass_rate", new.get("pass_at_1"))
                    codes = new.get("failure_codes") or None
                    changes.append(
                        (
                            key,
                            new.get("status"),
                            group_passed(old),
                            rate,
                            new.get("c"),
                            codes,
                            run.pk,
                        )
                    )
    return changes


def test_the_stored_verdicts_give_the_changes_the_whole_summaries_give(
    two_projects: Any, member: Any
) -> None:
    admin = member("admin")
    version = synthetic_version(two_projects.mine, replicas=3)
    # The baseline: tool-outage fails; then it passes and slow-llm fails and is flaky.
    reference = synthetic_run(version, flaky_scenario="", branch="main")
    services.baseline_promote(run_id=reference.pk, user=admin, reason="r")
    latest = synthetic_run(version, failing_scenario="slow-llm", flaky_scenario="no-chaos")

    regressions, improvements = project_group_changes(two_projects.mine, cells=True)

    found = [
        (
            r.group,
            r.current_status,
            r in regressions,
            r.current_pass_rate,
            int(r.current_counts.split("/")[0]) if r.current_counts else None,
            r.failure_codes or None,
            r.run_id,
        )
        for r in [*regressions, *improvements]
    ]
    expected = changes_from_full_json(two_projects.mine)
    assert sorted(found, key=str) == sorted(expected, key=str)
    assert {change[0] for change in found} == {
        "no-chaos / prompt 0",
        "no-chaos / prompt 1",
        "slow-llm / prompt 0",
        "slow-llm / prompt 1",
        "tool-outage / prompt 0",
        "tool-outage / prompt 1",
        "cites @ no-chaos",
        "cites @ slow-llm",
        "cites @ tool-outage",
    }
    assert latest.pk == regressions[0].run_id


def first_failing_executions(row: dict[str, Any], limit: int = 3) -> list[int]:
    """A regression's first failing executions, one plain query (what the report did per
    row before)."""
    if row["invariant"]:
        scenario = row["group"].split(" @ ")[1]
        ids = (
            CheckResult.objects.filter(
                run_id=row["run_id"],
                invariant_id=row["invariant"],
                execution__scenario=scenario,
                passed=False,
            )
            .order_by("execution_id")
            .values_list("execution_id", flat=True)
            .distinct()
        )
    else:
        scenario, prompt = row["group"].split(" / prompt ")
        ids = Execution.objects.filter(
            run_id=row["run_id"], scenario=scenario, prompt_index=int(prompt), passed=False
        ).values_list("id", flat=True)
    return list(ids.order_by("id" if not row["invariant"] else "execution_id")[:limit])


def test_each_regression_has_its_streak_and_first_failing_executions_in_fixed_queries(
    two_projects: Any, member: Any, client_as: Any
) -> None:
    mine, client = two_projects.mine, client_as("viewer")
    admin = member("admin")
    version = synthetic_version(two_projects.mine, replicas=4)
    baseline = synthetic_run(version, failing_scenario="", flaky_scenario="", branch="main")
    services.baseline_promote(run_id=baseline.pk, user=admin, reason="passing")
    url = reverse("regressions", args=[mine.slug]) + "?format=json"

    # tool-outage fails: two groups and one cell regressed.
    first = synthetic_run(version, flaky_scenario="", branch="main")
    with CaptureQueriesContext(connection) as fewer:
        rows = json.loads(client.get(url).content)["regressions"]
    assert len(rows) == 3

    # tool-outage still fails and slow-llm is flaky now: twice the rows, the same queries.
    second = synthetic_run(version, branch="main")
    with CaptureQueriesContext(connection) as more:
        rows = json.loads(client.get(url).content)["regressions"]
    assert len(rows) == 6
    assert len(more.captured_queries) == len(fewer.captured_queries)

    since = {row["group"]: row["since_run_id"] for row in rows}
    assert since == {
        "tool-outage / prompt 0": first.pk,
        "tool-outage / prompt 1": first.pk,
        "cites @ tool-outage": first.pk,
        "slow-llm / prompt 0": second.pk,
        "slow-llm / prompt 1": second.pk,
        "cites @ slow-llm": second.pk,
    }
    # tool-outage fails in its 4 replicas per prompt (8 in its cell): the first 3 are shown;
    # slow-llm in replica 0 of each prompt.
    shown = {"tool-outage": 3, "cites @ tool-outage": 3, "slow-llm": 1, "cites @ slow-llm": 2}
    for row in rows:
        expected = first_failing_executions(row)
        assert len(expected) == shown[row["group"].split(" / ")[0]]
        assert row["failing_urls"] == [
            reverse("execution_detail", args=[mine.slug, pk]) for pk in expected
        ]


def test_the_report_reads_every_specs_history_in_one_query(
    two_projects: Any, member: Any, client_as: Any
) -> None:
    mine, client = two_projects.mine, client_as("viewer")
    admin = member("admin")
    url = reverse("regressions", args=[mine.slug]) + "?format=json"
    counts, specs = [], []
    for _ in range(3):
        version = synthetic_version(mine)
        baseline = synthetic_run(version, failing_scenario="", flaky_scenario="")
        services.baseline_promote(run_id=baseline.pk, user=admin, reason="passing")
        synthetic_run(version)
        with CaptureQueriesContext(connection) as queries:
            rows = json.loads(client.get(url).content)["regressions"]
        counts.append(len(queries.captured_queries))
        specs.append(len({row["spec"] for row in rows}))
        assert all(row["since_run_id"] == row["run_id"] for row in rows)

    assert specs == [1, 2, 3]
    assert counts[0] == counts[1] == counts[2]


def test_a_streak_longer_than_the_runs_read_first_is_followed_to_its_start(
    two_projects: Any, member: Any, client_as: Any
) -> None:
    """The failing keys of a spec's newest runs come with the runs; a streak that goes past
    them has the older runs' keys read then (one query more), and ends where a run passed."""
    mine, client = two_projects.mine, client_as("viewer")
    admin = member("admin")
    url = reverse("regressions", args=[mine.slug]) + "?format=json"
    version = synthetic_version(mine)
    baseline = synthetic_run(version, failing_scenario="", flaky_scenario="")
    services.baseline_promote(run_id=baseline.pk, user=admin, reason="passing")
    synthetic_run(version)  # failed once, long ago
    synthetic_run(version, failing_scenario="", flaky_scenario="")  # passed: a streak ends here
    short = [synthetic_run(version)]
    with CaptureQueriesContext(connection) as read_first:
        rows = json.loads(client.get(url).content)["regressions"]
    assert {row["since_run_id"] for row in rows} == {short[0].pk}

    streak = short + [synthetic_run(version) for _ in range(SINCE_FIRST_READ + 1)]
    with CaptureQueriesContext(connection) as read_later:
        rows = json.loads(client.get(url).content)["regressions"]

    assert {row["run_id"] for row in rows} == {streak[-1].pk}
    assert {row["since_run_id"] for row in rows} == {streak[0].pk}
    assert len(read_later.captured_queries) == len(read_first.captured_queries) + 1
