"""Fixtures for dashboard view tests: two projects, people of every role, specs and runs.

    def test_x(two_projects, member, client_as, make_spec, make_run): ...

- `two_projects`: (mine, other). Pages are tested in `mine`; `other` holds look-alike rows
  that must stay invisible (a 404) to members of `mine`.
- `member(role, project=None)`: a new user with that role in `mine` (or `project`).
  `member("outsider")` is an admin of `other` but not a member of `mine`.
- `client_as(role, project=None)`: a test Client logged in as `member(role, project)`.
- `make_spec(project, source=SPEC_YAML, author=None)`: a SpecVersion through the real
  service (validated, numbered).
- `make_run(version, failing=(), **columns)`: a completed Run whose summary comes from the
  real scoring engine (`score_run`) over synthetic records of the spec's plan; `failing`
  lists invariant ids, or (scenario, invariant id) pairs, that fail in every replica.
  Other keyword arguments set Run columns (status, created, branch, labels, ...).

ROLES lists the member roles; ALL_ROLES adds "outsider" for permission tables.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import pytest
from django.test import Client

from checks.planning import plan_run
from checks.report_model import ExecutionRecord
from checks.results import CheckResult as EngineResult
from checks.results import FailureCode
from checks.scoring import score_run
from checks.spec.model import Spec as EngineSpec
from evaluations import services
from evaluations.models import (
    Membership,
    Project,
    Role,
    Run,
    RunStatus,
    SpecVersion,
    summary_invariant_counts,
)
from evaluations.selectors.regressions import compared_verdicts, summary_failing_keys

ROLES = ["viewer", "reviewer", "editor", "admin"]
ALL_ROLES = [*ROLES, "outsider"]

# Two prompts x two scenarios; one critical invariant and one of medium severity.
SPEC_YAML = """\
version: 1
id: refund-agent
description: "Refunds orders"
task:
  prompts: ["Refund order 1042", "Refund order 7"]
agent: {type: command, command: "echo refunded"}
llm: {provider: scripted, rules: [{reply: {content: refunded}}]}
chaos_matrix:
  - name: no-chaos
  - name: llm-degraded
    llm_faults:
      - {mode: truncated_response, max_tokens: 20}
invariants:
  says_refunded:
    description: "Mentions the refund"
    severity: critical
    check: {type: contains, value: refunded}
  short_answer:
    description: "Short answer"
    check: {type: max_length, max: 200}
"""


class TwoProjects(NamedTuple):
    mine: Project
    other: Project


@pytest.fixture
def two_projects(db: None) -> TwoProjects:
    return TwoProjects(
        mine=Project.objects.create(name="Mine", slug="mine"),
        other=Project.objects.create(name="Other", slug="other"),
    )


@pytest.fixture
def member(two_projects: TwoProjects, django_user_model: Any) -> Callable[..., Any]:
    counter = itertools.count(1)

    def make(role: str, project: Project | None = None) -> Any:
        user = django_user_model.objects.create_user(
            username=f"{role}-{next(counter)}", password="pw-123456"
        )
        if role == "outsider":
            Membership.objects.create(project=two_projects.other, user=user, role=Role.ADMIN)
        else:
            Membership.objects.create(
                project=project or two_projects.mine, user=user, role=Role(role)
            )
        return user

    return make


@pytest.fixture
def client_as(member: Callable[..., Any]) -> Callable[..., Client]:
    def make(role: str, project: Project | None = None) -> Client:
        client = Client()
        client.force_login(member(role, project))
        return client

    return make


@pytest.fixture
def make_spec(db: None) -> Callable[..., SpecVersion]:
    def make(project: Project, source: str = SPEC_YAML, author: Any = None) -> SpecVersion:
        return services.spec_version_create(project=project, source_yaml=source, author=author)

    return make


def scored_summary(
    version: SpecVersion, failing: Iterable[str | tuple[str, str]] = ()
) -> dict[str, Any]:
    """The summary score_run gives for one execution per planned cell, where the invariants
    in `failing` fail (everywhere, or in one scenario) and every other one passes."""
    spec = EngineSpec.from_dict(version.parsed)
    failing = set(failing)
    records = []
    for index, planned in enumerate(plan_run(spec)):
        results = []
        for invariant_id in planned.invariant_ids:
            invariant = spec.invariants[invariant_id]
            failed = invariant_id in failing or (planned.scenario, invariant_id) in failing
            results.append(
                EngineResult(
                    invariant_id=invariant_id,
                    check_type=invariant.check_type,
                    passed=not failed,
                    score=0.0 if failed else 1.0,
                    failure_code=FailureCode.CONTAINS_FAILED if failed else None,
                    severity=invariant.severity,
                    weight=invariant.weight,
                    gate=invariant.gate,
                )
            )
        records.append(
            ExecutionRecord(
                id=str(index),
                scenario=planned.scenario,
                prompt_index=planned.prompt_index,
                prompt=planned.prompt,
                replica=planned.replica,
                pillar=planned.pillar,
                duration_ms=100.0 + 10 * index,
                cost_usd=0.001,
                results=results,
            )
        )
    return score_run(spec, records).to_dict(per_execution=False)


@pytest.fixture
def make_run(db: None) -> Callable[..., Run]:
    def make(
        version: SpecVersion, failing: Iterable[str | tuple[str, str]] = (), **columns: Any
    ) -> Run:
        labels = columns.pop("labels", {})
        values: dict[str, Any] = {
            "project": version.spec.project,
            "spec": version.spec,
            "spec_version": version,
            "labels": labels,
            "branch": labels.get("branch", ""),
        }
        if columns.get("status", RunStatus.COMPLETED) == RunStatus.COMPLETED:
            # The columns run_finalize writes, from the summary.
            summary = scored_summary(version, failing)
            values.update(
                status=RunStatus.COMPLETED,
                summary=summary,
                invariant_counts=summary_invariant_counts(summary),
                failing_keys=summary_failing_keys(summary),
                verdicts=compared_verdicts(summary),
                pass_rate=summary["pass_rate"],
                resilience=summary["resilience"]["score"],
                overall=summary["overall"],
                composite=summary["overall"],
                gate_passed=summary["exit_code"] == 0,
                exit_code=summary["exit_code"],
                cost_usd=summary["metrics"]["total_cost_usd"],
                p95_duration_ms=summary["metrics"]["p95_duration_ms"],
                judge_mean=0.8,
                execution_count=summary["metrics"]["executions"],
                executions_done=summary["metrics"]["executions"],
            )
        values.update(columns)
        return Run.objects.create(**values)

    return make
