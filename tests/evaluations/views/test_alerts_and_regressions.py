"""The alerts section of the project settings page (channels, rules, firings, "send again"),
the regressions report page with its exports, and `keystone report regressions`."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from evaluations import cli, services
from evaluations.models import AlertChannel, AlertFiring, AlertRule, FiringStatus
from evaluations.selectors.regressions import compared_verdicts, summary_failing_keys
from tests.evaluations.alert_history import FAILING, PASSING, baseline_of, finished_run, spec_in

pytestmark = pytest.mark.django_db


def alerts_url(project: Any) -> str:
    return reverse("project_alerts", args=[project.slug])


def test_an_admin_adds_a_channel_and_a_rule_and_sees_them(
    two_projects: Any, client_as: Any
) -> None:
    mine = two_projects.mine
    spec_in(mine)
    client = client_as("admin")
    answer = client.post(
        alerts_url(mine),
        {"action": "channel_add", "name": "ops", "kind": "email", "target": "ops@example.com"},
        HTTP_HX_REQUEST="true",
    )
    assert answer.status_code == 200 and "Channel ops added." in answer.content.decode()
    channel = AlertChannel.objects.get(project=mine)
    answer = client.post(
        alerts_url(mine),
        {
            "action": "rule_add",
            "name": "contract",
            "condition": "pass_rate < 0.9",
            "window": "last_5_runs",
            "specs": "refund-agent",
            "branches": "main, release",
            "channels": [str(channel.pk)],
        },
    )
    page = answer.content.decode()
    assert answer.status_code == 200 and "Rule contract added." in page
    rule = AlertRule.objects.get(project=mine)
    assert (rule.window, rule.specs, rule.branches) == (
        "last_5_runs",
        ["refund-agent"],
        ["main", "release"],
    )
    assert list(rule.channels.all()) == [channel]
    settings_page = client.get(reverse("project_settings", args=[mine.slug])).content.decode()
    assert "<code>pass_rate &lt; 0.9</code>" in settings_page and "Last 5 runs" in settings_page


def test_a_bad_condition_comes_back_naming_the_metric(two_projects: Any, client_as: Any) -> None:
    answer = client_as("admin").post(
        alerts_url(two_projects.mine),
        {"action": "rule_add", "name": "r", "condition": "pass_rat < 0.9", "window": "last_run"},
    )
    assert answer.status_code == 400
    assert "Not saved: condition: unknown metric &#x27;pass_rat&#x27;" in answer.content.decode()
    assert not AlertRule.objects.exists()


@pytest.mark.parametrize("role", ["viewer", "editor", "outsider"])
def test_only_admins_edit_alerts(two_projects: Any, client_as: Any, role: str) -> None:
    answer = client_as(role).post(
        alerts_url(two_projects.mine),
        {"action": "channel_add", "name": "x", "kind": "email", "target": "a@b.co"},
    )
    assert answer.status_code in (403, 404)
    assert not AlertChannel.objects.exists()


def test_a_failed_firing_shows_with_its_error_and_can_be_sent_again(
    two_projects: Any, client_as: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    mine = two_projects.mine
    channel = services.alert_channel_create(
        project=mine, name="ops", kind="email", target="ops@example.com"
    )
    services.alert_rule_create(
        project=mine, name="low", condition="pass_rate < 0.9", channel_ids=[channel.pk]
    )
    run = finished_run(spec_in(mine), finished=timezone.now(), pass_rate=0.2)
    (firing_id,) = services.alerts_evaluate(run_id=run.pk)
    AlertFiring.objects.filter(pk=firing_id).update(
        status=FiringStatus.FAILED, attempts=4, last_error="mail server: connection refused"
    )
    client = client_as("admin")
    page = client.get(reverse("project_settings", args=[mine.slug])).content.decode()
    firings = page[page.index('id="alert-firings"') :]
    assert 'data-status="failed"' in firings and "mail server: connection refused" in firings
    assert "Send again</button>" in firings
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(alerts_url(mine), {"action": "resend", "id": str(firing_id)})
    assert "Firing queued to be sent again." in answer.content.decode()
    firing = AlertFiring.objects.get(pk=firing_id)
    assert (firing.status, firing.attempts) == ("delivered", 1)
    # A delivered firing is not sent again.
    again = client.post(alerts_url(mine), {"action": "resend", "id": str(firing_id)})
    assert again.status_code == 400 and "only a failed firing" in again.content.decode()


# --- The regressions report ----------------------------------------------------------------


@pytest.fixture
def regressed(two_projects: Any) -> Any:
    mine = two_projects.mine
    spec = spec_in(mine)
    now = timezone.now()
    reference = finished_run(spec, finished=now - timedelta(days=10), groups=PASSING)
    baseline_of(spec, reference, PASSING)
    return finished_run(spec, finished=now - timedelta(days=1), groups=FAILING, branch="main")


def report_url(project: Any, **query: str) -> str:
    url = reverse("regressions", args=[project.slug])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def test_the_report_lists_a_regression_and_exports_it(
    two_projects: Any, client_as: Any, regressed: Any
) -> None:
    mine, client = two_projects.mine, client_as("viewer")
    page = client.get(report_url(mine)).content.decode()
    assert "no-chaos / prompt 0" in page and "CONTAINS_FAILED" in page
    assert f'href="/p/{mine.slug}/runs/{regressed.pk}/"' in page
    assert (
        f'href="/p/{mine.slug}/runs/{regressed.pk}/compare/#change-group-no-chaos-prompt-0"' in page
    )
    data = json.loads(client.get(report_url(mine, format="json")).content)
    (row,) = data["regressions"]
    assert (row["spec"], row["branch"], row["run_id"]) == ("refund-agent", "main", regressed.pk)
    assert (row["baseline_pass_rate"], row["current_pass_rate"]) == (1.0, 0.0)
    # Counts and Fisher's exact p-value of the drop (issue 15): 1/1 -> 0/1 tells nothing yet.
    assert (row["baseline_counts"], row["current_counts"]) == ("1/1", "0/1")
    assert row["p_value"] == pytest.approx(0.5)
    rows = list(
        csv.DictReader(io.StringIO(client.get(report_url(mine, format="csv")).content.decode()))
    )
    assert rows[0]["failure_codes"] == "CONTAINS_FAILED" and rows[0]["baseline"] == "release-1"
    markdown = client.get(report_url(mine, format="md")).content.decode()
    assert f"[#{regressed.pk}](/p/{mine.slug}/runs/{regressed.pk}/)" in markdown


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ({"since": "12h"}, "No completed run since"),
        ({"spec": "nope"}, "No active baseline for spec nope"),
        ({"branch": "feature"}, "No completed run since the baseline"),
    ],
)
def test_an_empty_report_says_why(
    two_projects: Any, client_as: Any, regressed: Any, query: dict[str, str], reason: str
) -> None:
    page = client_as("viewer").get(report_url(two_projects.mine, **query)).content.decode()
    assert 'id="empty-reason"' in page and reason in page


def test_nothing_regressed_and_no_baseline_are_told_apart(
    two_projects: Any, client_as: Any
) -> None:
    mine, client = two_projects.mine, client_as("viewer")
    assert "No active baseline" in client.get(report_url(mine)).content.decode()
    spec = spec_in(mine)
    reference = finished_run(spec, finished=timezone.now() - timedelta(days=2), groups=PASSING)
    baseline_of(spec, reference, PASSING)
    finished_run(spec, finished=timezone.now(), groups=PASSING)
    assert "Nothing regressed" in client.get(report_url(mine)).content.decode()


def test_a_bad_period_or_format_is_refused_by_name(two_projects: Any, client_as: Any) -> None:
    client = client_as("viewer")
    page = client.get(report_url(two_projects.mine, since="lastweek"))
    assert page.status_code == 400 and "since &#x27;lastweek&#x27;" in page.content.decode()
    export = client.get(report_url(two_projects.mine, format="pdf"))
    assert export.status_code == 400 and "format 'pdf'" in export.content.decode()


def test_the_report_is_private_to_members(two_projects: Any, client_as: Any) -> None:
    assert client_as("outsider").get(report_url(two_projects.mine)).status_code == 404


def test_keystone_report_regressions_writes_markdown(
    two_projects: Any, regressed: Any, tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "regressions.md"
    code = cli.main(
        ["report", "regressions", "--project", "mine", "--since", "7d", "--markdown", str(out)]
    )
    assert code == 0
    text = out.read_text()
    assert text.startswith("**Keystone regressions: mine** since ")
    assert "| refund-agent | main | no-chaos / prompt 0 | 100% | 0% | `CONTAINS_FAILED` |" in text
    assert "1 regressed group(s) in mine" in capsys.readouterr().err


def test_keystone_report_regressions_refuses_a_bad_project_or_period(
    two_projects: Any, capsys: Any
) -> None:
    assert cli.main(["report", "regressions", "--project", "nope"]) == 2
    assert "no project 'nope'" in capsys.readouterr().err
    assert cli.main(["report", "regressions", "--project", "mine", "--since", "7x"]) == 2
    assert "--since '7x'" in capsys.readouterr().err


def test_preview_digest_renders_it_on_the_settings_page(two_projects: Any, client_as: Any) -> None:
    mine = two_projects.mine
    finished_run(spec_in(mine), finished=timezone.now(), pass_rate=0.5, cost_usd=2.0)
    client = client_as("admin")
    page = client.get(reverse("project_settings", args=[mine.slug])).content.decode()
    assert "Preview digest</button>" in page and 'id="digest-markdown"' not in page
    with CaptureQueriesContext(connection) as queries:
        region = client.get(
            reverse("project_digest_preview", args=[mine.slug]), HTTP_HX_REQUEST="true"
        ).content.decode()
    assert region.lstrip().startswith('<div id="digest-preview">')
    assert "# Keystone weekly digest: Mine" in region and "$2.00 over 1 run(s)" in region
    # The button's request gets the region alone, and reads none of the page's lists.
    listed = ("evaluations_apitoken", "evaluations_alertrule", "evaluations_alertchannel")
    read = " ".join(q["sql"] for q in queries.captured_queries)
    assert [table for table in listed if f'FROM "{table}"' in read] == []
    page = client.get(reverse("project_digest_preview", args=[mine.slug])).content.decode()
    assert "# Keystone weekly digest: Mine" in page and 'id="api-tokens"' in page
    assert client_as("editor").get(
        reverse("project_digest_preview", args=[mine.slug])
    ).status_code in (403, 404)


def test_the_report_filters_by_run_label(two_projects: Any, client_as: Any, regressed: Any) -> None:
    regressed.labels = {"model": "gpt-4o"}
    regressed.save()
    client = client_as("viewer")
    labelled = client.get(report_url(two_projects.mine, label="model=gpt-4o")).content.decode()
    assert "CONTAINS_FAILED" in labelled
    other = client.get(report_url(two_projects.mine, label="model=claude")).content.decode()
    assert "Nothing regressed in runs labelled model=claude." in other
    refused = client.get(report_url(two_projects.mine, label="gpt-4o"))
    assert refused.status_code == 400 and "write key=value" in refused.content.decode()


def test_improvements_are_listed_below_the_regressions(
    two_projects: Any, client_as: Any, regressed: Any
) -> None:
    mine = two_projects.mine
    other = spec_in(mine, "triage-agent")
    failed = finished_run(other, finished=timezone.now() - timedelta(days=5), groups=FAILING)
    baseline_of(other, failed, FAILING)
    recovered = finished_run(other, finished=timezone.now(), groups=PASSING)
    client = client_as("viewer")
    page = client.get(report_url(mine)).content.decode()
    assert page.index("CONTAINS_FAILED") < page.index('id="improvements"')
    assert f"#{recovered.pk}</a>" in page[page.index('id="improvements"') :]
    data = json.loads(client.get(report_url(mine, format="json")).content)
    assert [r["run_id"] for r in data["improvements"]] == [recovered.pk]
    rows = list(
        csv.DictReader(io.StringIO(client.get(report_url(mine, format="csv")).content.decode()))
    )
    assert [(r["change"], r["spec"]) for r in rows] == [
        ("regressed", "refund-agent"),
        ("improved", "triage-agent"),
    ]
    markdown = client.get(report_url(mine, format="md")).content.decode()
    assert f"Improved (1): triage-agent no-chaos / prompt 0 ([#{recovered.pk}]" in markdown


def _summary(passed: bool) -> dict[str, Any]:
    """A run summary's group and matrix cell for `no-chaos / prompt 0` and `says_refund`."""
    group = {
        "key": "no-chaos / prompt 0",
        "scenario": "no-chaos",
        "prompt_index": 0,
        "passed": passed,
        "pass_rate": 1.0 if passed else 0.0,
        "status": "pass" if passed else "fail",
        "c": 2 if passed else 0,
        "n": 2,
        "failure_codes": [] if passed else ["CONTAINS_FAILED"],
    }
    cell = {
        "invariant_id": "says_refund",
        "scenario": "no-chaos",
        "passed": passed,
        "status": "pass" if passed else "fail",
        "results_passed": 2 if passed else 0,
        "results_total": 2,
        "failure_codes": [] if passed else ["CONTAINS_FAILED"],
    }
    return {"groups": [group], "matrix": [cell]}


def test_each_regression_says_since_which_run_with_per_invariant_rows_and_failing_executions(
    two_projects: Any, client_as: Any
) -> None:
    from evaluations.models import CheckResult, Execution

    mine, client = two_projects.mine, client_as("viewer")
    spec = spec_in(mine)
    now = timezone.now()
    runs = []
    # The baseline, one more passing run, then two failing ones: it fails since the third.
    for days, passed in ((10, True), (6, True), (4, False), (1, False)):
        run = finished_run(spec, finished=now - timedelta(days=days), branch="main")
        run.summary = _summary(passed)
        run.failing_keys = summary_failing_keys(run.summary)
        run.verdicts = compared_verdicts(run.summary)
        run.save(update_fields=["summary", "failing_keys", "verdicts"])
        runs.append(run)
    baseline_of(spec, runs[0], _summary(True)["groups"])
    baseline = spec.baselines.get()
    baseline.data = _summary(True)
    baseline.verdicts = compared_verdicts(baseline.data)
    baseline.save(update_fields=["data", "verdicts"])
    latest = runs[-1]
    failing = []
    for replica in range(2):
        execution = Execution.objects.create(
            run=latest, project=mine, key=f"e{replica}", scenario="no-chaos", prompt_index=0,
            replica=replica, passed=False,
        )  # fmt: skip
        CheckResult.objects.create(
            execution=execution, run=latest, invariant_id="says_refund", check_type="contains",
            score=0.0, passed=False,
        )  # fmt: skip
        failing.append(execution)

    data = json.loads(client.get(report_url(mine, format="json")).content)
    rows = {row["group"]: row for row in data["regressions"]}
    assert set(rows) == {"no-chaos / prompt 0", "says_refund @ no-chaos"}
    cell = rows["says_refund @ no-chaos"]
    assert cell["invariant"] == "says_refund"
    assert (cell["baseline_counts"], cell["current_counts"]) == ("2/2", "0/2")
    for row in rows.values():
        assert row["run_id"] == latest.pk
        assert row["since_run_id"] == runs[2].pk  # the first run of the failing streak
        assert row["failing_urls"] == [f"/p/{mine.slug}/executions/{e.pk}/" for e in failing]
    page = client.get(report_url(mine)).content.decode()
    assert f'href="/p/{mine.slug}/runs/{runs[2].pk}/">#{runs[2].pk}</a>' in page
    assert page.count('class="failing-execution"') == 4
    markdown = client.get(report_url(mine, format="md")).content.decode()
    assert f"[#{runs[2].pk}](/p/{mine.slug}/runs/{runs[2].pk}/)" in markdown
    assert f"[failing 1](/p/{mine.slug}/executions/{failing[0].pk}/)" in markdown
