"""The weekly digest: its Markdown for a seeded project (compared with a stored file), when
it is due, and that it is sent once per week to the channels that take it, by Celery beat's
task or by the embedded worker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core import mail

from evaluations import services
from evaluations.models import (
    AlertFiring,
    Digest,
    FiringStatus,
    Project,
    ReviewAgreementDay,
    ReviewItem,
    ReviewStatus,
)
from evaluations.selectors.digest import digest_markdown, sparkline
from tests.evaluations.alert_history import (
    FAILING,
    PASSING,
    baseline_of,
    finished_run,
    open_review_item,
    spec_in,
)

EXPECTED = Path(__file__).parent / "data" / "digest_expected.md"
# Monday 23 November 2026, 08:00 UTC: the default digest moment.
WEEK_END = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def seed(project: Project) -> None:
    """Three specs over the week: refund-agent falls from 100% to 0% (a regression against
    its baseline) on main; search-agent improves; triage-agent recovers against its baseline.
    Review items, kappa, firings, costs."""
    refund, search = spec_in(project), spec_in(project, "search-agent")
    reference = finished_run(
        refund, finished=WEEK_END - timedelta(days=9), groups=PASSING, pass_rate=1.0
    )
    baseline_of(refund, reference, PASSING)
    days = [6, 4, 2, 1]
    refund_runs = []
    for index, (rate, resilience) in enumerate(
        [(1.0, 90.0), (0.75, 80.0), (0.5, 50.0), (0.0, 20.0)]
    ):
        last = index == len(days) - 1
        run = finished_run(
            refund,
            finished=WEEK_END - timedelta(days=days[index]),
            groups=FAILING if last else PASSING,
            branch="main",
            pass_rate=rate,
            resilience=resilience,
            cost_usd=0.5,
        )
        refund_runs.append(run)
    for day, rate in [(5, 0.25), (3, 0.5), (1, 0.875)]:
        finished_run(
            search,
            finished=WEEK_END - timedelta(days=day, hours=2),
            pass_rate=rate,
            resilience=None,
            cost_usd=1.25,
        )
    # triage-agent failed in its baseline and passes now: a recovery.
    triage = spec_in(project, "triage-agent")
    failed = finished_run(triage, finished=WEEK_END - timedelta(days=8), groups=FAILING)
    baseline_of(triage, failed, FAILING)
    finished_run(
        triage, finished=WEEK_END - timedelta(days=2), groups=PASSING, pass_rate=1.0, cost_usd=0.25
    )
    # Outside the week: not counted.
    finished_run(search, finished=WEEK_END + timedelta(hours=1), pass_rate=0.0, cost_usd=99.0)
    # Review: two open items, one in adjudication, and four graded items of one judge.
    open_review_item(run)
    waiting = open_review_item(run)
    ReviewItem.objects.filter(pk=waiting.pk).update(status=ReviewStatus.ADJUDICATION)
    for judge_passed, final_passed in [(True, True), (False, False), (True, False), (True, True)]:
        item = open_review_item(run)
        ReviewItem.objects.filter(pk=item.pk).update(
            status=ReviewStatus.COMPLETE,
            judge_model="gpt-4o-mini",
            prompt_version="v2",
            judge_passed=judge_passed,
            final_passed=final_passed,
            completed=WEEK_END - timedelta(days=1),
        )
    # Graded here by updating the items, not through the review services that keep
    # agreement's daily tallies: count them from the items.
    ReviewAgreementDay.recount(project)
    channel = services.alert_channel_create(
        project=project, name="ops", kind="email", target="ops@example.com"
    )
    rule = services.alert_rule_create(
        project=project, name="low", condition="pass_rate < 0.6", channel_ids=[channel.pk]
    )
    for firing_run, status in zip(
        refund_runs[2:], (FiringStatus.DELIVERED, FiringStatus.FAILED), strict=True
    ):
        AlertFiring.objects.create(
            project=project,
            rule=rule,
            run=firing_run,
            channel=channel,
            idempotency_key=f"seed-{status}",
            status=status,
            created=WEEK_END - timedelta(days=3),
        )


def test_the_digest_of_a_seeded_project_matches_the_stored_markdown(project: Project) -> None:
    seed(project)
    text = digest_markdown(project, end=WEEK_END, base_url="https://keystone.example.com")
    # The run ids differ between databases and runs: the stored file names the runs.
    for name, slug in (("REGRESSED", "refund-agent"), ("RECOVERED", "triage-agent")):
        latest = project.runs.filter(spec__slug=slug).order_by("-finished").first()
        assert latest is not None
        text = text.replace(f"/runs/{latest.pk}/", f"/runs/{name}/").replace(
            f"run #{latest.pk}", f"run #{name}"
        )
    assert text == EXPECTED.read_text(encoding="utf-8")


def test_sparkline_uses_a_fixed_scale_and_shows_gaps() -> None:
    assert sparkline([0.0, 0.5, 1.0, None, 1.5]) == "▁▅█ █"


@pytest.mark.parametrize(
    ("now", "due"),
    [
        (datetime(2026, 11, 23, 8, 0, tzinfo=UTC), datetime(2026, 11, 23, 8, 0, tzinfo=UTC)),
        (datetime(2026, 11, 23, 7, 59, tzinfo=UTC), datetime(2026, 11, 16, 8, 0, tzinfo=UTC)),
        (datetime(2026, 11, 26, 15, 0, tzinfo=UTC), datetime(2026, 11, 23, 8, 0, tzinfo=UTC)),
    ],
)
def test_the_digest_is_due_after_the_configured_day_and_hour(now: datetime, due: datetime) -> None:
    assert services.digest_due_end(now) == due


def test_another_configured_day(settings: Any) -> None:
    settings.KEYSTONE_DIGEST_DAY, settings.KEYSTONE_DIGEST_HOUR = "friday", 17
    friday = datetime(2026, 11, 20, 17, 0, tzinfo=UTC)
    assert services.digest_due_end(friday + timedelta(days=2)) == friday


def test_the_digest_is_sent_once_to_the_channels_that_take_it(
    project: Project, settings: Any
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    seed(project)
    services.alert_channel_create(
        project=project, name="quiet", kind="email", target="quiet@example.com", digest=False
    )
    now = WEEK_END + timedelta(minutes=10)
    (digest_id,) = services.digests_send_due(now=now)
    assert services.digests_send_due(now=now + timedelta(hours=1)) == []
    (sent,) = mail.outbox
    assert sent.to == ["ops@example.com"] and "weekly digest" in sent.subject
    digest = Digest.objects.get(pk=digest_id)
    assert sent.body == digest.markdown
    # The week's trend as a PNG made by Plotly's static export (Kaleido + Chromium, offline).
    ((name, content, mimetype),) = sent.attachments
    assert (name, mimetype) == ("trend.png", "image/png")
    assert content.startswith(b"\x89PNG\r\n\x1a\n") and len(content) > 5000
    assert digest.deliveries == {"ops": {"status": "delivered", "attempts": 1, "error": ""}}
    # Two days late (the server was down): not sent stale.
    Digest.objects.all().delete()
    assert services.digests_send_due(now=WEEK_END + timedelta(days=2)) == []


def test_the_embedded_worker_runs_the_digest_job(project: Project, settings: Any) -> None:
    from evaluations import embedded_worker

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.KEYSTONE_DIGEST_DAY = datetime.now(UTC).strftime("%A").lower()
    settings.KEYSTONE_DIGEST_HOUR = 0
    services.alert_channel_create(project=project, name="ops", kind="email", target="o@x.io")
    embedded_worker.periodic_once()
    embedded_worker.periodic_once()
    assert Digest.objects.filter(project=project).count() == 1 and len(mail.outbox) == 1


def test_the_beat_schedule_asks_for_digests(settings: Any) -> None:
    from keystone_web.celery import app

    # What a worker does at start-up: import the apps' task modules (autodiscovery). Nothing
    # else registers them: a process imports them only when it first hands work on.
    app.loader.import_default_modules()
    entry = settings.CELERY_BEAT_SCHEDULE["weekly-digest"]
    assert entry["task"] in app.tasks
