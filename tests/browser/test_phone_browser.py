"""Every page at a phone's width (390 px) and a laptop's (1440 px): the page itself never
scrolls sideways (wide tables and the heatmap scroll inside their own box), links and badges
reach WCAG AA contrast, and on the phone the top bar's links stay reachable behind a menu
button.

The world is real: the example python support agent (scripted model, tool faults, context
attacks) run through the services, and a judge-graded spec whose verdicts go to review.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from evaluations import services
from evaluations.models import Execution, Membership, Project, ReviewItem, Role

from .conftest import Browse

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1440, "height": 900}

JUDGED = """\
version: 1
id: polite-refunds
description: "Refund answers, graded by a judge and then by people"
task:
  prompts: ["Refund order 1", "Refund order 2"]
# Replica 1 forgets the refund: mentions_refund is flaky (the run page's "flaky" badge).
agent:
  type: command
  command: "sh -c 'if [ $KEYSTONE_REPLICA = 0 ]; then echo Your refund is on its way; else echo Thank you; fi'"
replicas: 2
sandbox: {backend: local}
judge: {provider: scripted, model: judge-small, rules: [{score: 0.9, reason: "polite"}]}
scoring: {pass_threshold: 0.9}
invariants:
  polite:
    description: "The answer is polite and confirms the refund"
    check:
      type: llm_as_judge
      criteria: "Is the answer polite and does it confirm the refund?"
      rubric: {pass: "Polite and confirms the refund", fail: "Rude or silent about it"}
      pass_threshold: 0.7
  mentions_refund:
    description: "Mentions the refund"
    check: {type: contains, value: refund}
review: {all: true, reviewers_per_item: 1, blind: true}
"""

# What overflows, for the failure message: the widest elements that end past the viewport.
OVERFLOW_JS = """() => {
  const width = window.innerWidth;
  const page = document.documentElement.scrollWidth;
  const culprits = [];
  for (const el of document.querySelectorAll('body *')) {
    const box = el.getBoundingClientRect();
    let clipped = false;  // inside a box that scrolls or clips: not the page's overflow
    for (let up = el.parentElement; up && up !== document.body; up = up.parentElement) {
      if (getComputedStyle(up).overflowX !== 'visible') { clipped = true; break; }
    }
    if (!clipped && box.right > width + 1 && box.width > 0) {
      const name = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
        (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
      culprits.push(name + ' ' + Math.round(box.right));
    }
  }
  return {page, width, culprits: culprits.slice(0, 6)};
}"""


# WCAG AA: text under 18.66 px bold / 24 px needs 4.5:1 against what is behind it. Checked
# for every visible link and badge (the "flaky" one included), on every page.
CONTRAST_JS = """() => {
  function rgb(text) { return (text.match(/[\\d.]+/g) || []).map(Number); }
  function luminance(c) {
    const [r, g, b] = c.slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  }
  function background(el) {
    for (; el; el = el.parentElement) {
      const c = rgb(getComputedStyle(el).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c;
    }
    return [255, 255, 255];
  }
  const poor = [];
  for (const el of document.querySelectorAll('a, .badge')) {
    const box = el.getBoundingClientRect();
    if (!box.width || !box.height || getComputedStyle(el).visibility === 'hidden') continue;
    if (el.closest('.js-plotly-plot, .visually-hidden, .skip-link')) continue;
    const fg = rgb(getComputedStyle(el).color), bg = background(el);
    const [a, b] = [luminance(fg), luminance(bg)];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5) poor.push(`${el.className || el.tagName} "${el.textContent.trim().slice(0, 20)}" ${ratio.toFixed(2)}`);
  }
  return poor.slice(0, 5);
}"""


def _world(django_user_model: Any) -> dict[str, str]:
    project = Project.objects.create(name="Support team with a long project name", slug="support")
    admin = django_user_model.objects.create_user(username="ada", password="pw-ada-12345")
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    examples = Path(settings.BASE_DIR) / "examples" / "specs"
    agent_spec = services.spec_version_create(
        project=project,
        source_yaml=(examples / "support-agent-python.yaml").read_text(),
        base_dir=str(examples),
        read_from_files=True,
    )
    agent_run = services.run_create(spec_version=agent_spec, replicas=1, labels={"branch": "main"})
    judged = services.spec_version_create(project=project, source_yaml=JUDGED)
    services.spec_version_create(
        project=project, source_yaml=JUDGED.replace("Refund order 2", "Refund order 22")
    )
    first = services.run_create(spec_version=judged, labels={"branch": "main", "model": "gpt-4o"})
    judged_run = services.run_create(spec_version=judged.spec.latest_version())
    faulted = Execution.objects.filter(run=agent_run, scenario="lookup-down").order_by("pk").first()
    assert faulted is not None
    item = ReviewItem.objects.filter(run=judged_run).order_by("pk").first()
    assert item is not None
    p = "/p/support"
    return {
        "projects": "/p/",
        "overview": f"{p}/",
        "members": f"{p}/members/",
        "settings": f"{p}/settings/",
        "regressions": f"{p}/regressions/",
        "spec-list": f"{p}/specs/",
        "spec-detail": f"{p}/specs/support-agent-python/",
        "spec-new": f"{p}/specs/new/",
        "spec-edit": f"{p}/specs/support-agent-python/edit/",
        "spec-diff": f"{p}/specs/polite-refunds/diff/",
        "spec-trends": f"{p}/specs/polite-refunds/trends/",
        "run-list": f"{p}/runs/",
        "run-detail": f"{p}/runs/{agent_run.pk}/",
        "run-detail-judged": f"{p}/runs/{judged_run.pk}/",
        "run-cell": f"{p}/runs/{agent_run.pk}/cell/?scenario=lookup-down&invariant=valid-json",
        "run-compare": f"{p}/runs/{judged_run.pk}/compare/?against={first.pk}",
        "execution-detail": f"{p}/executions/{faulted.pk}/",
        "review-queue": f"{p}/review/",
        "review-item": f"{p}/review/{item.pk}/",
        "review-agreement": f"{p}/review/agreement/",
        "not-found": f"{p}/runs/999999/",
    }


def _walk(browser: Any, base_url: str, pages: dict[str, str], viewport: dict[str, int]) -> Any:
    """Sign in at this width and open every page: none may scroll sideways, every link and
    badge must reach WCAG AA contrast. Screenshots: phone-<page> / laptop-<page>. Returns
    the context (still open) for more checks."""
    prefix = "phone" if viewport["width"] < 600 else "laptop"
    context = browser.new_context(viewport=viewport, device_scale_factor=1)
    context.set_default_timeout(15_000)
    page = context.new_page()
    browse = Browse(page, base_url)
    page.goto(f"{base_url}/accounts/login/")
    overflow = page.evaluate(OVERFLOW_JS)
    assert overflow["page"] <= viewport["width"], ("login", overflow)
    browse.login("ada", "pw-ada-12345")
    too_wide: dict[str, Any] = {}
    low_contrast: dict[str, Any] = {}
    for name, path in pages.items():
        response = page.goto(f"{base_url}{path}")
        assert response is not None
        assert response.status == (404 if name == "not-found" else 200), (name, response.status)
        page.wait_for_load_state("networkidle")
        overflow = page.evaluate(OVERFLOW_JS)
        if overflow["page"] > viewport["width"]:
            too_wide[name] = overflow
        if name == "run-detail-judged":  # the flaky badge is among those checked
            assert page.locator(".badge.flaky").count() > 0
        poor = page.evaluate(CONTRAST_JS)
        if poor:
            low_contrast[name] = poor
        browse.screenshot(f"{prefix}-{name}")
    assert not too_wide, "\n".join(f"{k}: {v}" for k, v in too_wide.items())
    assert not low_contrast, "\n".join(f"{k}: {v}" for k, v in low_contrast.items())
    return context


def test_every_page_fits_a_phone_and_a_laptop_and_the_nav_collapses(
    browser: Any, live_server: Any, django_user_model: Any
) -> None:
    pages = _world(django_user_model)
    _walk(browser, live_server.url, pages, LAPTOP).close()
    context = _walk(browser, live_server.url, pages, PHONE)
    try:
        # On the phone the nav is behind a menu button: closed, its links are hidden; open,
        # they show and lead where they say.
        page = context.pages[0]
        page.goto(f"{live_server.url}{pages['overview']}")
        runs_link = page.locator(".topnav a", has_text="Runs")
        assert not runs_link.is_visible()
        toggle = page.get_by_role("button", name="Menu")
        assert toggle.get_attribute("aria-expanded") == "false"
        toggle.click()
        assert toggle.get_attribute("aria-expanded") == "true"
        assert runs_link.is_visible()
        runs_link.click()
        page.wait_for_url("**/p/support/runs/")
    finally:
        context.close()
