"""The API's regressions report and alert rules, with project tokens."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from evaluations import services
from evaluations.models import AlertRule, Membership, Project, Role
from tests.evaluations.alert_history import FAILING, PASSING, baseline_of, finished_run, spec_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def bearer(project: Project, django_user_model: Any) -> Any:
    def make(role: str) -> dict[str, str]:
        user = django_user_model.objects.create_user(
            username=f"ci-{role}-{django_user_model.objects.count()}", password="pw-123456"
        )
        Membership.objects.create(project=project, user=user, role=Role(role))
        _, raw = services.token_issue(project=project, user=user, name=f"ci-{role}")
        return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}

    return make


def test_a_ci_job_reads_the_regressions(project: Project, bearer: Any) -> None:
    spec = spec_in(project)
    reference = finished_run(spec, finished=timezone.now() - timedelta(days=3), groups=PASSING)
    baseline_of(spec, reference, PASSING)
    regressed = finished_run(spec, finished=timezone.now(), groups=FAILING, branch="main")
    client, headers = Client(), bearer("viewer")
    data = client.get(f"/api/projects/{project.slug}/regressions?since=7d", **headers).json()
    assert [r["run_id"] for r in data["regressions"]] == [regressed.pk]
    markdown = client.get(f"/api/projects/{project.slug}/regressions?format=md", **headers)
    assert markdown["Content-Type"].startswith("text/markdown")
    refused = client.get(f"/api/projects/{project.slug}/regressions?since=soon", **headers)
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "since"


def test_an_admin_token_creates_lists_and_deletes_rules(project: Project, bearer: Any) -> None:
    spec_in(project)
    services.alert_channel_create(project=project, name="ops", kind="email", target="o@x.io")
    client, headers = Client(), bearer("admin")
    url = f"/api/projects/{project.slug}/alert-rules"
    body = {
        "name": "contract",
        "condition": "pass_rate<0.9",
        "window": "last_24h",
        "specs": ["refund-agent"],
        "channels": ["ops"],
    }
    created = client.post(url, body, content_type="application/json", **headers)
    assert created.status_code == 201
    rule = created.json()
    assert (rule["condition"], rule["channels"]) == ("pass_rate < 0.9", ["ops"])
    assert [r["name"] for r in client.get(url, **headers).json()] == ["contract"]
    deleted = client.delete(f"{url}/{rule['id']}", **headers)
    assert deleted.status_code == 204 and not AlertRule.objects.exists()


@pytest.mark.parametrize(
    ("change", "path", "named"),
    [
        ({"condition": "pass_rate =< 1"}, "condition", "unknown operator '=<'"),
        ({"condition": "flakiness > 0"}, "condition", "unknown metric 'flakiness'"),
        ({"window": "forever"}, "window", "'forever'"),
        ({"channels": ["pager"]}, "channels", "no channel named pager"),
    ],
)
def test_a_bad_rule_is_a_422_naming_the_field(
    project: Project, bearer: Any, change: dict[str, Any], path: str, named: str
) -> None:
    body = {"name": "r", "condition": "pass_rate < 1", **change}
    answer = Client().post(
        f"/api/projects/{project.slug}/alert-rules",
        body,
        content_type="application/json",
        **bearer("admin"),
    )
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["field"] == path and named in error["message"]


def test_only_admins_create_rules(project: Project, bearer: Any) -> None:
    answer = Client().post(
        f"/api/projects/{project.slug}/alert-rules",
        {"name": "r", "condition": "pass_rate < 1"},
        content_type="application/json",
        **bearer("editor"),
    )
    assert answer.status_code == 403 and not AlertRule.objects.exists()


def test_firings_are_listed_and_a_failed_one_is_sent_again(project: Project, bearer: Any) -> None:
    from evaluations.models import AlertFiring, ChannelKind, FiringStatus

    channel = services.alert_channel_create(
        project=project, name="ops", kind=ChannelKind.EMAIL, target="ops@example.com"
    )
    services.alert_rule_create(
        project=project, name="low", condition="pass_rate < 0.9", channel_ids=[channel.pk]
    )
    run = finished_run(spec_in(project), finished=timezone.now(), pass_rate=0.1)
    (firing_id,) = services.alerts_evaluate(run_id=run.pk)
    AlertFiring.objects.filter(pk=firing_id).update(
        status=FiringStatus.FAILED, attempts=4, last_error="SMTP refused"
    )

    listed = Client().get(f"/api/projects/{project.slug}/alert-firings", **bearer("viewer"))
    assert listed.status_code == 200
    (row,) = listed.json()
    assert (row["id"], row["rule"], row["channel"], row["run_id"]) == (
        firing_id,
        "low",
        "ops",
        run.pk,
    )
    assert row["status"] == "failed" and row["last_error"] == "SMTP refused"
    assert row["value"] == pytest.approx(0.1)

    url = f"/api/projects/{project.slug}/alert-firings/{firing_id}/resend"
    assert Client().post(url, **bearer("editor")).status_code == 403
    assert Client().post(url, **bearer("admin")).status_code == 202
    assert AlertFiring.objects.get(pk=firing_id).status == FiringStatus.PENDING
    again = Client().post(url, **bearer("admin"))
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
