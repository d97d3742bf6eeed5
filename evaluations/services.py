"""Writes: every change to Keystone's rows goes through one of these functions.

Naming follows `<entity>_<action>`; tasks, views, the API and the CLI call these and hold
no domain logic of their own. The execution lifecycle is:

run_create -> run_plan (Execution rows) -> execution_execute (claim, harness, record)
-> run_finalize (scores, gates, exit code), with execution_requeue_expired for dead workers.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from checks.context import SecurityPolicy
from checks.planning import PlannedExecution, plan_run
from checks.report_model import ExecutionRecord
from checks.results import ERROR_CODES
from checks.scoring import score_execution, score_run
from checks.spec import SpecValidationError, validate_spec_text
from checks.spec.model import Spec as EngineSpec
from evaluations.models import (
    Artifact,
    ArtifactKind,
    CheckResult,
    Execution,
    ExecutionStatus,
    Project,
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
    *, project: Project, source_yaml: str, author: Any = None, source_name: str = "spec.yaml"
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
            spec=spec, number=number, source_yaml=source_yaml, parsed=data, author=author
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
) -> Run:
    """A queued run; its planning is handed to a worker once the row is committed."""
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
    run = Run.objects.create(
        project=spec_version.spec.project,
        spec=spec_version.spec,
        spec_version=spec_version,
        trigger=trigger,
        labels=labels,
        git_sha=labels.get("git_sha", ""),
        branch=labels.get("branch", ""),
        replicas_override=replicas,
        options={"scenarios": scenarios or [], "spec_dir": spec_dir or "", "seed": seed},
        created_by=created_by,
    )
    if enqueue:
        from evaluations import tasks

        transaction.on_commit(lambda: tasks.run_plan.delay(run.pk))
    return run


def engine_spec(run: Run) -> EngineSpec:
    return EngineSpec.from_dict(run.spec_version.parsed)


def run_plan(*, run_id: int) -> list[int]:
    """Create the run's Execution rows (once, whatever the number of calls) and return the
    ids still to execute."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("spec_version").get(pk=run_id)
        if run.status == RunStatus.QUEUED:
            spec = engine_spec(run)
            planned = plan_run(
                spec,
                replicas=run.replicas_override,
                scenarios=run.options.get("scenarios") or None,
            )
            rows = [_execution_row(run, p) for p in planned]
            Execution.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
            run.execution_count = run.executions.count()
            run.status = RunStatus.RUNNING
            run.started = timezone.now()
            run.save(update_fields=["execution_count", "status", "started"])
    return list(
        Execution.objects.filter(run_id=run_id, status=ExecutionStatus.PENDING)
        .order_by("id")
        .values_list("id", flat=True)
    )


def _execution_row(run: Run, planned: PlannedExecution) -> Execution:
    key = Execution.build_key(
        scenario=planned.scenario,
        prompt_index=planned.prompt_index,
        replica=planned.replica,
        invariant_id=planned.isolated_invariant,
        pillar=planned.pillar,
        mutation_type=planned.mutation_type or "",
    )
    return Execution(
        run=run,
        project_id=run.project_id,
        key=key,
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


JUDGE_CHECK_TYPES = frozenset({"llm_as_judge", "judge"})


def run_finalize(*, run_id: int) -> Run:
    """Scores, gates, verdict and exit code of a run, from its stored results (idempotent)."""
    from evaluations.selectors import run_records

    run = Run.objects.select_related("spec_version").get(pk=run_id)
    if run.status == RunStatus.CANCELLED:
        return run
    spec = engine_spec(run)
    records = run_records(run)
    summary = score_run(spec, records)
    composites = [e.composite for e in summary.executions]
    judge_scores = [
        result.score
        for record in records
        for result in record.results
        if result.check_type in JUDGE_CHECK_TYPES
    ]
    run.summary = summary.to_dict()
    run.cost_usd = summary.metrics.total_cost_usd
    run.p95_duration_ms = summary.metrics.p95_duration_ms
    run.judge_mean = sum(judge_scores) / len(judge_scores) if judge_scores else None
    run.composite = sum(composites) / len(composites) if composites else None
    run.pass_rate = summary.pass_rate
    run.resilience = summary.resilience.score
    run.overall = summary.overall
    run.gate_passed = summary.exit_code == 0
    run.exit_code = summary.exit_code
    run.warnings = sorted(set(run.warnings) | set(summary.warnings))
    run.status = RunStatus.COMPLETED
    run.finished = timezone.now()
    run.save()
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

    spec_dir = run.options.get("spec_dir") or str(settings.KEYSTONE_HOME)
    return HarnessConfig(
        workspaces_root=Path(settings.KEYSTONE_WORK_DIR),
        spec_dir=Path(spec_dir),
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
    watcher = _LeaseWatcher(execution_id, worker, sandbox)
    watcher.start()
    try:
        outcome = run_execution(
            spec,
            planned,
            config,
            execution_key=f"{run.pk}-{execution.pk}",
            seed=planned.seed(int(run.options.get("seed", 0))),
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
                    [CheckResult.from_engine(r, execution=execution) for r in outcome.results]
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
        execution.final_output = artifact.final_output[:cap]
        execution.error = artifact.error or ""
        execution.forbidden_violations = outcome.forbidden_violations
        execution.lease_expires = None
        execution.save()
        for warning in outcome.warnings:
            if warning:
                run_warning_add(run_id=execution.run_id, warning=warning)
        _count_done(execution.run_id)


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
        if not text or text in ("[]", "{}"):
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
    stale_pending = now - timedelta(seconds=settings.KEYSTONE_EXECUTION_LEASE_SECONDS)
    ids = list(
        Execution.objects.filter(run__status=RunStatus.RUNNING)
        .filter(
            Q(status=ExecutionStatus.RUNNING, lease_expires__lt=now)
            | Q(status=ExecutionStatus.PENDING, created__lt=stale_pending)
        )
        .values_list("id", flat=True)[:1000]
    )
    if enqueue:
        from evaluations import tasks

        for execution_id in ids:
            tasks.execution_run.delay(execution_id)
    return ids


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
            project=project, source_yaml=path.read_text(encoding="utf-8"), source_name=str(path)
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
