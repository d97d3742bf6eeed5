"""No page issues a query per row (issue 18): every page that lists rows is requested with N
of everything it shows (runs, executions in a run, check results, versions, baselines,
review items and verdicts, members, tokens, alert channels, rules and firings), then with
3N, and must not issue one query more. A query per row would add at least 2N queries.

The counts do not depend on the machine, so these are ordinary tests; bench/bench_pages.py
measures the time of the same pages at 200,000 executions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evaluations import services
from evaluations.models import Execution, Project, ReviewItem, ReviewStatus, Run, SpecVersion
from tests.evaluations.review_world import add_execution, add_judge, make_run
from tests.evaluations.views.run_data import synthetic_run, synthetic_version

pytestmark = pytest.mark.django_db

N = 2


@dataclass
class Growing:
    """The project `mine`, grown in steps: each step adds `n` of every kind of row."""

    project: Project
    admin: Any
    member: Callable[..., Any]
    version: SpecVersion | None = None
    review_run: Run | None = None
    subjects: list[Run] = field(default_factory=list)
    size: int = 0

    def grow(self, n: int) -> None:
        self.size += n
        project = self.project
        if self.version is None:
            self.version = synthetic_version(project)
            self.review_run = make_run(project, review={"all": True})
            channel = services.alert_channel_create(
                project=project, name="ops", kind="email", target="ops@example.com"
            )
            # Fires for every run below: the settings page lists the firings.
            services.alert_rule_create(
                project=project, name="low", condition="pass_rate < 1", channel_ids=[channel.pk]
            )
        for _ in range(n):
            index = next_index(self)
            passing = synthetic_run(
                self.version, failing_scenario="", labels={"branch": "main"}, branch="main"
            )
            services.baseline_promote(run_id=passing.pk, user=self.admin, reason=f"step {index}")
            failing = synthetic_run(self.version, labels={"branch": "main"}, branch="main")
            for run in (passing, failing):
                services.alerts_evaluate(run_id=run.pk)
            services.spec_version_create(
                project=project,
                source_yaml=self.version.source_yaml.replace("Polite", f"Polite {index}"),
            )
            self.member("viewer")
            services.token_issue(project=project, user=self.admin, name=f"token {index}")
            services.alert_channel_create(
                project=project, name=f"ops {index}", kind="email", target="ops@example.com"
            )
            services.alert_rule_create(
                project=project, name=f"rule {index}", condition="resilience < 0.1"
            )
        self._grow_reviews(n)
        # The run, cell, compare and execution pages show one run: a newer, bigger one
        # (its executions grow with the size), compared with the one before it.
        for _ in range(2):
            self.subjects.append(synthetic_run(self.version, replicas=2 * self.size))

    def _grow_reviews(self, n: int) -> None:
        """n review items (judge results), one of them graded by the admin."""
        assert self.review_run is not None
        start = Execution.objects.filter(run=self.review_run).count()
        for replica in range(start, start + n):
            execution = add_execution(self.review_run, replica)
            add_judge(execution, score=0.3 + replica / 100)
        # Finalizing scores the run and queues its judge results (review: all).
        services.run_finalize(run_id=self.review_run.pk)
        item = (
            ReviewItem.objects.filter(run=self.review_run, status=ReviewStatus.OPEN)
            .order_by("-id")
            .first()
        )
        assert item is not None
        services.review_claim(item_id=item.pk, user=self.admin)
        services.review_submit(item_id=item.pk, user=self.admin, passed=True, score=1.0)

    def urls(self) -> dict[str, str]:
        slug = self.project.slug
        assert self.version is not None
        spec = self.version.spec.slug
        before, after = self.subjects[-2:]
        execution = Execution.objects.filter(run=after).order_by("id").first()
        items = ReviewItem.objects.filter(project=self.project).order_by("created", "id")
        open_item = items.filter(status=ReviewStatus.OPEN).first()
        done_item = items.filter(status=ReviewStatus.COMPLETE).first()
        assert execution is not None and open_item is not None and done_item is not None
        return {
            "project list": reverse("project_list"),
            "overview": reverse("overview", args=[slug]),
            "spec list": reverse("spec_list", args=[slug]),
            "spec detail": reverse("spec_detail", args=[slug, spec]),
            "spec edit": reverse("spec_edit", args=[slug, spec]),
            "spec new": reverse("spec_new", args=[slug]),
            "spec diff": reverse("spec_diff", args=[slug, spec]),
            "spec trends": reverse("spec_trends", args=[slug, spec]),
            "spec baselines": reverse("spec_baselines", args=[slug, spec]),
            "regressions": reverse("regressions", args=[slug]),
            "run list": reverse("run_list", args=[slug]),
            "run detail": reverse("run_detail", args=[slug, after.pk]),
            "run cell": reverse("run_cell", args=[slug, after.pk])
            + "?scenario=tool-outage&invariant=cites",
            "compare (baseline)": reverse("run_compare", args=[slug, after.pk]),
            "compare (two runs)": reverse("run_compare", args=[slug, after.pk])
            + f"?against={before.pk}",
            "compare pair": reverse("run_compare_pair", args=[slug, after.pk, execution.pk])
            + f"?against={before.pk}",
            "execution detail": reverse("execution_detail", args=[slug, execution.pk]),
            "review queue": reverse("review_queue", args=[slug]),
            "review queue (complete)": reverse("review_queue", args=[slug]) + "?status=complete",
            "review item (open)": reverse("review_item", args=[slug, open_item.pk]),
            "review item (complete)": reverse("review_item", args=[slug, done_item.pk]),
            "review agreement": reverse("review_agreement", args=[slug]),
            "members": reverse("members", args=[slug]),
            "settings": reverse("project_settings", args=[slug]),
            "settings: digest": reverse("project_digest_preview", args=[slug]),
        }


def next_index(growing: Growing) -> int:
    return Run.objects.filter(project=growing.project).count()


def query_counts(client: Client, urls: dict[str, str]) -> dict[str, int]:
    counts = {}
    for name, url in urls.items():
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, f"{name}: HTTP {response.status_code} for {url}"
        counts[name] = len(queries)
    return counts


def readers(growing: Growing) -> tuple[Client, Client]:
    """The admin in a browser session, and the API with a token of the admin's."""
    browser = Client()
    browser.force_login(growing.admin)
    _, token = services.token_issue(project=growing.project, user=growing.admin, name="ci")
    return browser, Client(headers={"Authorization": f"Bearer {token}"})


def every_read(growing: Growing, browser: Client, api: Client) -> list[tuple[Client, str, str]]:
    """Every page and every API read of rows, as (client, name, url), at the size now."""
    pages = [(browser, name, url) for name, url in growing.urls().items()]
    return pages + [(api, f"API {name}", url) for name, url in api_urls(growing).items()]


@pytest.fixture
def growing(two_projects: Any, member: Callable[..., Any]) -> Growing:
    return Growing(project=two_projects.mine, admin=member("admin"), member=member)


def test_every_page_is_measured() -> None:
    """A page added to evaluations/urls.py is added here too (downloads are not pages)."""
    from evaluations.urls import urlpatterns

    downloads_and_actions = {
        "home", "spec_validate", "spec_run", "spec_version_download", "spec_baseline_rollback",
        "run_compare_pick", "run_cancel", "run_rerun_failed", "run_baseline", "run_export",
        "artifact_download", "review_export", "review_send", "project_tokens", "project_alerts",
    }  # fmt: skip
    measured = {
        "project_list", "overview", "spec_list", "spec_detail", "spec_edit", "spec_new",
        "spec_diff", "spec_trends", "spec_baselines", "regressions", "run_list", "run_detail",
        "run_cell", "run_compare", "run_compare_pair", "execution_detail", "review_queue", "review_item",
        "review_agreement", "members", "project_settings", "project_digest_preview",
    }  # fmt: skip
    assert {p.name for p in urlpatterns} == measured | downloads_and_actions


def test_no_page_issues_more_queries_with_three_times_the_rows(
    growing: Growing, django_assert_max_num_queries: Any
) -> None:
    client = Client()
    client.force_login(growing.admin)
    growing.grow(N)
    few = query_counts(client, growing.urls())

    growing.grow(2 * N)
    urls = growing.urls()
    assert ReviewItem.objects.filter(project=growing.project).count() == 3 * N
    assert growing.subjects[-1].execution_count == 3 * growing.subjects[0].execution_count
    for name, url in urls.items():
        with django_assert_max_num_queries(few[name], info=name):
            response = client.get(url)
        assert response.status_code == 200, name


def api_urls(growing: Growing) -> dict[str, str]:
    """Every GET of the REST API that reads rows (the run's event stream and an artifact's
    download are not lists), by its url name."""
    slug = growing.project.slug
    assert growing.version is not None
    spec = growing.version.spec.slug
    before, after = growing.subjects[-2:]
    execution = Execution.objects.filter(run=after).order_by("id").first()
    item = ReviewItem.objects.filter(project=growing.project).order_by("id").first()
    assert execution is not None and item is not None

    def api(name: str, *args: Any) -> str:
        return reverse(f"api:{name}", args=args)

    return {
        "spec_list": api("spec_list", slug),
        "spec_versions": api("spec_versions", slug, spec),
        "spec_version": api("spec_version", slug, spec, 1),
        "spec_diff": api("spec_diff", slug, spec) + "?a=1&b=2",
        "baseline_history": api("baseline_history", slug, spec),
        "runs": api("runs", slug),
        "run_detail": api("run_detail", slug, after.pk),
        "run_report": api("run_report", slug, after.pk),
        "run_compare": api("run_compare", slug, after.pk) + f"?against={before.pk}",
        "executions": api("executions", slug, after.pk),
        "execution_detail": api("execution_detail", slug, execution.pk),
        "regressions": api("regressions", slug),
        "reviews": api("reviews", slug),
        "review_item": api("review_item", slug, item.pk),
        "alert_rules": api("alert_rules", slug),
        "alert_firings": api("alert_firings", slug),
        "project tokens": api("project_token_create", slug),
    }


def test_no_api_list_issues_more_queries_with_three_times_the_rows(
    growing: Growing, django_assert_max_num_queries: Any
) -> None:
    """The API's lists are the pages' rows as JSON: the same rule, a query per list, not
    per row."""
    _, client = readers(growing)
    growing.grow(N)
    few = query_counts(client, api_urls(growing))

    growing.grow(2 * N)
    for name, url in api_urls(growing).items():
        with django_assert_max_num_queries(few[name], info=name):
            response = client.get(url)
        assert response.status_code == 200, name


def test_no_page_or_api_list_reverses_more_urls_with_three_times_the_rows(
    growing: Growing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rule for URLs: a {% url %} per row (~35 µs each; two per cell were most of
    a 100-cell run page's reversing) is reversed once per table instead ({% id_url %},
    charts.id_paths, or `{% url ... as %}` before the loop). A URL reversed once per row
    is reversed 2N times more for the 2N rows more; a link that appears once a table
    grows past a page (the compare page's "more pairs") adds fewer."""
    from django.urls.resolvers import URLResolver

    reversed_urls: list[str] = []
    reverse_with_prefix = URLResolver._reverse_with_prefix

    def counted(self: URLResolver, lookup_view: Any, *args: Any, **kwargs: Any) -> str:
        reversed_urls.append(str(lookup_view))
        return reverse_with_prefix(self, lookup_view, *args, **kwargs)

    monkeypatch.setattr(URLResolver, "_reverse_with_prefix", counted)
    clients = readers(growing)

    def reversals() -> dict[str, Counter[str]]:
        counts = {}
        for requester, name, url in every_read(growing, *clients):
            reversed_urls.clear()
            assert requester.get(url).status_code == 200, name
            counts[name] = Counter(reversed_urls)
        return counts

    growing.grow(N)
    few = reversals()
    growing.grow(2 * N)
    many = reversals()
    per_row = {
        name: {view: n for view, n in (many[name] - few[name]).items() if n >= 2 * N}
        for name in few
    }
    per_row = {name: views for name, views in per_row.items() if views}
    assert not per_row, f"pages that reverse a URL per row (the URLs reversed more): {per_row}"


# PostgreSQL's planner weighs the orders it could join a query's tables in: the review item's
# eight tables (seven joins) took it 6-7 ms to plan, a query that then ran in 0.3 ms; with
# five joins, 1.8-2.4 ms. Related rows past that come in a query of their own
# (prefetch_related).
MAX_JOINS = 5


def test_no_page_or_api_sends_a_query_that_joins_more_than_six_tables(growing: Growing) -> None:
    clients = readers(growing)
    growing.grow(N)
    widest = {}
    for requester, name, url in every_read(growing, *clients):
        with CaptureQueriesContext(connection) as queries:
            assert requester.get(url).status_code == 200, name
        joins = max(query["sql"].count(" JOIN ") for query in queries.captured_queries)
        if joins > MAX_JOINS:
            widest[name] = joins
    assert not widest, f"requests with a query of more than {MAX_JOINS} joins: {widest}"
