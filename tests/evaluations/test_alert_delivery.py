"""Delivering alert firings to real receivers: a local HTTP server (webhook and Slack), Django's
locmem mail backend and a real SMTP server on loopback (aiosmtpd). Retries on 5xx and
connection errors, a receiver down for every try ending as a visible failed firing, "send
again", and no second delivery for the same run."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from collections.abc import Iterator
from datetime import timedelta
from email import message_from_bytes, policy
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from evaluations import services
from evaluations.models import (
    AlertEvaluation,
    AlertFiring,
    AlertRule,
    ChannelKind,
    FiringStatus,
    Project,
    Run,
)
from tests.evaluations.alert_history import NOW, finished_run, spec_in
from tests.evaluations.execution_helpers import run_spec
from tests.http_peer import HttpPeer, PeerHandler

SECRET = "s3cret-for-signing"


class Receiver(HttpPeer):
    """An HTTP server in a thread that answers POSTs with the scripted statuses in turn
    (then 200) and keeps what it received."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(PeerHandler):
            def do_POST(self) -> None:  # noqa: N802
                receiver.requests.append((dict(self.headers), self.read_body()))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok")

        super().__init__(Handler)
        self.url = f"{self.url}/hook"

    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver([]) as server:
        yield server


@pytest.fixture(autouse=True)
def _quick_backoff(settings: Any) -> None:
    settings.KEYSTONE_ALERT_BACKOFF = 0.01
    settings.KEYSTONE_ALERT_MAX_ATTEMPTS = 3
    settings.KEYSTONE_BASE_URL = "https://keystone.example.com"


def _firing(project: Project, kind: str, target: str, secret: str = "") -> AlertFiring:
    channel = services.alert_channel_create(
        project=project, name=kind, kind=kind, target=target, secret=secret
    )
    services.alert_rule_create(
        project=project,
        name="pass rate low",
        condition="pass_rate < 0.9",
        channel_ids=[channel.pk],
    )
    run = finished_run(spec_in(project), finished=NOW, pass_rate=0.5, branch="main")
    (firing_id,) = services.alerts_evaluate(run_id=run.pk)
    return AlertFiring.objects.get(pk=firing_id)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.django_db
def test_a_webhook_gets_a_signed_json_body(project: Project, receiver: Receiver) -> None:
    firing = _firing(project, ChannelKind.WEBHOOK, receiver.url, SECRET)
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.DELIVERED
    ((headers, body),) = receiver.requests
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Keystone-Signature"], expected)
    payload = json.loads(body)
    assert payload["idempotency_key"] == firing.idempotency_key
    assert payload["rule"]["condition"] == "pass_rate < 0.9"
    assert payload["value"] == 0.5
    assert payload["run"]["url"] == (
        f"https://keystone.example.com/p/{project.slug}/runs/{firing.run_id}/"
    )
    firing.refresh_from_db()
    assert (firing.status, firing.attempts, firing.last_error) == ("delivered", 1, "")
    assert firing.delivered is not None
    # The secret is not stored in clear.
    assert SECRET not in firing.channel.secret_encrypted


@pytest.mark.django_db
def test_a_500_is_retried_and_the_retry_succeeds(project: Project, receiver: Receiver) -> None:
    receiver.statuses = [500]
    firing = _firing(project, ChannelKind.WEBHOOK, receiver.url, SECRET)
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.DELIVERED
    first, second = receiver.payloads()
    assert first == second  # the same body, so the receiver can drop a duplicate by its key
    firing.refresh_from_db()
    assert (firing.status, firing.attempts) == ("delivered", 2)


@pytest.mark.django_db
def test_a_receiver_down_for_every_try_leaves_a_failed_firing_to_send_again(
    project: Project, receiver: Receiver
) -> None:
    down = f"http://127.0.0.1:{_free_port()}/hook"
    firing = _firing(project, ChannelKind.WEBHOOK, down, SECRET)
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.FAILED
    firing.refresh_from_db()
    assert (firing.status, firing.attempts) == ("failed", 3)
    assert "unreachable" in firing.last_error and down in firing.last_error
    # Sending it again after the receiver is back (here: pointing the channel at it).
    firing.channel.target = receiver.url
    firing.channel.save()
    assert services.firing_resend(project=project, firing_id=firing.pk) == 1
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.DELIVERED
    assert len(receiver.requests) == 1


@pytest.mark.django_db
def test_a_4xx_is_not_retried(project: Project, receiver: Receiver) -> None:
    receiver.statuses = [404]
    firing = _firing(project, ChannelKind.WEBHOOK, receiver.url, SECRET)
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.FAILED
    firing.refresh_from_db()
    assert firing.attempts == 1 and "HTTP 404" in firing.last_error


@pytest.mark.django_db
def test_a_delivered_firing_is_never_sent_again(project: Project, receiver: Receiver) -> None:
    firing = _firing(project, ChannelKind.WEBHOOK, receiver.url, SECRET)
    services.firing_deliver(firing_id=firing.pk)
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.DELIVERED
    assert services.firing_resend(project=project, firing_id=firing.pk) == 0
    assert services.alerts_evaluate(run_id=firing.run_id) == []
    assert len(receiver.requests) == 1


@pytest.mark.django_db
def test_slack_gets_a_block_kit_message(project: Project, receiver: Receiver) -> None:
    firing = _firing(project, ChannelKind.SLACK, receiver.url)
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.DELIVERED
    (message,) = receiver.payloads()
    assert message["text"] == firing.message
    kinds = [block["type"] for block in message["blocks"]]
    assert kinds == ["header", "section", "context"]
    assert f"|run #{firing.run_id}>" in message["blocks"][2]["elements"][0]["text"]


@pytest.mark.django_db
def test_email_through_the_locmem_backend(project: Project, settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    firing = _firing(project, ChannelKind.EMAIL, "ops@example.com, lead@example.com")
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.DELIVERED
    (sent,) = mail.outbox
    assert sent.to == ["ops@example.com", "lead@example.com"]
    assert "pass rate low" in sent.subject and firing.message in sent.body
    assert sent.extra_headers["X-Keystone-Idempotency-Key"] == firing.idempotency_key


@pytest.mark.django_db
def test_email_through_a_real_smtp_server(project: Project, settings: Any) -> None:
    from aiosmtpd.controller import Controller

    received: list[Any] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
            received.append(envelope)
            return "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=_free_port())
    controller.start()
    try:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
        firing = _firing(project, ChannelKind.EMAIL, "ops@example.com")
        assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.DELIVERED
    finally:
        controller.stop()
    (envelope,) = received
    assert envelope.rcpt_tos == ["ops@example.com"]
    message = message_from_bytes(envelope.content, policy=policy.default)  # unfolds headers
    assert str(message["X-Keystone-Idempotency-Key"]).strip() == firing.idempotency_key
    assert firing.message in message.get_content()


@pytest.mark.django_db
def test_email_to_a_server_that_is_down_fails_visibly(project: Project, settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", _free_port()
    firing = _firing(project, ChannelKind.EMAIL, "ops@example.com")
    assert services.firing_deliver(firing_id=firing.pk) == FiringStatus.FAILED
    firing.refresh_from_db()
    assert firing.attempts == 3 and firing.last_error.startswith("mail server:")


def test_bad_channels_are_refused_naming_the_field(db: None, project: Project) -> None:
    cases = [
        (dict(kind="webhook", target="ftp://x", secret="s"), r"^target 'ftp://x'"),
        (dict(kind="webhook", target="http://x"), r"^secret: a webhook channel needs a secret"),
        (dict(kind="email", target="ops@, lead"), r"^target .*not an email address: ops@, lead"),
        (dict(kind="pager", target="x"), r"^kind 'pager'"),
    ]
    for arguments, message in cases:
        with pytest.raises(services.AlertError, match=message):
            services.alert_channel_create(project=project, name="c", **arguments)


FAILING_SPEC = """\
version: 1
id: refund-agent
task: {prompt: "Refund order 1042"}
agent: {type: command, command: "echo declined"}
invariants:
  says_refunded:
    description: mentions the refund
    check: {type: contains, value: refunded}
"""


@pytest.mark.django_db(transaction=True)
def test_a_finalised_run_that_breaks_a_rule_reaches_the_webhook(
    receiver: Receiver, tmp_path: Path
) -> None:
    project = Project.objects.create(name="Alerts", slug="alerts")
    spec_in(project)  # the rule may name the spec before its first upload
    channel = services.alert_channel_create(
        project=project, name="hook", kind="webhook", target=receiver.url, secret=SECRET
    )
    services.alert_rule_create(
        project=project,
        name="contract broken",
        condition="pass_rate < 1",
        specs=["refund-agent"],
        channel_ids=[channel.pk],
    )
    run = run_spec(project, FAILING_SPEC, spec_dir=tmp_path)
    assert run.status == "completed" and run.pass_rate == 0.0
    (payload,) = receiver.payloads()
    assert payload["run"]["id"] == run.pk and payload["value"] == 0.0
    assert AlertFiring.objects.get().status == FiringStatus.DELIVERED
    # Finalising again (a rescore after a review) sends nothing more.
    services.run_finalize(run_id=run.pk)
    assert len(receiver.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_under_serve_the_embedded_worker_sends_what_a_request_left_pending(
    receiver: Receiver, settings: Any
) -> None:
    from evaluations.embedded_worker import work_once
    from evaluations.tasks import alerts_evaluate

    settings.KEYSTONE_EMBEDDED_WORKER = True
    project = Project.objects.create(name="Served", slug="served")
    firing = _firing(project, ChannelKind.WEBHOOK, receiver.url, SECRET)
    AlertFiring.objects.all().delete()
    # The task a finalising run enqueues records the firing but sends nothing itself...
    assert alerts_evaluate(firing.run_id) == 1
    assert receiver.requests == []
    assert AlertFiring.objects.get().status == FiringStatus.PENDING
    # ...the worker loop does, once.
    assert work_once("tests:embedded") == firing.run_id
    assert AlertFiring.objects.get().status == FiringStatus.DELIVERED
    assert work_once("tests:embedded") is None
    assert len(receiver.requests) == 1


@pytest.mark.django_db
def test_the_periodic_sweep_sends_a_firing_whose_message_was_lost(
    project: Project, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from evaluations.tasks import requeue_expired_executions

    firing = _firing(project, ChannelKind.WEBHOOK, receiver.url, SECRET)
    with django_capture_on_commit_callbacks(execute=True):
        requeue_expired_executions()
    assert receiver.requests == []  # a fresh pending firing may still have its message coming
    AlertFiring.objects.filter(pk=firing.pk).update(created=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        requeue_expired_executions()
    assert len(receiver.requests) == 1
    assert AlertFiring.objects.get(pk=firing.pk).status == FiringStatus.DELIVERED


@pytest.mark.django_db
def test_a_firing_whose_worker_died_while_sending_is_shown_failed(
    project: Project, receiver: Receiver
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    firing = _firing(project, ChannelKind.WEBHOOK, receiver.url, SECRET)
    # Claimed by a worker that then died: `sending` since long before every try could end.
    AlertFiring.objects.filter(pk=firing.pk).update(
        status=FiringStatus.SENDING, sending_since=timezone.now() - timedelta(hours=1)
    )
    services.firings_send_stale()
    firing.refresh_from_db()
    assert firing.status == FiringStatus.FAILED
    assert firing.last_error.startswith("delivery interrupted")
    assert receiver.requests == []  # not sent again behind anyone's back
    # A firing claimed just now is left to its worker.
    AlertFiring.objects.filter(pk=firing.pk).update(
        status=FiringStatus.SENDING, sending_since=timezone.now()
    )
    services.firings_send_stale()
    assert AlertFiring.objects.get(pk=firing.pk).status == FiringStatus.SENDING


@pytest.mark.django_db
def test_the_sweep_evaluates_a_run_whose_evaluation_message_was_lost(
    project: Project, receiver: Receiver, django_capture_on_commit_callbacks: Any
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from evaluations.models import AlertEvaluation

    channel = services.alert_channel_create(
        project=project, name="hook", kind="webhook", target=receiver.url, secret=SECRET
    )
    services.alert_rule_create(
        project=project, name="low", condition="pass_rate < 0.9", channel_ids=[channel.pk]
    )
    # Finalised ten minutes ago; the alerts message never arrived (the broker was away).
    lost = finished_run(
        spec_in(project), finished=timezone.now() - timedelta(minutes=10), pass_rate=0.5
    )
    with django_capture_on_commit_callbacks(execute=True):
        services.firings_send_stale()
    assert AlertEvaluation.objects.filter(run=lost).exists()
    assert AlertFiring.objects.get().status == FiringStatus.DELIVERED
    assert len(receiver.requests) == 1
    with django_capture_on_commit_callbacks(execute=True):
        services.firings_send_stale()  # evaluated once: nothing more
    assert len(receiver.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_a_finalised_run_sends_the_alerts_task_only_when_its_project_has_an_enabled_rule(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project with no rule, or with only disabled ones, has nothing to evaluate: no
    message to the workers for every run it finalises (nor the alerts' import in the CLI)."""
    from evaluations import queue

    sent: list[int] = []
    evaluate_later = queue.alerts_evaluate_later
    monkeypatch.setattr(
        queue, "alerts_evaluate_later", lambda run_id: (sent.append(run_id), evaluate_later(run_id))
    )
    project = Project.objects.create(name="Alerts", slug="alerts")
    earlier = [run_spec(project, FAILING_SPEC, spec_dir=tmp_path).pk]
    channel = services.alert_channel_create(
        project=project, name="hook", kind="webhook", target=receiver.url, secret=SECRET
    )
    rule = services.alert_rule_create(
        project=project, name="broken", condition="pass_rate < 1", channel_ids=[channel.pk]
    )
    AlertRule.objects.filter(pk=rule.pk).update(enabled=False)
    earlier.append(run_spec(project, FAILING_SPEC, spec_dir=tmp_path).pk)
    assert sent == [] and receiver.requests == []
    AlertRule.objects.filter(pk=rule.pk).update(enabled=True)
    run = run_spec(project, FAILING_SPEC, spec_dir=tmp_path)
    assert sent == [run.pk]
    assert [p["run"]["id"] for p in receiver.payloads()] == [run.pk]
    # The earlier runs count as evaluated (there was nothing to evaluate): the sweep for lost
    # messages does not evaluate them now against the rule enabled since.
    Run.objects.filter(pk__in=earlier).update(finished=timezone.now() - timedelta(hours=1))
    services.firings_send_stale()
    assert sent == [run.pk] and len(receiver.requests) == 1
    assert AlertEvaluation.objects.filter(run_id__in=earlier).count() == 2
