"""Alert rules and channels (writes), evaluating the rules when a run finalises, and
delivering each firing.

A firing is one (rule, run, channel) row, unique in the database, created before anything
is sent; delivery claims it with a conditional UPDATE (pending -> sending), so two workers,
or a run finalised twice, never send it twice. Connection errors and 5xx answers are
retried with a doubling backoff; after the last try the firing stays `failed`, with its
error, until someone sends it again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import smtplib
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from checks.spec.semantics import too_long
from evaluations import queue
from evaluations.models import (
    ALERT_NAME_MAX,
    ALERT_TARGET_MAX,
    AlertChannel,
    AlertEvaluation,
    AlertFiring,
    AlertRule,
    AlertWindow,
    ChannelKind,
    FiringStatus,
    Project,
    Run,
    RunStatus,
    run_large_fields,
)
from evaluations.selectors.alerts import (
    AlertConditionError,
    parse_condition,
    rule_applies,
    rule_value,
)
from evaluations.services.unique import Taken

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Keystone-Signature"
_EMAIL = re.compile(r"^[^@\s,]+@[^@\s,]+\.[^@\s,]+$")

if TYPE_CHECKING:
    from cryptography.fernet import Fernet


class AlertError(ValueError):
    """A rule or channel that cannot be saved; the message says which field and why."""


# --- Rules and channels -------------------------------------------------------------------


def _secret_box() -> Fernet:
    # Imported here, not by every run that evaluates alert rules (~30 ms): only a channel
    # with a secret needs it.
    from cryptography.fernet import Fernet

    # The key is derived from SECRET_KEY: rotating SECRET_KEY means re-entering webhook secrets.
    digest = hashlib.sha256(b"keystone-alert-channel:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def channel_secret(channel: AlertChannel) -> str:
    if not channel.secret_encrypted:
        return ""
    from cryptography.fernet import InvalidToken

    try:
        return _secret_box().decrypt(channel.secret_encrypted.encode()).decode()
    except InvalidToken:
        raise AlertError(
            f"channel {channel.name!r}: its secret cannot be read (SECRET_KEY changed?); "
            "enter the secret again"
        ) from None


def _check_length(field: str, value: str, limit: int) -> None:
    """A name or target longer than its column: PostgreSQL refused the whole row with a
    500 that named no field; this names it."""
    problem = too_long(value, limit)
    if problem:
        raise AlertError(f"{field}: {problem}")


def _check_target(kind: str, target: str) -> str:
    target = target.strip()
    if kind in (ChannelKind.WEBHOOK, ChannelKind.SLACK):
        if not re.match(r"^https?://[^\s/]+", target):
            raise AlertError(f"target {target!r}: a {kind} channel needs an http(s):// URL")
        _check_length("target", target, ALERT_TARGET_MAX)
        return target
    addresses = [a.strip() for a in target.split(",") if a.strip()]
    bad = [a for a in addresses if not _EMAIL.match(a)]
    if not addresses or bad:
        raise AlertError(f"target {target!r}: not an email address: {', '.join(bad) or '(none)'}")
    # The stored list (", " between addresses) is what must fit.
    _check_length("target", ", ".join(addresses), ALERT_TARGET_MAX)
    return ", ".join(addresses)


def alert_channel_create(
    *,
    project: Project,
    name: str,
    kind: str,
    target: str,
    secret: str = "",
    digest: bool = True,
) -> AlertChannel:
    name = name.strip()
    if not name:
        raise AlertError("name: a channel needs a name")
    _check_length("name", name, ALERT_NAME_MAX)
    if kind not in ChannelKind.values:
        raise AlertError(f"kind {kind!r}: use one of {', '.join(ChannelKind.values)}")
    taken = Taken(
        lambda: AlertChannel.objects.filter(project=project, name=name).first(),
        lambda _: AlertError(f"name: a channel named {name!r} already exists in this project"),
    )
    taken.check()
    if kind == ChannelKind.WEBHOOK and not secret:
        raise AlertError("secret: a webhook channel needs a secret to sign its requests")
    target = _check_target(kind, target)
    encrypted = _secret_box().encrypt(secret.encode()).decode() if secret else ""
    with taken.inserting():
        return AlertChannel.objects.create(
            project=project,
            name=name,
            kind=kind,
            target=target,
            secret_encrypted=encrypted,
            digest=digest,
        )


def alert_channel_delete(*, project: Project, channel_id: int) -> None:
    AlertChannel.objects.filter(project=project, pk=channel_id).delete()


def alert_rule_create(
    *,
    project: Project,
    name: str,
    condition: str,
    window: str = AlertWindow.LAST_RUN,
    specs: Sequence[str] = (),
    branches: Sequence[str] = (),
    channel_ids: Sequence[int] = (),
) -> AlertRule:
    name = name.strip()
    if not name:
        raise AlertError("name: a rule needs a name")
    _check_length("name", name, ALERT_NAME_MAX)
    try:
        parsed = parse_condition(condition)
    except AlertConditionError as exc:
        raise AlertError(f"condition: {exc}") from None
    if window not in AlertWindow.values:
        raise AlertError(f"window {window!r}: use one of {', '.join(AlertWindow.values)}")
    taken = Taken(
        lambda: AlertRule.objects.filter(project=project, name=name).first(),
        lambda _: AlertError(f"name: a rule named {name!r} already exists in this project"),
    )
    taken.check()
    channels = list(AlertChannel.objects.filter(project=project, pk__in=channel_ids))
    missing = set(channel_ids) - {c.pk for c in channels}
    if missing:
        raise AlertError(f"channels: no channel {sorted(missing)} in this project")
    unknown = sorted(set(specs) - set(project.specs.values_list("slug", flat=True)))
    if unknown:
        raise AlertError(f"specs: no spec {', '.join(unknown)} in this project")
    with taken.inserting():
        rule = AlertRule.objects.create(
            project=project,
            name=name,
            condition=str(parsed),
            window=window,
            specs=sorted({s.strip() for s in specs if s.strip()}),
            branches=sorted({b.strip() for b in branches if b.strip()}),
        )
        rule.channels.set(channels)
    return rule


def alert_rule_delete(*, project: Project, rule_id: int) -> None:
    AlertRule.objects.filter(project=project, pk=rule_id).delete()


# --- Evaluation --------------------------------------------------------------------------


def alerts_evaluate(*, run_id: int) -> list[int]:
    """Create the firings of every enabled rule of the run's project that holds as of this
    run (idempotent: the unique constraint keeps the first), and return the ids of this
    run's firings still waiting to be sent."""
    # A rule reads the run's stored figures, never its summary, verdicts or keys.
    run = Run.objects.select_related("spec", "project").defer(*run_large_fields()).get(pk=run_id)
    if run.status != RunStatus.COMPLETED or run.finished is None:
        return []
    for rule in AlertRule.objects.filter(project=run.project, enabled=True).prefetch_related(
        "channels"
    ):
        if not rule_applies(rule, run):
            continue
        condition = parse_condition(rule.condition)
        value = rule_value(rule, condition, run)
        if not condition.holds(value):
            continue
        message = _firing_message(rule, condition, value, run)
        AlertFiring.objects.bulk_create(
            [
                AlertFiring(
                    project=run.project,
                    rule=rule,
                    run=run,
                    channel=channel,
                    value=value,
                    message=message,
                    idempotency_key=_idempotency_key(rule.pk, run.pk, channel.pk),
                )
                for channel in rule.channels.all()
            ],
            ignore_conflicts=True,
        )
    AlertEvaluation.objects.get_or_create(run=run)
    return list(
        AlertFiring.objects.filter(run=run, status=FiringStatus.PENDING).values_list(
            "id", flat=True
        )
    )


def _idempotency_key(rule_id: int, run_id: int, channel_id: int) -> str:
    return hashlib.sha256(f"keystone:{rule_id}:{run_id}:{channel_id}".encode()).hexdigest()


def _firing_message(rule: AlertRule, condition: Any, value: float | None, run: Run) -> str:
    where = f"{run.spec.slug}" + (f" on {run.branch}" if run.branch else "")
    if condition.is_event:
        return f"{rule.name}: {value:g} regressed group(s) in {where} ({rule.get_window_display()})"
    return (
        f"{rule.name}: {condition.metric} = {value:.4g} over {rule.get_window_display().lower()}"
        f" ({condition}) in {where}, run #{run.pk}"
    )


# --- Delivery ----------------------------------------------------------------------------


class TransientDeliveryError(Exception):
    """Worth trying again: the receiver could not be reached or answered 5xx."""


class PermanentDeliveryError(Exception):
    """Trying again will not help (a 4xx answer, a refused address)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One thing to tell one channel, in each channel's shape: `payload` is the webhook's
    JSON body (with its idempotency key), `slack` a Block Kit message, `subject` and
    `text` an email."""

    channel: AlertChannel
    payload: dict[str, Any]
    slack: dict[str, Any]
    subject: str
    text: str
    # (file name, content, MIME type), for email only.
    attachments: tuple[tuple[str, bytes, str], ...] = ()


def _firing_message_for(firing: AlertFiring) -> Message:
    run, rule = firing.run, firing.rule
    run_url = settings.KEYSTONE_BASE_URL + reverse("run_detail", args=[run.project.slug, run.pk])
    payload = {
        "kind": "alert",
        "idempotency_key": firing.idempotency_key,
        "project": run.project.slug,
        "rule": {
            "id": rule.pk,
            "name": rule.name,
            "condition": rule.condition,
            "window": rule.window,
        },
        "run": {"id": run.pk, "spec": run.spec.slug, "branch": run.branch, "url": run_url},
        "value": firing.value,
        "message": firing.message,
        "fired_at": firing.created.isoformat(timespec="seconds"),
    }
    return Message(
        channel=firing.channel,
        payload=payload,
        slack=slack_message(payload),
        subject=f"[Keystone] {rule.name} ({run.project.slug})",
        text=f"{firing.message}\n\nRun: {run_url}\nIdempotency key: {firing.idempotency_key}\n",
    )


def _post_json(url: str, body: bytes, headers: dict[str, str]) -> None:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.KEYSTONE_ALERT_TIMEOUT) as reply:
            reply.read()
    except urllib.error.HTTPError as exc:
        text = f"{url} answered HTTP {exc.code}"
        if exc.code >= 500 or exc.code == 429:
            raise TransientDeliveryError(text) from None
        raise PermanentDeliveryError(text) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TransientDeliveryError(f"{url} unreachable: {reason}") from None


def sign(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _send_webhook(message: Message) -> None:
    body = json.dumps(message.payload, sort_keys=True).encode()
    secret = channel_secret(message.channel)
    _post_json(message.channel.target, body, {SIGNATURE_HEADER: sign(body, secret)})


def slack_message(payload: dict[str, Any]) -> dict[str, Any]:
    run = payload["run"]
    return {
        "text": payload["message"],
        "blocks": [
            {
                "type": "header",
                "text": {
                    "type": "plain_text",
                    "text": f"Keystone alert: {payload['rule']['name']}",
                },
            },
            {"type": "section", "text": {"type": "mrkdwn", "text": payload["message"]}},
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": f"<{run['url']}|run #{run['id']}> · {payload['project']} · "
                        f"`{payload['rule']['condition']}` · key {payload['idempotency_key'][:12]}",
                    }
                ],
            },
        ],
    }


def _send_slack(message: Message) -> None:
    _post_json(message.channel.target, json.dumps(message.slack).encode(), {})


def _send_email(message: Message) -> None:
    email = EmailMessage(
        subject=message.subject,
        body=message.text,
        to=[a.strip() for a in message.channel.target.split(",")],
        headers={"X-Keystone-Idempotency-Key": message.payload["idempotency_key"]},
    )
    for name, content, mimetype in message.attachments:
        email.attach(name, content, mimetype)
    try:
        email.send()
    except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused) as exc:
        raise PermanentDeliveryError(f"mail refused: {exc}") from None
    except (smtplib.SMTPException, OSError) as exc:
        raise TransientDeliveryError(f"mail server: {exc}") from None


SENDERS: dict[str, Callable[[Message], None]] = {
    ChannelKind.WEBHOOK: _send_webhook,
    ChannelKind.SLACK: _send_slack,
    ChannelKind.EMAIL: _send_email,
}


def message_send(message: Message, on_attempt: Callable[[int], object] | None = None) -> str:
    """Send with retries: connection errors and 5xx wait KEYSTONE_ALERT_BACKOFF seconds,
    doubling, up to KEYSTONE_ALERT_MAX_ATTEMPTS tries. Returns "" or the last error."""
    delay = settings.KEYSTONE_ALERT_BACKOFF
    error = ""
    for attempt in range(1, settings.KEYSTONE_ALERT_MAX_ATTEMPTS + 1):
        if on_attempt is not None:
            on_attempt(attempt)
        try:
            SENDERS[message.channel.kind](message)
        except TransientDeliveryError as exc:
            error = str(exc)
            if attempt < settings.KEYSTONE_ALERT_MAX_ATTEMPTS:
                time.sleep(delay)
                delay *= 2
            continue
        except (PermanentDeliveryError, AlertError) as exc:
            return str(exc)
        return ""
    return error


def firing_deliver(*, firing_id: int) -> str:
    """Send one pending firing, retrying transient failures; returns its final status."""
    claimed = AlertFiring.objects.filter(pk=firing_id, status=FiringStatus.PENDING).update(
        status=FiringStatus.SENDING, sending_since=timezone.now()
    )
    firing = (
        AlertFiring.objects.select_related("rule", "channel", "run__spec", "run__project")
        .defer(*run_large_fields("run__"))
        .get(pk=firing_id)
    )
    if not claimed:
        return firing.status  # delivered, failed, or another worker is sending it
    error = message_send(
        _firing_message_for(firing),
        on_attempt=lambda n: AlertFiring.objects.filter(pk=firing_id).update(attempts=n),
    )
    if not error:
        AlertFiring.objects.filter(pk=firing_id).update(
            status=FiringStatus.DELIVERED, delivered=timezone.now(), last_error=""
        )
        return FiringStatus.DELIVERED
    logger.warning("alert firing %s failed: %s", firing_id, error)
    AlertFiring.objects.filter(pk=firing_id).update(status=FiringStatus.FAILED, last_error=error)
    return FiringStatus.FAILED


def _longest_delivery() -> timedelta:
    tries = settings.KEYSTONE_ALERT_MAX_ATTEMPTS
    waits = settings.KEYSTONE_ALERT_BACKOFF * (2 ** max(tries - 1, 0) - 1)
    return timedelta(seconds=tries * settings.KEYSTONE_ALERT_TIMEOUT + waits + 60)


def firings_send_stale() -> list[int]:
    """Runs whose alert evaluation, and pending firings whose delivery, was lost (the broker
    was away) are sent again by the periodic sweep; the claim in firing_deliver keeps a merely slow message harmless. A
    firing still `sending` long after every try would have ended lost its worker: it is
    marked failed, to be sent again by a person (it may have reached the receiver, whose
    idempotency key tells), rather than silently sent twice or never."""
    interrupted = AlertFiring.objects.filter(
        status=FiringStatus.SENDING, sending_since__lt=timezone.now() - _longest_delivery()
    ).update(
        status=FiringStatus.FAILED,
        last_error="delivery interrupted: the worker stopped while sending; send again",
    )
    if interrupted:
        logger.warning("%s alert firing(s) interrupted while sending", interrupted)
    stale = timezone.now() - timedelta(seconds=settings.KEYSTONE_EXECUTION_LEASE_SECONDS)
    # Runs finalised in the last day whose evaluation never happened, in projects with rules.
    for run_id in (
        Run.objects.filter(
            status=RunStatus.COMPLETED,
            finished__lt=stale,
            finished__gt=timezone.now() - timedelta(days=1),
            alert_evaluation__isnull=True,
            project__alert_rules__enabled=True,
        )
        .distinct()
        .values_list("id", flat=True)[:100]
    ):
        queue.alerts_evaluate_later(run_id)
    firing_ids = list(
        AlertFiring.objects.filter(status=FiringStatus.PENDING, created__lt=stale)
        .order_by("id")
        .values_list("id", flat=True)[:100]
    )
    for firing_id in firing_ids:
        queue.firing_deliver_later(firing_id)
    return firing_ids


def firing_resend(*, project: Project, firing_id: int) -> int:
    """Put a failed firing back in the queue ("send again"); a delivered one never is."""
    return AlertFiring.objects.filter(
        Q(status=FiringStatus.FAILED), project=project, pk=firing_id
    ).update(status=FiringStatus.PENDING, attempts=0)
