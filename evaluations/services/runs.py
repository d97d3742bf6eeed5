"""Runs: create, plan into executions (contract, chaos, mutation and replay pillars),
cancel, re-run the failed ones, and warnings shown on the run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone

from checks.planning import (
    PlannedExecution,
    plan_run,
    select_planned,
    validate_selection,
)
from checks.spec.model import Spec as EngineSpec
from checks.spec.semantics import too_long
from evaluations import policy, queue
from evaluations.models import (
    RUN_LABEL_MAX,
    RUN_TERMINAL_STATUSES,
    Execution,
    ExecutionStatus,
    Run,
    RunStatus,
    SpecVersion,
    Trigger,
)
from evaluations.services import statements
from evaluations.services.replay import execution_replay_session


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
    idempotency_key: str = "",
    request_digest: str = "",
) -> Run:
    """A queued run; its planning is handed to a worker once the row is committed.
    `only` keeps part of the plan (checks.planning.select_planned): the failed groups of an
    earlier run, or the one execution a reproducer command names. `judge_cache=False` makes
    the run's judge neither read nor write cached verdicts. With an `idempotency_key` the run
    that key already made is returned (IdempotencyConflict when it was asked for something
    else, told by `request_digest`)."""
    if idempotency_key:
        earlier = _run_of_key(spec_version.spec.project_id, idempotency_key, request_digest)
        if earlier is not None:
            return earlier
    if replicas is not None and replicas < 1:
        raise ValueError(f"replicas: expected a whole number of at least 1, got {replicas}")
    labels = {str(k): str(v) for k, v in (labels or {}).items()}
    _check_label_lengths(labels)
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
        # A directory given for this run is where `keystone run` read the file from.
        "read_from_files": bool(spec_dir) or host_parts_allowed(spec_version),
        "seed": seed,
    }
    if not judge_cache:
        options["judge_cache"] = False
    if only is not None:
        options["only"] = _checked_selection(spec_version, only, replicas, scenarios)
    else:
        # The plan's size is refused when the run is asked for, not after it was queued.
        matrix = plan_run(
            EngineSpec.from_dict(spec_version.parsed),
            replicas=replicas,
            scenarios=scenarios or None,
        )
        policy.check_plan_size(len(matrix))
    try:
        with transaction.atomic():
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
                idempotency_key=idempotency_key,
                request_digest=request_digest,
            )
    except IntegrityError:
        if not idempotency_key:  # not a race on a key: what refused the row is the error
            raise
        # The same key in a request that was a moment quicker.
        earlier = _run_of_key(spec_version.spec.project_id, idempotency_key, request_digest)
        assert earlier is not None
        return earlier
    if enqueue:
        queue.run_plan_later(run.pk)
    return run


class RunLabelError(ValueError):
    """A label the run cannot store; the message starts with the label's name."""


def _check_label_lengths(labels: dict[str, str]) -> None:
    """The git_sha and branch labels are also stored in columns of fixed size: a longer
    value reached PostgreSQL, which refused the whole run (a 500) without saying which."""
    for name, limit in RUN_LABEL_MAX.items():
        problem = too_long(labels.get(name, ""), limit)
        if problem:
            raise RunLabelError(f"labels.{name}: {problem}")


class IdempotencyConflict(ValueError):
    """An Idempotency-Key used again for a request that asks for something else."""


def _run_of_key(project_id: int, key: str, digest: str) -> Run | None:
    earlier = Run.objects.filter(project_id=project_id, idempotency_key=key).first()
    if earlier is not None and earlier.request_digest != digest:
        raise IdempotencyConflict(
            f"Idempotency-Key {key!r} already made run {earlier.pk} from another request; "
            "use a new key for a new run"
        )
    return earlier


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


PLAN_BATCH = 1000


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
            try:
                policy.check_plan_size(len(planned))
            except policy.PolicyError as exc:  # mutants and replays counted: known only now
                run.status = RunStatus.FAILED
                run.finished = timezone.now()
                run.warnings = [*run.warnings, str(exc)]
                run.save(update_fields=["status", "finished", "warnings"])
                return []
            # Made and inserted a batch at a time: a run's rows all at once held 1.6 kB each
            # (10,000 executions: 16 MB more at the run's start, for as long as it ran).
            # Inserted once: the run's row is locked (on SQLite every transaction takes the
            # write lock first) and planned only while it is queued.
            for start in range(0, len(planned), PLAN_BATCH):
                rows = [_execution_row(run, p) for p in planned[start : start + PLAN_BATCH]]
                statements.insert(Execution, rows)
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
    selection = run.options.get("only") or []
    reproduces_extra = any(s.get("pillar") in ("mutation", "replay") for s in selection)
    if run.options.get("scenarios") and not reproduces_extra:
        return [], [], []
    mutation_config = spec.raw.get("mutations")
    replay_sessions = (spec.raw.get("replay") or {}).get("sessions")
    if not (mutation_config or {}).get("types") and not replay_sessions:
        return [], [], []  # neither pillar: nothing to plan, nor its modules to import
    from evaluations.runner.mutations import plan_mutants
    from evaluations.runner.replay import plan_sessions

    run_seed = int(run.options.get("seed", 0))
    ask_model = None
    if (mutation_config or {}).get("use_llm") and spec.raw.get("llm"):
        ask_model = _mutation_writer(run, spec)
    mutants, warnings = plan_mutants(
        mutation_config, spec.prompts, run_seed=run_seed, ask_model=ask_model
    )
    sessions, replay_warnings = plan_sessions(
        spec.raw.get("replay"),
        base_dir=_files_dir(run),
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
        with Gateway(llm, secrets=run_secrets(run)) as gateway:
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
        # Every state that has not ended: a run whose finalising message was lost too.
        updated = (
            Run.objects.filter(pk=run_id)
            .exclude(status__in=RUN_TERMINAL_STATUSES)
            .update(status=RunStatus.CANCELLED, finished=timezone.now())
        )
        if updated:
            Execution.objects.filter(run_id=run_id, status=ExecutionStatus.PENDING).update(
                status=ExecutionStatus.ERROR, error="cancelled", finished=timezone.now()
            )


def run_rerun_failed(
    *, run_id: int, created_by: Any = None, enqueue: bool = True, trigger: str = Trigger.WEB
) -> Run:
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
        trigger=trigger,
        labels={**run.labels, "rerun_of": str(run.pk)},
        replicas=run.replicas_override,
        scenarios=run.options.get("scenarios") or None,
        spec_dir=_files_dir(run),
        seed=int(run.options.get("seed", 0)),
        created_by=created_by,
        enqueue=enqueue,
        only=selection,
    )


# The distinct warnings a run keeps. Most repeat one cause (every execution meets the same
# sandbox), but some carry an execution's own details (its id, a provider's "try again in
# 1.02s"): one each would grow the run's row, its page and every write of the list with the
# run. The next one after these is said once, as RUN_WARNINGS_MORE; each execution keeps
# its own error.
RUN_WARNINGS_KEPT = 20
RUN_WARNINGS_MORE = (
    f"more than {RUN_WARNINGS_KEPT} different warnings: the later ones are not kept here "
    "(each execution keeps its own error)"
)


def _warning_to_add(warnings: list[str], warning: str) -> str | None:
    """What adding `warning` to a run's `warnings` appends: the warning, RUN_WARNINGS_MORE in
    its place once the list holds RUN_WARNINGS_KEPT, or nothing (None) when the list has it
    already or says it is full."""
    if not warning or warning in warnings or RUN_WARNINGS_MORE in warnings:
        return None
    return warning if len(warnings) < RUN_WARNINGS_KEPT else RUN_WARNINGS_MORE


def run_warning_note(run: Run, warning: str) -> None:
    """Add `warning` to the run unless this copy of it carries it already (or is full); the
    copy learns it too. An execution's warnings are usually its run's (every execution
    meets the same sandbox): whoever runs many executions of one run with one copy of it
    adds each once."""
    added = _warning_to_add(run.warnings, warning)
    if added is not None:
        run_warning_add(run_id=run.pk, warning=warning)
        run.warnings = [*run.warnings, added]


def run_warning_add(*, run_id: int, warning: str) -> None:
    # Most calls repeat a warning the run has (every execution of it meets the same sandbox):
    # a plain read first spares them a write transaction, which SQLite serialises.
    if _warning_to_add(Run.objects.values_list("warnings", flat=True).get(pk=run_id), warning):
        with transaction.atomic():
            run = Run.objects.select_for_update().only("warnings").get(pk=run_id)
            added = _warning_to_add(run.warnings, warning)
            if added is not None:
                run.warnings = [*run.warnings, added]
                run.save(update_fields=["warnings"])


def _files_dir(run: Run) -> str | None:
    """The directory the run's spec was read from, when its host parts may be used there
    (options["read_from_files"]); None for a run confined to its directory's inside."""
    return run.options.get("spec_dir") if run.options.get("read_from_files") else None


def _host_parts(parsed: dict[str, Any]) -> list[Any]:
    """What a spec reaches on the server outside its sandbox and its directory: the command
    agent.start runs on the host, the directory sandbox.workspace copies (from anywhere),
    the replay files read (from anywhere)."""
    sessions = (parsed.get("replay") or {}).get("sessions") or []
    return [
        (parsed.get("agent") or {}).get("start"),
        (parsed.get("sandbox") or {}).get("workspace"),
        [s for s in sessions if isinstance(s, str) or (isinstance(s, dict) and "file" in s)],
    ]


def host_parts_allowed(version: SpecVersion) -> bool:
    """Whether runs of `version` may use its host parts (_host_parts). A text read from a
    file on the server may: the operator laid it out. A text typed in the browser may only
    keep those of the spec's latest version read from the same directory, so that an edited
    demo spec runs as before (issue 17) while an editor can put no new command on the host
    and no other server path in it."""
    if version.read_from_files:
        return True
    if not version.base_dir:
        return False
    origin = (
        version.spec.versions.filter(
            read_from_files=True, base_dir=version.base_dir, number__lt=version.number
        )
        .order_by("-number")
        .first()
    )
    return origin is not None and _host_parts(origin.parsed) == _host_parts(version.parsed)


def run_secrets(run: Run) -> dict[str, str]:
    """Only the variables the spec names (its `secrets` and the llm's api_key_env), and of
    those only the ones the policy allows now: a run plans (mutations.use_llm) before any
    execution checks the policy again, and the server's own settings never leave it."""
    import os

    parsed = run.spec_version.parsed
    names = list(parsed.get("secrets") or [])
    for block in ("llm", "judge"):
        key_env = (parsed.get(block) or {}).get("api_key_env")
        if key_env:
            names.append(key_env)
    current = policy.current()
    return {
        name: os.environ[name]
        for name in names
        if name in os.environ and policy.secret_refusal(str(name), current) is None
    }


def run_sweep_stuck(*, enqueue: bool = True) -> list[int]:
    """Runs whose message was lost get it again, so every state has a way out: a run still
    `queued` a lease after it was created is planned, one whose executions are all done
    but that is still `running` or `finalizing` a lease after its last execution ended is
    finalised. Planning and finalising are idempotent, so a message that was only slow does
    no harm. The embedded worker passes enqueue=False and finalises the returned runs itself;
    it plans queued runs on its own. Returns the ids of the runs to finalise."""
    stale = timezone.now() - timedelta(seconds=settings.KEYSTONE_EXECUTION_LEASE_SECONDS)
    if enqueue:
        for run_id in Run.objects.filter(status=RunStatus.QUEUED, created__lt=stale).values_list(
            "id", flat=True
        )[:100]:
            queue.run_plan_later(run_id)
    done = Run.objects.filter(
        status__in=[RunStatus.RUNNING, RunStatus.FINALIZING],
        executions_done__gte=F("execution_count"),
    ).annotate(last_finished=Max("executions__finished"))
    to_finalize = [
        run.pk for run in done[:100] if run.last_finished is None or run.last_finished < stale
    ]
    if enqueue:
        for run_id in to_finalize:
            queue.run_finalize_later(run_id)
    return to_finalize
