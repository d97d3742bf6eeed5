"""Sending each project's weekly digest to its channels, once per week.

Celery beat (and, with no broker, the embedded worker) asks every few minutes; the digest
is due once the configured day and hour (KEYSTONE_DIGEST_DAY, KEYSTONE_DIGEST_HOUR, UTC)
has passed, and a Digest row, unique per (project, week end), is written before anything
is sent, so it goes out once however many workers ask.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from evaluations.models import AlertChannel, ChannelKind, Digest, Project
from evaluations.selectors.digest import DIGEST_PERIOD, digest_chart_png, digest_markdown
from evaluations.services.alerts import Message, message_send

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
# A digest found due more than this late (the server was down) is skipped, not sent stale.
DIGEST_GRACE = timedelta(days=1)


def digest_due_end(now: datetime) -> datetime:
    """The latest scheduled digest moment at or before `now`."""
    now = now.astimezone(UTC)
    weekday = WEEKDAYS.index(settings.KEYSTONE_DIGEST_DAY)
    moment = now.replace(hour=settings.KEYSTONE_DIGEST_HOUR, minute=0, second=0, microsecond=0)
    moment -= timedelta(days=(moment.weekday() - weekday) % 7)
    return moment if moment <= now else moment - timedelta(days=7)


def digests_send_due(*, now: datetime | None = None) -> list[int]:
    """Write and send the digest of every project with a digest channel, if due and not yet
    sent; returns the ids of the digests sent now."""
    now = now or timezone.now()
    end = digest_due_end(now)
    if now - end > DIGEST_GRACE:
        return []
    project_ids = (
        AlertChannel.objects.filter(digest=True).values_list("project_id", flat=True).distinct()
    )
    sent = []
    for project in Project.objects.filter(pk__in=project_ids).exclude(digests__period_end=end):
        try:
            with transaction.atomic():
                digest = Digest.objects.create(
                    project=project,
                    period_start=end - DIGEST_PERIOD,
                    period_end=end,
                    markdown=digest_markdown(project, end=end, base_url=settings.KEYSTONE_BASE_URL),
                )
        except IntegrityError:
            continue  # another worker wrote it first and sends it
        digest_deliver(digest)
        sent.append(digest.pk)
    return sent


def digest_deliver(digest: Digest) -> None:
    project = digest.project
    deliveries = {}
    chart: bytes | None = None
    if project.alert_channels.filter(digest=True, kind=ChannelKind.EMAIL).exists():
        chart = digest_chart_png(project, end=digest.period_end)
    for channel in project.alert_channels.filter(digest=True).order_by("name"):
        key = hashlib.sha256(f"keystone-digest:{digest.pk}:{channel.pk}".encode()).hexdigest()
        title = f"Keystone weekly digest: {project.name} (to {digest.period_end:%Y-%m-%d})"
        message = Message(
            channel=channel,
            payload={
                "kind": "digest",
                "idempotency_key": key,
                "project": project.slug,
                "period_start": digest.period_start.isoformat(timespec="seconds"),
                "period_end": digest.period_end.isoformat(timespec="seconds"),
                "markdown": digest.markdown,
            },
            slack={
                "text": title,
                "blocks": [
                    {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
                    {"type": "section", "text": {"type": "mrkdwn", "text": digest.markdown[:2900]}},
                ],
            },
            subject=f"[Keystone] {title}",
            text=digest.markdown,
            attachments=(("trend.png", chart, "image/png"),) if chart else (),
        )
        attempts = 0

        def count(n: int) -> None:
            nonlocal attempts
            attempts = n

        error = message_send(message, on_attempt=count)
        deliveries[channel.name] = {
            "status": "failed" if error else "delivered",
            "attempts": attempts,
            "error": error,
        }
    Digest.objects.filter(pk=digest.pk).update(deliveries=deliveries)
