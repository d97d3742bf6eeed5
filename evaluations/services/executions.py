"""Executing one execution: claim it (a lease), run the harness, and hand the outcome to
recording; leases of dead workers are re-queued."""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DataError, IntegrityError
from django.db.models import F, Q
from django.utils import timezone

from checks.context import SecurityPolicy
from checks.planning import (
    PlannedExecution,
    execution_seed,
)
from checks.results import INTERNAL_ERROR_PREFIX
from checks.spec.model import Spec as EngineSpec
from evaluations import policy, queue
from evaluations.models import (
    Execution,
    ExecutionStatus,
    Run,
    RunStatus,
)
from evaluations.services import statements
from evaluations.services.finalize import deferred_invariants
from evaluations.services.recording import (
    execution_orphan_files_remove,
    execution_record,
    execution_record_error,
)
from evaluations.services.runs import (
    engine_spec,
    run_secrets,
    run_warning_add,
    run_warning_note,
)

logger = logging.getLogger(__name__)


class InfrastructureError(Exception):
    """Something outside the agent failed (a database server, the Docker engine): retry later."""


_CELERY_TASK_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# The claim's test that the execution's run still runs (a cancelled run's are never taken).
_OF_A_RUNNING_RUN = "run_id IN (SELECT id FROM evaluations_run WHERE status = %s)"


def execution_claim(*, execution_id: int, worker: str) -> Execution | None:
    """Take an execution for this worker: a conditional UPDATE, so exactly one worker wins;
    returns the row as the claim left it, or None when another worker has it or it is done.
    A running execution whose lease expired (its worker died), or whose Celery task came
    back after its process died, can be taken again."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.KEYSTONE_EXECUTION_LEASE_SECONDS)
    # The row comes back with the claim (RETURNING): reading it apart was a round trip of
    # its own per execution.
    claimed = statements.update_row(
        Execution,
        where={"id": execution_id, "status": ExecutionStatus.PENDING},
        values={
            "status": ExecutionStatus.RUNNING,
            "claimed_by": worker,
            "lease_expires": lease,
            "started": now,
        },
        condition=_OF_A_RUNNING_RUN,
        condition_params=[RunStatus.RUNNING],
    )
    if claimed is not None:
        return claimed
    # Celery redelivers a task only when the process that held it died (acks_late with reject
    # on worker loss, or the visibility timeout, set above the hard time limit): the same task
    # id back means the lease has no living holder, so it is taken now, not when it expires.
    stale = Q(lease_expires__lt=now)
    task_id = worker.rpartition(":")[2]
    if _CELERY_TASK_ID.fullmatch(task_id):
        stale |= Q(claimed_by__endswith=f":{task_id}")
    expired = Execution.objects.filter(
        stale, run__status=RunStatus.RUNNING, pk=execution_id, status=ExecutionStatus.RUNNING
    )
    if not expired.update(
        claimed_by=worker, lease_expires=lease, started=now, attempt=F("attempt") + 1
    ):
        return None
    # The dead holder may have written files it never recorded: they go before this attempt.
    execution_orphan_files_remove(execution_id=execution_id)
    return statements.row(Execution, execution_id)


def execution_release(*, execution_id: int, worker: str, reason: str) -> bool:
    """Give an execution back after an infrastructure error so a later attempt can claim it,
    not before a backoff that doubles with each attempt. After the last attempt it ends as
    `error` with the reason (and the run says so) instead of being retried forever.
    True when it was given back for another attempt."""
    row = (
        Execution.objects.filter(pk=execution_id, claimed_by=worker, status=ExecutionStatus.RUNNING)
        .values("attempt", "run_id")
        .first()
    )
    if row is None:
        return False
    attempt, limit = row["attempt"], settings.KEYSTONE_EXECUTION_MAX_ATTEMPTS
    if attempt >= limit:
        message = f"{INTERNAL_ERROR_PREFIX}could not start after {attempt} attempts: {reason}"
        execution_record_error(execution_id=execution_id, worker=worker, error=message)
        run_warning_add(run_id=row["run_id"], warning=f"execution {execution_id} {message}")
        return False
    backoff = settings.KEYSTONE_EXECUTION_RETRY_BASE_SECONDS * 2 ** (attempt - 1)
    Execution.objects.filter(
        pk=execution_id, claimed_by=worker, status=ExecutionStatus.RUNNING
    ).update(
        status=ExecutionStatus.PENDING,
        claimed_by="",
        lease_expires=None,
        attempt=F("attempt") + 1,
        retry_at=timezone.now() + timedelta(seconds=backoff),
        error=f"attempt {attempt} of {limit} could not start: {reason}"[:10000],
    )
    return True


def _postgres_url(spec: Any) -> str | None:
    """KEYSTONE_POSTGRES_URL, else (when the spec has a postgres service) this process's
    throwaway cluster; None when there is neither, which the service reports naming the
    setting."""
    from evaluations.runner.local_postgres import LocalPostgresError, local_postgres_url
    from evaluations.runner.services import ServiceNotConfigured

    if settings.KEYSTONE_POSTGRES_URL:
        return str(settings.KEYSTONE_POSTGRES_URL)
    needs = [s for s in spec.services if s.get("type") == "postgres"]
    if not needs or not settings.KEYSTONE_POSTGRES_LOCAL_CLUSTER:
        return None
    try:
        return local_postgres_url()
    except LocalPostgresError as exc:
        raise ServiceNotConfigured(
            str(needs[0].get("name") or "?"),
            f"the spec needs a postgres server and this Keystone has none: set "
            f"KEYSTONE_POSTGRES_URL to a server where it may create a database per execution "
            f"({exc})",
        ) from exc


def harness_config(run: Run, spec: Any) -> Any:
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
        confine_to_spec_dir=not run.options.get("read_from_files"),
        sandbox_backend=settings.KEYSTONE_SANDBOX_BACKEND or None,
        postgres_url=_postgres_url(spec),
        mysql_url=settings.KEYSTONE_MYSQL_URL or None,
        policy=SecurityPolicy(
            allow_python_hooks=settings.KEYSTONE_ALLOW_PYTHON_HOOKS,
            allow_host_scripts=settings.KEYSTONE_ALLOW_HOST_SCRIPTS,
        ),
        secrets=run_secrets(run),
    )


def execution_modules_import(spec: EngineSpec | None = None) -> None:
    """Import what execution_execute imports at its first call for `spec`'s executions (for
    any spec's when None). A process about to fork executing processes (`keystone run`, a
    Celery worker before its pool) calls it once, so they share those modules' pages
    instead of each importing its own copy."""
    from evaluations.judge import spec_uses_judge
    from evaluations.runner.harness import gateway_wanted, tool_proxy_wanted

    # What the harness, the judge and finalizing import only for a spec that has the part.
    raw = spec.raw if spec is not None else None
    if raw is None or gateway_wanted(raw):
        import evaluations.runner.gateway  # noqa: F401
    if raw is None or tool_proxy_wanted(raw, replaying=bool(raw.get("replay"))):
        import evaluations.runner.toolproxy  # noqa: F401
    if raw is None or spec_uses_judge(raw):
        import checks.judge_client  # noqa: F401
        import evaluations.services.reviews  # noqa: F401  (finalizing queues the judge's results)
    if raw is None:  # a worker plans runs too; `keystone run` planned its own before this
        import evaluations.runner.mutations  # noqa: F401
        import evaluations.runner.replay  # noqa: F401


def execution_execute(
    *, execution_id: int, worker: str, run: Run | None = None
) -> Execution | None:
    """Claim, run and record one execution. Returns the execution as this call left it (the
    status and verdict it recorded: a progress line needs no second read), or None when
    another worker has it or it is done. `run`: a run with its spec version, read by a caller
    that runs many executions (`keystone run`, a worker's message) once for all of them; it
    is read again when it is not this execution's. What an execution reads of it (options,
    spec) does not change while it runs."""
    from evaluations.judge import judge_for_run
    from evaluations.runner.harness import choose_sandbox, run_execution
    from evaluations.runner.sandbox import SandboxUnavailable
    from evaluations.runner.services import ServiceError, ServiceNotConfigured
    from evaluations.runner.workspace import WorkspaceError

    execution = execution_claim(execution_id=execution_id, worker=worker)
    if execution is None:
        return None
    if run is None or run.pk != execution.run_id:
        run = Run.objects.select_related("spec_version").filter(pk=execution.run_id).first()
        if run is None:  # deleted since the claim: nothing left to run
            return None
    execution.run = run
    spec = engine_spec(run)
    try:
        config = harness_config(run, spec)
        sandbox, warning = choose_sandbox(spec, config.sandbox_backend)
    except (ServiceNotConfigured, SandboxUnavailable) as exc:  # said at once, never retried
        execution_record_error(execution_id=execution_id, worker=worker, error=str(exc))
        run_warning_note(run, str(exc))
        return _errored(execution)
    # The policy again, as it is now (it may have tightened since the upload), and against
    # the backend this host really gives (the default may have fallen back to local).
    refused = [f"{path}: {why}" for path, why in policy.spec_refusals(run.spec_version.parsed)]
    try:
        policy.check_backend(sandbox.name)
    except policy.PolicyError as exc:
        refused.append(str(exc))
    if refused:
        message = "refused by the server's policy: " + "; ".join(refused)
        execution_record_error(execution_id=execution_id, worker=worker, error=message)
        run_warning_note(run, message)
        return _errored(execution)
    if warning:
        run_warning_note(run, warning)
    planned = PlannedExecution(**execution.plan)
    # behavior_unchanged against the no-chaos output is checked when the run is finalised.
    deferred = deferred_invariants(spec)
    planned.invariant_ids = [i for i in planned.invariant_ids if i not in deferred]
    lease = _leases.hold(execution_id, worker, sandbox)
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
                sandbox=sandbox,
            )
    except (ServiceNotConfigured, WorkspaceError) as exc:  # not transient: said, not retried
        execution_record_error(execution_id=execution_id, worker=worker, error=str(exc))
        run_warning_note(run, str(exc))
        return _errored(execution)
    except ServiceError as exc:
        if execution_release(execution_id=execution_id, worker=worker, reason=str(exc)):
            raise InfrastructureError(str(exc)) from exc
        return _errored(execution)  # out of attempts: recorded as an error
    except Exception as exc:  # the platform failed, not the agent: record it, don't lose the run
        logger.exception("execution %s failed inside Keystone", execution_id)
        execution_record_error(
            execution_id=execution_id,
            worker=worker,
            error=f"{INTERNAL_ERROR_PREFIX}{type(exc).__name__}: {exc}",
        )
        return _errored(execution)
    finally:
        _leases.release(lease)
    if lease.cancelled:
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
        return _errored(execution)
    try:
        execution_record(execution=execution, worker=worker, outcome=outcome, spec=spec)
    except (OSError, IntegrityError, DataError) as exc:
        # A full disk, a value the database refuses: the execution ends now, saying why,
        # not when its lease expires (and again on every attempt after it).
        logger.exception("results of execution %s could not be stored", execution_id)
        execution_record_error(
            execution_id=execution_id,
            worker=worker,
            error=f"{INTERNAL_ERROR_PREFIX}the results could not be stored: {exc}",
        )
        return _errored(execution)
    return execution


def _errored(execution: Execution) -> Execution:
    """The execution in memory as execution_record_error (or a cancellation) left its row."""
    execution.status = ExecutionStatus.ERROR
    execution.passed = False
    return execution


@dataclass(eq=False)
class _Lease:
    """An execution this process is running, whose lease it renews; its `sandbox` is stopped
    if the run is cancelled."""

    execution_id: int
    worker: str
    sandbox: Any
    due: float  # time.monotonic() of the next renewal
    cancelled: bool = False  # final once released


class _Leases:
    """Renews the leases of the executions this process is running, and stops the sandbox
    of one whose run was cancelled: one thread per process for all of them. (A thread per
    execution cost every execution a thread start and a join, each waiting for the GIL: a
    tenth of an execution's time when its process is busy.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._held: list[_Lease] = []
        self._thread: threading.Thread | None = None
        self._next_round = math.inf  # when the thread wakes next (time.monotonic())
        # Set by renew_now: this process is cancelling, so a lease held from then on is
        # renewed at once too. (An execution claimed just before the cancel holds its lease
        # only after the round renew_now asked for; its agent would run until the next one.)
        self._renew_at_once = False

    @staticmethod
    def _interval() -> float:
        return max(0.5, settings.KEYSTONE_EXECUTION_LEASE_SECONDS / 3)

    def hold(self, execution_id: int, worker: str, sandbox: Any) -> _Lease:
        lease = _Lease(execution_id, worker, sandbox, time.monotonic() + self._interval())
        with self._lock:
            if self._renew_at_once:
                lease.due = time.monotonic()
            self._held.append(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="leases", daemon=True)
                self._thread.start()
            elif lease.due < self._next_round:  # idle, or waiting longer than this one may
                self._wake.notify()
        return lease

    def release(self, lease: _Lease) -> None:
        """From now on the lease is neither renewed nor cancelled."""
        with self._lock:
            self._held.remove(lease)

    def renew_now(self) -> None:
        """Renew every lease now, and every lease held from now on as soon as it is held,
        which stops the sandboxes of a run cancelled meanwhile instead of at their next
        round (up to a third of a lease away)."""
        with self._lock:
            self._renew_at_once = True
            for lease in self._held:
                lease.due = time.monotonic()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                due = [lease for lease in self._held if lease.due <= time.monotonic()]
                if not due:
                    self._next_round = min((lease.due for lease in self._held), default=math.inf)
                    self._wake.wait(
                        None
                        if self._next_round == math.inf
                        else self._next_round - time.monotonic()
                    )
                    self._next_round = math.inf
                    continue
                for lease in due:  # before any database work, which may fail
                    lease.due = time.monotonic() + self._interval()
            try:
                self._renew(due)
            except Exception:  # the database went away for a while: the next round retries
                logger.exception("leases could not be renewed")

    def _renew(self, due: list[_Lease]) -> None:
        from django.db import connection

        try:
            for lease in due:
                expires = timezone.now() + timedelta(
                    seconds=settings.KEYSTONE_EXECUTION_LEASE_SECONDS
                )
                Execution.objects.filter(
                    pk=lease.execution_id, claimed_by=lease.worker, status=ExecutionStatus.RUNNING
                ).update(lease_expires=expires)
                if Run.objects.filter(
                    executions=lease.execution_id, status=RunStatus.CANCELLED
                ).exists():
                    with self._lock:
                        if lease in self._held:  # not released meanwhile: its agent still runs
                            lease.cancelled = True
                            lease.sandbox.stop_all()
        finally:
            connection.close()  # no connection left open between rounds


_leases = _Leases()


def _leases_of_a_forked_process() -> None:
    """A forked process (keystone run's, a Celery worker's) starts with no lease thread, none
    of its parent's leases, and a lock that no thread of the parent can be holding."""
    global _leases
    _leases = _Leases()


os.register_at_fork(after_in_child=_leases_of_a_forked_process)


def execution_leases_renew_now() -> None:
    """This process's running executions see a cancelled run at once: `keystone run` calls
    it on Ctrl-C, so it does not wait for the next lease round to stop the agents."""
    _leases.renew_now()


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


# Celery's own work per message (the broker's round trips, the prefork pool's hand-over, the
# ack) was most of a short execution's cost: a message holds up to this many executions, fewer
# when that would leave some of the deployment's slots (KEYSTONE_EXECUTION_SLOTS) idle.
EXECUTIONS_PER_MESSAGE = 16


def execution_enqueue(*, execution_ids: list[int]) -> None:
    """Send the executions to the workers, a few per message, noting when
    (Execution.enqueued_at)."""
    slots = max(1, settings.KEYSTONE_EXECUTION_SLOTS)
    per_message = max(1, min(EXECUTIONS_PER_MESSAGE, len(execution_ids) // slots))
    for start in range(0, len(execution_ids), 500):
        batch = execution_ids[start : start + 500]
        Execution.objects.filter(pk__in=batch).update(enqueued_at=timezone.now())
        for first in range(0, len(batch), per_message):
            queue.executions_send(batch[first : first + per_message])
