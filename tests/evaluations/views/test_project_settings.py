"""The project settings page: admins edit the review policy (which judge results go to
people); a spec's `review:` block still wins key by key. Bad values come back with the
field named and nothing saved. Only admins see the page and its link in the nav."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evaluations import services
from evaluations.models import Project
from tests.evaluations.views.run_data import synthetic_run, synthetic_version

from .conftest import ALL_ROLES

pytestmark = pytest.mark.django_db

SETTINGS = reverse("project_settings", args=["mine"])

FULL_POLICY_FORM = {
    "all": "on",
    "sample_rate": "0.25",
    "borderline_margin": "0.1",
    "check_disagreement": "on",
    "spread_max": "0.3",
    "failing_gates": "on",
    "reviewers_per_item": "2",
    "blind": "on",
    "disagreement": "0.2",
}


def policy_of(slug: str = "mine") -> dict[str, Any]:
    return Project.objects.get(slug=slug).review_policy


def test_admin_sees_the_form_filled_with_the_stored_policy(two_projects, client_as):
    services.project_review_policy_set(
        project=two_projects.mine, policy={"sample_rate": 0.5, "blind": True}
    )

    response = client_as("admin").get(SETTINGS)

    html = response.content.decode()
    assert response.status_code == 200
    assert '<section id="policy-form"' in html
    assert 'name="sample_rate" value="0.5"' in html
    assert re.search(r'<input type="checkbox" name="blind"[^>]* checked>', html)
    assert re.search(r'<input type="checkbox" name="all"[^>]*>', html)
    assert not re.search(r'<input type="checkbox" name="all"[^>]* checked>', html)
    assert 'id="id_sample_rate_helptext">Share of judge results sampled at random' in html
    for field in FULL_POLICY_FORM:
        assert f'<label for="id_{field}"><code>{field}</code></label>' in html
    assert "{&quot;blind&quot;: true, &quot;sample_rate&quot;: 0.5}" in html  # what is stored


def test_admin_saves_every_key_of_the_policy(two_projects, client_as):
    response = client_as("admin").post(SETTINGS, FULL_POLICY_FORM, follow=True)

    assert response.redirect_chain == [(SETTINGS, 302)]
    assert "Review policy saved." in response.content.decode()
    assert policy_of() == {
        "all": True,
        "sample_rate": 0.25,
        "borderline_margin": 0.1,
        "check_disagreement": True,
        "spread_max": 0.3,
        "failing_gates": True,
        "reviewers_per_item": 2,
        "blind": True,
        "disagreement": 0.2,
    }
    # The policy the review selection uses: the project's, then the spec's block wins.
    project = Project.objects.get(slug="mine")
    effective = services.review_policy_for(project=project, spec_raw={})
    assert effective.all and effective.blind and effective.reviewers_per_item == 2
    assert effective.sample_rate == 0.25 and effective.borderline_margin == 0.1
    overridden = services.review_policy_for(
        project=project, spec_raw={"review": {"blind": False, "reviewers_per_item": 1}}
    )
    assert not overridden.blind and overridden.reviewers_per_item == 1
    assert overridden.sample_rate == 0.25
    assert policy_of("other") == {}


def test_empty_fields_and_unticked_boxes_fall_back_to_the_defaults(two_projects, client_as):
    services.project_review_policy_set(
        project=two_projects.mine, policy={"blind": True, "sample_rate": 0.5, "all": True}
    )

    client_as("admin").post(SETTINGS, {"sample_rate": "", "borderline_margin": "0.05"})

    assert policy_of() == {"borderline_margin": 0.05}
    effective = services.review_policy_for(project=Project.objects.get(slug="mine"), spec_raw={})
    assert not effective.blind and not effective.all and effective.sample_rate == 0.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sample_rate", "1.5", "sample_rate: Ensure this value is less than or equal to 1.0."),
        ("sample_rate", "abc", "sample_rate: Enter a number."),
        ("borderline_margin", "-0.1", "borderline_margin: Ensure this value is greater than"),
        ("spread_max", "nan", "spread_max: Enter a number."),
        ("reviewers_per_item", "0", "reviewers_per_item: Ensure this value is greater than"),
        ("reviewers_per_item", "1.5", "reviewers_per_item: Enter a whole number."),
    ],
)
def test_invalid_values_are_refused_with_the_field_named(
    two_projects, client_as, field, value, message
):
    services.project_review_policy_set(project=two_projects.mine, policy={"blind": True})
    client = client_as("admin")

    page = client.post(SETTINGS, {**FULL_POLICY_FORM, field: value})
    fragment = client.post(SETTINGS, {field: value}, HTTP_HX_REQUEST="true")

    assert page.status_code == 400
    html = page.content.decode()
    assert "Not saved:" in html and message in html
    assert f'<p class="field-error" id="id_{field}-error">{message}' in html
    assert f'value="{value}"' in html  # what was typed is kept
    assert fragment.status_code == 200  # htmx swaps 2xx answers only
    assert message in fragment.content.decode()
    assert policy_of() == {"blind": True}


def test_htmx_gets_the_form_region(two_projects, client_as):
    client = client_as("admin")

    shown = client.get(SETTINGS, HTTP_HX_REQUEST="true")
    saved = client.post(SETTINGS, {"sample_rate": "0.2"}, HTTP_HX_REQUEST="true")

    for response in (shown, saved):
        body = response.content.decode()
        assert response.status_code == 200
        assert body.lstrip().startswith('<section id="policy-form"')
        assert "<html" not in body
        assert 'hx-post="/p/mine/settings/" hx-target="#policy-form"' in body
    body = saved.content.decode()
    assert "Review policy saved." in body and 'name="sample_rate" value="0.2"' in body
    assert policy_of() == {"sample_rate": 0.2}


def test_the_nav_links_settings_for_admins_only(two_projects, client_as):
    link = f'<a href="{SETTINGS}">Settings</a>'
    for role in ("viewer", "reviewer", "editor"):
        assert link not in client_as(role).get(reverse("members", args=["mine"])).content.decode()
    assert link in client_as("admin").get(reverse("overview", args=["mine"])).content.decode()


@pytest.mark.parametrize("role", ALL_ROLES)
def test_only_admins_see_and_change_the_policy(two_projects, client_as, role):
    client = client_as(role)

    responses = [
        client.get(SETTINGS),
        client.get(SETTINGS, HTTP_HX_REQUEST="true"),
        client.post(SETTINGS, {"all": "on"}),
    ]

    expected = {"admin": [200, 200, 302], "outsider": [404] * 3}.get(role, [403] * 3)
    assert [r.status_code for r in responses] == expected
    assert policy_of() == ({"all": True} if role == "admin" else {})


def test_an_admin_of_one_project_cannot_change_the_others(two_projects, client_as):
    client = client_as("admin")

    response = client.post(reverse("project_settings", args=["other"]), {"all": "on"})

    assert response.status_code == 404
    assert policy_of("other") == {}


def test_settings_need_login(two_projects):
    response = Client().get(SETTINGS)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_firings_list_reads_none_of_a_runs_large_columns(
    two_projects: Any, member: Any
) -> None:
    """The settings page and the API list up to 50 firings with their run's spec: neither
    reads the run's summary (about 0.5 kB an execution), verdicts or keys for that, nor the
    channel's secret."""
    mine = two_projects.mine
    channel = services.alert_channel_create(
        project=mine, name="ops", kind="email", target="ops@example.com"
    )
    services.alert_rule_create(
        project=mine, name="low", condition="pass_rate < 1", channel_ids=[channel.pk]
    )
    run = synthetic_run(synthetic_version(mine))  # a failing run: the rule fires for it
    services.alerts_evaluate(run_id=run.pk)
    admin = member("admin")
    _, token = services.token_issue(project=mine, user=admin, name="t")
    browser = Client()
    browser.force_login(admin)
    requests = {
        "settings page": lambda: browser.get(reverse("project_settings", args=[mine.slug])),
        "API": lambda: Client().get(
            reverse("api:alert_firings", args=[mine.slug]),
            headers={"Authorization": f"Bearer {token}"},
        ),
    }
    large = [
        '"evaluations_run"."summary"',
        '"evaluations_run"."verdicts"',
        '"evaluations_run"."failing_keys"',
        '"evaluations_alertchannel"."secret_encrypted"',
    ]
    for name, request in requests.items():
        with CaptureQueriesContext(connection) as queries:
            response = request()
        assert response.status_code == 200, name
        assert f"{run.spec.slug}" in response.content.decode(), name  # the firing is listed
        reads = [
            q["sql"] for q in queries.captured_queries if '"evaluations_alertfiring"' in q["sql"]
        ]
        assert reads, name
        assert [column for column in large if any(column in sql for sql in reads)] == [], name
