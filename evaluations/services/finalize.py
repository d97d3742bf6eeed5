"""Finalising a run once every execution has finished: deferred checks, scores, gates,
exit code, the review items for the judge's scores, then the alert rules (a task)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from checks.results import JUDGE_CHECK_TYPES
from checks.scoring import score_execution, score_run
from checks.spec.model import Spec as EngineSpec
from evaluations import queue
from evaluations.models import (
    AlertEvaluation,
    AlertRule,
    Baseline,
    BaselineCell,
    CheckResult,
    Execution,
    ExecutionStatus,
    ResultSource,
    Run,
    RunStatus,
    summary_invariant_counts,
)
from evaluations.selectors.baselines import active_baseline_for
from evaluations.selectors.records import execution_record as execution_record_of
from evaluations.selectors.records import run_records
from evaluations.selectors.regressions import compared_verdicts, summary_failing_keys
from evaluations.services.runs import engine_spec


def run_finalize(*, run_id: int) -> Run:
    """Scores, gates, verdict and exit code of a run, from its stored results (idempotent)."""

    run = Run.objects.select_related("spec_version").get(pk=run_id)
    if run.status == RunStatus.CANCELLED:
        return run
    spec = engine_spec(run)
    _evaluate_deferred(run, spec)
    # The kappa gate needs people's grades of this run's judge (a query), so only then.
    kappa = run_review_kappa(run) if "judge_human_kappa_min" in spec.gates else None
    summary = score_run(spec, run_records(run), kappa=kappa)
    # Every execution's record, results included, serves the scoring only (no report is
    # written here): let them go before the summary's JSON is built and stored, which
    # would otherwise peak on top of them.
    summary.records = []
    composites = [e.composite for e in summary.executions]
    # Without each execution's score: those are the executions' own rows (and a report or
    # an export scores them again). The list was 95 % of a 1,000-execution run's summary,
    # read whole wherever the run was (a baseline's promotion, a rerun of failed groups).
    run.summary = summary.to_dict(per_execution=False)
    run.invariant_counts = summary_invariant_counts(run.summary)
    run.failing_keys = summary_failing_keys(run.summary)
    run.verdicts = compared_verdicts(run.summary)
    run.cost_usd = summary.metrics.total_cost_usd
    run.p95_duration_ms = summary.metrics.p95_duration_ms
    run.judge_mean = summary.metrics.judge_mean
    run.composite = sum(composites) / len(composites) if composites else None
    run.pass_rate = summary.pass_rate
    run.resilience = summary.resilience.score
    run.overall = summary.overall
    run.gate_passed = summary.exit_code == 0
    run.exit_code = summary.exit_code
    run.warnings = sorted(set(run.warnings) | set(summary.warnings) | _no_baseline_warning(run))
    run.status = RunStatus.COMPLETED
    # A run rescored after a review keeps the time it really finished.
    run.finished = run.finished or timezone.now()
    run.save()
    if any(i.check_type in JUDGE_CHECK_TYPES for i in spec.invariants.values()):
        # Only a judge's results are queued for review; without a judge there is nothing to
        # queue, and a `keystone run` need not import the review queue (84 M instructions).
        from evaluations.services.reviews import review_items_select

        review_items_select(run_id=run.pk)
    if AlertRule.objects.filter(project_id=run.project_id, enabled=True).exists():
        queue.alerts_evaluate_later(run.pk)
    else:
        # Nothing to evaluate: no task to send (nor, in `keystone run`, the alerts to import).
        # Recorded as evaluated, as the task would have, so the sweep never evaluates this
        # run later against a rule made or enabled since.
        AlertEvaluation.objects.get_or_create(run=run)
    return run


def _no_baseline_warning(run: Run) -> set[str]:
    """Drift measured against nothing passes flagged `no_baseline`; the run page says so, so
    nobody reads those passes as "unchanged"."""
    unmeasured = CheckResult.objects.filter(
        run=run, check_type__in=("drift", "behavior_unchanged"), details__flag="no_baseline"
    ).count()
    if not unmeasured:
        return set()
    return {
        f"{unmeasured} drift result(s) had no baseline to compare with and passed flagged "
        "no_baseline: promote a run of this spec to a baseline (for this branch or main)."
    }


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


# behavior_unchanged and `drift` compare an execution's output with a reference: the no-chaos
# output of the same prompt in this run (`baseline: auto`, and drift without `baseline`), or
# the matching cell (same execution key: scenario, prompt, replica) of a promoted baseline
# (`baseline: active` for the run's branch, falling back to main's, or a baseline's name).
# Workers finish executions in any order, so these checks do not run with the execution:
# they run in run_finalize, when every execution of the run has finished and the reference
# is known. One place, no waiting worker, and the same answer whatever the order was.
# behavior_unchanged with a literal text is deferred too: whether `baseline` names a
# promoted baseline is only known from the database.


def deferred_invariants(spec: EngineSpec) -> set[str]:
    return {
        invariant.id
        for invariant in spec.invariants.values()
        if invariant.check_type in ("drift", "behavior_unchanged")
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


@dataclass(slots=True)
class _StoredReference:
    """A promoted baseline an invariant compares with, and its cells by execution key."""

    name: str
    cells: dict[str, tuple[str, list[dict[str, Any]]]]


def _stored_references(
    run: Run, spec: EngineSpec, deferred: set[str]
) -> dict[str, _StoredReference | None]:
    """Per invariant compared with a stored baseline (`active` or a name; every drift check,
    `active` when it names none): the baseline's cells, or None when there is none (the
    check then passes flagged no_baseline). A behavior_unchanged `baseline` that names no
    baseline is its reference text and is left out."""
    wanted: dict[str, str] = {}
    for invariant_id in deferred:
        invariant = spec.invariants[invariant_id]
        reference = str(invariant.check.get("baseline") or "")
        if invariant.check_type == "behavior_unchanged" and reference in ("", "auto"):
            continue  # compared with the same run's no-chaos output
        if invariant.check_type == "drift" and not reference:
            # Drift is always against a baseline (SPEC_FORMAT, reference 004): by default the
            # active one for the run's branch, falling back to the spec's default.
            reference = "active"
        if reference:
            wanted[invariant_id] = reference
    found: dict[str, Baseline | None] = {}
    for reference in set(wanted.values()):
        if reference == "active":
            found[reference] = active_baseline_for(run.spec_id, run.branch)
        else:
            found[reference] = (
                Baseline.objects.filter(spec_id=run.spec_id, name=reference)
                .order_by("-active", "-created", "-id")
                .first()
            )
    loaded: dict[int, _StoredReference] = {}
    for baseline in found.values():
        if baseline is not None and baseline.pk not in loaded:
            rows = BaselineCell.objects.filter(baseline=baseline).values_list(
                "key", "final_output", "tool_sequence"
            )
            loaded[baseline.pk] = _StoredReference(
                baseline.name, {key: (output, tools) for key, output, tools in rows}
            )
    references: dict[str, _StoredReference | None] = {}
    for invariant_id, reference in wanted.items():
        baseline = found[reference]
        is_text = spec.invariants[invariant_id].check_type == "behavior_unchanged"
        if baseline is None and is_text and reference != "active":
            continue  # not a baseline's name: the reference text itself
        references[invariant_id] = loaded[baseline.pk] if baseline is not None else None
    return references


def _evaluate_deferred_with(run: Run, spec: EngineSpec, deferred: set[str], judge: Any) -> None:
    from checks.artifact import RunArtifact, ToolCall
    from checks.context import CheckContext
    from checks.engine import evaluate
    from evaluations.runner.harness import scenario_named

    executions = list(
        Execution.objects.filter(run=run)
        .exclude(status__in=[ExecutionStatus.PENDING, ExecutionStatus.RUNNING])
        .order_by("id")
    )
    in_run: dict[int, Execution] = {}
    for execution in sorted(executions, key=lambda e: (e.replica, e.pk)):
        if execution.pillar == "contract" and execution.status == ExecutionStatus.SUCCESS:
            in_run.setdefault(execution.prompt_index, execution)
    stored = _stored_references(run, spec, deferred)
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
        artifact = RunArtifact(
            final_output=execution.final_output,
            status=execution.status,
            tool_calls=[
                ToolCall(name=str(c.get("name", "")), arguments=c.get("arguments") or {})
                for c in execution.tool_sequence
            ],
        )
        scenario = scenario_named(spec, execution.scenario)
        results = []
        # One context per reference: the invariants comparing with one baseline share it.
        by_reference: dict[int, list[Any]] = defaultdict(list)
        for invariant in wanted:
            by_reference[id(stored.get(invariant.id, _IN_RUN))].append(invariant)
        for invariants in by_reference.values():
            reference = stored.get(invariants[0].id, _IN_RUN)
            context = CheckContext(
                prompt=execution.prompt, scenario=execution.scenario, judge=judge
            )
            if reference is _IN_RUN:
                same_run = in_run.get(execution.prompt_index)
                if same_run is not None:
                    context.baseline_output = same_run.final_output
                    context.baseline_tool_calls = same_run.tool_sequence
            elif isinstance(reference, _StoredReference):
                context.baseline_name = reference.name
                cell = reference.cells.get(execution.key)
                if cell is not None:
                    context.baseline_output, context.baseline_tool_calls = cell
            results.extend(evaluate(artifact, invariants, context, scenario))
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


_IN_RUN = object()  # the reference is the no-chaos output of the same run


def run_review_kappa(run: Run) -> float | None:
    """Judge-human kappa for the judge this run used (the models of its judge results),
    over the spec's completed reviews; None when there is nothing to measure."""
    from django.db.models.fields.json import KeyTextTransform, KeyTransform

    from evaluations.selectors.reviews import review_kappa

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
