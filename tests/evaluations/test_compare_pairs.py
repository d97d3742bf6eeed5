"""The compare page's executions side by side (issues 14 and 18): which cells differ, in
which order, a page at a time, read by the database in a fixed number of queries whatever
the runs' size. Runs on PostgreSQL and on the embedded SQLite default (the tool calls are
jsonb on one, text on the other)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evaluations import services
from evaluations.models import Execution, Membership, Project, Role, Run, RunStatus
from evaluations.selectors.compare import EXECUTION_PAIRS_PAGE, execution_pairs, pair_cursor

pytestmark = [pytest.mark.embedded, pytest.mark.django_db]

SPEC = """\
version: 1
id: pairs
task: {prompt: "Refund order 1042"}
agent: {type: command, command: "echo ok"}
sandbox: {backend: local}
invariants:
  ok: {description: says ok, check: {type: contains, value: ok}}
"""
LOOKUP = [{"name": "lookup", "arguments": {"order": 1042}}]


def make_run(project: Project, cells: dict[int, tuple[bool | None, str, list[Any]]]) -> Run:
    """A completed run whose execution for replica R is cells[R]: (passed, output, tools)."""
    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = Run.objects.create(
        project=project, spec_version=version, status=RunStatus.COMPLETED, execution_count=0
    )
    Execution.objects.bulk_create(
        Execution(
            run=run,
            project=project,
            key=Execution.build_key(scenario="no-chaos", prompt_index=0, replica=replica),
            scenario="no-chaos",
            replica=replica,
            status="success",
            passed=passed,
            final_output=output,
            tool_sequence=tools,
        )
        for replica, (passed, output, tools) in cells.items()
    )
    return run


@pytest.fixture
def runs(project: Project) -> tuple[Run, Run]:
    long_argument = {"query": "x" * 300}
    before = make_run(
        project,
        {
            0: (True, "same", LOOKUP),  # unchanged
            1: (None, "no verdict", []),  # unchanged, no verdict on either side
            2: (True, "refunded", LOOKUP),  # -> failed: first
            3: (False, "declined", LOOKUP),  # -> passed: after every flip to failing
            4: (True, "refunded today", LOOKUP),  # output changed
            5: (True, "same", LOOKUP),  # tool arguments changed
            6: (True, "same", [{"name": "search", "arguments": long_argument}]),
            7: (True, "refunded", []),  # -> no verdict: a flip to failing
        },
    )
    long_changed = {"query": "x" * 299 + "y"}  # differs past the 200 characters shown
    after = make_run(
        project,
        {
            0: (True, "same", LOOKUP),
            1: (None, "no verdict", []),
            2: (False, "declined", LOOKUP),
            3: (True, "refunded", LOOKUP),
            4: (True, "refunded tomorrow", LOOKUP),
            5: (True, "same", [{"name": "lookup", "arguments": {"order": 1043}}]),
            6: (True, "same", [{"name": "search", "arguments": long_changed}]),
            7: (None, "crashed", []),
            8: (True, "a cell the reference lacks", []),
        },
    )
    return before, after


def replicas(pairs: list[Any]) -> list[int]:
    return [pair.replica for pair in pairs]


def test_only_cells_that_differ_flipped_verdicts_first(runs: tuple[Run, Run]) -> None:
    before, after = runs
    page = execution_pairs(before, after)
    # Flips to failing (2, 7), to passing (3), then the rest in run order.
    assert replicas(page.pairs) == [2, 7, 3, 4, 5, 6, 8]
    assert page.remaining == 7 and page.next_cursor is None
    by_replica = {pair.replica: pair for pair in page.pairs}
    assert by_replica[4].output_changed and not by_replica[4].tools_changed
    assert by_replica[4].diff == [
        ("equal", "refunded "),
        ("delete", "today"),
        ("insert", "tomorrow"),
    ]
    assert by_replica[5].tools_changed and not by_replica[5].output_changed
    assert by_replica[5].tools_before == ['lookup({"order": 1042})']
    assert by_replica[5].tools_after == ['lookup({"order": 1043})']
    # Arguments that differ only past what a line shows still count as changed calls.
    assert by_replica[6].tools_changed
    assert by_replica[6].tools_before == by_replica[6].tools_after
    assert by_replica[8].before is None and by_replica[8].after["passed"] is True
    assert by_replica[7].verdict_changed and by_replica[7].after["passed"] is None


def test_pages_walk_every_differing_cell_once_in_two_queries_each(
    runs: tuple[Run, Run],
) -> None:
    before, after = runs
    seen: list[int] = []
    cursor = None
    remaining = []
    while True:
        with CaptureQueriesContext(connection) as queries:
            page = execution_pairs(before, after, cursor=cursor, size=3)
        assert len(queries.captured_queries) == 2
        seen += replicas(page.pairs)
        remaining.append(page.remaining)
        if page.next_cursor is None:
            break
        cursor = pair_cursor(page.next_cursor)
    assert seen == [2, 7, 3, 4, 5, 6, 8]
    assert remaining == [7, 4, 1]


def test_the_same_run_twice_has_nothing_to_show(runs: tuple[Run, Run]) -> None:
    _, after = runs
    page = execution_pairs(after, after)
    assert page.pairs == [] and page.remaining == 0 and page.next_cursor is None


@pytest.mark.parametrize("text", ["", "7", "3-4", "x-1", "1-y", "-1-4"])
def test_a_cursor_that_is_not_one_is_named(text: str) -> None:
    with pytest.raises(ValueError, match=f"cursor={text!r} is not a page"):
        pair_cursor(text)


def test_the_page_shows_a_page_and_htmx_appends_the_next(
    project: Project, django_user_model: Any
) -> None:
    size = EXECUTION_PAIRS_PAGE
    before = make_run(project, {r: (True, "refunded", []) for r in range(size + 3)})
    after = make_run(project, {r: (True, "declined", []) for r in range(size + 3)})
    viewer = django_user_model.objects.create_user(username="vera")
    Membership.objects.create(project=project, user=viewer, role=Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    url = reverse("run_compare", args=[project.slug, after.pk])

    html = client.get(url, {"against": before.pk}).content.decode()
    assert html.count('<details class="execution-pair"') == size
    assert f"{size + 3} executions of run #{after.pk} differ" in html
    assert f"?against={before.pk}&amp;cursor=2-" in html and "More executions" in html

    cursor = html.split("cursor=", 1)[1].split('"', 1)[0].split("#", 1)[0]
    fragment = client.get(
        url, {"against": before.pk, "cursor": cursor}, headers={"HX-Request": "true"}
    ).content.decode()
    assert "<html" not in fragment and "Figures" not in fragment
    assert fragment.count('<details class="execution-pair"') == 3
    assert (
        f'data-key="{Execution.build_key(scenario="no-chaos", prompt_index=0, replica=size)}"'
        in fragment
    )
    assert "More executions" not in fragment

    # Without htmx the link opens the whole page at that page of executions.
    paged = client.get(url, {"against": before.pk, "cursor": cursor}).content.decode()
    assert "<strong>" in paged and paged.count('<details class="execution-pair"') == 3
    assert "3 executions" in paged and "from this page on" in paged

    refused = client.get(url, {"against": before.pk, "cursor": "later"})
    assert refused.status_code == 400
    assert "cursor='later' is not a page of this comparison" in refused.content.decode()


def test_an_opened_pair_loads_its_diff_for_members_only(
    project: Project, runs: tuple[Run, Run], django_user_model: Any
) -> None:
    before, after = runs
    viewer = django_user_model.objects.create_user(username="vera")
    Membership.objects.create(project=project, user=viewer, role=Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    changed = Execution.objects.get(run=after, replica=4)
    url = reverse("run_compare_pair", args=[project.slug, after.pk, changed.pk])

    # Without `against`, the spec's baseline, which it has not: said so.
    no_baseline = client.get(url)
    assert (
        no_baseline.status_code == 400 and "has no active baseline" in no_baseline.content.decode()
    )
    listed = client.get(
        reverse("run_compare", args=[project.slug, after.pk]), {"against": before.pk}
    )
    assert f'hx-get="{url}?against={before.pk}"' in listed.content.decode()

    fragment = client.get(url, {"against": before.pk}, headers={"HX-Request": "true"})
    body = fragment.content.decode()
    assert fragment.status_code == 200 and "<html" not in body
    assert "refunded <del>today</del><ins>tomorrow</ins>" in body
    assert body.count("<li>lookup({&quot;order&quot;: 1042})</li>") == 2
    full = client.get(url, {"against": before.pk}).content.decode()
    assert "<html" in full and "refunded <del>today</del><ins>tomorrow</ins>" in full
    assert f"Compare with run #{before.pk}" in full

    # A cell the reference run lacks says so.
    new_cell = Execution.objects.get(run=after, replica=8)
    lone = client.get(
        reverse("run_compare_pair", args=[project.slug, after.pk, new_cell.pk]),
        {"against": before.pk},
        headers={"HX-Request": "true"},
    ).content.decode()
    assert f"run #{before.pk} has no execution in this cell" in lone

    # An execution of another run, a reference that is not one, and a non-member: refused.
    other = Execution.objects.get(run=before, replica=4)
    wrong_run = reverse("run_compare_pair", args=[project.slug, after.pk, other.pk])
    assert client.get(wrong_run, {"against": before.pk}).status_code == 404
    refused = client.get(url, {"against": "yesterday"})
    assert refused.status_code == 400
    assert "compare against 'baseline' or a run id, not 'yesterday'" in refused.content.decode()
    outsider = django_user_model.objects.create_user(username="otto")
    client.force_login(outsider)
    assert client.get(url, {"against": before.pk}).status_code == 404


def test_a_new_cell_counts_as_changed_output_only_when_it_said_something() -> None:
    from evaluations.selectors.compare import ExecutionPair

    def new_cell(output: str) -> ExecutionPair:
        after = {"pk": 1, "passed": True, "final_output": output, "tool_sequence": []}
        return ExecutionPair(
            key="k", scenario="s", prompt_index=0, replica=0, before=None, after=after
        )

    silent, said = new_cell(""), new_cell("hello")
    assert not silent.output_changed and silent.diff == [] and not silent.tools_changed
    assert said.output_changed and said.diff == [("insert", "hello")]
