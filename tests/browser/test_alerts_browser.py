"""Alerts in a real browser: an admin adds a signed webhook channel and an `any_regression`
rule on the settings page, runs a spec that now fails where its baseline passed, and sees
the firing delivered on the same page; the receiver got the signed body, and the
regressions page lists the regression."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evaluations import services
from evaluations.models import AlertFiring, Membership, Project, Role, Run
from tests.http_peer import HttpPeer, PeerHandler

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SECRET = "browser-secret"
SPEC = """\
version: 1
id: refunder
task: {prompt: "Refund order 1042"}
agent: {type: command, command: "echo %s"}
sandbox: {backend: local}
invariants:
  says_refunded:
    description: mentions the refund
    check: {type: contains, value: refunded}
"""


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    received: list[tuple[dict[str, str], bytes]] = []

    class Handler(PeerHandler):
        def do_POST(self) -> None:  # noqa: N802
            received.append((dict(self.headers), self.read_body()))
            self.send_response(200)
            self.end_headers()

    with HttpPeer(Handler) as peer:
        yield f"{peer.url}/hook", received


def _wait_until(condition: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting for the embedded worker"
        time.sleep(0.2)


def test_admin_creates_a_rule_runs_a_regressing_spec_and_sees_the_firing(
    browse: Any,
    embedded_worker: None,
    django_user_model: Any,
    receiver: tuple[str, list[tuple[dict[str, str], bytes]]],
    tmp_path: Path,
) -> None:
    url, received = receiver
    project = Project.objects.create(name="Agents", slug="agents")
    admin = django_user_model.objects.create_user(username="ada", password="pw-ada-12345")
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    # Version 1 refunds: its run, executed by the embedded worker, is the baseline.
    version = services.spec_version_create(project=project, source_yaml=SPEC % "refunded")
    reference = services.run_create(spec_version=version, spec_dir=str(tmp_path))
    _wait_until(lambda: Run.objects.get(pk=reference.pk).status == "completed")
    services.baseline_promote(run_id=reference.pk, user=admin, name="release-1")
    page, base = browse.page, browse.base_url
    browse.login("ada", "pw-ada-12345")

    page.goto(f"{base}/p/agents/settings/")
    page.fill("#channel-name", "ci-hook")
    page.select_option("#channel-kind", "webhook")
    page.fill("#channel-target", url)
    page.fill("#channel-secret", SECRET)
    page.click("#alerts form:has(#channel-name) button[type=submit]")
    page.locator("#alert-channels").get_by_text("ci-hook").wait_for()
    page.fill("#rule-name", "anything regressed")
    page.fill("#rule-condition", "any_regression")
    page.check("#alerts input[name=channels]")
    page.click("#alerts form:has(#rule-name) button[type=submit]")
    page.locator("#alert-rules code", has_text="any_regression").wait_for()
    browse.screenshot("settings-alerts")

    # Version 2 declines: the group that passed in the baseline now fails.
    services.spec_version_create(project=project, source_yaml=SPEC % "declined")
    page.goto(f"{base}/p/agents/specs/refunder/")
    page.click("#run-form button[type=submit]")
    page.wait_for_url("**/runs/*/")
    page.locator('[data-run-status="completed"]').wait_for(timeout=60_000)
    run = Run.objects.exclude(pk=reference.pk).get(project=project)

    # The embedded worker sends the firing; the settings page shows it delivered.
    _wait_until(lambda: AlertFiring.objects.filter(status="delivered").exists())
    page.goto(f"{base}/p/agents/settings/")
    row = page.locator("#alert-firings tr[data-status=delivered]")
    assert "anything regressed" in row.inner_text() and f"#{run.pk}" in row.inner_text()
    browse.screenshot("settings-firings")
    ((headers, body),) = received
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert headers["X-Keystone-Signature"] == expected
    assert json.loads(body)["run"]["id"] == run.pk

    page.goto(f"{base}/p/agents/regressions/")
    assert "CONTAINS_FAILED" in page.inner_text("#regression-report")
    browse.screenshot("regressions")
