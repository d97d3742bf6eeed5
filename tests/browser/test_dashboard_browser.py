"""The dashboard in a real browser: from signing in to a JUnit file, without reloading to wait.

An editor signs in, writes a spec with a mistake and sees the error at its line while typing,
fixes it, saves, starts a run and watches the page follow it to the end (htmx polling, no
reload), opens a failing execution from the heatmap and downloads the JUnit report. Screenshots
of the main pages go to a temporary directory (KEYSTONE_SCREENSHOTS_DIR=docs/screenshots
regenerates the committed ones).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from evaluations.models import Membership, Project, Role, Run

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Two prompts x two replicas; each execution sleeps a little so the page has a run in
# progress to watch. `says_goodbye` fails everywhere, so there are failing executions.
GOOD_SPEC = """\
version: 1
id: greeter
description: "A greeting agent"
task:
  prompts: ["Say hello", "Say hello again"]
agent:
  type: command
  command: "sh -c 'sleep 0.7; echo hello from replica $KEYSTONE_REPLICA'"
sandbox: {backend: local}
invariants:
  greets:
    description: "The answer greets"
    gate: true
    check: {type: contains, value: hello}
  says_goodbye:
    description: "The answer says goodbye"
    weight: 0.2
    check: {type: contains, value: goodbye}
replicas: 2
scoring: {pass_threshold: 0.5}
"""
# The same spec with a check type that does not exist, on line 16.
BAD_SPEC = GOOD_SPEC.replace("check: {type: contains, value: hello}", "check: {type: contans}")
BAD_LINE = BAD_SPEC.splitlines().index("    check: {type: contans}") + 1


def test_editor_writes_a_spec_runs_it_watches_it_and_exports_junit(
    browse: Any, embedded_worker: None, django_user_model: Any
) -> None:
    project = Project.objects.create(name="Agents", slug="agents")
    editor = django_user_model.objects.create_user(username="eddie", password="pw-eddie-123")
    Membership.objects.create(project=project, user=editor, role=Role.EDITOR)
    page = browse.page
    base = browse.base_url

    browse.login("eddie", "pw-eddie-123")
    assert page.url.endswith("/p/agents/")  # the only project: straight to its overview

    # A spec with a mistake: the live validation names the line while typing.
    page.goto(f"{base}/p/agents/specs/new/")
    page.fill("#spec-source", BAD_SPEC)
    page.dispatch_event("#spec-source", "input")
    error = page.locator("#validation .spec-error").first
    error.wait_for()
    assert f"line {BAD_LINE}" in error.inner_text()
    assert "contans" in page.inner_text("#validation")
    browse.screenshot("spec-editor-error")

    # Fixed: the validation turns green, and saving stores version 1.
    page.fill("#spec-source", GOOD_SPEC)
    page.dispatch_event("#spec-source", "input")
    page.locator("#validation .validation-state.valid").wait_for()
    page.click("#spec-editor-form button[type=submit]")
    page.wait_for_url("**/specs/greeter/")
    assert "Version 1" in page.inner_text("body")
    browse.screenshot("spec-detail")

    # Start a run; the run page follows it to the end without a reload.
    page.click("#run-form button[type=submit]")
    page.wait_for_url("**/runs/*/")
    run = Run.objects.get(project=project)
    page.evaluate("window.__sameDocument = true")  # disappears if the page reloads
    page.locator("#run-live progress").wait_for()  # in progress, shown as such
    browse.screenshot("run-in-progress")
    page.locator('[data-run-status="completed"]').wait_for(timeout=60_000)
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded"
    run.refresh_from_db()
    assert run.status == "completed" and run.execution_count == 4
    assert "gates pass" in page.inner_text("#run-live")
    browse.screenshot("run-detail")

    # The failing invariant's heatmap cell lists its executions; open one.
    cell = page.locator("table.heatmap a[href*='invariant=says_goodbye']").first
    cell.click()
    execution_link = page.locator("#cell-detail a[href*='/executions/']").first
    execution_link.wait_for()
    execution_link.click()
    page.wait_for_url("**/executions/*/")
    body = page.inner_text("body")
    assert "says_goodbye" in body and "CONTAINS_FAILED" in body
    assert "keystone run" in body  # the reproducer command
    browse.screenshot("execution-detail")

    # Export JUnit from the run page: a real download, a real JUnit document.
    page.goto(f"{base}/p/agents/runs/{run.pk}/")
    with page.expect_download() as download_info:
        page.click("a:text-is('JUnit')")
    junit = ET.parse(download_info.value.path()).getroot()
    cases = junit.findall(".//testcase")
    assert cases, "the JUnit report has no test cases"
    assert any(case.find("failure") is not None for case in cases)

    # The other main pages, for the screenshots (and they must render).
    for name, path in [
        ("overview", "/p/agents/"),
        ("run-list", "/p/agents/runs/"),
        ("spec-list", "/p/agents/specs/"),
        ("spec-trends", "/p/agents/specs/greeter/trends/"),
    ]:
        response = page.goto(f"{base}{path}")
        assert response is not None and response.status == 200, path
        browse.screenshot(name)
