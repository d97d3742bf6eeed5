"""Run exports: JSON (re-scorable), JUnit XML and Markdown from checks.reporters, and the
CSV of every check result streamed row by row; unknown formats, permissions across two
projects, and a query count that does not grow with the results."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from checks.reporters import load_report
from checks.scoring import score_run
from evaluations import services
from evaluations.models import CheckResult, Execution, ResultSource

from .run_data import World, real_world, synthetic_run, synthetic_version

pytestmark = pytest.mark.django_db

CSV_HEADER = [
    "execution_id",
    "scenario",
    "prompt_index",
    "replica",
    "invariant",
    "check_type",
    "source",
    "passed",
    "score",
    "failure_code",
    "message",
]


@pytest.fixture(scope="module")
def world(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: Any) -> Iterator[World]:
    with django_db_blocker.unblock(), real_world(tmp_path_factory.mktemp("exp"), "dashexp") as w:
        yield w


def export_url(world: World, fmt: str, run_id: int | None = None) -> str:
    return reverse("run_export", args=[world.mine.slug, run_id or world.run.pk, fmt])


def csv_rows(response: Any) -> list[list[str]]:
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def test_json_export_is_the_cli_report_and_scores_again_to_the_same_verdict(world: World) -> None:
    response = world.client("viewer").get(export_url(world, "json"))

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == (
        f'attachment; filename="dash-agent-run-{world.run.pk}.json"'
    )
    report = json.loads(response.content)
    assert report["format"] == "keystone-run-report"
    assert len(report["executions"]) == 8
    assert report["summary"]["exit_code"] == 1 == world.run.exit_code
    assert report["summary"]["pass_rate"] == world.run.pass_rate
    loaded = load_report(report)
    assert score_run(loaded.spec, loaded.records).exit_code == 1
    # The agent's command and services stay out of a report (it may be attached to CI).
    assert "agent.py" not in json.dumps(report["spec"])


def test_junit_export_parses_and_shows_the_failures(world: World) -> None:
    response = world.client("viewer").get(export_url(world, "junit"))

    assert response.status_code == 200
    assert response["Content-Type"] == "application/xml"
    assert response["Content-Disposition"].endswith(f'dash-agent-run-{world.run.pk}-junit.xml"')
    root = ET.fromstring(response.content)
    cases = root.findall(".//testcase")
    failures = root.findall(".//failure")
    assert cases
    assert failures
    # says_shipped in each orders-down execution, and the failed pass-rate gate.
    contains = [
        c
        for c in cases
        if (f := c.find("failure")) is not None and f.get("type") == "CONTAINS_FAILED"
    ]
    assert len(contains) == 4
    assert {c.get("classname") for c in contains} == {"dash-agent.orders-down"}
    assert any(
        "pass_rate_min" in (c.get("name") or "") for c in cases if c.find("failure") is not None
    )
    assert len(failures) == 5


def test_markdown_export_summarises_the_run(world: World) -> None:
    response = world.client("viewer").get(export_url(world, "md"))

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    assert response["Content-Disposition"].endswith(f'dash-agent-run-{world.run.pk}.md"')
    text = response.content.decode()
    assert text.startswith("# Keystone run: dash-agent")
    assert "FAIL" in text
    assert "orders-down / prompt 0" in text


def test_csv_export_has_one_row_per_check_result(world: World) -> None:
    CheckResult.objects.create(
        execution=Execution.objects.filter(run=world.run).order_by("id").first(),
        run=world.run,
        invariant_id="says_shipped",
        check_type="contains",
        score=0.0,
        passed=False,
        failure_code="JUDGE_BELOW_THRESHOLD",
        message='a "quoted", multi-line\nmessage',
        source=ResultSource.HUMAN,
    )

    response = world.client("viewer").get(export_url(world, "csv"))

    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == (
        f'attachment; filename="dash-agent-run-{world.run.pk}-results.csv"'
    )
    rows = csv_rows(response)
    assert rows[0] == CSV_HEADER
    assert len(rows) == 1 + CheckResult.objects.filter(run=world.run).count() == 1 + 25
    by_column = [dict(zip(CSV_HEADER, row, strict=True)) for row in rows[1:]]
    failed = [r for r in by_column if r["passed"] == "False" and r["source"] == "engine"]
    assert len(failed) == 4
    assert {(r["scenario"], r["invariant"], r["failure_code"]) for r in failed} == {
        ("orders-down", "says_shipped", "CONTAINS_FAILED")
    }
    assert {(r["prompt_index"], r["replica"]) for r in failed} == {
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    }
    human = next(r for r in by_column if r["source"] == "human")
    assert human["message"] == 'a "quoted", multi-line\nmessage'
    execution_ids = {
        str(i) for i in Execution.objects.filter(run=world.run).values_list("id", flat=True)
    }
    assert {r["execution_id"] for r in by_column} == execution_ids


def test_csv_export_streams_lazily_and_its_queries_do_not_grow(world: World) -> None:
    client = world.client("viewer")
    small = synthetic_run(synthetic_version(world.mine, replicas=1))
    large = synthetic_run(synthetic_version(world.mine, replicas=60))  # 1,080 results

    def export(run_id: int) -> tuple[int, int, int]:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(export_url(world, "csv", run_id))
            before_reading = len(queries)
            rows = csv_rows(response)
        return before_reading, len(queries), len(rows)

    small_before, small_total, small_rows = export(small.pk)
    large_before, large_total, large_rows = export(large.pk)

    assert (small_rows, large_rows) == (1 + 18, 1 + 1080)
    # No result is read before the body is consumed: the rows are produced as sent.
    assert small_total == small_before + 1
    assert (large_before, large_total) == (small_before, small_total)


@pytest.mark.parametrize("fmt", ["xlsx", "pdf", "JSON", "html", "xml"])
def test_unknown_export_format_is_404(world: World, fmt: str) -> None:
    assert world.client("viewer").get(export_url(world, fmt)).status_code == 404


@pytest.mark.parametrize(
    ("role", "status"),
    [("viewer", 200), ("reviewer", 200), ("editor", 200), ("admin", 200), ("outsider", 404)],
)
@pytest.mark.parametrize("fmt", ["json", "junit", "md", "csv"])
def test_exports_are_for_members_only(world: World, fmt: str, role: str, status: int) -> None:
    assert world.client(role).get(export_url(world, fmt)).status_code == status


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_another_projects_run_cannot_be_exported_under_this_slug(world: World, fmt: str) -> None:
    response = world.client("admin").get(export_url(world, fmt, world.other_run.pk))

    assert response.status_code == 404


@pytest.mark.parametrize("fmt", ["json", "junit", "md", "csv"])
def test_a_run_not_executed_yet_exports_empty_reports(world: World, fmt: str) -> None:
    queued = services.run_create(spec_version=world.version, enqueue=False)

    response = world.client("viewer").get(export_url(world, fmt, queued.pk))

    assert response.status_code == 200
    if fmt == "json":
        assert json.loads(response.content)["executions"] == []
    elif fmt == "junit":
        assert ET.fromstring(response.content).findall(".//testcase") is not None
    elif fmt == "csv":
        assert csv_rows(response) == [CSV_HEADER]
