"""Issue 17: pages every user meets are inside the layout and usable from the keyboard: a
skip-to-content link, the current page marked in the nav, a favicon, 404/403 pages in the
layout (never Django's technical pages once DEBUG is off), "just now"."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from evaluations.models import Membership, Project, Role
from evaluations.templatetags.keystone import ago

pytestmark = pytest.mark.django_db


@pytest.fixture
def member(project: Project, django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user(username="m", password="pw-123456")
    Membership.objects.create(project=project, user=user, role=Role.VIEWER)
    client = Client()
    client.force_login(user)
    return client


def test_every_page_has_a_skip_link_a_favicon_and_marks_where_you_are(
    project: Project, member: Client
) -> None:
    html = member.get(f"/p/{project.slug}/runs/").content.decode()
    assert '<a class="skip-link" href="#content">Skip to content</a>' in html
    assert 'id="content"' in html and 'rel="icon"' in html
    assert f'href="/p/{project.slug}/runs/" aria-current="page">Runs' in html
    assert f'href="/p/{project.slug}/specs/">Specs' in html  # not marked


def test_404_and_403_pages_are_inside_the_layout(
    project: Project, member: Client, settings: Any
) -> None:
    settings.DEBUG = False
    missing = member.get(f"/p/{project.slug}/runs/999999/")
    assert missing.status_code == 404
    assert "<h1>Not found</h1>" in missing.content.decode()
    assert "skip-link" in missing.content.decode()
    forbidden = member.get(f"/p/{project.slug}/settings/")  # a viewer, not an admin
    assert forbidden.status_code == 403
    assert "<h1>Not allowed</h1>" in forbidden.content.decode()


def test_a_moment_ago_reads_just_now() -> None:
    assert ago(timezone.now() - timedelta(seconds=5)) == "just now"
    assert ago(timezone.now() - timedelta(hours=3, minutes=1)) == "3\xa0hours, 1\xa0minute ago"


def test_the_overview_says_there_is_no_baseline_instead_of_no_regressions(
    project: Project, member: Client
) -> None:
    html = member.get(f"/p/{project.slug}/").content.decode()
    assert 'id="no-baseline"' in html
    assert "No regressions" not in html
