"""The small things people notice, in Chromium: cancelling a run asks first, a revoke button
looks dangerous, a new token has a copy button that copies it, admins create accounts from
the members page, and the spec editor numbers its lines and jumps to an error's line."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from evaluations import services
from evaluations.models import Membership, Project, Role, Run, RunStatus

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SPEC = """\
version: 1
id: tiny
task: {prompt: "hi"}
agent: {type: command, command: "echo hi"}
sandbox: {backend: local}
invariants:
  says_hi: {description: "says hi", check: {type: contains, value: hi}}
"""


@pytest.fixture
def admin_world(browse: Any, django_user_model: Any) -> Project:
    project = Project.objects.create(name="Tiny", slug="tiny")
    admin = django_user_model.objects.create_user(username="ada", password="pw-ada-12345")
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    browse.login("ada", "pw-ada-12345")
    return project


def test_cancelling_a_run_asks_first(browse: Any, admin_world: Project) -> None:
    version = services.spec_version_create(project=admin_world, source_yaml=SPEC)
    # A run some worker is on (none is here): the page offers to cancel it.
    run = Run.objects.create(project=admin_world, spec_version=version, status=RunStatus.RUNNING)
    page = browse.page
    page.goto(f"{browse.base_url}/p/tiny/runs/{run.pk}/")
    questions: list[str] = []

    def answer(dialog: Any, accept: bool) -> None:
        questions.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda d: answer(d, False))
    page.click("button:text-is('Cancel run')")
    page.wait_for_timeout(300)
    assert questions and f"Cancel run #{run.pk}?" in questions[0]
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # "no": nothing sent

    page.once("dialog", lambda d: answer(d, True))
    with page.expect_navigation():
        page.click("button:text-is('Cancel run')")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_a_new_token_is_copied_and_revoke_looks_dangerous(
    browse: Any, admin_world: Project
) -> None:
    page = browse.page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(f"{browse.base_url}/p/tiny/settings/")
    page.fill("#token-name", "ci")
    page.click("button:text-is('Issue token')")
    token = page.locator("#new-token")
    token.wait_for()
    page.click("button[data-copy='#new-token']")
    page.locator("button[data-copy='#new-token']:text-is('Copied')").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == token.inner_text().strip()

    revoke = page.locator("#api-tokens button", has_text="Revoke")
    assert "danger" in (revoke.get_attribute("class") or "")
    red = revoke.evaluate("b => getComputedStyle(b).backgroundColor")
    assert red == "rgb(198, 40, 40)"  # var(--fail)


def test_an_admin_creates_an_account_from_the_members_page(
    browse: Any, admin_world: Project, django_user_model: Any
) -> None:
    page = browse.page
    page.goto(f"{browse.base_url}/p/tiny/members/")
    page.fill("#create-username", "newbie")
    page.select_option("#create-role", "reviewer")
    page.click("button:text-is('Create and add')")
    password = page.locator("#new-password")
    password.wait_for()
    assert "Account newbie created and added as reviewer." in page.inner_text("#member-list")
    user = django_user_model.objects.get(username="newbie")
    assert Membership.objects.get(project=admin_world, user=user).role == Role.REVIEWER
    assert Client().login(username="newbie", password=password.inner_text().strip())


def test_the_spec_editor_numbers_lines_and_jumps_to_an_error(
    browse: Any, admin_world: Project
) -> None:
    bad = SPEC.replace("type: contains, value: hi", "type: contans")
    wrong_line = bad.splitlines().index(next(x for x in bad.splitlines() if "contans" in x)) + 1
    page = browse.page
    page.goto(f"{browse.base_url}/p/tiny/specs/new/")
    page.fill("#spec-source", bad)
    page.dispatch_event("#spec-source", "input")
    gutter = page.locator(".line-gutter[data-for='spec-source']")
    assert gutter.inner_text().split() == [str(n) for n in range(1, len(bad.split("\n")) + 1)]

    jump = page.locator(f"#validation [data-jump-line='{wrong_line}']")
    jump.wait_for()
    jump.click()
    selected = page.evaluate(
        "() => { const t = document.getElementById('spec-source');"
        " return [document.activeElement === t, t.value.slice(t.selectionStart, t.selectionEnd)]; }"
    )
    assert selected == [True, bad.splitlines()[wrong_line - 1]]
