"""Finalising a run once every execution has finished: deferred checks, scores, gates,
exit code, the review items for the judge's scores, then the alert rules (a task)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from checks.results import JUDGE_CHECK_TYPES
from checks.scoring import score_execution, score_run
from checks.spec.model import Spec as EngineSpec
from evaluations import queue
from evaluations.models import (
    CheckResult,
    Execution,
    ExecutionStatus,
    ResultSource,
    Run,
    RunStatus,
)
from evaluations.selectors.records import execution_record as execution_record_of
from evaluations.selectors.records import run_records
from evaluations.selectors.reviews import review_kappa
from evaluations.services.reviews import review_items_select
from evaluations.services.runs import engine_spec


def run_finalize(*, run_id: int) -> Run:
    """Scores, gates, verdict and exit code of a run, from its stored results (idempotent)."""

    run = Run.objects.select_related("spec_version").get(pk=run_id)
    if run.status == RunStatus.CANCELLED:
        return run
    spec = engine_spec(run)
    _evaluate_deferred(run, spec)
    records = run_records(run)
    # The kappa gate needs people's grades of this run's judge (a query), so only then.
    kappa = run_review_kappa(run) if "judge_human_kappa_min" in spec.gates else None
    summary = score_run(spec, records, kappa=kappa)
    composites = [e.composite for e in summary.executions]
    run.summary = summary.to_dict()
    run.cost_usd = summary.metrics.total_cost_usd
    run.p95_duration_ms = summary.metrics.p95_duration_ms
    run.judge_mean = summary.metrics.judge_mean
    run.composite = sum(composites) / len(composites) if composites else None
    run.pass_rate = summary.pass_rate
    run.resilience = summary.resilience.score
    run.overall = summary.overall
    run.gate_passed = summary.exit_code == 0
    run.exit_code = summary.exit_code
    run.warnings = sorted(set(run.warnings) | set(summary.warnings))
    run.status = RunStatus.COMPLETED
    # A run rescored after a review keeps the time it really finished.
    run.finished = run.finished or timezone.now()
    run.save()
    review_items_select(run_id=run.pk)
    queue.alerts_evaluate_later(run.pk)
    return run


def run_finalize_if_done(*, run_id: int) -> None:
    """Finalize a planned run with nothing left to execute (also a run with no executions)."""
    run = Run.objects.only("status", "executions_done", "execution_count").get(pk=run_id)
    if run.status == RunStatus.RUNNING and run.executions_done >= run.execution_count:
        if Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
            status=RunStatus.FINALIZING
        ):
            run_finalize(run_id=run_id)
    elif run.status == RunStatus.FINALIZING:
        run_finalize(run_id=run_id)


# behavior_unchanged with `baseline: auto`, and `drift`, compare an execution's output with
# the no-chaos output of the same prompt. Workers finish executions in any order, so these
# checks do not run with the execution: they run in run_finalize, when every execution of
# the run has finished and the reference is known (the lowest no-chaos replica that
# succeeded). One place, no waiting worker, and the same answer whatever the order was.


def deferred_invariants(spec: EngineSpec) -> set[str]:
    return {
        invariant.id
        for invariant in spec.invariants.values()
        if invariant.check_type == "drift"
        or (
            invariant.check_type == "behavior_unchanged"
            and str(invariant.check.get("baseline", "auto")) == "auto"
        )
    }


def _evaluate_deferred(run: Run, spec: EngineSpec) -> None:
    """Check the deferred invariants of every finished execution (idempotent: the unique
    constraint keeps the first result) and rescore the executions that got results."""
    from evaluations.judge import judge_for_run

    deferred = deferred_invariants(spec)
    if not deferred:
        return
    with judge_for_run(run) as judge:  # drift by judge or embedding asks the run's judge
        _evaluate_deferred_with(run, spec, deferred, judge)


def _evaluate_deferred_with(run: Run, spec: EngineSpec, deferred: set[str], judge: Any) -> None:
    from checks.artifact import RunArtifact
    from checks.context import CheckContext
    from checks.engine import evaluate
    from evaluations.runner.harness import scenario_named

    executions = list(
        Execution.objects.filter(run=run)
        .exclude(status__in=[ExecutionStatus.PENDING, ExecutionStatus.RUNNING])
        .order_by("id")
    )
    references: dict[int, str] = {}
    for execution in sorted(executions, key=lambda e: (e.replica, e.pk)):
        if execution.pillar == "contract" and execution.status == ExecutionStatus.SUCCESS:
            references.setdefault(execution.prompt_index, execution.final_output)
    done = set(
        CheckResult.objects.filter(run=run, invariant_id__in=deferred).values_list(
            "execution_id", "invariant_id"
        )
    )
    for execution in executions:
        wanted = [
            spec.invariants[i]
            for i in execution.plan.get("invariant_ids") or []
            if i in deferred and (execution.pk, i) not in done
        ]
        if not wanted or execution.error == "cancelled" or execution.pillar == "replay":
            continue
        if execution.status == ExecutionStatus.ERROR and not execution.final_output:
            continue  # the agent never ran: scoring already counts the execution as failed
        artifact = RunArtifact(final_output=execution.final_output, status=execution.status)
        context = CheckContext(
            prompt=execution.prompt,
            scenario=execution.scenario,
            baseline_output=references.get(execution.prompt_index),
            judge=judge,
        )
        results = evaluate(artifact, wanted, context, scenario_named(spec, execution.scenario))
        with transaction.atomic():
            CheckResult.objects.bulk_create(
                [CheckResult.from_engine(r, execution=execution) for r in results],
                ignore_conflicts=True,
            )
            record = execution_record_of(execution)
            score = score_execution(record, pass_threshold=spec.scoring.pass_threshold)
            Execution.objects.filter(pk=execution.pk).update(
                composite=score.composite, passed=score.passed
            )


def run_review_kappa(run: Run) -> float | None:
    """Judge-human kappa for the judge this run used (the models of its judge results),
    over the spec's completed reviews; None when there is nothing to measure."""
    from django.db.models.fields.json import KeyTextTransform, KeyTransform

    rows = (
        CheckResult.objects.filter(run=run, check_type__in=JUDGE_CHECK_TYPES)
        .exclude(source=ResultSource.HUMAN)
        .annotate(
            nested=KeyTextTransform("model", KeyTransform("judge", "details")),
            flat=KeyTextTransform("model", "details"),
        )
        .values_list("nested", "flat")
        .distinct()
    )
    models = {nested or flat for nested, flat in rows if nested or flat}
    return review_kappa(project_id=run.project_id, spec_id=run.spec_id, judge_models=models)
