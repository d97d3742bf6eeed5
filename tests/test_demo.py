"""The README's first command: the demo loads the example specs and a user who can log in."""

from __future__ import annotations

import pytest
from django.test import Client

from evaluations.models import SpecVersion
from evaluations.services import demo_load

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def test_demo_load_stores_every_example_spec_once_and_the_demo_user_can_log_in() -> None:
    first = demo_load()
    second = demo_load()
    assert any(line.startswith("demo spec calculator-fix v1") for line in first)
    assert SpecVersion.objects.filter(spec__slug="calculator-fix").count() == 1
    assert all("v1" in line for line in second if line.startswith("demo spec"))

    client = Client()
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b"Log in" in page.content
    response = client.post("/accounts/login/", {"username": "demo", "password": "demo"})
    assert response.status_code == 302
    home = client.get("/")
    assert home.status_code == 302 and home["Location"] == "/p/default/"
    assert client.get("/admin/evaluations/run/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_demo_spec_started_from_the_web_finds_its_relative_files() -> None:
    """calculator-fix copies `../agents/shell_agent` into the workspace: a run started in the
    browser (no spec directory given) must resolve it against examples/specs/."""
    from evaluations.models import Execution, Run

    demo_load()
    client = Client()
    client.login(username="demo", password="demo")
    response = client.post("/p/default/specs/calculator-fix/run/", {"replicas": "1"})
    assert response.status_code == 302
    run = Run.objects.get(spec__slug="calculator-fix")
    assert run.options["spec_dir"].endswith("examples/specs")
    run.refresh_from_db()
    assert run.status == "completed"
    executions = list(Execution.objects.filter(run=run))
    assert executions and all(e.status in {"success", "failed"} for e in executions), [
        (e.status, e.error) for e in executions
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_demo_starts_with_a_history_worth_looking_at_made_by_running_the_specs() -> None:
    """Issue 19: after seeding, the demo has a baseline, a regression against it, a flaky
    scenario and review items waiting, all from really running the demo specs."""
    from evaluations.models import Baseline, Execution, ReviewItem, ReviewStatus, Run, RunStatus
    from evaluations.selectors.regressions import project_regressions
    from evaluations.services import demo_runs_seed, project_default

    demo_load()
    lines = demo_runs_seed()
    assert len(lines) == 5, lines
    assert demo_runs_seed() == []  # once
    runs = list(Run.objects.select_related("spec", "spec_version").order_by("pk"))
    assert [(r.spec.slug, r.branch) for r in runs] == [
        ("calculator-fix", "main"),
        ("calculator-fix", "feature/tidy"),
        ("support-agent-python", "main"),
        ("refund-agent", "main"),
        ("calculator-fix", "main"),
    ]
    assert all(r.status == RunStatus.COMPLETED for r in runs), [r.status for r in runs]
    # Really run: every planned execution ran, none could not start.
    for run in runs:
        statuses = set(Execution.objects.filter(run=run).values_list("status", flat=True))
        assert statuses and "error" not in statuses and "pending" not in statuses, (run, statuses)

    baseline = Baseline.objects.get(active=True)
    assert baseline.run_id == runs[0].pk and baseline.spec.slug == "calculator-fix"

    regressions = project_regressions(project_default())
    assert [(r.spec_slug, r.run_id) for r in regressions] == [("calculator-fix", runs[4].pk)]
    assert runs[4].spec_version.number == 2  # the agent's release 2

    flaky = [g for g in runs[4].summary["groups"] if g["status"] == "flaky"]
    assert flaky and all(g["prompt_index"] == 0 for g in flaky), runs[4].summary["groups"]

    waiting = ReviewItem.objects.filter(run=runs[3], status=ReviewStatus.OPEN)
    assert waiting.exists()
