"""End to end (issue 14): `keystone run` on main, `keystone baseline promote`, the agent
changed, `keystone run` again; the regression is seen by drift against the baseline, on the
compare page (diffed outputs), in `keystone compare` (exit 1) and in its Markdown."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from checks.compare import compare_summaries
from checks.scoring import score_run
from evaluations.cli import main
from evaluations.models import Baseline, CheckResult, Execution, Membership, Role, Run
from evaluations.selectors.compare import run_comparison, word_diff
from evaluations.selectors.records import run_records
from evaluations.selectors.reports import regression_report
from evaluations.services import engine_spec

SPEC = """\
version: 1
id: refund-desk
task: {{prompts: ["refund order 1042", "refund order 7"]}}
agent: {{type: command, command: "echo {answer}", timeout: 30}}
sandbox: {{backend: local}}
invariants:
  says_refunded: {{description: says refunded, check: {{type: contains, value: refunded}}}}
  no_drift:
    description: the answer stays close to the baseline's
    check: {{type: drift, baseline: active, max_score: 0.3}}
replicas: 4
gates: {{drift_score_max: 0.3}}
"""


def test_word_diff_keeps_the_words_and_marks_what_changed() -> None:
    assert word_diff("a b c", "a b c") == [("equal", "a b c")]
    assert word_diff("the order was refunded today", "the order was declined today") == [
        ("equal", "the order was "),
        ("delete", "refunded"),
        ("insert", "declined"),
        ("equal", " today"),
    ]
    assert word_diff("", "new") == [("insert", "new")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@override_settings(CELERY_TASK_ALWAYS_EAGER=True)
def test_promote_on_main_change_the_agent_and_see_the_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], django_user_model: Any
) -> None:
    spec_file = tmp_path / "refund-desk.yaml"
    spec_file.write_text(SPEC.format(answer="Your order was refunded"))
    assert main(["run", str(spec_file), "--label", "branch=main"]) == 0
    good = Run.objects.get()
    assert main(["baseline", "promote", str(good.pk), "--reason", "release 1"]) == 0
    baseline = Baseline.objects.get(active=True)
    assert (baseline.branch, baseline.reason, baseline.cells.count()) == ("main", "release 1", 8)

    spec_file.write_text(SPEC.format(answer="Your order was declined"))
    assert main(["run", str(spec_file), "--label", "branch=main"]) == 1
    worse = Run.objects.latest("id")
    capsys.readouterr()

    # Drift against the baseline's cells failed, and so did the drift gate.
    drift = CheckResult.objects.filter(run=worse, invariant_id="no_drift")
    assert drift.count() == 8 and not drift.filter(passed=True).exists()
    assert {g["name"]: g["passed"] for g in worse.summary["gates"]}["drift_score_max"] is False

    markdown, verdicts = tmp_path / "compare.md", tmp_path / "compare.json"
    code = main(["compare", str(worse.pk), "--markdown", str(markdown), "--json", str(verdicts)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"run {worse.pk} against run {good.pk}: REGRESSED" in out
    assert "says_refunded @ no-chaos  8/8 -> 0/8" in out
    text = markdown.read_text()
    assert text.startswith(f"# Keystone compare: run {worse.pk} against run {good.pk}")
    assert "REGRESSED" in text and "GATE_FLIPPED" in text and "drift_score_max" in text
    assert "## Executions that changed" in text
    assert "### no-chaos / prompt 0 / replica 0: passed -> failed" in text
    assert "Your order was [-refunded-]{+declined+}" in text
    assert text.count("### ") == 8
    assert json.loads(verdicts.read_text())["before"] == good.pk

    # The page and the CLI read the summaries run_finalize stored; scoring the stored results
    # again gives the same verdicts.
    rescored = compare_summaries(
        *(score_run(engine_spec(r), run_records(r)) for r in (good, worse))
    )
    assert run_comparison(good, worse).to_dict() == rescored.to_dict()

    viewer = django_user_model.objects.create_user(username="vic", password="pw-123456")
    Membership.objects.create(project=worse.project, user=viewer, role=Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    page = client.get(reverse("run_compare", args=[worse.project.slug, worse.pk]))
    html = page.content.decode()
    assert page.status_code == 200
    assert "<strong>Regressed</strong>" in html and "(the baseline)" in html
    assert html.count('<details class="execution-pair"') == 8
    # Each pair's diff is loaded when it is opened.
    first = Execution.objects.filter(run=worse).order_by("id").first()
    assert first is not None
    pair = client.get(
        reverse("run_compare_pair", args=[worse.project.slug, worse.pk, first.pk]),
        {"against": good.pk},
        headers={"HX-Request": "true"},
    ).content.decode()
    assert "Your order was <del>refunded</del><ins>declined</ins>" in pair

    # The overview's regression rows link to the compare page at the row of that change.
    overview = client.get(reverse("overview", args=[worse.project.slug])).content.decode()
    links = re.findall(r'href="([^"]*/compare/#change-[^"]+)"', overview)
    assert links, "no regression row links to its change on the compare page"
    for link in links:
        fragment = link.partition("#")[2]
        assert f'id="{fragment}"' in html, f"the compare page has no row {fragment}"
    assert any(link.endswith("#change-group-no-chaos-prompt-0") for link in links)

    # The regressions report names the invariant that broke, per scenario, against the
    # baseline as promoted (its matrix is kept with it), not only the scenario x prompt group.
    report = regression_report(worse.project)
    assert {(row.group, row.invariant) for row in report.rows} >= {
        ("no-chaos / prompt 0", ""),
        ("says_refunded @ no-chaos", "says_refunded"),
    }
