"""Spec pages: list, detail, diff, the editor with live validation, the Run form and
trends. Whole pages and htmx fragments, every role, and another project's specs (404)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import plotly.graph_objects as go
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from evaluations import selectors, services
from evaluations.models import Run, RunStatus, Spec, SpecVersion, Trigger

from .conftest import ALL_ROLES, ROLES, SPEC_YAML

pytestmark = pytest.mark.django_db

RANK = {"outsider": 0, "viewer": 1, "reviewer": 2, "editor": 3, "admin": 4}

SPEC_V2 = SPEC_YAML.replace('description: "Refunds orders"', 'description: "Refunds orders fast"')

INVALID_YAML = """\
version: 1
id: refund-agent
task: {prompt: "Refund order 1042"}
agent: {type: command, command: "echo refunded"}
invariants:
  says_refunded:
    description: mentions the refund
    check: {type: comand_exit}
"""


def htmx_get(client: Client, url: str, **params: Any) -> Any:
    return client.get(url, params, HTTP_HX_REQUEST="true")


def url(name: str, *args: Any, project: str = "mine") -> str:
    return reverse(name, args=[project, *args])


def chart_figure(html: str, chart_id: str) -> dict[str, Any]:
    """The figure plotly.js draws: what the page embeds, with its "shared" per-point arrays
    given to every line that lacks them (as static/js/charts.js does)."""
    match = re.search(rf'<script id="{chart_id}" type="application/json">(.*?)</script>', html)
    assert match, f"no chart {chart_id}"
    figure: dict[str, Any] = json.loads(match.group(1))
    shared = figure.pop("shared", {})
    for trace in figure["data"]:
        for key, values in shared.items():
            trace.setdefault(key, list(values))
    go.Figure(figure)  # raises on anything plotly.js would not understand
    return figure


@pytest.fixture
def spec_v1(two_projects, make_spec, member) -> SpecVersion:
    return make_spec(two_projects.mine, author=member("editor"))


# --- List -----------------------------------------------------------------------------------


@pytest.mark.embedded
def test_spec_list_shows_latest_version_and_last_run(
    two_projects, client_as, make_spec, make_run, spec_v1
):
    make_spec(two_projects.mine, source=SPEC_V2)
    make_run(spec_v1)
    last = make_run(spec_v1, failing=["says_refunded"])
    make_spec(two_projects.other, source=SPEC_YAML.replace("refund-agent", "secret-agent"))

    html = client_as("viewer").get(url("spec_list")).content.decode()

    row = html[html.index('href="/p/mine/specs/refund-agent/"') :]
    row = row[: row.index("</tr>")]
    assert "v2" in row
    assert f"#{last.pk}" in row and "gates fail" in row and "exit 1" in row
    assert "secret-agent" not in html


def test_spec_list_marks_specs_never_run_and_offers_new_spec_to_editors(
    two_projects, client_as, spec_v1
):
    editor_page = client_as("editor").get(url("spec_list")).content.decode()
    viewer_page = client_as("viewer").get(url("spec_list")).content.decode()

    assert "never run" in editor_page
    assert url("spec_new") in editor_page
    assert url("spec_new") not in viewer_page


def test_spec_list_htmx_returns_the_table(two_projects, client_as, spec_v1):
    body = htmx_get(client_as("viewer"), url("spec_list")).content.decode()
    assert body.lstrip().startswith('<section id="spec-table"')
    assert "refund-agent" in body and "<html" not in body


def test_spec_list_query_count_does_not_grow(two_projects, client_as, make_spec, make_run, spec_v1):
    client = client_as("viewer")
    make_run(spec_v1)
    with CaptureQueriesContext(connection) as few:
        client.get(url("spec_list"))
    for index in range(4):
        version = make_spec(
            two_projects.mine, source=SPEC_YAML.replace("refund-agent", f"agent-{index}")
        )
        for _ in range(3):
            make_run(version)
    with CaptureQueriesContext(connection) as many:
        response = client.get(url("spec_list"))
    assert response.content.decode().count('class="badge status-completed"') == 5
    assert len(many) == len(few) <= 6


# --- Detail ---------------------------------------------------------------------------------


def test_spec_detail_shows_versions_yaml_diff_links_and_runs(
    two_projects, client_as, make_spec, make_run, spec_v1
):
    v2 = make_spec(two_projects.mine, source=SPEC_V2)
    run = make_run(v2, labels={"branch": "main"})

    html = client_as("viewer").get(url("spec_detail", "refund-agent")).content.decode()

    assert "Version 2 (latest)" in html
    assert "Refunds orders fast" in html  # the latest YAML
    assert "editor-1" in html  # the author of v1
    assert f"{url('spec_diff', 'refund-agent')}?a=1&amp;b=2" in html
    assert f"/p/mine/runs/{run.pk}/" in html
    assert f"{url('run_list')}?spec=refund-agent" in html


@pytest.mark.parametrize(
    ("role", "has_form"),
    [("viewer", False), ("reviewer", False), ("editor", True), ("admin", True)],
)
def test_run_form_and_edit_link_are_for_editors(two_projects, client_as, spec_v1, role, has_form):
    html = client_as(role).get(url("spec_detail", "refund-agent")).content.decode()

    assert ('id="run-form"' in html) is has_form
    assert (url("spec_edit", "refund-agent") in html) is has_form
    if has_form:  # the scenarios of the chaos matrix are offered
        assert '<option value="no-chaos"' in html and '<option value="llm-degraded"' in html


def test_spec_detail_htmx_returns_the_runs(two_projects, client_as, make_run, spec_v1):
    run = make_run(spec_v1)
    body = htmx_get(client_as("viewer"), url("spec_detail", "refund-agent")).content.decode()
    assert body.lstrip().startswith('<section id="spec-runs"')
    assert f"#{run.pk}" in body and "<html" not in body and "Versions" not in body


def test_spec_detail_query_count_does_not_grow(
    two_projects, client_as, make_spec, make_run, spec_v1
):
    client = client_as("editor")
    make_run(spec_v1)
    with CaptureQueriesContext(connection) as few:
        client.get(url("spec_detail", "refund-agent"))
    make_spec(two_projects.mine, source=SPEC_V2)
    for _ in range(12):
        make_run(spec_v1)
    with CaptureQueriesContext(connection) as many:
        client.get(url("spec_detail", "refund-agent"))
    assert len(many) == len(few) <= 9


# --- Diff -----------------------------------------------------------------------------------


@pytest.mark.embedded
def test_diff_defaults_to_latest_against_previous(two_projects, client_as, make_spec, spec_v1):
    make_spec(two_projects.mine, source=SPEC_V2)

    html = client_as("viewer").get(url("spec_diff", "refund-agent")).content.decode()

    assert (
        '<span class="diff-line diff-removed">-description: &quot;Refunds orders&quot;</span>'
        in html
    )
    assert (
        '<span class="diff-line diff-added">+description: &quot;Refunds orders fast&quot;</span>'
        in html
    )
    assert '<span class="diff-line diff-header">--- v1</span>' in html
    assert html.count("diff-added") == 1 and html.count("diff-removed") == 1


def test_diff_between_chosen_versions_both_ways(two_projects, client_as, make_spec, spec_v1):
    make_spec(two_projects.mine, source=SPEC_V2)
    make_spec(two_projects.mine, source=SPEC_V2 + "replicas: 3\n")
    client = client_as("viewer")

    forward = client.get(url("spec_diff", "refund-agent"), {"a": 1, "b": 3}).content.decode()
    backward = client.get(url("spec_diff", "refund-agent"), {"a": "v3", "b": "v1"}).content.decode()
    same = client.get(url("spec_diff", "refund-agent"), {"a": 2, "b": 2}).content.decode()

    assert 'diff-added">+replicas: 3<' in forward
    assert 'diff-removed">-replicas: 3<' in backward
    assert "nothing differs" in same


def test_diff_htmx_returns_the_diff_only(two_projects, client_as, make_spec, spec_v1):
    make_spec(two_projects.mine, source=SPEC_V2)
    body = htmx_get(
        client_as("viewer"), url("spec_diff", "refund-agent"), a=1, b=2
    ).content.decode()
    assert body.lstrip().startswith('<section id="diff"') and "diff-added" in body


def test_diff_with_bad_version_numbers(two_projects, client_as, spec_v1):
    client = client_as("viewer")

    not_a_number = client.get(url("spec_diff", "refund-agent"), {"a": "one", "b": 1})
    missing = client.get(url("spec_diff", "refund-agent"), {"a": 1, "b": 9})

    assert not_a_number.status_code == 400
    assert "a=&#x27;one&#x27; is not a version number (1, 2, ...)" in not_a_number.content.decode()
    assert missing.status_code == 404


# --- Editor ---------------------------------------------------------------------------------


def test_editor_starts_from_the_latest_version(two_projects, client_as, spec_v1):
    html = client_as("editor").get(url("spec_edit", "refund-agent")).content.decode()
    assert "creates version 2" in html
    assert "Refund order 1042" in html  # the YAML is in the textarea
    assert 'hx-trigger="input changed delay:500ms"' in html
    assert f'hx-post="{url("spec_validate")}"' in html


def test_editor_htmx_returns_the_editor_region(two_projects, client_as, spec_v1):
    body = htmx_get(client_as("editor"), url("spec_new")).content.decode()
    assert body.lstrip().startswith('<div id="editor"') and "<html" not in body


def test_saving_a_valid_edit_creates_the_next_version(two_projects, client_as, spec_v1):
    client = client_as("editor")

    response = client.post(
        url("spec_edit", "refund-agent"), {"source": SPEC_V2.replace("\n", "\r\n")}
    )

    assert response.status_code == 302
    assert response["Location"] == url("spec_detail", "refund-agent")
    latest = SpecVersion.objects.filter(spec__slug="refund-agent").order_by("-number").first()
    assert latest.number == 2 and latest.source_yaml == SPEC_V2  # CRLF from the browser normalised
    assert latest.author.username == "editor-2"
    assert "Saved refund-agent version 2." in client.get(response["Location"]).content.decode()


def test_saving_the_same_text_again_creates_no_version(two_projects, client_as, spec_v1):
    client = client_as("editor")
    response = client.post(url("spec_edit", "refund-agent"), {"source": SPEC_YAML})
    assert response.status_code == 302
    assert SpecVersion.objects.filter(spec__slug="refund-agent").count() == 1
    assert (
        "No change: the text is version 1 already."
        in client.get(response["Location"]).content.decode()
    )


@pytest.mark.embedded
def test_invalid_yaml_shows_every_error_with_its_line_and_keeps_the_text(
    two_projects, client_as, spec_v1
):
    response = client_as("editor").post(url("spec_edit", "refund-agent"), {"source": INVALID_YAML})

    html = response.content.decode()
    assert response.status_code == 422
    assert "line 8, col 19" in html
    assert "invariants.says_refunded.check.type" in html
    assert (
        "unknown check type &#x27;comand_exit&#x27; (did you mean &#x27;command_exit&#x27;?)"
        in html
    )
    assert "check: {type: comand_exit}" in html  # the textarea still holds the user's text
    assert SpecVersion.objects.filter(spec__slug="refund-agent").count() == 1


def test_broken_yaml_syntax_is_reported_at_its_line(two_projects, client_as):
    broken = "version: 1\nid: x\ntask: {prompt: [\n"
    html = client_as("editor").post(url("spec_new"), {"source": broken}).content.decode()
    assert "line 4, col 1" in html and "invalid YAML" in html


def test_editing_a_spec_may_not_change_its_id(two_projects, client_as, spec_v1):
    renamed = SPEC_V2.replace("id: refund-agent", "id: other-agent")

    response = client_as("editor").post(url("spec_edit", "refund-agent"), {"source": renamed})

    html = response.content.decode()
    assert response.status_code == 422
    assert "line 2, col 5" in html and "the id must stay &#x27;refund-agent&#x27;" in html
    assert not Spec.objects.filter(slug="other-agent").exists()


def test_new_spec_from_the_textarea(two_projects, client_as):
    source = SPEC_YAML.replace("refund-agent", "brand-new")
    response = client_as("editor").post(url("spec_new"), {"source": source})
    assert response.status_code == 302 and response["Location"] == url("spec_detail", "brand-new")
    spec = Spec.objects.get(project=two_projects.mine, slug="brand-new")
    assert spec.versions.get().number == 1


def test_uploading_a_file_saves_it(two_projects, client_as, spec_v1):
    upload = SimpleUploadedFile("refund.yaml", SPEC_V2.encode(), content_type="application/yaml")

    response = client_as("admin").post(url("spec_edit", "refund-agent"), {"file": upload})

    assert response.status_code == 302
    assert SpecVersion.objects.get(spec=spec_v1.spec, number=2).source_yaml == SPEC_V2


def test_uploading_an_invalid_file_shows_its_errors_and_its_text(two_projects, client_as):
    upload = SimpleUploadedFile("bad.yaml", INVALID_YAML.encode())
    html = client_as("editor").post(url("spec_new"), {"file": upload}).content.decode()
    assert "line 8, col 19" in html and "check: {type: comand_exit}" in html


def test_uploading_a_file_that_is_not_utf8_names_the_line(two_projects, client_as):
    upload = SimpleUploadedFile("latin1.yaml", b"version: 1\nid: caf\xe9\n")
    response = client_as("editor").post(url("spec_new"), {"file": upload})
    assert response.status_code == 422
    assert "not valid UTF-8 (byte 0xe9)" in response.content.decode()
    assert "line 2, col 8" in response.content.decode()


# --- Live validation ------------------------------------------------------------------------


def test_live_validation_lists_errors_with_line_column_and_path(two_projects, client_as):
    response = client_as("editor").post(
        url("spec_validate"), {"source": INVALID_YAML}, HTTP_HX_REQUEST="true"
    )

    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="validation"')
    assert "1 error" in body and "line 8, col 19" in body
    assert "invariants.says_refunded.check.type" in body


def test_live_validation_says_valid(two_projects, client_as):
    body = client_as("editor").post(url("spec_validate"), {"source": SPEC_YAML}).content.decode()
    assert "<strong>Valid</strong>" in body and "error" not in body.lower().replace("aria-live", "")


def test_live_validation_checks_the_id_of_the_spec_being_edited(two_projects, client_as, spec_v1):
    source = SPEC_YAML.replace("id: refund-agent", "id: another")
    body = (
        client_as("editor")
        .post(url("spec_validate"), {"source": source, "spec": "refund-agent"})
        .content.decode()
    )
    assert "line 2, col 5" in body and "the id must stay" in body


def test_live_validation_only_accepts_post(two_projects, client_as):
    assert client_as("editor").get(url("spec_validate")).status_code == 405


# --- Run form -------------------------------------------------------------------------------


@pytest.mark.embedded
def test_run_form_creates_a_run_with_overrides_and_redirects(
    two_projects, client_as, spec_v1, settings
):
    client = client_as("editor")

    response = client.post(
        url("spec_run", "refund-agent"),
        {
            "replicas": "3",
            "scenarios": ["llm-degraded"],
            "labels": "branch=main\n# note\n\nenv = ci\n",
        },
    )

    run = Run.objects.get()
    assert response.status_code == 302
    assert response["Location"] == url("run_detail", run.pk)
    assert run.spec_version == spec_v1 and run.project == two_projects.mine
    assert run.replicas_override == 3
    assert run.options["scenarios"] == ["llm-degraded"]
    assert run.labels == {"branch": "main", "env": "ci"} and run.branch == "main"
    assert run.trigger == Trigger.WEB and run.created_by.username == "editor-2"
    assert run.status == RunStatus.QUEUED  # the embedded worker plans it (no broker here)


def test_run_form_runs_the_chosen_version_with_the_spec_defaults(
    two_projects, client_as, make_spec, spec_v1
):
    make_spec(two_projects.mine, source=SPEC_V2)
    response = client_as("editor").post(url("spec_run", "refund-agent"), {"version": "1"})
    run = Run.objects.get()
    assert response.status_code == 302
    assert run.spec_version == spec_v1 and run.replicas_override is None
    assert run.options["scenarios"] == [] and run.labels == {}


def test_run_form_htmx_redirects_the_browser(two_projects, client_as, spec_v1):
    response = client_as("editor").post(url("spec_run", "refund-agent"), {}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response["HX-Redirect"] == url("run_detail", Run.objects.get().pk)


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"replicas": "0"}, "replicas: expected a whole number from 1 to 100"),
        ({"replicas": "lots"}, "replicas: expected a whole number from 1 to 100"),
        ({"scenarios": ["no-such"]}, "scenarios: unknown scenario &#x27;no-such&#x27;"),
        (
            {"labels": "branch=main\njust-a-word"},
            "labels line 2: expected key=value, got &#x27;just-a-word&#x27;",
        ),
        ({"version": "7"}, "version: refund-agent has no version &#x27;7&#x27;"),
    ],
)
def test_run_form_refuses_bad_overrides(two_projects, client_as, spec_v1, form, message):
    client = client_as("editor")

    response = client.post(url("spec_run", "refund-agent"), {"labels": "", **form})
    fragment = client.post(
        url("spec_run", "refund-agent"), {"labels": "", **form}, HTTP_HX_REQUEST="true"
    )

    assert response.status_code == 400 and message in response.content.decode()
    assert fragment.status_code == 200 and fragment.content.decode().lstrip().startswith(
        '<section id="run-form"'
    )
    assert message in fragment.content.decode()
    assert not Run.objects.exists()


def test_run_form_enqueues_planning_on_commit_unless_the_embedded_worker_runs(
    two_projects, client_as, spec_v1, settings, django_capture_on_commit_callbacks
):
    client = client_as("editor")
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        client.post(url("spec_run", "refund-agent"), {})
    settings.KEYSTONE_EMBEDDED_WORKER = True  # as under `keystone serve` with no broker
    with django_capture_on_commit_callbacks(execute=False) as left_for_the_worker:
        client.post(url("spec_run", "refund-agent"), {})

    assert len(enqueued) == 1  # run_plan is sent once the run row is committed
    assert len(left_for_the_worker) == 0  # the polling worker plans queued runs itself
    assert Run.objects.filter(status=RunStatus.QUEUED).count() == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_started_from_the_page_executes_on_the_embedded_worker(
    two_projects, client_as, make_spec, settings
):
    from evaluations.embedded_worker import work_once

    settings.KEYSTONE_EMBEDDED_WORKER = True  # `keystone serve` on the embedded default

    source = """\
version: 1
id: hello-agent
task: {prompts: ["Say hello"]}
agent: {type: command, command: "echo hello", timeout: 30}
sandbox: {backend: local}
invariants:
  greets: {description: greets, check: {type: contains, value: hello}}
  says_goodbye: {description: goodbye, check: {type: contains, value: goodbye}}
"""
    make_spec(two_projects.mine, source=source)
    client = client_as("editor")
    response = client.post(
        url("spec_run", "hello-agent"), {"replicas": "2", "labels": "branch=main"}
    )
    run = Run.objects.get()
    assert response["Location"] == url("run_detail", run.pk)

    for _ in range(10):
        if not work_once("test-embedded:1"):
            break
    run.refresh_from_db()

    assert run.status == RunStatus.COMPLETED and run.execution_count == 2
    assert run.gate_passed is False and run.exit_code == 1  # says_goodbye fails
    html = client.get(url("spec_trends", "hello-agent"), {"branch": "main"}).content.decode()
    invariants = chart_figure(html, "trend-invariants")
    rates = {line["name"]: line["y"] for line in invariants["data"]}
    assert rates == {"greets": [1.0], "says_goodbye": [0.0]}


# --- Trends ---------------------------------------------------------------------------------


@pytest.mark.embedded
def test_trends_chart_every_metric_over_the_specs_runs(two_projects, client_as, make_run, spec_v1):
    now = timezone.now()
    first = make_run(spec_v1, created=now - timedelta(hours=2), judge_mean=0.6)
    second = make_run(
        spec_v1,
        failing=[("llm-degraded", "short_answer")],
        created=now - timedelta(hours=1),
        judge_mean=0.9,
    )
    make_run(spec_v1, status=RunStatus.RUNNING)  # not completed: not a point

    html = client_as("viewer").get(url("spec_trends", "refund-agent")).content.decode()

    series = {
        metric: chart_figure(html, f"trend-{metric.replace('_', '-')}")["data"][0]
        for metric in selectors.TREND_METRICS
    }
    assert series["resilience"]["y"] == [first.resilience, second.resilience]
    assert series["pass_rate"]["y"] == [1.0, 0.5]
    assert series["judge_mean"]["y"] == [0.6, 0.9]
    assert series["cost_usd"]["y"] == [first.cost_usd, second.cost_usd]
    assert series["p95_duration_ms"]["y"] == [first.p95_duration_ms, second.p95_duration_ms]
    assert series["pass_rate"]["customdata"] == [
        url("run_detail", first.pk),
        url("run_detail", second.pk),
    ]
    invariants = {
        line["name"]: line["y"] for line in chart_figure(html, "trend-invariants")["data"]
    }
    # short_answer fails in llm-degraded (2 of its 4 results in the second run).
    assert invariants == {"says_refunded": [1.0, 1.0], "short_answer": [1.0, 0.5]}
    assert "50%" in html  # the invariant table (no JavaScript needed)


@pytest.mark.embedded
def test_trend_tooltips_name_the_run_and_a_zero_cost_axis_starts_at_zero(
    two_projects, client_as, make_run, spec_v1
):
    now = timezone.now()
    first = make_run(spec_v1, created=now - timedelta(hours=2), cost_usd=0.0, branch="main")
    second = make_run(spec_v1, created=now - timedelta(hours=1), cost_usd=0.0, branch="main")

    html = client_as("viewer").get(url("spec_trends", "refund-agent")).content.decode()

    cost = chart_figure(html, "trend-cost-usd")
    go.Figure(cost)
    # Every cost is $0: the axis runs from $0 up, never from -$1.
    assert cost["layout"]["yaxis"]["range"] == [0, 1]
    assert cost["layout"]["yaxis"]["rangemode"] == "nonnegative"
    [line] = cost["data"]
    for run, text in zip([first, second], line["text"], strict=True):
        when = timezone.localtime(run.created).strftime("%Y-%m-%d %H:%M")
        # The line is the branch's (trends split by branch): said once.
        assert text == f"Run #{run.pk} · main · v1 · {when}"
    assert "Cost (USD): %{y:$.4f}" in line["hovertemplate"]
    # Lines of the invariant chart differ by dash and marker, not only by colour.
    invariants = chart_figure(html, "trend-invariants")["data"]
    assert len({(t["line"]["dash"], t["marker"]["symbol"]) for t in invariants}) == len(invariants)
    # Their tooltips say the same about the run as the metric charts', and name the line;
    # each point links to its run.
    for line in invariants:
        assert line["hovertemplate"] == (
            "%{text} · %{fullData.name} · %{hovertext}<br>%{y:.0%}<extra>%{fullData.name}</extra>"
        )
        tooltips = [
            f"{text} · {line['name']} · {rest}"
            for text, rest in zip(line["text"], line["hovertext"], strict=True)
        ]
        assert tooltips == [
            f"Run #{run.pk} · {line['name']} · v1 · main · "
            + timezone.localtime(run.created).strftime("%Y-%m-%d %H:%M")
            for run in (first, second)
        ]
        assert line["customdata"] == [url("run_detail", first.pk), url("run_detail", second.pk)]
    # The page sends what the invariant lines share once, not once per line: the run's
    # number is in each metric chart and once in the invariant chart.
    assert len(invariants) == 2
    assert len(re.findall(rf"Run #{first.pk}\b", html)) == len(selectors.TREND_METRICS) + 1


@pytest.mark.embedded
def test_trends_filter_by_branch_and_label(two_projects, client_as, make_run, spec_v1):
    main = make_run(spec_v1, labels={"branch": "main", "env": "ci"})
    feature = make_run(spec_v1, labels={"branch": "feature", "env": "ci"})
    nightly = make_run(spec_v1, labels={"branch": "main", "env": "nightly"})
    client = client_as("viewer")

    by_branch = client.get(url("spec_trends", "refund-agent"), {"branch": "main"}).content.decode()
    by_label = client.get(url("spec_trends", "refund-agent"), {"label": "env=ci"}).content.decode()
    both = client.get(
        url("spec_trends", "refund-agent"), {"branch": "main", "label": "env=ci"}
    ).content.decode()

    def runs_in(html: str) -> set[int]:
        return {int(n) for n in re.findall(r'href="/p/mine/runs/(\d+)/">#', html)}

    assert runs_in(by_branch) == {main.pk, nightly.pk}
    assert runs_in(by_label) == {main.pk, feature.pk}
    assert runs_in(both) == {main.pk}
    assert '<option value="feature">' in by_branch and '<option value="main" selected>' in by_branch


def test_trends_split_lines_per_branch_and_mark_versions_and_baselines(
    two_projects, client_as, make_spec, make_run, member, spec_v1
):
    now = timezone.now()
    first = make_run(spec_v1, labels={"branch": "main"}, created=now - timedelta(hours=3))
    feature = make_run(spec_v1, labels={"branch": "feature"}, created=now - timedelta(hours=2))
    v2 = make_spec(two_projects.mine, SPEC_V2)
    later = make_run(v2, labels={"branch": "main"}, created=now - timedelta(hours=1))
    services.baseline_promote(run_id=first.pk, user=member("editor"), name="rel-1")

    html = client_as("viewer").get(url("spec_trends", "refund-agent")).content.decode()

    figure = chart_figure(html, "trend-pass-rate")
    lines = {trace["name"]: trace["customdata"] for trace in figure["data"]}
    assert lines == {
        "main": [url("run_detail", first.pk), url("run_detail", later.pk)],
        "feature": [url("run_detail", feature.pk)],
    }
    marks = [a["text"] for a in figure["layout"]["annotations"]]
    assert marks == ["v2", "baseline rel-1 (main)"]
    assert len(figure["layout"]["shapes"]) == 2
    assert figure["layout"]["shapes"][0]["x0"] == figure["data"][0]["x"][1]  # v2's first run


def test_trends_with_a_bad_label_filter_say_so(two_projects, client_as, make_run, spec_v1):
    make_run(spec_v1)
    response = client_as("viewer").get(url("spec_trends", "refund-agent"), {"label": "nokey"})
    assert response.status_code == 400
    assert (
        "label=&#x27;nokey&#x27;: expected key=value, e.g. env=staging" in response.content.decode()
    )


def test_trends_htmx_returns_the_charts_and_table(two_projects, client_as, make_run, spec_v1):
    make_run(spec_v1, labels={"branch": "main"})
    body = htmx_get(
        client_as("viewer"), url("spec_trends", "refund-agent"), branch="main"
    ).content.decode()
    assert body.lstrip().startswith('<div id="trends"')
    assert (
        "<html" not in body and 'data-chart="trend-resilience"' in body and "1 run on main" in body
    )


def test_trends_without_runs_show_empty_states(two_projects, client_as, spec_v1):
    html = client_as("viewer").get(url("spec_trends", "refund-agent")).content.decode()
    assert "No completed runs match." in html and "application/json" not in html


def test_trend_runs_are_bounded_to_the_newest(two_projects, make_run, spec_v1):
    now = timezone.now()
    runs = [make_run(spec_v1, created=now - timedelta(minutes=10 - n)) for n in range(5)]
    rows = selectors.spec_trend_runs(spec_v1.spec, limit=3)
    assert [row["id"] for row in rows] == [run.pk for run in runs[2:]]  # newest 3, oldest first


def test_trends_query_count_does_not_grow(two_projects, client_as, make_run, spec_v1):
    client = client_as("viewer")
    make_run(spec_v1, labels={"branch": "main"})
    with CaptureQueriesContext(connection) as few:
        client.get(url("spec_trends", "refund-agent"), {"branch": "main"})
    for n in range(15):
        make_run(spec_v1, labels={"branch": "main" if n % 2 else f"b{n}"})
    with CaptureQueriesContext(connection) as many:
        client.get(url("spec_trends", "refund-agent"), {"branch": "main"})
    # session, user, project, membership, spec, runs, invariant sums, branches, baselines
    assert len(many) == len(few) <= 9


# --- Permissions across roles and projects ----------------------------------------------------

# (url name, method, form, minimum role, status when allowed)
SPEC_ACTIONS = [
    ("spec_list", "get", None, "viewer", 200),
    ("spec_detail", "get", None, "viewer", 200),
    ("spec_diff", "get", None, "viewer", 200),
    ("spec_trends", "get", None, "viewer", 200),
    ("spec_new", "get", None, "editor", 200),
    ("spec_edit", "get", None, "editor", 200),
    ("spec_edit", "post", {"source": SPEC_V2}, "editor", 302),
    ("spec_new", "post", {"source": SPEC_YAML.replace("refund-agent", "newer")}, "editor", 302),
    ("spec_validate", "post", {"source": SPEC_YAML}, "editor", 200),
    ("spec_run", "post", {"replicas": "1"}, "editor", 302),
]


def _action_url(name: str, project: str = "mine", spec: str = "refund-agent") -> str:
    if name in ("spec_list", "spec_new", "spec_validate"):
        return reverse(name, args=[project])
    return reverse(name, args=[project, spec])


@pytest.mark.parametrize("role", ALL_ROLES)
@pytest.mark.parametrize(("name", "method", "form", "minimum", "allowed"), SPEC_ACTIONS)
def test_spec_pages_and_actions_by_role(
    two_projects, client_as, spec_v1, role, name, method, form, minimum, allowed
):
    client = client_as(role)
    target = _action_url(name)

    response = getattr(client, method)(target, form or {})
    fragment = getattr(client, method)(target, form or {}, HTTP_HX_REQUEST="true")

    if role == "outsider":
        expected = 404
    elif RANK[role] < RANK[minimum]:
        expected = 403
    else:
        expected = allowed
    assert response.status_code == expected
    if expected == 302:
        assert fragment.status_code == 200 and "HX-Redirect" in fragment
    else:
        assert fragment.status_code == expected
    writes = name in ("spec_edit", "spec_new", "spec_run") and method == "post"
    if writes and expected == 403:
        assert SpecVersion.objects.count() == 1 and not Run.objects.exists()


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("name", "method", "form", "minimum", "allowed"), SPEC_ACTIONS)
def test_another_projects_spec_is_a_404(
    two_projects, client_as, make_spec, role, name, method, form, minimum, allowed
):
    make_spec(two_projects.mine)
    make_spec(two_projects.other, source=SPEC_YAML.replace("refund-agent", "secret-agent"))
    client = client_as(role)

    through_mine = getattr(client, method)(_action_url(name, spec="secret-agent"), form or {})
    in_other = getattr(client, method)(
        _action_url(name, project="other", spec="secret-agent"), form or {}
    )

    assert in_other.status_code == 404
    if name not in ("spec_list", "spec_new", "spec_validate"):  # a spec in the URL
        # Like a spec that does not exist; a role too low is refused before any lookup.
        assert through_mine.status_code == (404 if RANK[role] >= RANK[minimum] else 403)
        if through_mine.status_code == 404 and method == "get":
            # The same words as for a spec that does not exist, naming the one asked for.
            assert through_mine.context["exception"] == "No spec 'secret-agent' in this project."
    assert not Run.objects.exists()
    assert not Spec.objects.filter(project=two_projects.other).exclude(slug="secret-agent").exists()


def test_spec_pages_need_login(two_projects, spec_v1):
    response = Client().get(url("spec_detail", "refund-agent"))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
