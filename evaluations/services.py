"""Writes: every change to Keystone's rows goes through one of these functions.

Naming follows `<entity>_<action>`; tasks, views, the API and the CLI call these and hold
no domain logic of their own. The execution lifecycle is:

run_create -> run_plan (Execution rows) -> execution_execute (claim, harness, record)
-> run_finalize (scores, gates, exit code), with execution_requeue_expired for dead workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.db.models import Avg, F, Min, Q, Sum
from django.db.models.functions import Substr
from django.utils import timezone

from checks.context import SecurityPolicy
from checks.planning import (
    PlannedExecution,
    execution_seed,
    plan_run,
    select_planned,
    validate_selection,
)
from checks.report_model import ExecutionRecord
from checks.results import ERROR_CODES, JUDGE_CHECK_TYPES, FailureCode
from checks.scoring import score_execution, score_run
from checks.spec import SpecValidationError, validate_spec_text
from checks.spec.model import Spec as EngineSpec
from evaluations.models import (
    ApiToken,
    Artifact,
    ArtifactKind,
    Baseline,
    CheckResult,
    Execution,
    ExecutionStatus,
    Membership,
    Project,
    ResultChange,
    ResultSource,
    ReviewItem,
    ReviewReason,
    ReviewStatus,
    ReviewVerdict,
    Role,
    Run,
    RunStatus,
    Spec,
    SpecVersion,
    Trigger,
    sha256_hex,
)

logger = logging.getLogger(__name__)


class InfrastructureError(Exception):
    """Something outside the agent failed (a database server, the Docker engine): retry later."""


# --- Specs --------------------------------------------------------------------------------


def spec_version_create(
    *,
    project: Project,
    source_yaml: str,
    author: Any = None,
    source_name: str = "spec.yaml",
    base_dir: str = "",
) -> SpecVersion:
    """Validate and store a spec's text. The same text again returns the existing version;
    a changed text under the same `id` becomes version N+1. Invalid text is never stored."""
    data, errors = validate_spec_text(source_yaml, source=source_name)
    if errors or data is None:
        raise SpecValidationError(errors, source_name)
    content_hash = sha256_hex(source_yaml)
    with transaction.atomic():
        spec, _ = Spec.objects.get_or_create(
            project=project, slug=data["id"], defaults={"name": data.get("description", "")[:200]}
        )
        # Lock the spec row so two uploads cannot take the same version number.
        Spec.objects.select_for_update().filter(pk=spec.pk).first()
        existing = spec.versions.filter(content_hash=content_hash).order_by("-number").first()
        latest = spec.latest_version()
        if existing is not None and latest is not None and existing.pk == latest.pk:
            return existing
        number = (latest.number if latest else 0) + 1
        return SpecVersion.objects.create(
            spec=spec,
            number=number,
            source_yaml=source_yaml,
            parsed=data,
            author=author,
            base_dir=base_dir,
        )


# --- Runs ---------------------------------------------------------------------------------


def run_create(
    *,
    spec_version: SpecVersion,
    trigger: str = Trigger.WEB,
    labels: dict[str, str] | None = None,
    replicas: int | None = None,
    scenarios: list[str] | None = None,
    spec_dir: str | None = None,
    seed: int = 0,
    created_by: Any = None,
    enqueue: bool = True,
    only: list[dict[str, Any]] | None = None,
    judge_cache: bool = True,
) -> Run:
    """A queued run; its planning is handed to a worker once the row is committed.
    `only` keeps part of the plan (checks.planning.select_planned): the failed groups of an
    earlier run, or the one execution a reproducer command names. `judge_cache=False` makes
    the run's judge neither read nor write cached verdicts."""
    labels = {str(k): str(v) for k, v in (labels or {}).items()}
    if scenarios:
        known = {
            s["name"] for s in spec_version.parsed.get("chaos_matrix") or [{"name": "no-chaos"}]
        }
        unknown = [name for name in scenarios if name not in known]
        if unknown:
            raise ValueError(
                f"unknown scenario {unknown[0]!r}; the spec has: {', '.join(sorted(known))}"
            )
    options: dict[str, Any] = {
        "scenarios": scenarios or [],
        # Relative files resolve against the directory given for this run, else the one
        # the version was read from.
        "spec_dir": spec_dir or spec_version.base_dir,
        "seed": seed,
    }
    if not judge_cache:
        options["judge_cache"] = False
    if only is not None:
        options["only"] = _checked_selection(spec_version, only, replicas, scenarios)
    run = Run.objects.create(
        project=spec_version.spec.project,
        spec=spec_version.spec,
        spec_version=spec_version,
        trigger=trigger,
        labels=labels,
        git_sha=labels.get("git_sha", ""),
        branch=labels.get("branch", ""),
        replicas_override=replicas,
        options=options,
        created_by=created_by,
    )
    # Under `keystone serve` on the embedded default, the polling worker picks queued runs
    # up; an eager task here would run the whole evaluation inside the web request.
    if enqueue and not settings.KEYSTONE_EMBEDDED_WORKER:
        from evaluations import tasks

        transaction.on_commit(lambda: tasks.run_plan.delay(run.pk))
    return run


def _checked_selection(
    spec_version: SpecVersion,
    only: list[dict[str, Any]],
    replicas: int | None,
    scenarios: list[str] | None,
) -> list[dict[str, Any]]:
    """A selection that keeps at least one execution of this spec: a run that would plan
    nothing is refused when it is asked for, not discovered empty later."""
    selection = validate_selection(only)
    # Mutants and replay sessions are generated when the run is planned (maybe by a model),
    # so only selectors of the scenario x prompt matrix are checked here.
    matrix = [s for s in selection if s.get("pillar") not in ("mutation", "replay")]
    if not matrix:
        return selection
    plan = plan_run(
        EngineSpec.from_dict(spec_version.parsed), replicas=replicas, scenarios=scenarios or None
    )
    if not select_planned(plan, matrix):
        described = "; ".join(
            ", ".join(f"{name}={value}" for name, value in selector.items())
            for selector in selection
        )
        raise ValueError(f"no execution of this spec matches the selection ({described})")
    return selection


def engine_spec(run: Run) -> EngineSpec:
    return EngineSpec.from_dict(run.spec_version.parsed)


def run_plan(*, run_id: int) -> list[int]:
    """Create the run's Execution rows (once, whatever the number of calls) and return the
    ids still to execute."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("spec_version").get(pk=run_id)
        if run.status == RunStatus.QUEUED:
            spec = engine_spec(run)
            mutants, sessions, warnings = _pillar_inputs(run, spec)
            planned = plan_run(
                spec,
                replicas=run.replicas_override,
                scenarios=run.options.get("scenarios") or None,
                mutations=mutants,
                replay_sessions=sessions,
            )
            planned = select_planned(planned, run.options.get("only"))
            rows = [_execution_row(run, p) for p in planned]
            Execution.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
            run.execution_count = run.executions.count()
            run.status = RunStatus.RUNNING
            run.started = timezone.now()
            run.warnings = [*run.warnings, *(w for w in warnings if w not in run.warnings)]
            run.save(update_fields=["execution_count", "status", "started", "warnings"])
    return list(
        Execution.objects.filter(run_id=run_id, status=ExecutionStatus.PENDING)
        .order_by("id")
        .values_list("id", flat=True)
    )


def _pillar_inputs(
    run: Run, spec: EngineSpec
) -> tuple[list[tuple[int, str, int, str]], list[dict[str, Any]], list[str]]:
    """The mutants and replay sessions of a run, and warnings. A run limited to some
    scenarios (`--scenario`) runs only those: the mutation and replay pillars belong to
    full runs."""
    from evaluations.runner.mutations import plan_mutants
    from evaluations.runner.replay import plan_sessions

    selection = run.options.get("only") or []
    reproduces_extra = any(s.get("pillar") in ("mutation", "replay") for s in selection)
    if run.options.get("scenarios") and not reproduces_extra:
        return [], [], []
    run_seed = int(run.options.get("seed", 0))
    mutation_config = spec.raw.get("mutations")
    ask_model = None
    if (mutation_config or {}).get("use_llm") and spec.raw.get("llm"):
        ask_model = _mutation_writer(run, spec)
    mutants, warnings = plan_mutants(
        mutation_config, spec.prompts, run_seed=run_seed, ask_model=ask_model
    )
    sessions, replay_warnings = plan_sessions(
        spec.raw.get("replay"),
        base_dir=run.options.get("spec_dir") or None,
        from_execution=lambda execution_id: execution_replay_session(
            execution_id=execution_id, project_id=run.project_id
        ),
    )
    return mutants, sessions, warnings + replay_warnings


def _mutation_writer(run: Run, spec: EngineSpec) -> Any:
    """`ask_model(prompt, type)` through a gateway on the spec's llm (scripted or upstream,
    the key kept server-side), for `mutations.use_llm`."""
    import openai

    from evaluations.runner.gateway import Gateway
    from evaluations.runner.mutations import generate_with_llm

    llm = spec.raw["llm"]

    def ask(prompt: str, mutation_type: str) -> str:
        with Gateway(llm, secrets=_server_secrets(run)) as gateway:
            return generate_with_llm(
                prompt,
                mutation_type,
                lambda: openai.OpenAI(
                    base_url=gateway.base_url, api_key=gateway.api_key, max_retries=1
                ),
                model=str(llm.get("model") or "gpt-4o-mini"),
            )

    return ask


def _execution_row(run: Run, planned: PlannedExecution) -> Execution:
    return Execution(
        run=run,
        project_id=run.project_id,
        key=planned.key,
        scenario=planned.scenario,
        prompt_index=planned.prompt_index,
        replica=planned.replica,
        invariant_id=planned.isolated_invariant,
        pillar=planned.pillar,
        mutation_type=planned.mutation_type or "",
        prompt=planned.prompt,
        plan=planned.to_dict(),
    )


def run_cancel(*, run_id: int) -> None:
    """Stop a run: nothing pending starts, running sandboxes are stopped by their workers."""
    with transaction.atomic():
        updated = Run.objects.filter(
            pk=run_id, status__in=[RunStatus.QUEUED, RunStatus.PLANNING, RunStatus.RUNNING]
        ).update(status=RunStatus.CANCELLED, finished=timezone.now())
        if updated:
            Execution.objects.filter(run_id=run_id, status=ExecutionStatus.PENDING).update(
                status=ExecutionStatus.ERROR, error="cancelled", finished=timezone.now()
            )


def run_rerun_failed(*, run_id: int, created_by: Any = None, enqueue: bool = True) -> Run:
    """A new run of the same spec version, replicas, scenarios and seed that executes only
    the (scenario x prompt) groups whose verdict failed in the finished run `run_id`, every
    replica of each, so the new run gives those groups a fresh verdict and pass@k."""
    run = Run.objects.select_related("spec_version__spec").get(pk=run_id)
    if run.status != RunStatus.COMPLETED:
        raise ValueError(f"run {run.pk} is {run.status}: only a completed run has verdicts")
    failed = [group for group in run.summary.get("groups") or [] if not group.get("passed")]
    if not failed:
        raise ValueError(f"run {run.pk} has no failed group to re-run")
    selection = [
        {
            "pillar": group["pillar"],
            "scenario": group["scenario"],
            "prompt_index": group["prompt_index"],
            "mutation_type": group.get("mutation_type") or "",
        }
        for group in failed
    ]
    return run_create(
        spec_version=run.spec_version,
        trigger=Trigger.WEB,
        labels={**run.labels, "rerun_of": str(run.pk)},
        replicas=run.replicas_override,
        scenarios=run.options.get("scenarios") or None,
        spec_dir=run.options.get("spec_dir") or None,
        seed=int(run.options.get("seed", 0)),
        created_by=created_by,
        enqueue=enqueue,
        only=selection,
    )


def run_finalize(*, run_id: int) -> Run:
    """Scores, gates, verdict and exit code of a run, from its stored results (idempotent)."""
    from evaluations.selectors import run_records

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


def run_warning_add(*, run_id: int, warning: str) -> None:
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if warning not in run.warnings:
            run.warnings = [*run.warnings, warning]
            run.save(update_fields=["warnings"])


# --- Executions ---------------------------------------------------------------------------


def execution_claim(*, execution_id: int, worker: str) -> bool:
    """Take an execution for this worker: a conditional UPDATE, so exactly one worker wins.
    A running execution whose lease expired (its worker died) can be taken again."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.KEYSTONE_EXECUTION_LEASE_SECONDS)
    active_run = Q(run__status=RunStatus.RUNNING)
    fresh = Execution.objects.filter(active_run, pk=execution_id, status=ExecutionStatus.PENDING)
    if fresh.update(
        status=ExecutionStatus.RUNNING, claimed_by=worker, lease_expires=lease, started=now
    ):
        return True
    expired = Execution.objects.filter(
        active_run, pk=execution_id, status=ExecutionStatus.RUNNING, lease_expires__lt=now
    )
    return bool(
        expired.update(
            claimed_by=worker, lease_expires=lease, started=now, attempt=F("attempt") + 1
        )
    )


def execution_release(*, execution_id: int, worker: str) -> None:
    """Give an execution back after an infrastructure error, so a retry can claim it."""
    Execution.objects.filter(
        pk=execution_id, claimed_by=worker, status=ExecutionStatus.RUNNING
    ).update(status=ExecutionStatus.PENDING, claimed_by="", lease_expires=None)


def harness_config(run: Run) -> Any:
    from evaluations.runner.harness import HarnessConfig

    spec_dir = run.options.get("spec_dir") or ""
    if not spec_dir:
        # A spec written in the browser has no directory of its own. Its relative files
        # resolve in an empty stand-in, never in the server's own state (KEYSTONE_HOME
        # holds the database and artifacts).
        stand_in = Path(settings.KEYSTONE_WORK_DIR) / "spec-without-directory"
        stand_in.mkdir(parents=True, exist_ok=True)
        spec_dir = str(stand_in)
    return HarnessConfig(
        workspaces_root=Path(settings.KEYSTONE_WORK_DIR),
        spec_dir=Path(spec_dir),
        confine_to_spec_dir=not run.options.get("spec_dir"),
        sandbox_backend=settings.KEYSTONE_SANDBOX_BACKEND or None,
        postgres_url=settings.KEYSTONE_POSTGRES_URL or None,
        mysql_url=settings.KEYSTONE_MYSQL_URL or None,
        policy=SecurityPolicy(
            allow_python_hooks=settings.KEYSTONE_ALLOW_PYTHON_HOOKS,
            allow_host_scripts=settings.KEYSTONE_ALLOW_HOST_SCRIPTS,
        ),
        secrets=_server_secrets(run),
    )


def _server_secrets(run: Run) -> dict[str, str]:
    """Only the variables the spec names (its `secrets` and the llm's api_key_env)."""
    import os

    parsed = run.spec_version.parsed
    names = list(parsed.get("secrets") or [])
    for block in ("llm", "judge"):
        key_env = (parsed.get(block) or {}).get("api_key_env")
        if key_env:
            names.append(key_env)
    return {name: os.environ[name] for name in names if name in os.environ}


def execution_execute(*, execution_id: int, worker: str) -> bool:
    """Claim, run and record one execution. False when another worker has it or it is done."""
    from evaluations.judge import judge_for_run
    from evaluations.runner.harness import run_execution
    from evaluations.runner.sandbox import select_backend
    from evaluations.runner.services import ServiceError

    if not execution_claim(execution_id=execution_id, worker=worker):
        return False
    execution = Execution.objects.select_related("run__spec_version").get(pk=execution_id)
    run = execution.run
    spec = engine_spec(run)
    config = harness_config(run)
    preferred = (spec.raw.get("sandbox") or {}).get("backend") or config.sandbox_backend
    sandbox, warning = select_backend(preferred)
    if warning and warning not in run.warnings:
        run_warning_add(run_id=run.pk, warning=warning)
    planned = PlannedExecution(**execution.plan)
    # behavior_unchanged against the no-chaos output is checked when the run is finalised.
    deferred = _deferred_invariants(spec)
    planned.invariant_ids = [i for i in planned.invariant_ids if i not in deferred]
    watcher = _LeaseWatcher(execution_id, worker, sandbox)
    watcher.start()
    try:
        with judge_for_run(run) as judge:
            config.judge = judge
            outcome = run_execution(
                spec,
                planned,
                config,
                execution_key=f"{run.pk}-{execution.pk}",
                # One identity: the row's key seeds the faults (equal to planned.key).
                seed=execution_seed(int(run.options.get("seed", 0)), execution.key),
                baseline_output=_baseline_output(execution),
                sandbox=sandbox,
            )
    except ServiceError as exc:
        execution_release(execution_id=execution_id, worker=worker)
        raise InfrastructureError(str(exc)) from exc
    except Exception as exc:  # the platform failed, not the agent: record it, don't lose the run
        logger.exception("execution %s failed inside Keystone", execution_id)
        execution_record_error(
            execution_id=execution_id, worker=worker, error=f"{type(exc).__name__}: {exc}"
        )
        return True
    finally:
        watcher.stop()
    if watcher.cancelled:
        # The run was cancelled while this execution ran: it ends like the pending ones,
        # not `running` forever with a claim nobody will renew.
        Execution.objects.filter(
            pk=execution_id, claimed_by=worker, status=ExecutionStatus.RUNNING
        ).update(
            status=ExecutionStatus.ERROR,
            error="cancelled",
            finished=timezone.now(),
            lease_expires=None,
        )
        return True
    execution_record(execution_id=execution_id, worker=worker, outcome=outcome, spec=spec)
    return True


class _LeaseWatcher(threading.Thread):
    """Renews the execution's lease while the agent runs, and stops the sandbox when the
    run is cancelled."""

    def __init__(self, execution_id: int, worker: str, sandbox: Any) -> None:
        super().__init__(daemon=True)
        self.execution_id = execution_id
        self.worker = worker
        self.sandbox = sandbox
        self.cancelled = False
        self._stop_event = threading.Event()

    def run(self) -> None:
        from django.db import connection

        interval = max(0.5, settings.KEYSTONE_EXECUTION_LEASE_SECONDS / 3)
        try:
            while not self._stop_event.wait(interval):
                lease = timezone.now() + timedelta(
                    seconds=settings.KEYSTONE_EXECUTION_LEASE_SECONDS
                )
                Execution.objects.filter(pk=self.execution_id, claimed_by=self.worker).update(
                    lease_expires=lease
                )
                if Run.objects.filter(
                    executions=self.execution_id, status=RunStatus.CANCELLED
                ).exists():
                    self.cancelled = True
                    self.sandbox.stop_all()
                    return
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def _baseline_output(execution: Execution) -> str | None:
    """The no-chaos output of the same prompt and replica, for behavior_unchanged (auto)."""
    if execution.pillar != "chaos":
        return None
    reference = (
        Execution.objects.filter(
            run_id=execution.run_id,
            pillar="contract",
            prompt_index=execution.prompt_index,
            status=ExecutionStatus.SUCCESS,
        )
        .order_by("replica")
        .values_list("final_output", flat=True)
        .first()
    )
    return reference


# behavior_unchanged with `baseline: auto` compares a faulted execution's output with the
# no-chaos output of the same prompt. Workers finish executions in any order, so the check
# does not run with the execution: it runs in run_finalize, when every execution of the run
# has finished and the reference is known (the lowest no-chaos replica that succeeded).
# One place, no waiting worker, and the same answer whatever the order was.


def _deferred_invariants(spec: EngineSpec) -> set[str]:
    return {
        invariant.id
        for invariant in spec.invariants.values()
        if invariant.check_type == "behavior_unchanged"
        and str(invariant.check.get("baseline", "auto")) == "auto"
    }


def _evaluate_deferred(run: Run, spec: EngineSpec) -> None:
    """Check the deferred invariants of every finished execution (idempotent: the unique
    constraint keeps the first result) and rescore the executions that got results."""
    from checks.artifact import RunArtifact
    from checks.context import CheckContext
    from checks.engine import evaluate
    from evaluations.runner.harness import scenario_named
    from evaluations.selectors import execution_record as execution_record_of

    deferred = _deferred_invariants(spec)
    if not deferred:
        return
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


# --- Replay files ---------------------------------------------------------------------


def execution_replay_session(*, execution_id: int, project_id: int) -> Any:
    """A replay session (evaluations.runner.replay.ReplaySession) from a stored execution of
    the project: its prompt and the tool answers its agent saw. None if there is none."""
    from checks.artifact import RunArtifact
    from evaluations.runner.replay import session_from_artifact

    execution = Execution.objects.filter(pk=execution_id, project_id=project_id).first()
    if execution is None:
        return None
    stored = Artifact.objects.filter(execution=execution, kind=ArtifactKind.ARTIFACT_JSON).first()
    if stored is None:
        return None
    with stored.file.open("rb") as handle:
        artifact = RunArtifact.from_dict(json.loads(handle.read()))
    return session_from_artifact(
        execution.prompt,
        artifact,
        id=f"run-{execution.run_id}-execution-{execution.pk}",
        context={"scenario": execution.scenario, "replica": execution.replica},
    )


def run_replay_export(*, run_id: int, out_dir: str | Path, failed_only: bool = True) -> list[Path]:
    """Write the run's failed executions (or all with failed_only=False) as replay files,
    one `run-R-execution-E.json` each; executions that kept no artifact are left out."""
    from evaluations.runner.replay import save_session

    run = Run.objects.get(pk=run_id)
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    executions = Execution.objects.filter(run=run).exclude(
        status__in=[ExecutionStatus.PENDING, ExecutionStatus.RUNNING]
    )
    if failed_only:
        executions = executions.exclude(passed=True)
    written = []
    for execution_id in executions.order_by("id").values_list("id", flat=True):
        session = execution_replay_session(execution_id=execution_id, project_id=run.project_id)
        if session is not None:
            written.append(save_session(session, target / f"{session.id}.json"))
    return written


def execution_record(*, execution_id: int, worker: str, outcome: Any, spec: EngineSpec) -> None:
    """Write an execution's results exactly once: only the worker holding the claim writes,
    and the unique constraints refuse a second set of results."""
    artifact = outcome.artifact
    status = artifact.status
    if status == "success" and any(r.failure_code in ERROR_CODES for r in outcome.results):
        status = ExecutionStatus.ERROR
    with transaction.atomic():
        execution = (
            Execution.objects.select_for_update()
            .filter(pk=execution_id, claimed_by=worker, status=ExecutionStatus.RUNNING)
            .first()
        )
        if execution is None:
            return  # another worker took over after our lease expired, and owns the results
        record = ExecutionRecord.from_artifact(
            artifact,
            outcome.results,
            id=str(execution.pk),
            scenario=execution.scenario,
            forbidden_violations=outcome.forbidden_violations,
        )
        score = score_execution(record, pass_threshold=spec.scoring.pass_threshold)
        try:
            with transaction.atomic():
                CheckResult.objects.bulk_create(
                    [
                        CheckResult.from_engine(_storable_result(r), execution=execution)
                        for r in outcome.results
                    ]
                )
        except IntegrityError:
            return
        _store_artifacts(execution, artifact)
        cap = settings.KEYSTONE_FINAL_OUTPUT_MAX_CHARS
        execution.status = status
        execution.composite = score.composite
        execution.passed = score.passed
        execution.finished = timezone.now()
        execution.duration_ms = artifact.duration_ms
        execution.agent_cpu_ms = outcome.agent_cpu_ms
        execution.cost_usd = artifact.cost_usd
        execution.input_tokens = artifact.input_tokens
        execution.output_tokens = artifact.output_tokens
        execution.tool_call_count = len(artifact.all_tool_calls())
        execution.tool_error_count = len(artifact.failed_tool_calls())
        execution.final_output = _storable(artifact.final_output[:cap])
        execution.error = _storable(artifact.error or "")
        execution.forbidden_violations = outcome.forbidden_violations
        execution.lease_expires = None
        execution.save()
        for warning in outcome.warnings:
            if warning:
                run_warning_add(run_id=execution.run_id, warning=warning)
        _count_done(execution.run_id)


def _storable(value: Any) -> Any:
    """PostgreSQL text and jsonb refuse NUL characters, which agents (and the garbage LLM
    fault) do produce: they are stored as U+FFFD. The artifact files keep the exact bytes."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value


def _storable_result(result: Any) -> Any:
    from dataclasses import replace

    return replace(result, message=_storable(result.message), details=_storable(result.details))


def execution_record_error(*, execution_id: int, worker: str, error: str) -> None:
    with transaction.atomic():
        updated = Execution.objects.filter(
            pk=execution_id, claimed_by=worker, status=ExecutionStatus.RUNNING
        ).update(
            status=ExecutionStatus.ERROR,
            error=error[:10000],
            composite=0.0,
            passed=False,
            finished=timezone.now(),
            lease_expires=None,
        )
        if updated:
            run_id = Execution.objects.values_list("run_id", flat=True).get(pk=execution_id)
            _count_done(run_id)


def _count_done(run_id: int) -> None:
    """Count one more finished execution; the last one hands the run to run_finalize."""
    Run.objects.filter(pk=run_id).update(executions_done=F("executions_done") + 1)
    run = Run.objects.only("executions_done", "execution_count", "status").get(pk=run_id)
    if run.executions_done >= run.execution_count and run.status == RunStatus.RUNNING:
        claimed = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
            status=RunStatus.FINALIZING
        )
        if claimed:
            from evaluations import tasks

            transaction.on_commit(lambda: tasks.run_finalize.delay(run_id))


_EMPTY_TRACE = '{"llm_calls": [], "tool_calls": []}'


def _store_artifacts(execution: Execution, artifact: Any) -> None:
    """Large blobs go to Django storage; the rows keep only their names, sizes and hashes."""
    blobs: dict[str, tuple[str, str]] = {
        ArtifactKind.STDOUT: ("stdout.txt", artifact.stdout),
        ArtifactKind.STDERR: ("stderr.txt", artifact.stderr),
        ArtifactKind.TRACE: (
            "trace.json",
            _json({"llm_calls": artifact.llm_calls, "tool_calls": artifact.tool_calls}),
        ),
        ArtifactKind.WORKSPACE_DIFF: ("workspace_diff.json", _json(artifact.workspace_diff)),
        ArtifactKind.HTTP_LOG: ("http_log.json", _json(artifact.http_calls)),
        ArtifactKind.DB_WRITES: ("db_writes.json", _json(artifact.db_writes)),
        ArtifactKind.ARTIFACT_JSON: ("artifact.json", _json(artifact.to_dict())),
    }
    for kind, (name, text) in blobs.items():
        if not text or text in ("[]", "{}", _EMPTY_TRACE):
            continue
        data = text.encode()
        row = Artifact(
            execution=execution, kind=kind, name=name, size=len(data), sha256=sha256_hex(data)
        )
        row.truncated = "truncated" in text[-200:] and kind in (
            ArtifactKind.STDOUT,
            ArtifactKind.STDERR,
        )
        row.file.save(name, ContentFile(data), save=False)
        row.save()


def _json(value: Any) -> str:
    from dataclasses import asdict, is_dataclass

    def default(obj: Any) -> Any:
        if is_dataclass(obj) and not isinstance(obj, type):
            return asdict(obj)
        return str(obj)

    return json.dumps(value, default=default, ensure_ascii=False)


def execution_requeue_expired(*, enqueue: bool = True) -> list[int]:
    """Executions whose worker died (lease expired) or whose message was lost: send again.
    Claiming stays conditional, so a duplicate message can never run an execution twice.
    The embedded worker passes enqueue=False and runs the returned ids itself."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.KEYSTONE_EXECUTION_LEASE_SECONDS)
    # A message sent within the lease time is still on its way (or queued behind others):
    # sending it again every beat tick would only flood the broker.
    not_sent_lately = Q(enqueued_at__lt=stale) | Q(enqueued_at__isnull=True, created__lt=stale)
    ids = list(
        Execution.objects.filter(run__status=RunStatus.RUNNING)
        .filter(
            Q(status=ExecutionStatus.RUNNING, lease_expires__lt=now)
            & (Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=stale))
            | Q(status=ExecutionStatus.PENDING) & not_sent_lately
        )
        .order_by("id")
        .values_list("id", flat=True)[:1000]
    )
    if enqueue:
        execution_enqueue(execution_ids=ids)
    return ids


def execution_enqueue(*, execution_ids: list[int]) -> None:
    """Send an execution_run task for each execution, noting when (Execution.enqueued_at)."""
    from evaluations import tasks

    for start in range(0, len(execution_ids), 500):
        batch = execution_ids[start : start + 500]
        Execution.objects.filter(pk__in=batch).update(enqueued_at=timezone.now())
        for execution_id in batch:
            tasks.execution_run.delay(execution_id)


# --- Projects and members -----------------------------------------------------------------


class MembershipError(ValueError):
    """A project or membership change that is refused; the message says why, for people."""


def project_create(*, name: str, slug: str, created_by: Any) -> Project:
    """A new project whose creator is its first admin (a project always has one)."""
    name, slug = name.strip(), slug.strip()
    if not name:
        raise MembershipError("The project needs a name.")
    if not slug:
        raise MembershipError("The project needs a slug (letters, digits and dashes).")
    with transaction.atomic():
        if Project.objects.filter(slug=slug).exists():
            raise MembershipError(f"A project with the slug {slug!r} already exists.")
        project = Project.objects.create(name=name, slug=slug)
        Membership.objects.create(project=project, user=created_by, role=Role.ADMIN)
    return project


def _role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        choices = ", ".join(Role.values)
        raise MembershipError(f"Unknown role {value!r}: choose one of {choices}.") from None


def _lock_admins(project: Project) -> int:
    """Lock the project's admin memberships and count them. Two admins demoting each other
    at the same moment are serialised here, so neither can leave the project adminless."""
    return len(
        Membership.objects.select_for_update()
        .filter(project=project, role=Role.ADMIN)
        .values_list("pk", flat=True)
    )


def membership_add(*, project: Project, username: str, role: str) -> Membership:
    from django.contrib.auth import get_user_model

    new_role = _role(role)
    username = username.strip()
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise MembershipError(f"There is no active user named {username!r}.")
    with transaction.atomic():
        existing = Membership.objects.filter(project=project, user=user).first()
        if existing is not None:
            raise MembershipError(
                f"{username} is already a member ({existing.role}); change the role instead."
            )
        return Membership.objects.create(project=project, user=user, role=new_role)


def _membership_to_change(
    *, project: Project, membership_id: int, stays_admin: bool, last_admin_advice: str
) -> Membership:
    """The project's membership, locked with its admins (call inside a transaction). Refused
    when it is not in this project, or when it is the last admin and would stop being one;
    `last_admin_advice` ends that message."""
    admins = _lock_admins(project)
    membership = (
        Membership.objects.select_for_update(of=("self",))
        .select_related("user")
        .filter(project=project, pk=membership_id)
        .first()
    )
    if membership is None:
        raise MembershipError("That membership is not part of this project.")
    if membership.role == Role.ADMIN and not stays_admin and admins <= 1:
        raise MembershipError(
            f"{membership.user.get_username()} is the only admin of {project.name}: "
            + last_admin_advice
        )
    return membership


def membership_set_role(*, project: Project, membership_id: int, role: str) -> Membership:
    new_role = _role(role)
    with transaction.atomic():
        membership = _membership_to_change(
            project=project,
            membership_id=membership_id,
            stays_admin=new_role == Role.ADMIN,
            last_admin_advice="make someone else admin first.",
        )
        membership.role = new_role
        membership.save(update_fields=["role"])
        return membership


def membership_remove(*, project: Project, membership_id: int) -> None:
    with transaction.atomic():
        membership = _membership_to_change(
            project=project,
            membership_id=membership_id,
            stays_admin=False,
            last_admin_advice="make someone else admin before removing them.",
        )
        membership.delete()


# --- Projects and the demo ----------------------------------------------------------------


def project_default() -> Project:
    """The project the CLI records its runs in when none is named."""
    project, _ = Project.objects.get_or_create(slug="default", defaults={"name": "Default"})
    return project


def demo_load() -> list[str]:
    """Store the example specs in the default project (idempotent), for `keystone serve --demo`."""
    from django.contrib.auth import get_user_model

    from evaluations.models import Membership, Role

    project = project_default()
    lines = []
    examples = Path(settings.BASE_DIR) / "examples" / "specs"
    for path in sorted(examples.glob("*.yaml")):
        version = spec_version_create(
            project=project,
            source_yaml=path.read_text(encoding="utf-8"),
            source_name=str(path),
            base_dir=str(examples.resolve()),
        )
        lines.append(f"demo spec {version.spec.slug} v{version.number}")
    user_model = get_user_model()
    if not user_model.objects.filter(username="demo").exists():
        # A local demo only (--demo): the operator views are the way to browse runs for now.
        user = user_model.objects.create_user(
            "demo", password="demo", is_staff=True, is_superuser=True
        )
        Membership.objects.get_or_create(project=project, user=user, defaults={"role": Role.ADMIN})
        lines.append("demo user: demo / demo (admin of the default project)")
    return lines


# --- Review: people grading the judge -----------------------------------------------------
#
# run_finalize calls review_items_select, which queues judge results by the review policy
# (the project's `review_policy`, overridden key by key by the spec's `review:` block).
# A reviewer claims an item (a lock with a timeout, taken by a conditional UPDATE), grades
# it, and when `reviews_required` verdicts agree the human result is written: it outranks
# the judge's in selectors._effective_results, so the execution and the run are rescored
# from stored rows, and a ResultChange keeps before and after. Disagreeing reviewers send
# the item to an admin (adjudication). The number of verdicts per item is enforced by the
# ReviewVerdict constraints, not by this code.

REVIEW_POLICY_DEFAULTS: dict[str, Any] = {
    "all": False,
    "sample_rate": 0.0,
    "borderline_margin": None,
    "check_disagreement": False,
    "spread_max": None,
    "failing_gates": False,
    "reviewers_per_item": 1,
    "blind": False,
    # Reviewers whose scores differ by more than this disagree even on the same verdict.
    "disagreement": None,
}
REVIEW_NOTE_MAX = 2000
REVIEW_NEXT_CANDIDATES = 25
# Float sums (0.7 + 0.15) must not fall outside a margin they meet on paper.
_REVIEW_EPSILON = 1e-9


class ReviewError(Exception):
    """A review action that is refused; the message says why, for people."""


class ReviewPermissionError(ReviewError):
    """The user's role in the project does not allow this."""


class ReviewClaimError(ReviewError):
    """The item is held by someone else, closed, or already graded by this user."""


class ReviewInputError(ReviewError, ValueError):
    """A grade that is not valid (the message names the field)."""


@dataclass(frozen=True, slots=True)
class ReviewPolicy:
    all: bool
    sample_rate: float
    borderline_margin: float | None
    check_disagreement: bool
    spread_max: float | None
    failing_gates: bool
    reviewers_per_item: int
    blind: bool
    disagreement: float | None

    @property
    def selects_anything(self) -> bool:
        return (
            self.all
            or self.sample_rate > 0
            or self.borderline_margin is not None
            or self.check_disagreement
            or self.spread_max is not None
            or self.failing_gates
        )


def review_policy_for(*, project: Project, spec_raw: dict[str, Any]) -> ReviewPolicy:
    """Defaults, then the project's policy, then the spec's `review:` block (wins)."""
    merged = dict(REVIEW_POLICY_DEFAULTS)
    for layer in (project.review_policy or {}, spec_raw.get("review") or {}):
        merged.update({k: v for k, v in layer.items() if k in REVIEW_POLICY_DEFAULTS})
    return ReviewPolicy(
        all=bool(merged["all"]),
        sample_rate=float(merged["sample_rate"] or 0.0),
        borderline_margin=_optional_float(merged["borderline_margin"]),
        check_disagreement=bool(merged["check_disagreement"]),
        spread_max=_optional_float(merged["spread_max"]),
        failing_gates=bool(merged["failing_gates"]),
        reviewers_per_item=max(1, int(merged["reviewers_per_item"] or 1)),
        blind=bool(merged["blind"]),
        disagreement=_optional_float(merged["disagreement"]),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def project_review_policy_set(*, project: Project, policy: dict[str, Any]) -> Project:
    """Store a project's review policy, checked against the spec schema's `review` block."""
    import jsonschema

    from checks.spec.schema import spec_schema

    validator = jsonschema.Draft202012Validator(spec_schema()["$defs"]["review"])
    problems = sorted(validator.iter_errors(policy), key=lambda e: list(e.absolute_path))
    if problems:
        first = problems[0]
        where = ".".join(str(p) for p in first.absolute_path) or "review policy"
        raise ReviewInputError(f"{where}: {first.message}")
    project.review_policy = dict(policy)
    project.save(update_fields=["review_policy"])
    return project


def _require_role(project: Project, user: Any, minimum: Role) -> None:
    if not project.has_role(user, minimum):
        raise ReviewPermissionError(
            f"This needs the {minimum.label.lower()} role in {project.name}."
        )


def _review_claim_seconds() -> int:
    return int(settings.KEYSTONE_REVIEW_CLAIM_SECONDS)


def _sampled(seed: int, result_id: int, rate: float) -> bool:
    """A deterministic coin per (run seed, result): re-running the selection, or
    finalizing the run again, picks the same results."""
    digest = hashlib.sha256(f"{seed}:{result_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def _review_reason(
    row: CheckResult, policy: ReviewPolicy, seed: int, checks: list[CheckResult]
) -> str | None:
    """Why this judge result goes to people (the most telling reason), or None."""
    from evaluations.selectors import judge_view

    judge = judge_view(row)
    if policy.failing_gates and row.gate and (not row.passed or row.score < 1.0):
        return ReviewReason.GATE
    if policy.check_disagreement and judge.passed is not None:
        shared = set(row.dimensions)
        for check in checks:
            if (
                shared & set(check.dimensions)
                and not check.to_engine().is_error
                and check.passed != judge.passed
            ):
                return ReviewReason.DISAGREEMENT
    spread_max, margin = policy.spread_max, policy.borderline_margin
    spread = judge.spread
    if spread_max is not None and spread is not None and spread > spread_max + _REVIEW_EPSILON:
        return ReviewReason.SPREAD
    distance = None if judge.score is None else abs(judge.score - judge.threshold)
    if margin is not None and distance is not None and distance <= margin + _REVIEW_EPSILON:
        return ReviewReason.BORDERLINE
    if policy.sample_rate > 0 and _sampled(seed, row.pk, policy.sample_rate):
        return ReviewReason.SAMPLE
    if policy.all:
        return ReviewReason.ALL
    return None


def _review_item_for(
    run: Run, row: CheckResult, *, reason: str, policy: ReviewPolicy, sent_by: Any = None
) -> ReviewItem:
    from evaluations.selectors import judge_view

    invariant = (run.spec_version.parsed.get("invariants") or {}).get(row.invariant_id) or {}
    check = invariant.get("check") or {}
    is_judge = row.check_type in JUDGE_CHECK_TYPES and row.source != ResultSource.HUMAN
    judge = judge_view(row)
    return ReviewItem(
        project_id=run.project_id,
        spec_id=run.spec_id,
        run=run,
        execution_id=row.execution_id,
        check_result=row,
        invariant_id=row.invariant_id,
        criteria=str(check.get("criteria") or invariant.get("description") or row.invariant_id),
        judge_model=judge.model if is_judge else "",
        prompt_version=judge.prompt_version if is_judge else "",
        judge_score=judge.score if is_judge else None,
        judge_passed=judge.passed if is_judge else None,
        reason=reason,
        reviews_required=policy.reviewers_per_item,
        blind=policy.blind,
        sent_by=sent_by,
    )


def review_items_select(*, run_id: int) -> list[ReviewItem]:
    """Queue the run's judge results that the review policy asks people to grade.
    Idempotent: a result that already had an item, or already has a human verdict, is
    skipped, and the database refuses a second pending item for one result."""
    run = Run.objects.select_related("spec_version", "project").get(pk=run_id)
    policy = review_policy_for(project=run.project, spec_raw=run.spec_version.parsed)
    if not policy.selects_anything:
        return []
    judged = list(
        CheckResult.objects.filter(run=run, check_type__in=JUDGE_CHECK_TYPES)
        .exclude(source=ResultSource.HUMAN)
        .order_by("id")
    )
    if not judged:
        return []
    reviewed = set(ReviewItem.objects.filter(run=run).values_list("check_result_id", flat=True))
    humans = set(
        CheckResult.objects.filter(run=run, source=ResultSource.HUMAN).values_list(
            "execution_id", "invariant_id"
        )
    )
    checks: dict[int, list[CheckResult]] = {}
    if policy.check_disagreement:
        for check in (
            CheckResult.objects.filter(run=run, source=ResultSource.ENGINE)
            .exclude(check_type__in=JUDGE_CHECK_TYPES)
            .exclude(dimensions=[])
        ):
            checks.setdefault(check.execution_id, []).append(check)
    seed = int(run.options.get("seed", 0) or 0)
    new_items = []
    for row in judged:
        if row.pk in reviewed or (row.execution_id, row.invariant_id) in humans:
            continue
        reason = _review_reason(row, policy, seed, checks.get(row.execution_id, []))
        if reason is not None:
            new_items.append(_review_item_for(run, row, reason=reason, policy=policy))
    if not new_items:
        return []
    ReviewItem.objects.bulk_create(new_items, ignore_conflicts=True)
    return list(
        ReviewItem.objects.filter(
            run=run, check_result_id__in=[item.check_result_id for item in new_items]
        ).order_by("id")
    )


def review_send(*, result_id: int, user: Any) -> ReviewItem:
    """A person sends any check result to the queue (from the execution page). A result
    already waiting for review returns its pending item."""
    row = CheckResult.objects.select_related("run__spec_version", "run__project").get(pk=result_id)
    run = row.run
    _require_role(run.project, user, Role.REVIEWER)
    pending = ReviewItem.objects.filter(check_result=row).exclude(status=ReviewStatus.COMPLETE)
    existing = pending.first()
    if existing is not None:
        return existing
    policy = review_policy_for(project=run.project, spec_raw=run.spec_version.parsed)
    item = _review_item_for(run, row, reason=ReviewReason.MANUAL, policy=policy, sent_by=user)
    try:
        with transaction.atomic():
            item.save()
    except IntegrityError:
        # Someone sent the same result at the same moment: theirs is the pending item.
        return pending.get()
    return item


def review_claim(*, item_id: int, user: Any) -> ReviewItem:
    """Lock an item for this reviewer until the claim expires. A conditional UPDATE, so of
    two reviewers claiming at once exactly one wins; an expired claim can be taken over;
    claiming again renews one's own claim."""
    item = ReviewItem.objects.select_related("project").get(pk=item_id)
    _require_role(item.project, user, Role.REVIEWER)
    now = timezone.now()
    claimable = (
        ReviewItem.objects.filter(pk=item_id, status=ReviewStatus.OPEN)
        .filter(Q(claimed_by__isnull=True) | Q(claim_expires__lte=now) | Q(claimed_by=user))
        .exclude(verdicts__reviewer=user)
    )
    expires = now + timedelta(seconds=_review_claim_seconds())
    if claimable.update(claimed_by=user, claim_expires=expires):
        item.refresh_from_db()
        return item
    item.refresh_from_db()
    if item.status != ReviewStatus.OPEN:
        raise ReviewClaimError(f"Review item {item.pk} is {item.get_status_display().lower()}.")
    if item.verdicts.filter(reviewer=user).exists():
        raise ReviewClaimError(f"You already graded review item {item.pk}.")
    holder = item.claimed_by.get_username() if item.claimed_by else "someone else"
    until = (
        timezone.localtime(item.claim_expires).strftime("%H:%M:%S") if item.claim_expires else ""
    )
    raise ReviewClaimError(f"Review item {item.pk} is being graded by {holder} until {until}.")


def review_release(*, item_id: int, user: Any) -> None:
    """Give a claimed item back to the queue (skip)."""
    ReviewItem.objects.filter(pk=item_id, claimed_by=user).update(
        claimed_by=None, claim_expires=None
    )


def review_next(
    *, project: Project, user: Any, filters: Any = None, exclude: tuple[int, ...] = ()
) -> ReviewItem | None:
    """The item this reviewer should grade now, claimed for them: one they already hold,
    else the oldest open one nobody holds that they have not graded. None when done."""
    from evaluations.selectors import ReviewFilters

    _require_role(project, user, Role.REVIEWER)
    filters = filters or ReviewFilters()
    mine = (
        filters.apply(ReviewItem.objects.filter(project=project, status=ReviewStatus.OPEN))
        .exclude(verdicts__reviewer=user)
        .exclude(pk__in=exclude)
    )
    now = timezone.now()
    held = mine.filter(claimed_by=user, claim_expires__gt=now).order_by("created", "id").first()
    if held is not None:
        return review_claim(item_id=held.pk, user=user)
    free = mine.filter(Q(claimed_by__isnull=True) | Q(claim_expires__lte=now)).order_by(
        "created", "id"
    )
    for item_id in free.values_list("pk", flat=True)[:REVIEW_NEXT_CANDIDATES]:
        try:
            return review_claim(item_id=item_id, user=user)
        except ReviewClaimError:
            continue  # another reviewer took it a moment ago
    return None


def _checked_grade(passed: Any, score: Any, note: Any) -> tuple[bool, float, str]:
    if not isinstance(passed, bool):
        raise ReviewInputError("passed: choose pass or fail.")
    if score is None or score == "":
        score = 1.0 if passed else 0.0
    try:
        value = float(score)
    except (TypeError, ValueError):
        raise ReviewInputError(f"score: {score!r} is not a number between 0 and 1.") from None
    if isinstance(score, bool) or math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ReviewInputError(f"score: must be between 0 and 1, got {score!r}.")
    text = str(note or "").strip()
    if len(text) > REVIEW_NOTE_MAX:
        raise ReviewInputError(f"note: at most {REVIEW_NOTE_MAX} characters, got {len(text)}.")
    return passed, value, text


@dataclass(frozen=True, slots=True)
class ReviewSubmission:
    item: ReviewItem
    verdict: ReviewVerdict
    change: ResultChange | None  # set when this verdict completed the item


def review_submit(
    *, item_id: int, user: Any, passed: Any, score: Any = None, note: Any = ""
) -> ReviewSubmission:
    """Record one reviewer's grade. The last required verdict completes the item: agreeing
    reviewers override the result (and the run is rescored), disagreeing ones send it to
    adjudication. Someone else's live claim refuses the grade; the ReviewVerdict
    constraints refuse a grade beyond `reviews_required` or a second grade by one person."""
    passed, score, note = _checked_grade(passed, score, note)
    item = ReviewItem.objects.select_related("project", "claimed_by").get(pk=item_id)
    _require_role(item.project, user, Role.REVIEWER)
    if item.status != ReviewStatus.OPEN:
        raise ReviewClaimError(
            f"Review item {item.pk} is {item.get_status_display().lower()}: it takes no more grades."
        )
    if item.claimed_by_other(user):
        holder = item.claimed_by.get_username() if item.claimed_by else "someone else"
        raise ReviewClaimError(f"Review item {item.pk} is being graded by {holder}.")
    with transaction.atomic():
        verdict = _verdict_insert(item, user=user, passed=passed, score=score, note=note)
        # Lock the item only now: whichever grade locks last sees every committed verdict.
        locked = ReviewItem.objects.select_for_update().get(pk=item.pk)
        if locked.claimed_by_id == user.pk:
            locked.claimed_by = None
            locked.claim_expires = None
            locked.save(update_fields=["claimed_by", "claim_expires"])
        change = None
        verdicts = list(ReviewVerdict.objects.filter(item_id=item.pk).order_by("slot"))
        if locked.status == ReviewStatus.OPEN and len(verdicts) >= locked.reviews_required:
            if _verdicts_agree(locked, verdicts):
                change = _review_apply(
                    locked,
                    passed=verdicts[0].passed,
                    score=sum(v.score for v in verdicts) / len(verdicts),
                    user=user,
                    verdicts=verdicts,
                )
            else:
                locked.status = ReviewStatus.ADJUDICATION
                locked.save(update_fields=["status"])
    return ReviewSubmission(item=locked, verdict=verdict, change=change)


def _verdict_insert(
    item: ReviewItem, *, user: Any, passed: bool, score: float, note: str
) -> ReviewVerdict:
    """Take the next free slot. Slots are counted without a lock on purpose: grades racing
    for one slot are settled by the unique (item, slot) constraint (the loser counts again
    and takes the next slot), and a grade past the last slot is refused by the CHECK
    constraint slot <= slots_total; a second grade by one reviewer by (item, reviewer)."""
    for _attempt in range(item.reviews_required + 1):
        slot = ReviewVerdict.objects.filter(item_id=item.pk).count() + 1
        try:
            with transaction.atomic():
                return ReviewVerdict.objects.create(
                    item_id=item.pk,
                    reviewer=user,
                    slot=slot,
                    slots_total=item.reviews_required,
                    passed=passed,
                    score=score,
                    note=note,
                )
        except IntegrityError as exc:
            if _violated(exc) != "reviewverdict_unique_slot":
                raise _verdict_refused(exc, item) from exc
    raise ReviewClaimError(
        f"Review item {item.pk} already has its {item.reviews_required} grade(s)."
    )


def _violated(exc: IntegrityError) -> str:
    """The name of the constraint behind an IntegrityError (PostgreSQL reports it; on
    SQLite the message names the columns or the CHECK)."""
    diag = getattr(exc.__cause__, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if name:
        return str(name)
    text = str(exc)
    if "reviewer_id" in text:
        return "reviewverdict_one_per_reviewer"
    if "slot_in_range" in text:
        return "reviewverdict_slot_in_range"
    if "slot" in text:
        return "reviewverdict_unique_slot"
    return text


def _verdict_refused(exc: IntegrityError, item: ReviewItem) -> ReviewError:
    """Turn a ReviewVerdict constraint violation into a message for the reviewer."""
    if _violated(exc) == "reviewverdict_one_per_reviewer":
        return ReviewClaimError(f"You already graded review item {item.pk}.")
    return ReviewClaimError(
        f"Review item {item.pk} already has its {item.reviews_required} grade(s)."
    )


def _verdicts_agree(item: ReviewItem, verdicts: list[ReviewVerdict]) -> bool:
    if len({v.passed for v in verdicts}) > 1:
        return False
    run = Run.objects.select_related("spec_version", "project").get(pk=item.run_id)
    tolerance = review_policy_for(
        project=run.project, spec_raw=run.spec_version.parsed
    ).disagreement
    if tolerance is None:
        return True
    scores = [v.score for v in verdicts]
    return max(scores) - min(scores) <= tolerance + _REVIEW_EPSILON


def review_adjudicate(
    *, item_id: int, user: Any, passed: Any, score: Any = None, note: Any = ""
) -> ResultChange:
    """An admin decides an item whose reviewers disagreed."""
    passed, score, note = _checked_grade(passed, score, note)
    item = ReviewItem.objects.select_related("project").get(pk=item_id)
    _require_role(item.project, user, Role.ADMIN)
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update().get(pk=item.pk)
        if locked.status != ReviewStatus.ADJUDICATION:
            raise ReviewClaimError(
                f"Review item {item.pk} is {locked.get_status_display().lower()}, "
                "not waiting for adjudication."
            )
        locked.adjudicated_by = user
        verdicts = list(ReviewVerdict.objects.filter(item_id=item.pk).order_by("slot"))
        return _review_apply(
            locked, passed=passed, score=score, user=user, verdicts=verdicts, note=note
        )


def _review_apply(
    item: ReviewItem,
    *,
    passed: bool,
    score: float,
    user: Any,
    verdicts: list[ReviewVerdict],
    note: str = "",
) -> ResultChange:
    """Write the human result for the item's invariant, rescore its execution and its
    run from stored rows, and record before and after. Runs inside the caller's
    transaction, with the item locked."""
    from evaluations.selectors import _effective_results, execution_record

    # One recomputation of a run at a time, so none is computed from a stale read.
    run = Run.objects.select_for_update().select_related("spec_version").get(pk=item.run_id)
    execution = Execution.objects.select_for_update().get(pk=item.execution_id)
    reviewed = CheckResult.objects.get(pk=item.check_result_id)
    same_invariant = list(
        CheckResult.objects.filter(execution=execution, invariant_id=item.invariant_id)
    )
    current = _effective_results(same_invariant)[0] if same_invariant else reviewed
    before = _review_snapshot(current, execution, run)

    names = [v.reviewer.get_username() if v.reviewer else "(deleted user)" for v in verdicts]
    decided_by = user.get_username()
    adjudicated = item.adjudicated_by_id is not None
    human, _ = CheckResult.objects.update_or_create(
        execution=execution,
        invariant_id=item.invariant_id,
        source=ResultSource.HUMAN,
        defaults={
            "run": run,
            "check_type": reviewed.check_type,
            "score": score,
            "passed": passed,
            "failure_code": _human_failure_code(reviewed, passed),
            "message": (
                f"{'adjudicated by ' + decided_by if adjudicated else 'reviewed by ' + ', '.join(names)}: "
                f"{'pass' if passed else 'fail'} ({score:.2f})"
            ),
            "details": {
                "review_item": item.pk,
                "reviewed_result": reviewed.pk,
                "reviewed_source": reviewed.source,
                "verdicts": [
                    {"reviewer": name, "passed": v.passed, "score": v.score, "note": v.note}
                    for name, v in zip(names, verdicts, strict=True)
                ],
                "adjudicated_by": decided_by if adjudicated else None,
                "adjudication_note": note if adjudicated else "",
            },
            "severity": reviewed.severity,
            "weight": reviewed.weight,
            "gate": reviewed.gate,
            "dimensions": list(reviewed.dimensions),
        },
    )

    item.status = ReviewStatus.COMPLETE
    item.final_passed = passed
    item.final_score = score
    item.completed = timezone.now()
    item.claimed_by = None
    item.claim_expires = None
    item.save()

    _execution_rescore(execution, run, execution_record)
    if run.status == RunStatus.COMPLETED:
        # Scores, verdict, gates (and the kappa gate, now with this decision) again.
        run = run_finalize(run_id=run.pk)
    return ResultChange.objects.create(
        run=run,
        execution=execution,
        check_result=human,
        invariant_id=item.invariant_id,
        review_item=item,
        changed_by=user,
        before=before,
        after=_review_snapshot(human, execution, run),
    )


def _review_snapshot(result: CheckResult, execution: Execution, run: Run) -> dict[str, Any]:
    return {
        "score": result.score,
        "passed": result.passed,
        "source": result.source,
        "execution_composite": execution.composite,
        "execution_passed": execution.passed,
        "run_composite": run.composite,
        "run_gate_passed": run.gate_passed,
        "run_exit_code": run.exit_code,
    }


def _human_failure_code(reviewed: CheckResult, passed: bool) -> str:
    """A failing human verdict keeps the reviewed result's failure code, except an error
    code (people gave a verdict where the check could not); a judge's becomes 'below
    threshold'."""
    if passed:
        return ""
    if reviewed.failure_code and not reviewed.to_engine().is_error:
        return reviewed.failure_code
    if reviewed.check_type in JUDGE_CHECK_TYPES:
        return FailureCode.JUDGE_BELOW_THRESHOLD.value
    return ""


def _execution_rescore(execution: Execution, run: Run, record_of: Any) -> None:
    """The execution's composite and verdict from its effective results."""
    spec = engine_spec(run)
    record = record_of(execution)
    if (
        execution.status == ExecutionStatus.ERROR
        and not execution.error
        and not any(r.is_error for r in record.results)
    ):
        # execution_record marks a successful execution `error` only because a check
        # could not finish (a judge parse error, say); people have now given the verdict.
        execution.status = ExecutionStatus.SUCCESS
        record.status = ExecutionStatus.SUCCESS
    score = score_execution(record, pass_threshold=spec.scoring.pass_threshold)
    execution.composite = score.composite
    execution.passed = score.passed
    execution.save(update_fields=["status", "composite", "passed"])


def run_review_kappa(run: Run) -> float | None:
    """Judge-human kappa for the judge this run used (the models of its judge results),
    over the spec's completed reviews; None when there is nothing to measure."""
    from django.db.models.fields.json import KeyTextTransform, KeyTransform

    from evaluations.selectors import review_kappa

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


# --- Baselines ----------------------------------------------------------------------------
#
# A baseline freezes a completed run's results as the reference of its spec: the overview
# lists a group (scenario x prompt) that passed in the active baseline and fails in the
# spec's latest run (selectors.project_regressions). `data` keeps the run summary's groups,
# each with its first passing output, mean latency and cost (as KindLM stores them), so a
# baseline outlives the run it came from.

BASELINE_OUTPUT_MAX_CHARS = 4000
BASELINE_NAME_MAX = 200


class BaselineError(ValueError):
    """A run that cannot become a baseline; the message says why."""


def baseline_promote(*, run_id: int, user: Any, name: str = "") -> Baseline:
    """Make a completed run its spec's active baseline. The spec's previous active baseline
    is deactivated in the same transaction (the database allows one active per spec)."""
    name = name.strip()
    if len(name) > BASELINE_NAME_MAX:
        raise BaselineError(f"name: at most {BASELINE_NAME_MAX} characters, got {len(name)}")
    with transaction.atomic():
        run = Run.objects.select_related("project").get(pk=run_id)
        if user is not None and not run.project.has_role(user, Role.EDITOR):
            raise BaselineError(f"Promoting a baseline needs the editor role in {run.project}.")
        if run.status != RunStatus.COMPLETED or not run.summary.get("groups"):
            raise BaselineError(
                f"run {run.pk} is {run.status}: only a completed, scored run can be a baseline"
            )
        # Two people promoting runs of one spec at once: the second waits for the first.
        Spec.objects.select_for_update().filter(pk=run.spec_id).first()
        current = Baseline.objects.filter(spec_id=run.spec_id, active=True).first()
        if current is not None and current.run_id == run.pk:
            if name and name != current.name:
                current.name = name
                current.save(update_fields=["name"])
            return current
        Baseline.objects.filter(spec_id=run.spec_id, active=True).update(active=False)
        return Baseline.objects.create(
            project_id=run.project_id,
            spec_id=run.spec_id,
            run=run,
            name=name or f"run #{run.pk}",
            active=True,
            data=_baseline_data(run),
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )


def _baseline_data(run: Run) -> dict[str, Any]:
    """The run summary's groups with, per group, the first passing output, the mean
    latency and the total cost of its executions (two queries), and the run's metrics."""
    from evaluations.selectors import group_key

    per_group = {
        group_key(row): row
        for row in Execution.objects.filter(run=run)
        .values("pillar", "scenario", "prompt_index", "mutation_type")
        .annotate(
            mean_duration_ms=Avg("duration_ms"),
            cost_usd=Sum("cost_usd"),
            first_passing_id=Min("id", filter=Q(passed=True)),
        )
        .order_by()
    }
    passing_ids = [row["first_passing_id"] for row in per_group.values() if row["first_passing_id"]]
    outputs = dict(
        Execution.objects.filter(pk__in=passing_ids)
        .annotate(head=Substr("final_output", 1, BASELINE_OUTPUT_MAX_CHARS))
        .values_list("pk", "head")
    )
    groups = []
    for group in run.summary.get("groups") or []:
        row = per_group.get(group_key(group), {})
        first_passing_id = row.get("first_passing_id")
        groups.append(
            {
                **group,
                "first_passing_output": outputs.get(first_passing_id) if first_passing_id else None,
                "mean_duration_ms": row.get("mean_duration_ms"),
                "cost_usd": row.get("cost_usd"),
            }
        )
    return {
        "run_id": run.pk,
        "spec_version_id": run.spec_version_id,
        "pass_rate": run.pass_rate,
        "composite": run.composite,
        "resilience": run.resilience,
        "overall": run.overall,
        "exit_code": run.exit_code,
        "metrics": run.summary.get("metrics") or {},
        "groups": groups,
    }


# --- API tokens ---------------------------------------------------------------------------

API_TOKEN_NAME_MAX = 100


class TokenError(ValueError):
    """A token that cannot be issued or revoked; the message says why."""


def token_issue(*, project: Project, user: Any, name: str) -> tuple[ApiToken, str]:
    """A token acting in `project` with `user`'s role there, and its raw value, which is
    shown once and never stored (only its hash is)."""
    name = name.strip()
    if not name:
        raise TokenError("name: give the token a name, e.g. the CI job that uses it")
    if len(name) > API_TOKEN_NAME_MAX:
        raise TokenError(f"name: at most {API_TOKEN_NAME_MAX} characters")
    if project.role_of(user) is None:
        raise TokenError(f"{user} is not a member of {project.name}")
    return ApiToken.issue(project=project, user=user, name=name)


def token_revoke(*, project: Project, token_id: int) -> ApiToken:
    """Revoke one of the project's tokens; it stops working at once (revoking twice is fine)."""
    token = ApiToken.objects.filter(project=project, pk=token_id).first()
    if token is None:
        raise TokenError("no such token in this project")
    ApiToken.objects.filter(pk=token.pk).update(revoked=True)
    token.revoked = True
    return token
