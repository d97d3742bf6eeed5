"""Project pages: the project list, the overview (runs, regressions, trend charts) and
members. Every page is requested whole and as an htmx fragment, by every role."""

from __future__ import annotations

import json
import re
from typing import Any

import plotly.graph_objects as go
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evaluations import selectors, services
from evaluations.models import Baseline, Membership, Project, Role, RunStatus
from evaluations.selectors.regressions import compared_verdicts

from .conftest import ALL_ROLES, ROLES

pytestmark = pytest.mark.django_db


def htmx(client: Client, url: str, **kwargs: Any) -> Any:
    return client.get(url, HTTP_HX_REQUEST="true", **kwargs)


def chart_figure(html: str, chart_id: str) -> dict[str, Any]:
    """The figure a page embeds for plotly.js (json_script), parsed."""
    match = re.search(rf'<script id="{chart_id}" type="application/json">(.*?)</script>', html)
    assert match, f"no chart {chart_id}"
    figure: dict[str, Any] = json.loads(match.group(1))
    return figure


# --- Project list ---------------------------------------------------------------------------


def test_project_list_shows_my_projects_with_my_role(two_projects, member, django_user_model):
    user = member("editor")
    third = Project.objects.create(name="Third", slug="third")
    Membership.objects.create(project=third, user=user, role=Role.VIEWER)
    client = Client()
    client.force_login(user)

    page = client.get(reverse("project_list")).content.decode()

    assert "Mine" in page and "Third" in page
    assert "Other" not in page
    assert re.search(
        r"Mine</a></td>\s*<td class=\"mono\">mine</td>\s*<td><span class=\"role role-editor\">editor",
        page,
    )
    assert "New project" not in page  # only superusers create projects


def test_project_list_htmx_returns_the_list_fragment(two_projects, client_as):
    response = htmx(client_as("viewer"), reverse("project_list"))

    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="project-list"')
    assert "<html" not in body and "Mine" in body


def test_project_list_needs_login(two_projects):
    response = Client().get(reverse("project_list"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_superuser_creates_a_project_and_becomes_its_admin(db):
    admin = get_user_model().objects.create_superuser("root", password="pw-123456")
    client = Client()
    client.force_login(admin)

    assert "New project" in client.get(reverse("project_list")).content.decode()
    response = client.post(reverse("project_list"), {"name": "Payments Team", "slug": ""})

    project = Project.objects.get(slug="payments-team")
    assert response.status_code == 302
    assert response["Location"] == reverse("overview", args=["payments-team"])
    assert Membership.objects.get(project=project, user=admin).role == Role.ADMIN


def test_creating_a_project_with_a_taken_slug_is_refused(two_projects):
    admin = get_user_model().objects.create_superuser("root", password="pw-123456")
    client = Client()
    client.force_login(admin)

    response = client.post(reverse("project_list"), {"name": "Again", "slug": "mine"})

    assert response.status_code == 400
    assert "A project with the slug &#x27;mine&#x27; already exists." in response.content.decode()
    assert 'value="Again"' in response.content.decode()  # the form keeps what was typed
    assert Project.objects.count() == 2


def test_members_cannot_create_projects(two_projects, client_as):
    response = client_as("admin").post(reverse("project_list"), {"name": "X", "slug": "x"})
    assert response.status_code == 403
    assert not Project.objects.filter(slug="x").exists()


# --- Overview -------------------------------------------------------------------------------


def test_overview_lists_latest_runs_with_verdicts(two_projects, client_as, make_spec, make_run):
    version = make_spec(two_projects.mine)
    passing = make_run(version, cost_usd=0.0123, p95_duration_ms=1234.0)
    failing = make_run(version, failing=["says_refunded"], labels={"branch": "main"})
    running = make_run(version, status=RunStatus.RUNNING, execution_count=8, executions_done=3)
    hidden = make_run(make_spec(two_projects.other))

    page = client_as("viewer").get(reverse("overview", args=["mine"])).content.decode()

    for run in (passing, failing, running):
        assert f'href="/p/mine/runs/{run.pk}/"' in page
    assert f"/runs/{hidden.pk}/" not in page
    assert "gates pass" in page and "gates fail" in page
    assert "$0.0123" in page and "1234 ms" in page  # cost and p95 latency columns
    assert "100.0" in page  # resilience of the passing run
    assert "running 3/8" in page
    assert "exit 1" in page
    # A run is still going, so the latest-runs region polls.
    assert 'hx-trigger="every 5s"' in page


def test_overview_htmx_returns_the_latest_runs_fragment(
    two_projects, client_as, make_spec, make_run
):
    version = make_spec(two_projects.mine)
    run = make_run(version)

    response = htmx(client_as("viewer"), reverse("overview", args=["mine"]))

    body = response.content.decode()
    assert body.lstrip().startswith('<section id="latest-runs"')
    assert f"/p/mine/runs/{run.pk}/" in body
    assert "<html" not in body and "Regressions" not in body and "data-chart" not in body
    assert "every 5s" not in body  # every run has ended: nothing to poll for


@pytest.mark.embedded
def test_overview_trend_charts_carry_each_specs_runs(two_projects, client_as, make_spec, make_run):
    version = make_spec(two_projects.mine)
    first = make_run(version)
    second = make_run(version, failing=[("llm-degraded", "says_refunded")])

    html = client_as("viewer").get(reverse("overview", args=["mine"])).content.decode()

    resilience = chart_figure(html, "chart-resilience")
    pass_rate = chart_figure(html, "chart-pass-rate")
    go.Figure(resilience)  # a valid Plotly figure (raises on an unknown property)
    go.Figure(pass_rate)
    [line] = resilience["data"]
    assert line["name"] == "refund-agent"
    assert line["y"] == [first.resilience, second.resilience] and second.resilience < 100
    assert line["customdata"] == [f"/p/mine/runs/{first.pk}/", f"/p/mine/runs/{second.pk}/"]
    assert pass_rate["data"][0]["y"] == [1.0, 0.5]
    assert 'data-chart="chart-resilience"' in html
    # The same runs as a table, for people who do not read charts.
    table = html[html.index('data-testid="trend-table"') :]
    table = table[: table.index("</details>")]
    assert f'href="/p/mine/runs/{first.pk}/">#{first.pk}</a>' in table
    assert f'href="/p/mine/runs/{second.pk}/">#{second.pk}</a>' in table
    assert "100%" in table and "50%" in table
    assert "vendor/plotly.min.js" in html and "js/charts.js" in html
    # The charts are bounded and say so, with the way to the longer history.
    window = html[html.index('id="trend-window"') :]
    window = window[: window.index("</p>")]
    assert f"The last {selectors.OVERVIEW_TREND_RUNS} completed runs of each spec" in window
    assert f"has its last {selectors.TREND_RUNS}." in window
    assert 'href="/p/mine/specs/"' in window


def test_overview_without_runs_shows_empty_states(two_projects, client_as):
    html = client_as("viewer").get(reverse("overview", args=["mine"])).content.decode()
    assert "No runs yet." in html and "No data yet: no completed run has a value for this." in html
    assert "application/json" not in html


@pytest.mark.embedded
def test_overview_lists_regressions_against_the_active_baseline(
    two_projects, client_as, make_spec, make_run
):
    version = make_spec(two_projects.mine)
    # says_refunded already fails under chaos in the baseline: that group is no regression.
    reference = make_run(version, failing=[("llm-degraded", "says_refunded")])
    Baseline.objects.create(
        project=two_projects.mine,
        spec=version.spec,
        run=reference,
        name="release-1",
        active=True,
        data={"groups": reference.summary["groups"]},
        verdicts=compared_verdicts({"groups": reference.summary["groups"]}),
    )
    latest = make_run(version, failing=["says_refunded"])

    html = client_as("viewer").get(reverse("overview", args=["mine"])).content.decode()

    section = html[html.index('id="regressions"') :]
    section = section[: section.index("</section>")]
    assert section.count("<tr>") == 1 + 2  # header + the two no-chaos prompts
    assert "no-chaos / prompt 0" in section and "no-chaos / prompt 1" in section
    assert "llm-degraded" not in section
    assert "release-1" in section and "CONTAINS_FAILED" in section
    assert f"/p/mine/runs/{latest.pk}/" in section


def test_regressions_read_a_baseline_stored_as_a_mapping_and_ignore_inactive_ones(
    two_projects, client_as, make_spec, make_run
):
    version = make_spec(two_projects.mine)
    Baseline.objects.create(
        project=two_projects.mine,
        spec=version.spec,
        name="by-key",
        active=True,
        data={"groups": {"no-chaos / prompt 1": {"pass_rate": 1.0}}},
        verdicts=compared_verdicts({"groups": {"no-chaos / prompt 1": {"pass_rate": 1.0}}}),
    )
    Baseline.objects.create(
        project=two_projects.mine,
        spec=version.spec,
        name="old",
        active=False,
        data={"groups": {"no-chaos / prompt 0": {"passed": True}}},
        verdicts=compared_verdicts({"groups": {"no-chaos / prompt 0": {"passed": True}}}),
    )
    make_run(version, failing=[("no-chaos", "short_answer")])

    html = client_as("viewer").get(reverse("overview", args=["mine"])).content.decode()

    section = html[html.index('id="regressions"') : html.index('id="charts"')]
    assert "no-chaos / prompt 1" in section
    assert "no-chaos / prompt 0" not in section  # only the active baseline counts
    assert "by-key" in section and "100%" in section and "0%" in section


def _overview_queries(client: Client) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("overview", args=["mine"]))
    assert response.status_code == 200
    return len(queries)


def test_overview_query_count_does_not_grow_with_runs(two_projects, client_as, make_spec, make_run):
    client = client_as("viewer")
    version = make_spec(two_projects.mine)
    reference = make_run(version)
    Baseline.objects.create(
        project=two_projects.mine,
        spec=version.spec,
        run=reference,
        name="b",
        active=True,
        data={"groups": reference.summary["groups"]},
        verdicts=compared_verdicts({"groups": reference.summary["groups"]}),
    )
    make_run(version, failing=["says_refunded"])
    few = _overview_queries(client)

    for index in range(3):
        other = make_spec(two_projects.mine, source=SOURCE_NAMED.format(index=index))
        runs = [make_run(other, failing=["greets"] if n % 2 else ()) for n in range(8)]
        Baseline.objects.create(
            project=two_projects.mine,
            spec=other.spec,
            run=runs[0],
            name="b",
            active=True,
            data={"groups": runs[0].summary["groups"]},
            verdicts=compared_verdicts({"groups": runs[0].summary["groups"]}),
        )
    many = _overview_queries(client)

    assert many == few
    assert many <= 9  # session, user, project, membership, runs, regressions (3), trends


SOURCE_NAMED = """\
version: 1
id: agent-{index}
task: {{prompt: "hello"}}
agent: {{type: command, command: "echo hello"}}
invariants:
  greets: {{description: greets, check: {{type: contains, value: hello}}}}
"""


# --- Members --------------------------------------------------------------------------------


def test_members_page_lists_members_and_roles(two_projects, member, client_as):
    member("admin")
    member("reviewer")
    client = client_as("viewer")

    html = client.get(reverse("members", args=["mine"])).content.decode()

    assert "admin-1" in html and "reviewer-2" in html and "viewer-3" in html
    assert "(you)" in html
    assert 'name="action"' not in html  # a viewer gets no forms
    assert "outsider" not in html


def test_members_page_gives_admins_the_forms(two_projects, client_as):
    html = client_as("admin").get(reverse("members", args=["mine"])).content.decode()
    assert 'value="add"' in html and 'value="set_role"' in html and 'value="remove"' in html


def test_members_htmx_returns_the_member_list(two_projects, client_as):
    response = htmx(client_as("viewer"), reverse("members", args=["mine"]))
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="member-list"') and "<html" not in body


def test_admin_adds_a_member_by_username(two_projects, client_as, django_user_model):
    newcomer = django_user_model.objects.create_user("carol", password="pw-123456")
    client = client_as("admin")

    response = client.post(
        reverse("members", args=["mine"]), {"action": "add", "username": "carol", "role": "editor"}
    )

    assert response.status_code == 302
    assert Membership.objects.get(project=two_projects.mine, user=newcomer).role == Role.EDITOR
    page = client.get(response["Location"]).content.decode()
    assert "carol added as editor." in page


def test_adding_through_htmx_answers_with_the_updated_list(
    two_projects, client_as, django_user_model
):
    django_user_model.objects.create_user("carol", password="pw-123456")
    response = client_as("admin").post(
        reverse("members", args=["mine"]),
        {"action": "add", "username": "carol", "role": "viewer"},
        HTTP_HX_REQUEST="true",
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="member-list"')
    assert "carol added as viewer." in body and "carol</td>" in body.replace("\n", "")


def test_admin_creates_an_account_for_someone_new(two_projects, client_as, django_user_model):
    client = client_as("admin")
    response = client.post(
        reverse("members", args=["mine"]),
        {"action": "create", "new_username": "dora", "role": "reviewer"},
    )
    # No redirect: the password is on this answer only.
    assert response.status_code == 200
    page = response.content.decode()
    assert "Account dora created and added as reviewer." in page
    password = re.search(r'<code class="mono" id="new-password">([^<]+)</code>', page).group(1)
    assert len(password) >= 16
    dora = django_user_model.objects.get(username="dora")
    assert Membership.objects.get(project=two_projects.mine, user=dora).role == Role.REVIEWER
    assert password not in dora.password  # only its hash is stored
    assert Client().login(username="dora", password=password)
    # Shown once: the members page never shows it again.
    assert password not in client.get(reverse("members", args=["mine"])).content.decode()


@pytest.mark.parametrize(
    ("username", "message"),
    [
        ("admin-1", "username: &#x27;admin-1&#x27; is taken"),
        ("bad name!", "username: &#x27;bad name!&#x27; may contain only letters"),
        ("", "username: give the new person&#x27;s username."),
    ],
)
def test_creating_an_account_refuses_bad_usernames(two_projects, client_as, username, message):
    client = client_as("admin")
    before = (Membership.objects.count(), get_user_model().objects.count())
    response = client.post(
        reverse("members", args=["mine"]),
        {"action": "create", "new_username": username, "role": "viewer"},
    )
    assert response.status_code == 400 and message in response.content.decode()
    assert (Membership.objects.count(), get_user_model().objects.count()) == before


def test_only_admins_create_accounts(two_projects, client_as, django_user_model):
    response = client_as("editor").post(
        reverse("members", args=["mine"]),
        {"action": "create", "new_username": "eve", "role": "admin"},
    )
    assert response.status_code == 403
    assert not django_user_model.objects.filter(username="eve").exists()


@pytest.mark.parametrize(
    ("form", "message"),
    [
        (
            {"username": "nobody", "role": "viewer"},
            "There is no active user named &#x27;nobody&#x27;.",
        ),
        ({"username": "admin-1", "role": "viewer"}, "admin-1 is already a member (admin)"),
        ({"username": "carol", "role": "owner"}, "Unknown role &#x27;owner&#x27;"),
    ],
)
def test_adding_a_member_refuses_bad_input(
    two_projects, client_as, django_user_model, form, message
):
    django_user_model.objects.create_user("carol", password="pw-123456")
    client = client_as("admin")
    before = Membership.objects.count()

    response = client.post(reverse("members", args=["mine"]), {"action": "add", **form})
    fragment = client.post(
        reverse("members", args=["mine"]), {"action": "add", **form}, HTTP_HX_REQUEST="true"
    )

    assert response.status_code == 400 and message in response.content.decode()
    assert fragment.status_code == 200 and message in fragment.content.decode()
    assert Membership.objects.count() == before


@pytest.mark.embedded
def test_admin_changes_a_role_and_removes_a_member(two_projects, member, client_as):
    viewer = member("viewer")
    reviewer = member("reviewer")
    client = client_as("admin")
    url = reverse("members", args=["mine"])
    viewer_membership = Membership.objects.get(user=viewer)
    reviewer_membership = Membership.objects.get(user=reviewer)

    changed = client.post(
        url, {"action": "set_role", "membership": viewer_membership.pk, "role": "editor"}
    )
    removed = client.post(url, {"action": "remove", "membership": reviewer_membership.pk})

    assert changed.status_code == 302 and removed.status_code == 302
    viewer_membership.refresh_from_db()
    assert viewer_membership.role == Role.EDITOR
    assert not Membership.objects.filter(pk=reviewer_membership.pk).exists()


def test_the_last_admin_can_be_neither_demoted_nor_removed(two_projects, member):
    admin = member("admin")
    client = Client()
    client.force_login(admin)
    url = reverse("members", args=["mine"])
    membership = Membership.objects.get(user=admin, project=two_projects.mine)

    demoted = client.post(
        url, {"action": "set_role", "membership": membership.pk, "role": "viewer"}
    )
    removed = client.post(url, {"action": "remove", "membership": membership.pk})

    assert demoted.status_code == 400
    assert (
        "admin-1 is the only admin of Mine: make someone else admin first."
        in demoted.content.decode()
    )
    assert removed.status_code == 400
    assert "is the only admin of Mine" in removed.content.decode()
    membership.refresh_from_db()
    assert membership.role == Role.ADMIN

    # With a second admin, the first may step down.
    member("admin")
    assert (
        client.post(
            url, {"action": "set_role", "membership": membership.pk, "role": "viewer"}
        ).status_code
        == 302
    )
    membership.refresh_from_db()
    assert membership.role == Role.VIEWER


def test_a_membership_of_another_project_cannot_be_changed(two_projects, member, client_as):
    stranger = member("viewer", project=two_projects.other)
    membership = Membership.objects.get(user=stranger)

    response = client_as("admin").post(
        reverse("members", args=["mine"]),
        {"action": "set_role", "membership": membership.pk, "role": "admin"},
    )

    assert response.status_code == 400
    assert "That membership is not part of this project." in response.content.decode()
    membership.refresh_from_db()
    assert membership.role == Role.VIEWER


def test_membership_services_keep_an_admin(two_projects, member, django_user_model):
    first = Membership.objects.get(user=member("admin"))
    with pytest.raises(services.MembershipError, match="only admin"):
        services.membership_remove(project=two_projects.mine, membership_id=first.pk)
    django_user_model.objects.create_user("carol", password="pw-123456")
    second = services.membership_add(project=two_projects.mine, username="carol", role="viewer")
    with pytest.raises(services.MembershipError, match="already a member"):
        services.membership_add(
            project=two_projects.mine, username=second.user.username, role="admin"
        )
    services.membership_set_role(project=two_projects.mine, membership_id=second.pk, role="admin")
    services.membership_remove(project=two_projects.mine, membership_id=first.pk)
    assert list(Membership.objects.filter(project=two_projects.mine, role=Role.ADMIN)) == [second]


# --- Permissions across roles and projects ----------------------------------------------------


@pytest.mark.parametrize("role", ALL_ROLES)
@pytest.mark.parametrize("page", ["overview", "members"])
def test_project_pages_are_readable_by_members_only(two_projects, client_as, role, page):
    client = client_as(role)

    response = client.get(reverse(page, args=["mine"]))
    fragment = htmx(client, reverse(page, args=["mine"]))

    expected = 404 if role == "outsider" else 200
    assert response.status_code == expected and fragment.status_code == expected


@pytest.mark.parametrize("role", ALL_ROLES)
def test_only_admins_manage_members(two_projects, client_as, django_user_model, role):
    django_user_model.objects.create_user("carol", password="pw-123456")
    client = client_as(role)

    response = client.post(
        reverse("members", args=["mine"]), {"action": "add", "username": "carol", "role": "viewer"}
    )

    expected = {"outsider": 404, "admin": 302}.get(role, 403)
    assert response.status_code == expected
    assert Membership.objects.filter(user__username="carol").exists() == (role == "admin")


@pytest.mark.parametrize("role", ROLES)
def test_members_of_one_project_get_404_in_the_other(two_projects, client_as, role):
    client = client_as(role)
    for page in ("overview", "members"):
        assert client.get(reverse(page, args=["other"])).status_code == 404
    assert client.get(reverse("overview", args=["no-such-project"])).status_code == 404


@pytest.mark.parametrize("page", ["overview", "members"])
def test_project_pages_need_login(two_projects, page):
    response = Client().get(reverse(page, args=["mine"]))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
