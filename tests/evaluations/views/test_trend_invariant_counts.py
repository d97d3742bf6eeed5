"""Each run's per-invariant counts (Run.invariant_counts, issue 18): written when the run is
finalized, backfilled by migration 0012 for runs finalized before it, and what the trends
page's "pass rate per invariant" chart and table show."""

from __future__ import annotations

import importlib
import json
import re
from collections import Counter
from typing import Any

import pytest
from django.apps import apps
from django.urls import reverse

from evaluations.models import CheckResult, Run, summary_invariant_counts
from tests.evaluations.views.run_data import (
    runs_a_backfill_meets,
    synthetic_run,
    synthetic_version,
)

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]

backfill_migration = importlib.import_module("evaluations.migrations.0012_run_invariant_counts")


def counted_from_results(run: Run) -> dict[str, list[int]]:
    """invariant id -> [passed, total] counted from the run's check result rows."""
    passed: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for invariant_id, ok in CheckResult.objects.filter(run=run).values_list(
        "invariant_id", "passed"
    ):
        total[invariant_id] += 1
        passed[invariant_id] += bool(ok)
    return {invariant_id: [passed[invariant_id], total[invariant_id]] for invariant_id in total}


def test_finalize_stores_each_invariants_passed_and_total_results(two_projects: Any) -> None:
    version = synthetic_version(two_projects.mine)  # 3 scenarios x 2 prompts x 2 replicas

    run = synthetic_run(version)

    run.refresh_from_db()
    # `cites` fails in tool-outage (4 executions) and in slow-llm's replica 0 (2).
    assert run.invariant_counts == {"answers": [12, 12], "cites": [6, 12], "polite": [12, 12]}
    assert run.invariant_counts == counted_from_results(run)


def test_the_backfill_stores_what_finalize_does_batch_after_batch(
    two_projects: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = synthetic_version(two_projects.mine)
    finalized, unfinished = runs_a_backfill_meets(version)
    stored = {run.pk: Run.objects.get(pk=run.pk).invariant_counts for run in finalized}
    # As before migration 0012: nothing stored.
    Run.objects.update(invariant_counts={})
    monkeypatch.setattr(backfill_migration, "BATCH", 2)  # two batches for three runs

    backfill_migration.backfill(apps, None)

    after = dict(Run.objects.values_list("pk", "invariant_counts"))
    assert {pk: after[pk] for pk in stored} == stored
    assert after[unfinished.pk] == {}  # no summary, nothing to count
    for run in finalized:  # and both agree with the matrix and with the results
        run.refresh_from_db()
        assert after[run.pk] == summary_invariant_counts(run.summary)
        assert after[run.pk] == counted_from_results(run)
    assert after[finalized[1].pk]["cites"] == [8, 12]  # fails in no-chaos's 4 executions


def invariant_lines(html: str) -> dict[str, list[float | None]]:
    match = re.search(r'<script id="trend-invariants" type="application/json">(.*?)</script>', html)
    assert match, "no invariant chart"
    return {line["name"]: line["y"] for line in json.loads(match.group(1))["data"]}


def test_the_trends_page_shows_the_stored_counts_as_pass_rates(
    two_projects: Any, client_as: Any
) -> None:
    version = synthetic_version(two_projects.mine)
    runs = [
        synthetic_run(version),
        synthetic_run(version, failing_scenario="", flaky_scenario=""),
    ]
    url = reverse("spec_trends", args=["mine", version.spec.slug])

    html = client_as("viewer").get(url).content.decode()

    expected: dict[str, list[float | None]] = {}
    for run in runs:  # oldest first, each rate from the run's results
        for invariant_id, (passed, total) in counted_from_results(run).items():
            expected.setdefault(invariant_id, []).append(passed / total)
    assert expected == {"answers": [1.0, 1.0], "cites": [0.5, 1.0], "polite": [1.0, 1.0]}
    assert invariant_lines(html) == expected
    # The table: each invariant's rate in the newest run.
    assert re.search(r'<td class="mono">cites</td><td class="num">100%</td>', html)
