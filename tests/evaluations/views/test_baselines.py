"""Baselines: promoting a completed run freezes its groups (with the first passing output,
latency and cost of each) as its spec's active baseline; the overview then lists groups that
passed in it and fail in a later run. One active baseline per spec; editors only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db.models import Avg, Sum
from django.test import Client
from django.urls import reverse

from evaluations import services
from evaluations.models import Baseline, Execution, RunStatus

from .conftest import ALL_ROLES
from .run_data import synthetic_run, synthetic_version

pytestmark = pytest.mark.django_db

PROMOTE_BUTTON = ">Promote to baseline</button>"


def run_url(run: Any, project: str = "mine") -> str:
    return reverse("run_detail", args=[project, run.pk])


def promote_url(run: Any, project: str = "mine") -> str:
    return reverse("run_baseline", args=[project, run.pk])


def baseline_region(html: str) -> str:
    start = html.index('<div id="run-baseline"')
    return html[start : html.index("</div>", start)]


def regressions(html: str) -> str:
    return html[html.index('id="regressions"') : html.index('id="charts"')]


def test_promote_freezes_the_run_and_the_overview_shows_a_later_regression(
    two_projects, client_as, make_spec, make_run
):
    client = client_as("editor")
    version = make_spec(two_projects.mine)
    # says_refunded already fails under chaos in the reference run: no regression there.
    reference = make_run(version, failing=[("llm-degraded", "says_refunded")])

    before = baseline_region(client.get(run_url(reference)).content.decode())
    response = client.post(promote_url(reference), {"name": "release-1"})

    assert 'data-baseline="none"' in before and PROMOTE_BUTTON in before
    assert response.status_code == 302 and response["Location"] == run_url(reference)
    baseline = Baseline.objects.get(spec=version.spec)
    assert baseline.active and baseline.run_id == reference.pk and baseline.name == "release-1"
    assert baseline.created_by is not None and baseline.created_by.username.startswith("editor")
    groups = baseline.data["groups"]
    assert [g["key"] for g in groups] == [g["key"] for g in reference.summary["groups"]]
    assert {g["key"]: g["passed"] for g in groups} == {
        "no-chaos / prompt 0": True,
        "no-chaos / prompt 1": True,
        "llm-degraded / prompt 0": False,
        "llm-degraded / prompt 1": False,
    }
    assert baseline.data["run_id"] == reference.pk
    assert baseline.data["pass_rate"] == reference.pass_rate
    page = client.get(run_url(reference)).content.decode()
    region = baseline_region(page)
    assert 'data-baseline="active"' in region and "release-1" in region
    assert PROMOTE_BUTTON not in region
    assert "is now the baseline of refund-agent" in page  # the message after the redirect
    overview = client.get(reverse("overview", args=["mine"])).content.decode()
    assert "No regressions" in regressions(overview)  # nothing ran since

    later = make_run(version, failing=["says_refunded"])

    section = regressions(client.get(reverse("overview", args=["mine"])).content.decode())
    assert section.count("<tr>") == 1 + 2  # header + the two no-chaos prompts
    assert "no-chaos / prompt 0" in section and "no-chaos / prompt 1" in section
    assert "llm-degraded" not in section
    assert "release-1" in section and "CONTAINS_FAILED" in section
    assert f'href="{run_url(later)}"' in section
    later_region = baseline_region(client.get(run_url(later)).content.decode())
    assert 'data-baseline="other"' in later_region
    assert f'href="{run_url(reference)}">release-1</a>' in later_region


def test_a_second_promote_deactivates_the_first(two_projects, client_as, make_spec, make_run):
    client = client_as("admin")
    version = make_spec(two_projects.mine)
    first, second = make_run(version), make_run(version, failing=["short_answer"])

    client.post(promote_url(first))
    client.post(promote_url(second), {"name": "  "})

    baselines = {b.run_id: b for b in Baseline.objects.filter(spec=version.spec)}
    assert set(baselines) == {first.pk, second.pk}
    assert not baselines[first.pk].active and baselines[second.pk].active
    assert baselines[second.pk].name == f"run #{second.pk}"  # a blank name gets a default
    assert Baseline.objects.filter(spec=version.spec, active=True).count() == 1
    # The second baseline has every group failing: the overview compares with it, not the first.
    third = make_run(version, failing=["says_refunded"])
    overview = client.get(reverse("overview", args=["mine"])).content.decode()
    assert "No regressions" in regressions(overview)
    assert 'data-baseline="other"' in client.get(run_url(third)).content.decode()
    assert 'data-baseline="other"' in client.get(run_url(first)).content.decode()


def test_promote_over_htmx_answers_the_baseline_region(
    two_projects, client_as, make_spec, make_run
):
    client = client_as("editor")
    version = make_spec(two_projects.mine)
    run = make_run(version)

    response = client.post(promote_url(run), {"name": "rc"}, HTTP_HX_REQUEST="true")

    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="run-baseline"')
    assert "<html" not in body
    assert 'data-baseline="active"' in body and "rc of refund-agent" in body
    assert f"Run {run.pk} is now the baseline of refund-agent (rc) on main." in body
    # The run page's form posts there and swaps the region.
    page = client.get(run_url(make_run(version))).content.decode()
    assert 'hx-target="#run-baseline" hx-swap="outerHTML"' in page
    assert 'hx-confirm="Replace the baseline rc of refund-agent' in page


def test_promoting_the_active_baseline_again_keeps_it_and_renames_it(
    two_projects, member, make_spec, make_run
):
    editor = member("editor")
    run = make_run(make_spec(two_projects.mine))
    first = services.baseline_promote(run_id=run.pk, user=editor)

    again = services.baseline_promote(run_id=run.pk, user=editor, name="renamed")

    assert again.pk == first.pk and again.active and again.name == "renamed"
    assert Baseline.objects.count() == 1


def test_only_completed_runs_can_be_promoted(two_projects, client_as, make_spec, make_run):
    client = client_as("editor")
    version = make_spec(two_projects.mine)
    cancelled = make_run(version, status=RunStatus.CANCELLED)
    running = make_run(version, status=RunStatus.RUNNING, execution_count=4, executions_done=1)

    page = client.get(run_url(cancelled)).content.decode()
    plain = client.post(promote_url(cancelled), follow=True)
    fragment = client.post(promote_url(running), HTTP_HX_REQUEST="true")

    assert PROMOTE_BUTTON not in page
    assert "run-baseline" not in client.get(run_url(running)).content.decode()
    assert plain.redirect_chain == [(run_url(cancelled), 302)]
    assert (
        f"Not promoted: run {cancelled.pk} is cancelled: only a completed, scored run can be "
        "a baseline." in plain.content.decode()
    )
    assert fragment.status_code == 200
    assert f"run {running.pk} is running: only a completed" in fragment.content.decode()
    assert not Baseline.objects.exists()


def test_baseline_data_keeps_first_passing_output_latency_and_cost(two_projects, member):
    run = synthetic_run(synthetic_version(two_projects.mine, replicas=3))
    Execution.objects.filter(run=run, scenario="no-chaos", replica=0, prompt_index=0).update(
        final_output="x" * (services.BASELINE_OUTPUT_MAX_CHARS + 50)
    )

    baseline = services.baseline_promote(run_id=run.pk, user=member("editor"))

    groups = {g["key"]: g for g in baseline.data["groups"]}
    assert len(groups) == 6  # 3 scenarios x 2 prompts
    for key, group in groups.items():
        scenario, _, prompt = key.partition(" / prompt ")
        executions = Execution.objects.filter(run=run, scenario=scenario, prompt_index=int(prompt))
        expected = executions.aggregate(duration=Avg("duration_ms"), cost=Sum("cost_usd"))
        assert group["mean_duration_ms"] == pytest.approx(expected["duration"])
        assert group["cost_usd"] == pytest.approx(expected["cost"]) == pytest.approx(0.003)
    # Capped, and taken from the first replica that passed.
    assert groups["no-chaos / prompt 0"]["first_passing_output"] == "x" * (
        services.BASELINE_OUTPUT_MAX_CHARS
    )
    assert groups["no-chaos / prompt 1"]["first_passing_output"] == "ok"
    # `cites` fails in every replica under tool-outage: no passing output, failure codes kept.
    outage = groups["tool-outage / prompt 0"]
    assert outage["first_passing_output"] is None and not outage["passed"]
    assert outage["failure_codes"] == ["CONTAINS_FAILED"]
    # Flaky under slow-llm: replica 0 fails, so the first passing output is replica 1's.
    assert groups["slow-llm / prompt 0"]["status"] == "flaky"
    assert groups["slow-llm / prompt 0"]["first_passing_output"] == "ok"
    assert baseline.data["metrics"]["executions"] == 18


def test_baseline_promote_refuses_a_viewer_and_a_long_name(
    two_projects, member, make_spec, make_run
):
    run = make_run(make_spec(two_projects.mine))

    with pytest.raises(services.BaselineError, match="needs the editor role"):
        services.baseline_promote(run_id=run.pk, user=member("viewer"))
    with pytest.raises(services.BaselineError, match="name: at most 200 characters, got 201"):
        services.baseline_promote(run_id=run.pk, user=member("editor"), name="n" * 201)
    assert not Baseline.objects.exists()


# --- Permissions --------------------------------------------------------------------------


@pytest.mark.parametrize("role", ALL_ROLES)
def test_only_editors_and_admins_promote(two_projects, client_as, make_spec, make_run, role):
    run = make_run(make_spec(two_projects.mine))
    client = client_as(role)

    page = client.get(run_url(run))
    plain = client.post(promote_url(run))
    fragment = client.post(promote_url(run), HTTP_HX_REQUEST="true")

    expected = {"viewer": 403, "reviewer": 403, "outsider": 404}.get(role)
    if expected:
        assert (plain.status_code, fragment.status_code) == (expected, expected)
        assert not Baseline.objects.exists()
    else:
        assert (plain.status_code, fragment.status_code) == (302, 200)
        assert Baseline.objects.get().run_id == run.pk
    if role != "outsider":
        html = page.content.decode()
        assert (PROMOTE_BUTTON in html) == (role in ("editor", "admin"))


def test_another_projects_run_cannot_be_promoted_under_this_slug(
    two_projects, client_as, make_spec, make_run
):
    foreign = make_run(make_spec(two_projects.other))

    response = client_as("admin").post(promote_url(foreign))

    assert response.status_code == 404
    assert not Baseline.objects.exists()


def test_promote_refuses_get(two_projects, client_as, make_spec, make_run):
    run = make_run(make_spec(two_projects.mine))
    assert client_as("admin").get(promote_url(run)).status_code == 405


def test_promote_needs_login(two_projects, make_spec, make_run):
    run = make_run(make_spec(two_projects.mine))
    response = Client().post(promote_url(run))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert re.search(r"next=.*baseline", response["Location"])


def test_the_run_page_promotes_for_a_branch_with_a_reason_and_links_the_history(
    two_projects, client_as, make_spec, make_run
):
    client = client_as("editor")
    version = make_spec(two_projects.mine)
    on_main = make_run(version)
    feature = make_run(version, labels={"branch": "feature-x"})
    client.post(promote_url(on_main), {"name": "rel-1"})

    page = client.get(run_url(feature)).content.decode()
    region = baseline_region(page)
    # A branch with no baseline of its own is compared with main's, and the form offers the
    # run's branch as the scope.
    assert 'data-baseline="other"' in region and "rel-1</a> (main)" in region
    assert 'name="branch" value="feature-x"' in page
    assert reverse("spec_baselines", args=["mine", "refund-agent"]) in page

    response = client.post(
        promote_url(feature), {"name": "fx", "branch": "feature-x", "reason": "new tools"}
    )

    assert response.status_code == 302
    scoped = Baseline.objects.get(branch="feature-x")
    assert (scoped.run_id, scoped.reason, scoped.active) == (feature.pk, "new tools", True)
    assert Baseline.objects.get(branch="main").active  # main keeps its own
    region = baseline_region(client.get(run_url(feature)).content.decode())
    assert 'data-baseline="active"' in region and "fx of refund-agent on feature-x" in region
    history = client.get(reverse("spec_baselines", args=["mine", "refund-agent"])).content.decode()
    assert history.count("<tr data-baseline-id=") == 2 and "new tools" in history
    assert 'data-active-branch="feature-x"' in history and 'data-active-branch="main"' in history
