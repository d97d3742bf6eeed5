"""Issue 17: pages every user meets are inside the layout and usable from the keyboard: a
skip-to-content link, the current page marked in the nav, a favicon, 404/403 pages in the
layout (never Django's technical pages once DEBUG is off), "just now"."""

from __future__ import annotations

import json
import random
import re
from datetime import timedelta
from typing import Any

import pytest
from django.template.defaultfilters import date as date_filter
from django.template.defaultfilters import floatformat
from django.test import Client
from django.utils import timezone
from django.utils.html import json_script

from evaluations.models import Membership, Project, Role
from evaluations.templatetags.keystone import (
    ago,
    chart_script,
    fixed,
    iso,
    local_minute,
    local_second,
    percent,
)

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


def test_chart_data_cannot_end_its_script_element_and_reads_back_the_same() -> None:
    figure = {"data": [{"name": "</script><b>&amp; 'x' · é", "y": [0.5, None]}]}
    html = str(chart_script(figure, "chart-1"))
    body = re.fullmatch(r'<script id="chart-1" type="application/json">(.*)</script>', html)
    assert body is not None
    assert "<" not in body.group(1) and ">" not in body.group(1) and "&" not in body.group(1)
    assert json.loads(body.group(1)) == figure
    # What Django's json_script writes, but for the separators.
    django_body = re.search(r">(.*)</script>", str(json_script(figure, "chart-1")))
    assert django_body is not None and json.loads(django_body.group(1)) == figure


def test_table_filters_write_what_floatformat_widthratio_and_date_wrote() -> None:
    rng = random.Random(18)
    values = [0.0, -0.0, 0.4, 93.456, 1234.5678, 0.0042, 2.5, 0.125, 87.25, 1.0005, -0.0001]
    values += [-2.5, 1e20, 3e-9, float("nan"), float("inf"), "0.25", "n/a", "", True]
    values += [rng.uniform(-1e4, 1e4) for _ in range(300)] + [rng.random() for _ in range(300)]
    values += [round(rng.uniform(0, 100), rng.randint(1, 5)) for _ in range(300)]  # halves too
    for value in values:
        for places in (0, 1, 2, 3, 4):
            assert fixed(value, places) == floatformat(value, places), (value, places)
    assert fixed(2.5, 0) == "3" and fixed(0.125, 2) == "0.13"  # halves round up, as there
    assert fixed(-0.0001, 2) == "0.00"
    assert fixed(None, 2) == "" and percent(None) == ""
    assert [percent(v) for v in (0.0, 0.5, 0.955, 1.0)] == ["0%", "50%", "96%", "100%"]
    moment = timezone.now()
    local = timezone.localtime(moment)
    assert local_minute(moment) == date_filter(local, "Y-m-d H:i")
    assert local_second(moment) == date_filter(local, "Y-m-d H:i:s")
    assert iso(moment) == date_filter(local, "c")


def test_the_overview_says_there_is_no_baseline_instead_of_no_regressions(
    project: Project, member: Client
) -> None:
    html = member.get(f"/p/{project.slug}/").content.decode()
    assert 'id="no-baseline"' in html
    assert "No regressions" not in html
