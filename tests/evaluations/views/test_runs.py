"""Run pages: the list (filters, keyset pagination), a run's page (live progress that stops
polling when the run ends, scores, gates, heatmap, replica groups), one heatmap cell, the
cancel and re-run-failed actions, permissions for every role across two projects, and
query counts that do not grow with the data.

The run shown is executed for real once per module (run_data.real_world); lists, polling
and query counts also use synthetic runs made with bulk_create.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from evaluations import services
from evaluations.models import Execution, ExecutionStatus, Run, RunStatus
from tests.evaluations.execution_helpers import execute_run

from .run_data import (
    World,
    real_world,
    storage_settings,
    synthetic_run,
    synthetic_version,
)

pytestmark = pytest.mark.django_db

RUN_ID = re.compile(r'data-run-id="(\d+)"')


@pytest.fixture(scope="module")
def world(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: Any) -> Iterator[World]:
    with django_db_blocker.unblock(), real_world(tmp_path_factory.mktemp("runs"), "dashruns") as w:
        yield w


@pytest.fixture(autouse=True)
def _world_storage(world: World, settings: Any) -> None:
    """The artifacts of the module's run live in its own directory, not the test's."""
    for name, value in storage_settings(world.artifact_root).items():
        setattr(settings, name, value)


def htmx(client: Client, url: str, **kwargs: Any) -> Any:
    return client.get(url, HTTP_HX_REQUEST="true", **kwargs)


def url(name: str, world: World, *args: Any, project: str | None = None) -> str:
    return reverse(name, args=[project or world.mine.slug, *args])


def listed_ids(html: str) -> list[int]:
    return [int(i) for i in RUN_ID.findall(html)]


# --- Run list -------------------------------------------------------------------------------


def test_run_list_shows_every_column_of_a_run(world: World) -> None:
    response = world.client("viewer").get(url("run_list", world))

    assert response.status_code == 200
    html = response.content.decode()
    run = world.run
    assert listed_ids(html) == [run.pk]
    row = html[html.index(f'data-run-id="{run.pk}"') :]
    row = row[: row.index("</tr>")]
    assert f'href="{url("run_detail", world, run.pk)}"' in row
    assert "dash-agent" in row and "v1" in row
    assert "status-completed" in row
    assert "gates fail" in row and "exit 1" in row
    assert f"{run.composite:.3f}" in row
    assert "50%" in row  # two of four groups pass
    assert f"{run.resilience:.1f}" in row
    assert f"${run.cost_usd:.4f}" in row
    assert f"{run.p95_duration_ms:.0f} ms" in row
    assert "team=orders" in row and ">main<" in row
    assert "Runs" in html and "<html" in html  # the whole page, with the project nav


def test_run_list_htmx_answers_the_table_region(world: World) -> None:
    response = htmx(world.client("viewer"), url("run_list", world))

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="run-table"')
    assert "<html" not in html and 'role="search"' not in html
    assert listed_ids(html) == [world.run.pk]


def test_run_list_filters_by_spec_status_label_branch_and_dates(world: World) -> None:
    project = world.mine
    alpha, beta = synthetic_version(project), synthetic_version(project)
    now = timezone.now()

    def make(version: Any, **columns: Any) -> int:
        labels = columns.pop("labels", {})
        return Run.objects.create(
            project=project,
            spec_version=version,
            labels=labels,
            branch=labels.get("branch", ""),
            **columns,
        ).pk

    a_main = make(
        alpha,
        status=RunStatus.COMPLETED,
        labels={"branch": "main", "env": "ci", "model": "gpt-4o", "seed": 7},
    )
    a_feature = make(alpha, status=RunStatus.FAILED, labels={"branch": "feature/x"})
    b_old = make(beta, status=RunStatus.COMPLETED, created=now - timedelta(days=10))
    b_label = make(beta, status=RunStatus.RUNNING, labels={"env": "nightly", "a__b": "1"})
    client = world.client("viewer")

    def ids(**query: str) -> set[int]:
        response = client.get(url("run_list", world), query)
        assert response.status_code == 200, response.content
        return set(listed_ids(response.content.decode()))

    assert ids(spec=alpha.spec.slug) == {a_main, a_feature}
    assert ids(status="completed") == {a_main, b_old, world.run.pk}
    assert ids(status="running") == {b_label}
    assert ids(label="env=ci") == {a_main}
    assert ids(label="env=nightly") == {b_label}
    assert ids(label="a__b=1") == {b_label}  # a key with "__" stays a key
    # The URL (?label=model%3Dgpt-4o), which SQLite once read as JSON: a 500.
    assert ids(label="model=gpt-4o") == {a_main}
    assert ids(label="model=gpt-4") == set()
    assert ids(label="seed=7") == {a_main}  # a number set through the API compares as text
    assert ids(label="model=gpt-4o", branch="main", status="completed") == {a_main}
    assert ids(branch="feature/x") == {a_feature}
    assert ids(branch="main") == {a_main, world.run.pk}  # the real run has branch=main
    old_day = timezone.localdate(now - timedelta(days=10)).isoformat()
    assert ids(created_from=old_day, created_to=old_day) == {b_old}
    yesterday = timezone.localdate(now - timedelta(days=1)).isoformat()
    assert b_old not in ids(created_from=yesterday)
    assert ids(created_to=timezone.localdate(now - timedelta(days=2)).isoformat()) == {b_old}
    assert ids(spec=beta.spec.slug, status="completed") == {b_old}


def test_run_list_searches_by_failure_code_and_output_text(world: World) -> None:
    """Search across runs: the real run failed says_shipped with CONTAINS_FAILED in its
    outage scenario, and its answers say "the order tool said"; a run with neither is
    not found."""
    other = Run.objects.create(
        project=world.mine, spec_version=synthetic_version(world.mine), status=RunStatus.COMPLETED
    )
    Execution.objects.create(run=other, scenario="no-chaos", final_output="nothing to see")
    client = world.client("viewer")

    def ids(**query: str) -> set[int]:
        response = client.get(url("run_list", world), query)
        assert response.status_code == 200, response.content
        return set(listed_ids(response.content.decode()))

    assert ids(failure_code="CONTAINS_FAILED") == {world.run.pk}
    assert ids(failure_code="contains_failed") == {world.run.pk}  # codes read in any case
    assert ids(failure_code="TIMEOUT") == set()
    assert ids(output="ORDER TOOL SAID") == {world.run.pk}
    assert ids(output="nothing to see") == {other.pk}
    assert ids(output="order tool said", spec=world.run.spec.slug, branch="main") == {world.run.pk}
    assert ids(output="order tool said", label="team=orders") == {world.run.pk}
    refused = client.get(url("run_list", world), {"failure_code": "NOT A CODE;"})
    assert refused.status_code == 400  # said on the page, not a 500
    assert "a failure code is letters, digits and _" in refused.content.decode()
    assert ids(spec="no-such-spec") == set()


@pytest.mark.parametrize(
    ("query", "field", "message"),
    [
        ({"label": "no-equals-sign"}, "label", "expected key=value"),
        ({"after": "not-a-cursor!"}, "after", "is not a run list cursor"),
        ({"created_from": "2024-05-02", "created_to": "2024-05-01"}, "created_to", "before"),
        ({"created_from": "yesterday"}, "created_from", "Enter a valid date"),
        ({"status": "exploded"}, "status", "Select a valid choice"),
    ],
)
def test_run_list_names_a_bad_filter_and_its_field(
    world: World, query: dict[str, str], field: str, message: str
) -> None:
    client = world.client("viewer")

    page = client.get(url("run_list", world), query)
    fragment = htmx(client, url("run_list", world), data=query)

    assert page.status_code == 400
    assert fragment.status_code == 200  # htmx swaps 2xx only: the error is in the fragment
    for response in (page, fragment):
        html = response.content.decode()
        assert f"<strong>{field}</strong>" in html and message in html
        assert listed_ids(html) == []


def _walk(client: Client, first: str) -> tuple[list[int], int]:
    """Follow "Older runs" links from `first`; every id seen, in order, and the page count."""
    seen: list[int] = []
    pages = 0
    next_url: str | None = first
    while next_url:
        response = client.get(next_url)
        assert response.status_code == 200
        html = response.content.decode()
        seen += listed_ids(html)
        pages += 1
        match = re.search(r'<a href="(\?[^"]*)" rel="next"', html)
        next_url = first.split("?")[0] + match.group(1).replace("&amp;", "&") if match else None
        assert pages < 20, "pagination does not end"
    return seen, pages


def test_keyset_pages_list_every_run_once_in_order_even_with_equal_timestamps(
    world: World,
) -> None:
    version = synthetic_version(world.mine)
    moment = timezone.now() - timedelta(hours=1)
    # 130 runs sharing only 13 distinct timestamps: ties must be broken by id.
    Run.objects.bulk_create(
        Run(
            project=world.mine,
            spec=version.spec,
            spec_version=version,
            branch="paged" if i % 2 else "",
            created=moment - timedelta(minutes=i // 10),
        )
        for i in range(130)
    )
    expected = list(
        Run.objects.filter(project=world.mine)
        .order_by("-created", "-id")
        .values_list("id", flat=True)
    )

    seen, pages = _walk(world.client("viewer"), url("run_list", world))

    assert pages == 3  # 131 runs, 50 a page
    assert len(seen) == len(set(seen)), "a run appeared on two pages"
    assert seen == expected

    # The cursor carries the filters along.
    seen_paged, pages_paged = _walk(
        world.client("viewer"), url("run_list", world) + "?branch=paged"
    )
    assert pages_paged == 2
    assert seen_paged == [i for i in expected if Run.objects.get(pk=i).branch == "paged"]


def test_run_list_pages_by_keyset_not_offset(world: World) -> None:
    version = synthetic_version(world.mine)
    Run.objects.bulk_create(
        Run(project=world.mine, spec=version.spec, spec_version=version) for _ in range(60)
    )
    client = world.client("viewer")
    first = client.get(url("run_list", world)).content.decode()
    cursor = re.search(r'rel="next"', first) and re.search(r"after=([\w-]+)", first)
    assert cursor

    with CaptureQueriesContext(connection) as queries:
        response = client.get(url("run_list", world), {"after": cursor.group(1)})

    assert response.status_code == 200
    run_queries = [q["sql"] for q in queries if 'FROM "evaluations_run"' in q["sql"]]
    assert len(run_queries) == 1
    assert "OFFSET" not in run_queries[0].upper()
    assert "LIMIT 51" in run_queries[0]
    assert '"summary"' not in run_queries[0]  # lists never read the summary JSON


def test_run_list_query_count_does_not_grow_with_runs(world: World) -> None:
    client = world.client("viewer")
    version = synthetic_version(world.mine)

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url("run_list", world)).status_code == 200
        return len(queries)

    few = count()
    Run.objects.bulk_create(
        Run(project=world.mine, spec=version.spec, spec_version=version, labels={"k": str(i)})
        for i in range(80)
    )
    assert count() == few


# --- Run page -----------------------------------------------------------------------------


def test_run_page_shows_scores_gates_heatmap_groups_and_exports(world: World) -> None:
    run = world.run
    response = world.client("viewer").get(url("run_detail", world, run.pk))

    assert response.status_code == 200
    html = response.content.decode()
    # Summary cards from the Run columns and the summary.
    assert f"{run.composite:.3f}" in html
    assert "50%" in html
    assert f"{run.resilience:.1f}" in html
    assert f"{run.overall:.3f}" in html
    assert "exit code 1" in html and "gates fail" in html
    assert "contract" in html and "chaos" in html  # pillar scores
    # Gates: the default gate failed, critical_failures passed.
    gates = html[html.index('class="data compact gates"') :]
    assert re.search(r"pass_rate_min</td>\s*<td><span class=\"badge fail\">fail", gates)
    assert re.search(r"critical_failures</td>\s*<td><span class=\"badge (pass|warn)\"", gates)
    # Heatmap: says_shipped fails in orders-down (0 of 4 results), passes in no-chaos.
    cell_url = url("run_cell", world, run.pk) + "?scenario=orders-down&amp;invariant=says_shipped"
    assert re.search(r'class="heat heat-fail">\s*<a href="' + re.escape(cell_url), html)
    cell = html[html.index(f'href="{cell_url}"') :]
    cell = cell[: cell.index("</td>")]
    assert f'hx-get="{cell_url}"' in cell and 'hx-target="#cell-detail"' in cell
    assert "0/4" in cell
    ok_url = url("run_cell", world, run.pk) + "?scenario=no-chaos&amp;invariant=says_shipped"
    assert re.search(r'class="heat heat-pass">\s*<a href="' + re.escape(ok_url), html)
    assert html.count('class="heat heat-') >= 6 + 4  # 3 invariants x 2 scenarios + legend
    # Replica groups with pass@k / pass^k and links to their executions.
    groups = html[html.index('class="data compact groups"') :]
    assert groups.count('class="group-fail"') == 2 and groups.count('class="group-pass"') == 2
    for execution in Execution.objects.filter(run=run):
        assert f'href="{url("execution_detail", world, execution.pk)}"' in groups
    # Exports and no polling: the run has ended.
    for fmt in ("json", "junit", "md", "csv"):
        assert f'href="{url("run_export", world, run.pk, fmt)}"' in html
    assert "every 2s" not in html
    # A viewer sees no action buttons.
    assert "Cancel run" not in html and "Re-run" not in html


def test_run_page_offers_rerun_of_failed_groups_to_editors_only(world: World) -> None:
    run_url = url("run_detail", world, world.run.pk)
    for role, shown in (("viewer", False), ("reviewer", False), ("editor", True), ("admin", True)):
        html = world.client(role).get(run_url).content.decode()
        assert ("Re-run 2 failed groups" in html) is shown, role
        assert "Cancel run" not in html  # the run has ended


def test_run_page_htmx_of_an_ended_run_answers_286_with_the_final_region(world: World) -> None:
    response = htmx(world.client("viewer"), url("run_detail", world, world.run.pk))

    assert response.status_code == 286
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="run-live"')
    assert "hx-trigger" not in html
    assert "<html" not in html and "Export" not in html
    assert 'class="heatmap"' in html


def _running_run(world: World, *, done: int) -> Run:
    """A planned run of the real spec with `done` of its executions finished."""
    run = services.run_create(spec_version=world.version, enqueue=False)
    services.run_plan(run_id=run.pk)
    finished = list(Execution.objects.filter(run=run).order_by("id")[:done])
    Execution.objects.filter(pk__in=[e.pk for e in finished]).update(
        status=ExecutionStatus.SUCCESS, passed=True, composite=1.0
    )
    Run.objects.filter(pk=run.pk).update(executions_done=done)
    run.refresh_from_db()
    return run


def test_live_region_polls_while_running_and_stops_with_286_when_the_run_ends(
    world: World,
) -> None:
    run = _running_run(world, done=3)
    client = world.client("viewer")
    run_url = url("run_detail", world, run.pk)

    page = client.get(run_url)
    assert page.status_code == 200
    html = page.content.decode()
    assert f'hx-get="{run_url}" hx-trigger="every 2s" hx-swap="outerHTML"' in html
    assert '<meta http-equiv="refresh" content="5">' in html  # inside <noscript>

    poll = htmx(client, run_url)
    assert poll.status_code == 200
    fragment = poll.content.decode()
    assert 'hx-trigger="every 2s"' in fragment
    assert "3 of 8 executions done" in fragment
    assert '<progress max="8" value="3"' in fragment
    assert re.search(r"status-pending\">pending</span> 5", fragment)
    assert re.search(r"status-success\">success</span> 3", fragment)

    # The run ends: the next poll gets the final region and status 286 (stop polling).
    Execution.objects.filter(run=run).update(
        status=ExecutionStatus.SUCCESS, passed=True, composite=1.0
    )
    Run.objects.filter(pk=run.pk).update(executions_done=8)
    services.run_finalize_if_done(run_id=run.pk)
    final = htmx(client, run_url)
    assert final.status_code == 286
    final_html = final.content.decode()
    assert "hx-trigger" not in final_html
    assert "executions done" not in final_html
    assert 'class="card metric"' in final_html and "exit code" in final_html


def test_run_page_counts_one_execution_in_the_singular(world: World) -> None:
    running = _running_run(world, done=0)
    Run.objects.filter(pk=running.pk).update(execution_count=1)
    client = world.client("viewer")
    assert "0 of 1 execution done" in client.get(url("run_detail", world, running.pk)).text
    ended = synthetic_run(world.version)
    assert (
        f"· {ended.execution_count} executions"
        in client.get(url("run_detail", world, ended.pk)).text
    )
    Run.objects.filter(pk=ended.pk).update(execution_count=1)
    assert "· 1 execution<" in client.get(url("run_detail", world, ended.pk)).text


def test_cancelled_run_page_says_it_has_no_scores(world: World) -> None:
    run = _running_run(world, done=0)
    services.run_cancel(run_id=run.pk)

    html = world.client("viewer").get(url("run_detail", world, run.pk)).content.decode()

    assert "cancelled before it was scored" in html
    assert "every 2s" not in html


def test_run_page_query_count_does_not_grow_with_executions_or_results(world: World) -> None:
    client = world.client("viewer")

    def count(run: Run) -> int:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url("run_detail", world, run.pk))
        assert response.status_code == 200
        assert not any('"summary"' in q["sql"] and "->" not in q["sql"] for q in queries)
        return len(queries)

    small = synthetic_run(synthetic_version(world.mine, replicas=1))
    large = synthetic_run(synthetic_version(world.mine, replicas=30))
    assert Execution.objects.filter(run=large).count() == 180
    assert count(small) == count(large)
    running_small, running_large = _running_run(world, done=1), _running_run(world, done=7)
    assert count(running_small) == count(running_large)


def test_run_page_marks_flaky_groups(world: World) -> None:
    run = synthetic_run(synthetic_version(world.mine, replicas=2))

    html = world.client("viewer").get(url("run_detail", world, run.pk)).content.decode()

    groups = html[html.index('class="data compact groups"') :]
    assert groups.count('class="group-flaky"') == 2
    assert groups.count('class="flaky-marker"') == 2
    flaky_row = groups[groups.index('class="group-flaky"') :]
    flaky_row = flaky_row[: flaky_row.index("</tr>")]
    assert "1/2" in flaky_row and "1.00" in flaky_row and "0.00" in flaky_row  # pass@2, pass^2
    assert (
        'class="replica replica-fail"' in flaky_row and 'class="replica replica-pass"' in flaky_row
    )


# --- Heatmap cell -------------------------------------------------------------------------


def test_cell_lists_the_executions_of_the_cell_with_their_result(world: World) -> None:
    client = world.client("viewer")
    cell_url = url("run_cell", world, world.run.pk)
    query = {"scenario": "orders-down", "invariant": "says_shipped"}

    page = client.get(cell_url, query)
    fragment = htmx(client, cell_url, data=query)

    assert page.status_code == fragment.status_code == 200
    failing = Execution.objects.filter(run=world.run, scenario="orders-down")
    for response in (page, fragment):
        html = response.content.decode()
        for execution in failing:
            assert f'href="{url("execution_detail", world, execution.pk)}"' in html
        assert html.count("CONTAINS_FAILED") == 4
        assert html.count('class="badge fail">fail') == 4
    assert "<html" in page.content.decode()
    assert "<html" not in fragment.content.decode()
    assert fragment.content.decode().lstrip().startswith('<section class="section cell-detail"')
    passing = client.get(cell_url, {"scenario": "no-chaos", "invariant": "says_shipped"})
    assert passing.content.decode().count('class="badge pass">pass') == 4


def test_cell_pages_by_execution_id(world: World) -> None:
    run = synthetic_run(synthetic_version(world.mine, replicas=60))  # 120 executions a scenario
    client = world.client("viewer")
    cell_url = url("run_cell", world, run.pk)
    query = {"scenario": "tool-outage", "invariant": "cites"}

    first = client.get(cell_url, query).content.decode()
    after = re.search(r"after=(\d+)", first)
    assert after
    second = client.get(cell_url, {**query, "after": after.group(1)}).content.decode()

    pattern = re.compile(r'href="/p/[^/]+/executions/(\d+)/"')
    first_ids, second_ids = pattern.findall(first), pattern.findall(second)
    assert len(first_ids) == 100 and len(second_ids) == 20
    expected = Execution.objects.filter(run=run, scenario="tool-outage").order_by("id")
    assert [int(i) for i in first_ids + second_ids] == list(expected.values_list("id", flat=True))
    assert "after=" not in second


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"invariant": "greets"}, "scenario is required"),
        ({"scenario": "no-chaos"}, "invariant is required"),
        ({}, "scenario and invariant is required"),
        ({"scenario": "no-chaos", "invariant": "greets", "after": "x"}, "is not an execution id"),
    ],
)
def test_cell_refuses_missing_or_bad_parameters(
    world: World, query: dict[str, str], message: str
) -> None:
    response = world.client("viewer").get(url("run_cell", world, world.run.pk), query)

    assert response.status_code == 400
    assert message in response.content.decode()


def test_cell_query_count_does_not_grow_with_executions(world: World) -> None:
    client = world.client("viewer")

    def count(run: Run) -> int:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(
                url("run_cell", world, run.pk), {"scenario": "tool-outage", "invariant": "cites"}
            )
        assert response.status_code == 200
        return len(queries)

    small = synthetic_run(synthetic_version(world.mine, replicas=1))
    large = synthetic_run(synthetic_version(world.mine, replicas=40))
    assert count(small) == count(large)


# --- Actions ------------------------------------------------------------------------------


def test_cancel_stops_a_running_run(world: World) -> None:
    run = _running_run(world, done=2)
    editor = world.client("editor")

    response = editor.post(url("run_cancel", world, run.pk))

    assert response.status_code == 302
    assert response["Location"] == url("run_detail", world, run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    statuses = list(Execution.objects.filter(run=run).values_list("status", "error"))
    assert statuses.count((ExecutionStatus.ERROR, "cancelled")) == 6
    page = editor.get(response["Location"]).content.decode()
    assert f"Run {run.pk} cancelled" in page


def test_cancel_of_an_ended_run_changes_nothing(world: World) -> None:
    response = world.client("admin").post(url("run_cancel", world, world.run.pk), follow=True)

    assert "had already ended (completed)" in response.content.decode()
    assert Run.objects.get(pk=world.run.pk).status == RunStatus.COMPLETED


def test_rerun_failed_creates_a_run_with_only_the_failed_groups(world: World) -> None:
    response = world.client("editor").post(url("run_rerun_failed", world, world.run.pk))

    assert response.status_code == 302
    new_run = Run.objects.filter(project=world.mine).exclude(pk=world.run.pk).get()
    assert response["Location"] == url("run_detail", world, new_run.pk)
    assert new_run.spec_version_id == world.run.spec_version_id
    assert new_run.labels == {"branch": "main", "team": "orders", "rerun_of": str(world.run.pk)}
    assert new_run.options["seed"] == 42
    assert new_run.created_by == world.users["editor"]
    assert sorted((s["scenario"], s["prompt_index"]) for s in new_run.options["only"]) == [
        ("orders-down", 0),
        ("orders-down", 1),
    ]

    execute_run(new_run)

    cells = sorted(
        Execution.objects.filter(run=new_run).values_list("scenario", "prompt_index", "replica")
    )
    assert cells == [("orders-down", p, r) for p in (0, 1) for r in (0, 1)]
    new_run.refresh_from_db()
    assert [(g["key"], g["status"]) for g in new_run.summary["groups"]] == [
        ("orders-down / prompt 0", "fail"),
        ("orders-down / prompt 1", "fail"),
    ]
    page = world.client("viewer").get(response["Location"]).content.decode()
    assert (
        f're-run of <a href="{url("run_detail", world, world.run.pk)}">#{world.run.pk}</a>' in page
    )


def test_rerun_failed_includes_flaky_groups_whose_verdict_failed(world: World) -> None:
    run = synthetic_run(synthetic_version(world.mine, replicas=2))

    world.client("admin").post(url("run_rerun_failed", world, run.pk))

    new_run = Run.objects.get(labels__rerun_of=str(run.pk))
    services.run_plan(run_id=new_run.pk)
    scenarios = sorted(
        set(Execution.objects.filter(run=new_run).values_list("scenario", flat=True))
    )
    assert scenarios == ["slow-llm", "tool-outage"]
    assert Execution.objects.filter(run=new_run).count() == 8  # 2 scenarios x 2 prompts x 2


def test_rerun_failed_refuses_a_run_without_failures_or_not_ended(world: World) -> None:
    passing = synthetic_run(
        synthetic_version(world.mine, replicas=1), failing_scenario="", flaky_scenario=""
    )
    running = _running_run(world, done=1)
    before = Run.objects.count()
    client = world.client("editor")

    refused = client.post(url("run_rerun_failed", world, passing.pk), follow=True)
    not_ended = client.post(url("run_rerun_failed", world, running.pk), follow=True)

    assert "has no failed group to re-run" in refused.content.decode()
    assert "only a completed run has verdicts" in not_ended.content.decode()
    assert Run.objects.count() == before


def test_run_create_refuses_a_selection_that_matches_nothing(world: World) -> None:
    with pytest.raises(ValueError, match="no execution of this spec matches"):
        services.run_create(
            spec_version=world.version, enqueue=False, only=[{"scenario": "no-chaos", "replica": 5}]
        )
    with pytest.raises(ValueError, match="unknown field 'color'"):
        services.run_create(spec_version=world.version, enqueue=False, only=[{"color": "red"}])
    with pytest.raises(ValueError, match="prompt_index must be an integer"):
        services.run_create(spec_version=world.version, enqueue=False, only=[{"prompt_index": "1"}])


# --- Permissions --------------------------------------------------------------------------

PAGES = [
    ("run_list", lambda w: url("run_list", w)),
    ("run_detail", lambda w: url("run_detail", w, w.run.pk)),
    (
        "run_cell",
        lambda w: url("run_cell", w, w.run.pk) + "?scenario=no-chaos&invariant=greets",
    ),
]


@pytest.mark.parametrize(
    ("role", "allowed"),
    [
        ("viewer", True),
        ("reviewer", True),
        ("editor", True),
        ("admin", True),
        ("outsider", False),
    ],
)
@pytest.mark.parametrize("page", [name for name, _ in PAGES])
def test_pages_are_readable_by_every_member_and_404_for_others(
    world: World, page: str, role: str, allowed: bool
) -> None:
    page_url = dict(PAGES)[page](world)
    client = world.client(role)

    full, fragment = client.get(page_url), htmx(client, page_url)

    if allowed:
        assert full.status_code == 200
        assert fragment.status_code in (200, 286)
    else:
        assert full.status_code == fragment.status_code == 404


@pytest.mark.parametrize(
    ("role", "status"),
    [
        ("viewer", 403),
        ("reviewer", 403),
        ("editor", 302),
        ("admin", 302),
        ("outsider", 404),
    ],
)
@pytest.mark.parametrize("action", ["run_cancel", "run_rerun_failed"])
def test_actions_need_the_editor_role(world: World, action: str, role: str, status: int) -> None:
    run = world.run if action == "run_rerun_failed" else _running_run(world, done=0)
    runs_before = Run.objects.count()

    response = world.client(role).post(url(action, world, run.pk))

    assert response.status_code == status
    run.refresh_from_db()
    if action == "run_cancel":
        assert (run.status == RunStatus.CANCELLED) is (status == 302)
    else:
        assert Run.objects.count() == runs_before + (1 if status == 302 else 0)


@pytest.mark.parametrize("action", ["run_cancel", "run_rerun_failed"])
def test_actions_refuse_get(world: World, action: str) -> None:
    assert world.client("admin").get(url(action, world, world.run.pk)).status_code == 405


@pytest.mark.parametrize("name", ["run_detail", "run_cell", "run_cancel", "run_rerun_failed"])
def test_another_projects_run_is_404_under_this_projects_slug(world: World, name: str) -> None:
    client = world.client("admin")
    target = url(name, world, world.other_run.pk)
    response = (
        client.post(target)
        if name in ("run_cancel", "run_rerun_failed")
        else client.get(target, {"scenario": "no-chaos", "invariant": "greets"})
    )

    assert response.status_code == 404
    # and under its own project's slug the outsider (its admin) does see it
    own = world.client("outsider").get(
        url("run_detail", world, world.other_run.pk, project=world.other.slug)
    )
    assert own.status_code == 200


def test_signed_out_visitors_go_to_the_login_page(world: World) -> None:
    response = Client().get(url("run_list", world))

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_run_page_says_why_executions_did_not_pass(world: World) -> None:
    # Under orders-down says_shipped fails: the page names the invariant and its message.
    html = world.client("viewer").get(url("run_detail", world, world.run.pk)).content.decode()
    start = html.index('id="why-title"')
    why = html[start : html.index("</section>", start)]
    assert "orders-down / prompt 0 / replica 0" in why
    assert "invariant <code>" not in why  # plain text, escaped
    assert "invariant `says_shipped` failed: output does not contain" in why
    assert "no-chaos /" not in why  # the passing executions are not listed
