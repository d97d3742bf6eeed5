"""The `keystone` commands that need Django: run, worker, serve.

`keystone run` walks the same path as the web app: the spec becomes a SpecVersion, the run
is planned into Execution rows and each execution is claimed, run and recorded by the
services. With no broker the CLI drives the executions itself (in-process); with
CELERY_BROKER_URL set it hands the run to the workers and follows its progress.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checks.exit_codes import (
    EXIT_GATE_FAILED,
    EXIT_INTERNAL_ERROR,
    EXIT_PROVIDER_ERROR,
    EXIT_SPEC_INVALID,
    CommandFailed,
)
from checks.output_files import write_whole
from checks.wording import counted
from evaluations.cli import start_up_over

if TYPE_CHECKING:
    from checks.spec.model import Spec as EngineSpec


def setup_django(*, migrate: bool = True) -> None:
    """Django, and (`migrate`) a database schema this version can use: the embedded SQLite
    file is created or brought up to date; a server's database must have been migrated by
    its operator, or the command stops with a message saying so."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "keystone_web.settings")
    import django

    django.setup()
    start_up_over()
    if not migrate:
        return
    from django.conf import settings
    from django.core.management import call_command

    # `migrate` loads every migration module (~150 ms) even when there is nothing to do, so
    # it runs only when a migration is pending.
    pending = migrations_pending()
    if not pending:
        return
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):  # the embedded default, on a fresh machine too
        call_command("migrate", verbosity=0, interactive=False)
        return
    # A server's database is shared with the web app and the workers: its schema changes
    # when the operator upgrades (docs/operations.md), not as a side effect of a CLI run.
    where = f"{database['NAME']!r} on {database.get('HOST') or 'localhost'}"
    names = ", ".join(f"{app}.{name}" for app, name in pending[:3])
    more = f" and {len(pending) - 3} more" if len(pending) > 3 else ""
    raise CommandFailed(
        f"the database {where} is not set up for this version of Keystone: "
        f"{len(pending)} migration(s) not applied ({names}{more}). Run `python manage.py "
        "migrate` (or `django-admin migrate --settings keystone_web.settings`) with the same "
        "DATABASE_URL first."
    )


def migrations_pending() -> list[tuple[str, str]]:
    """The migration files of installed apps not recorded as applied in the database, as
    (app, name) in order: one query against the names of the files on disk, without
    importing them. Conservative: a squashed migration not recorded yet also counts
    (migrate records it)."""
    import pkgutil
    from importlib import import_module

    from django.apps import apps
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.recorder import MigrationRecorder

    on_disk: set[tuple[str, str]] = set()
    for app_config in apps.get_app_configs():
        module_name, _ = MigrationLoader.migrations_module(app_config.label)
        if module_name is None:
            continue
        try:
            module = import_module(module_name)  # the package only: its __init__ is empty
        except ModuleNotFoundError:
            continue  # an app without migrations
        # The files MigrationLoader would load: modules not starting with _ or ~.
        on_disk.update(
            (app_config.label, info.name)
            for info in pkgutil.iter_modules(module.__path__)
            if not info.ispkg and info.name[0] not in "_~"
        )
    # An empty set when the database has no django_migrations table yet (a fresh file).
    applied = MigrationRecorder(connection).applied_migrations()
    return sorted(on_disk - set(applied))


def cli_labels(pairs: list[str]) -> dict[str, str]:
    """--label k=v pairs, plus the git sha and branch CI systems put in the environment."""
    labels: dict[str, str] = {}
    sha = (
        os.environ.get("GITHUB_SHA")
        or os.environ.get("CI_COMMIT_SHA")
        or os.environ.get("GIT_COMMIT")
    )
    branch = (
        os.environ.get("GITHUB_REF_NAME")
        or os.environ.get("CI_COMMIT_REF_NAME")
        or os.environ.get("GIT_BRANCH")
    )
    if sha:
        labels["git_sha"] = sha
    if branch:
        labels["branch"] = branch
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {pair!r}: expected KEY=VALUE")
        labels[key.strip()] = value.strip()
    return labels


def cli_selection(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """--prompt-index / --replica / --invariant as a run selection (every combination of
    the values given); None when none of them is given: the whole plan runs."""
    dimensions = {
        "prompt_index": getattr(args, "prompt_index", None),
        "replica": getattr(args, "replica", None),
        "invariant": getattr(args, "invariant", None),
    }
    given = {name: values for name, values in dimensions.items() if values}
    if not given:
        return None
    names = list(given)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*given.values())]


def cmd_run(args: argparse.Namespace) -> int:
    from checks.spec import SpecValidationError, load_spec_file

    spec_path = Path(args.spec)
    try:
        spec = load_spec_file(spec_path)  # refuse an invalid spec before touching any database
    except SpecValidationError as exc:
        for error in exc.errors:
            print(f"{spec_path}: {error}", file=sys.stderr)
        print(
            f"{spec_path}: invalid ({counted(len(exc.errors), 'error')}); nothing was run",
            file=sys.stderr,
        )
        return EXIT_SPEC_INVALID
    try:
        labels = cli_labels(args.label or [])
    except ValueError as exc:
        print(f"keystone run: {exc}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    setup_django()
    from django.conf import settings

    from evaluations import services
    from evaluations.models import Trigger

    if settings.CELERY_TASK_ALWAYS_EAGER:  # the executions run here: can this machine?
        from evaluations.runner.sandbox import docker_missing

        missing = docker_missing(spec.raw.get("sandbox") or {})
        if missing:
            print(f"{spec_path}: {missing}; nothing was run", file=sys.stderr)
            return EXIT_GATE_FAILED
    project = services.project_default()
    try:
        version = services.spec_version_create(
            project=project,
            source_yaml=spec_path.read_text(encoding="utf-8"),
            source_name=str(spec_path),
            base_dir=str(spec_path.resolve().parent),
            read_from_files=True,
        )
    except SpecValidationError as exc:  # valid, but more than this server's policy allows
        for error in exc.errors:
            print(f"{spec_path}: {error}", file=sys.stderr)
        print(f"{spec_path}: refused; nothing was run", file=sys.stderr)
        return EXIT_SPEC_INVALID
    try:
        run = services.run_create(
            spec_version=version,
            trigger=Trigger.CLI,
            labels=labels,
            replicas=args.replicas,
            scenarios=args.scenario or None,
            spec_dir=str(spec_path.resolve().parent),
            seed=args.seed,
            enqueue=False,
            only=cli_selection(args),
            judge_cache=not getattr(args, "no_judge_cache", False),
        )
    except ValueError as exc:
        print(f"keystone run: {exc}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    progress = Progress(sys.stdout)
    if settings.CELERY_TASK_ALWAYS_EAGER:
        from evaluations.runner.cgroups import usable_cpus

        _run_in_process(
            run.pk, spec, progress, args.jobs or default_jobs(), args.processes or usable_cpus()
        )
    else:
        timeout = args.timeout or _default_timeout(run.pk)
        try:
            finished = _run_on_workers(run.pk, progress, deadline=time.monotonic() + timeout)
        except KeyboardInterrupt:  # Ctrl-C: the run is cancelled, as when it runs here
            services.run_cancel(run_id=run.pk)
            raise
        if not finished:
            services.run_cancel(run_id=run.pk)
            print(
                f"keystone run: run {run.pk} did not finish within {timeout:g} s; it was "
                "cancelled (--timeout sets the limit)",
                file=sys.stderr,
            )
            return EXIT_INTERNAL_ERROR
    return _report(run.pk, args)


def default_jobs() -> int:
    """Executions at a time without a broker: two per core this process may use, since an
    execution spends much of its time waiting on its agent."""
    from evaluations.runner.cgroups import usable_cpus

    return 2 * usable_cpus()


def _default_timeout(run_id: int) -> float:
    """A bound no healthy run reaches: every execution one after the other, each taking its
    whole sandbox timeout, plus time for planning and finalising."""
    from evaluations.models import Run
    from evaluations.services import engine_spec

    run = Run.objects.select_related("spec_version").get(pk=run_id)
    spec = engine_spec(run)
    per_execution = float((spec.raw.get("sandbox") or {}).get("resources", {}).get("timeout", 600))
    return per_execution * max(1, run.execution_count or len(spec.prompts)) + 300.0


def _run_in_process(
    run_id: int, spec: EngineSpec, progress: Progress, jobs: int, processes: int
) -> None:
    """Execute the run's executions on this machine, `jobs` at a time: threads in this
    process and in up to `processes` - 1 forked ones, one per further core. Threads, because
    an execution mostly waits on its sandbox's processes and on HTTP; processes, because
    preparing and recording an execution is Python work that holds its process's GIL (one
    process kept one core busy), at the cost of a Python of their own each (`--processes 1`
    keeps the run in this one). Each thread keeps its own database connection for all the
    executions it takes (SQLite takes writers one at a time; see settings), and each
    execution is claimed before it runs, as on the workers, so no two threads ever run the
    same one. `spec`: the run's spec as cmd_run read it (what the forked processes will need
    to import)."""
    import multiprocessing

    from django.db import connections

    from evaluations import services

    work: _SharedWork | None = None
    children: list[Any] = []
    own: list[threading.Thread] = []
    one_malloc_arena()  # before the threads start and the processes fork, who inherit it
    # Everything from planning on inside the try: a Ctrl-C at any moment (planning, forking,
    # starting the threads) cancels the run, which no one else would finish.
    try:
        execution_ids = services.run_plan(run_id=run_id)
        total = len(execution_ids)
        jobs = max(1, min(jobs, total))
        processes = min(processes, jobs)
        if processes > 1:
            # Imported once before forking (what this run's spec needs): each forked process
            # inherits it instead of importing it again (~0.1 s of CPU each).
            from evaluations.services.executions import execution_modules_import

            execution_modules_import(spec)
        # The jobs shared out: this process's threads first, then each forked process's.
        threads = [jobs // processes + (index < jobs % processes) for index in range(processes)]
        context = multiprocessing.get_context("fork")
        work = _SharedWork(
            run_id, execution_ids, context.Value("i", 0), context.Event(), _Outcomes(context)
        )
        connections.close_all()  # a forked process must not share this process's connections
        children = [
            context.Process(target=_execute_in_child, args=(work, count), daemon=True)
            for count in threads[1:]
        ]
        own = [threading.Thread(target=work.execute_until_done) for _ in range(threads[0])]
        for child in children:
            child.start()
        for thread in own:
            thread.start()
        for done in range(1, total + 1):
            outcome = work.finished.get(children)
            if isinstance(outcome, BaseException):
                raise outcome
            progress.step(done, total, outcome)
    except BaseException:
        # Ctrl-C or an error (a thread's, or a forked process that died): cancel the run and
        # start nothing more. The lease rounds stop the running executions' sandboxes, so the
        # threads end without waiting for their agents: at once, not at the next round, in
        # this process and (once they see `stopping`, _execute_in_child) in the forked ones.
        try:
            services.run_cancel(run_id=run_id)
        finally:
            if work is not None:
                work.stopping.set()
        services.execution_leases_renew_now()
        _record_dead_children(run_id, children)
        raise
    finally:
        for thread in own:
            if thread.ident is not None:  # started
                thread.join()
        for child in children:
            if child.pid is not None:  # started
                child.join()
    services.run_finalize_if_done(run_id=run_id)
    progress.finish()


def one_malloc_arena() -> None:
    """One malloc arena for this process, not glibc's one per thread (up to eight per core).
    `keystone run`'s threads take turns on the GIL, so an arena each buys them no
    parallelism, and each arena keeps the memory freed in it for itself: about 3 MB more in
    the peak of a four-thread run, no faster (issue 18). Not glibc (musl, say): nothing to
    set."""
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        m_arena_max = -8  # glibc's malloc.h
        mallopt(m_arena_max, 1)


def _record_dead_children(run_id: int, children: list[Any]) -> None:
    """The executions a forked process held when it died end as errors that say so (no
    lease watcher is left to end them), and its agents, which no one would stop, are killed."""
    from evaluations import services
    from evaluations.models import Execution, ExecutionStatus

    dead = [child for child in children if child.exitcode not in (None, 0)]
    if dead:
        _stop_what_dead_processes_left()
    for child in dead:
        worker = f"cli:{child.pid}"
        held = Execution.objects.filter(
            run_id=run_id, claimed_by=worker, status=ExecutionStatus.RUNNING
        ).values_list("pk", flat=True)
        for execution_id in held:
            services.execution_record_error(
                execution_id=execution_id,
                worker=worker,
                error=f"the process running it ended with exit code {child.exitcode}",
            )


def _stop_what_dead_processes_left() -> None:
    """At once, for a process of `keystone run` that has seen another one die: kill what the
    agents of the processes that died left running (their commands' groups; their uids'
    processes where there was no group; their containers), which no one else would stop
    before the next look of a command on this host, then remove their workspaces."""
    from django.conf import settings

    from evaluations.runner import cgroups, local_uids, sandbox, workspace

    cgroups.kill_orphans()
    local_uids.release_dead_holders()
    sandbox.remove_orphaned_containers_now()
    workspace.remove_orphaned_workspaces(Path(settings.KEYSTONE_WORK_DIR))


class _SharedWork:
    """The executions to run, shared by the threads of `keystone run`'s processes: the next
    one to take (an index into the ids every process has), whether to stop, and what each
    finished with, as the progress line needs it (or the exception that stopped a thread)."""

    def __init__(
        self, run_id: int, execution_ids: list[int], taken: Any, stopping: Any, finished: Any
    ):
        self.run_id = run_id
        self.execution_ids = execution_ids
        self.taken = taken
        self.stopping = stopping
        self.finished = finished

    def next_id(self) -> int | None:
        with self.taken.get_lock():
            index = self.taken.value
            if self.stopping.is_set() or index >= len(self.execution_ids):
                return None
            self.taken.value = index + 1
        return self.execution_ids[index]

    def execute_until_done(self) -> None:
        from types import SimpleNamespace

        from django.db import connections

        from evaluations import services
        from evaluations.models import Run

        worker = f"cli:{os.getpid()}"
        run = None  # read once for all the executions this thread takes, not once for each
        try:
            while (execution_id := self.next_id()) is not None:
                try:
                    run = run or Run.objects.select_related("spec_version").get(pk=self.run_id)
                    done = services.execution_execute(
                        execution_id=execution_id, worker=worker, run=run
                    )
                except BaseException as exc:  # handed to the main thread, which raises it
                    self.finished.put(_picklable(exc))
                    return
                # As recorded (None: not this process's to run), what the progress line shows.
                self.finished.put(
                    None
                    if done is None
                    else SimpleNamespace(
                        **{field: getattr(done, field) for field in PROGRESS_FIELDS}
                    )
                )
        finally:
            connections.close_all()  # this thread's connections only


class _Outcomes:
    """What each finished execution hands to the progress line, from any thread of any of
    `keystone run`'s processes: one pipe, written under a lock the processes share. Not a
    multiprocessing.Queue, whose every put wakes a feeder thread: a tenth of the executing
    threads' time holding the GIL."""

    def __init__(self, context: Any) -> None:
        self._reader, self._writer = context.Pipe(duplex=False)
        self._lock = context.Lock()

    def put(self, outcome: Any) -> None:
        import pickle

        data = pickle.dumps(outcome)
        with self._lock:
            self._writer.send_bytes(data)

    def get(self, children: list[Any]) -> Any:
        """The next outcome; an error as soon as a forked process has died (killed by the
        kernel, say) without handing over what it had taken."""
        import pickle
        from multiprocessing.connection import wait

        while True:
            if self._reader.poll():
                return pickle.loads(self._reader.recv_bytes())
            # Each exit code read once: a process that died between two reads would be
            # neither reported nor waited for, and the wait below would never end.
            running = []
            for child in children:
                exitcode = child.exitcode
                if exitcode not in (None, 0):
                    raise RuntimeError(
                        f"a process running executions ended with exit code {exitcode}"
                    )
                if exitcode is None:
                    running.append(child.sentinel)
            # Not for good: the kernel may hand a Ctrl-C sent to this process to any of its
            # threads, and a signal another thread takes does not interrupt this wait; Python
            # raises the KeyboardInterrupt only once the main thread runs again.
            wait([self._reader, *running], timeout=0.5)


PROGRESS_FIELDS = (
    "scenario",
    "prompt_index",
    "replica",
    "status",
    "passed",
    "pillar",
    "mutation_type",
)


def _execute_in_child(work: _SharedWork, threads: int) -> None:
    """A forked process of `keystone run`: `threads` threads taking executions until none is
    left. Ctrl-C reaches every process of the terminal's group: only the parent acts on it."""
    import atexit

    from evaluations import services

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # What this process starts for its executions and stops at exit (agent.start servers,
    # local PostgreSQL clusters) is stopped by atexit handlers, which multiprocessing skips
    # (a forked process ends with os._exit): they are run here, after dropping the ones
    # inherited from the parent, which are the parent's to run.
    atexit._clear()

    parent = os.getppid()

    def stop_agents_once_stopping() -> None:  # set once the run is cancelled
        # Polled, not wait(): the parent's set() waits for every waiter to wake, forever
        # for one in a process that was killed.
        while not work.stopping.is_set():
            if os.getppid() != parent:
                # The command was killed (the OOM killer, kill -9): no one is left to report
                # this process's executions, nor to finish the run, nor to stop its agents.
                _stop_what_dead_processes_left()
                services.run_cancel(run_id=work.run_id)
                work.stopping.set()
                break
            time.sleep(0.25)
        services.execution_leases_renew_now()

    threading.Thread(target=stop_agents_once_stopping, daemon=True).start()
    try:
        running = [threading.Thread(target=work.execute_until_done) for _ in range(threads)]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join()
    finally:
        atexit._run_exitfuncs()


def _picklable(exc: BaseException) -> BaseException:
    """The exception as it can cross to the parent process (the message, if it cannot)."""
    import pickle

    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _run_on_workers(run_id: int, progress: Progress, *, deadline: float) -> bool:
    """Hand the run to the workers and follow it until it ends (True) or the deadline passes
    (False). The database going away for a while (a restart) is waited out, not fatal: the
    run goes on on the workers meanwhile."""
    from django.db import DatabaseError, close_old_connections

    from evaluations import queue
    from evaluations.models import RUN_TERMINAL_STATUSES
    from evaluations.selectors import run_progress

    queue.run_plan_later(run_id)
    last = -1
    while time.monotonic() < deadline:
        try:
            status, done, total = run_progress(run_id)
        except DatabaseError as exc:
            print(f"keystone run: database unavailable ({exc}); waiting", file=sys.stderr)
            close_old_connections()
            time.sleep(2.0)
            continue
        if done != last:
            progress.step(done, total, None)
            last = done
        if status in RUN_TERMINAL_STATUSES:
            progress.finish()
            return True
        time.sleep(0.5)
    progress.finish()
    return False


def _report(run_id: int, args: argparse.Namespace) -> int:
    from checks.reporters import render_terminal, write_reports
    from checks.scoring import score_run
    from evaluations.models import Run, run_large_fields
    from evaluations.selectors import run_records
    from evaluations.services import engine_spec
    from evaluations.terminal import use_color

    # Scored again from the stored results, whose records the reports need: not the stored
    # summary, a large JSON field (~0.5 kB per scenario x prompt) this would only decode.
    run = Run.objects.select_related("spec_version").defer(*run_large_fields()).get(pk=run_id)
    summary = score_run(engine_spec(run), run_records(run))
    for warning in run.warnings:
        if warning not in summary.warnings:
            summary.warnings.append(warning)
    sys.stdout.write(render_terminal(summary, color=use_color(args.color, sys.stdout)))
    for path in write_reports(
        summary, json_path=args.json, junit_path=args.junit, markdown_path=args.markdown
    ):
        print(f"wrote {path}")
    print(f"run {run.pk}: exit code {summary.exit_code}")
    return summary.exit_code


class Progress:
    """A progress bar on a terminal, plain lines in CI logs."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = stream.isatty() and not os.environ.get("CI")

    def step(self, done: int, total: int, execution: Any) -> None:
        if self.tty:
            width = 30
            filled = int(width * done / total) if total else width
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
            self.stream.flush()
            return
        where = ""
        if execution is not None:
            verdict = (
                "pass"
                if execution.passed
                else execution.status
                if execution.status != "success"
                else "fail"
            )
            pillar = execution.pillar
            label = (
                f"{pillar} {execution.mutation_type or execution.scenario}"
                if pillar in ("mutation", "replay")
                else execution.scenario
            )
            where = (
                f" {label} prompt {execution.prompt_index} replica {execution.replica}: {verdict}"
            )
        self.stream.write(f"execution {done}/{total}{where}\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def cmd_replay_export(args: argparse.Namespace) -> int:
    """`keystone replay export RUN_ID --out DIR`: one replay file per failed execution."""
    setup_django()
    from evaluations import services
    from evaluations.models import Run

    if not Run.objects.filter(pk=args.run_id).exists():
        print(f"keystone replay export: no run {args.run_id}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    written = services.run_replay_export(
        run_id=args.run_id, out_dir=args.out, failed_only=not args.all
    )
    for path in written:
        print(f"wrote {path}")
    kind = "execution(s)" if args.all else "failed execution(s)"
    print(f"{len(written)} {kind} of run {args.run_id} exported as replay files")
    return 0


def cmd_report_regressions(args: argparse.Namespace) -> int:
    """`keystone report regressions --project P [--since 7d] [--markdown F] [--json F]
    [--csv F]`: the regressions report; Markdown on stdout when no file is named. Exits 0
    whether or not something regressed (gates decide a run's verdict, not this report)."""
    setup_django()
    from django.conf import settings

    from evaluations import selectors
    from evaluations.models import Project
    from evaluations.selectors.reports import parse_since

    project = Project.objects.filter(slug=args.project).first()
    if project is None:
        print(f"keystone report regressions: no project {args.project!r}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    try:
        since = parse_since(args.since)
    except ValueError as exc:
        print(f"keystone report regressions: --{exc}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    if args.label and "=" not in args.label:
        print(
            f"keystone report regressions: --label {args.label!r}: write key=value", file=sys.stderr
        )
        return EXIT_SPEC_INVALID
    report = selectors.regression_report(
        project, since=since, spec=args.spec, branch=args.branch, label=args.label
    )
    markdown = selectors.report_markdown(report, base_url=settings.KEYSTONE_BASE_URL)
    outputs = {
        args.markdown: markdown,
        args.json: selectors.report_json(report),
        args.csv: selectors.report_csv(report),
    }
    written = [(path, text) for path, text in outputs.items() if path]
    if not written:
        sys.stdout.write(markdown)
    for path, text in written:
        write_whole(path, [text])
        print(f"wrote {path}")
    print(f"{len(report.rows)} regressed group(s) in {project.slug}", file=sys.stderr)
    return 0


def celery_worker_command(
    *,
    concurrency: int,
    loglevel: str,
    beat_schedule: Path | None = None,
    hostname: str | None = None,
) -> list[str]:
    """The command line of a Celery worker for Keystone's tasks. With `beat_schedule` it
    also runs beat (the periodic requeue of dead workers' executions), keeping its state in
    that file; `hostname` names the worker (`name@%h`) where several share a machine."""
    command = [sys.executable, "-m", "keystone_web.worker"]
    command += ["--loglevel", loglevel, "--concurrency", str(concurrency)]
    if beat_schedule is not None:
        command += ["--beat", "--schedule", str(beat_schedule)]
    if hostname is not None:
        command += ["--hostname", hostname]
    return command


def cmd_worker(args: argparse.Namespace) -> int:
    """A Celery worker, or the embedded database-polling worker when no broker is configured.
    Beat (the periodic requeue of dead workers' executions) runs only with --beat: a
    deployment runs exactly one (`keystone beat`, or one worker started with --beat)."""
    setup_django(migrate=False)
    from django.conf import settings

    if settings.CELERY_TASK_ALWAYS_EAGER:
        from evaluations.embedded_worker import start_pollers

        threads = args.concurrency or default_jobs()
        print(
            f"keystone worker: no CELERY_BROKER_URL; polling the database for work "
            f"({counted(threads, 'execution')} at a time)"
        )
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        pollers = start_pollers(stop, threads)
        try:
            while any(poller.is_alive() for poller in pollers):
                pollers[0].join(timeout=1.0)
        except KeyboardInterrupt:
            stop.set()
        return 0
    command = celery_worker_command(
        concurrency=args.concurrency or 2,
        loglevel=args.loglevel,
        beat_schedule=Path(settings.KEYSTONE_HOME) / "celerybeat-schedule" if args.beat else None,
        # Unique per process, so two workers on one host are two nodes, not one name twice.
        hostname=args.name or f"keystone-{os.getpid()}@%h",
    )
    # One process tree: Celery replaces this process instead of running beside it.
    os.execv(command[0], command)
    return 0  # not reached


def cmd_beat(args: argparse.Namespace) -> int:
    """Celery beat alone: the periodic jobs (requeue of expired leases) for a deployment."""
    setup_django(migrate=False)
    from django.conf import settings

    if settings.CELERY_TASK_ALWAYS_EAGER:
        print("keystone beat: no CELERY_BROKER_URL; the embedded worker runs the periodic jobs")
        return 2
    schedule = Path(settings.KEYSTONE_HOME) / "celerybeat-schedule"
    command = [sys.executable, "-m", "celery", "-A", "keystone_web", "beat"]
    command += ["--loglevel", args.loglevel, "--schedule", str(schedule)]
    os.execv(command[0], command)
    return 0  # not reached


def cmd_serve(args: argparse.Namespace) -> int:
    """The web app with a worker beside it: on the embedded default a database-polling
    thread, so a run started in the browser executes without Redis or Celery."""
    setup_django()
    from django.conf import settings
    from django.core.management import call_command

    if args.demo:
        from evaluations.services import demo_load, demo_runs_seed

        for line in demo_load():
            print(line)
        # The first start only: the demo specs really run here, so the pages have a history.
        print("keystone serve: making the demo's history when it has none (about a minute)")
        demo_runs_seed(on_step=lambda line: print(line, flush=True))
    stop = threading.Event()
    if settings.CELERY_TASK_ALWAYS_EAGER:
        from evaluations.embedded_worker import start_pollers

        settings.KEYSTONE_EMBEDDED_WORKER = True
        jobs = default_jobs()
        start_pollers(stop, jobs)
        print(
            f"keystone serve: embedded worker started (no broker configured; "
            f"{jobs} executions at a time)"
        )
    # SIGTERM ends the server like Ctrl-C, through the exit handlers: the agents and the
    # throwaway PostgreSQL cluster this process started are stopped, not left running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        call_command(
            "runserver", f"{args.host}:{args.port}", use_reloader=False, use_threading=True
        )
    finally:
        stop.set()
    return 0


def handle_errors(func: Any) -> Any:
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except ConnectionError as exc:
            print(f"keystone: provider or service unreachable: {exc}", file=sys.stderr)
            return EXIT_PROVIDER_ERROR
        except Exception as exc:
            print(f"keystone: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_INTERNAL_ERROR

    return wrapper


def cmd_compare(args: argparse.Namespace) -> int:
    """A run against its spec's active baseline or another run of the same spec: what
    regressed, by Fisher's exact test; exit 1 when something did (a CI gate), 0 otherwise."""
    setup_django()
    from checks.compare import render_comparison
    from checks.reporters import cap_markdown
    from evaluations.models import Run
    from evaluations.selectors.compare import (
        ComparisonRefused,
        comparison_reference,
        execution_pairs,
        run_comparison,
    )

    after = Run.objects.select_related("spec", "spec_version").filter(pk=args.run).first()
    try:
        if after is None:
            raise ComparisonRefused(f"no run {args.run}")
        before = comparison_reference(after, args.against)
    except ComparisonRefused as exc:
        print(f"keystone compare: {exc}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    comparison = run_comparison(before, after, alpha=args.alpha)
    text = render_comparison(comparison, f"run {before.pk}", f"run {after.pk}")
    sys.stdout.write(text)
    if args.json:
        document = {"before": before.pk, "after": after.pk, **comparison.to_dict()}
        write_whole(args.json, [json.dumps(document, indent=2)])
        print(f"wrote {args.json}")
    if args.markdown:
        markdown = cap_markdown(
            f"# Keystone compare: run {after.pk} against run {before.pk}\n\n```\n{text}```\n"
            + _changed_executions_markdown(execution_pairs(before, after, size=20).pairs)
        )
        write_whole(args.markdown, [markdown])
        print(f"wrote {args.markdown}")
    return 1 if comparison.regressed else 0


def _changed_executions_markdown(pairs: list[Any]) -> str:
    """The first executions that changed, each with its output diffed word by word
    ([-removed-]{+added+}, as git diff --word-diff shows it) and its tool calls."""
    if not pairs:
        return ""
    lines = ["", "## Executions that changed", ""]
    for pair in pairs:
        verdict = "passed" if pair.after["passed"] else "failed"
        if pair.before is not None:
            verdict = f"{'passed' if pair.before['passed'] else 'failed'} -> {verdict}"
        lines.append(
            f"### {pair.scenario} / prompt {pair.prompt_index} / replica {pair.replica}: {verdict}"
        )
        marks = {"delete": "[-{}-]", "insert": "{{+{}+}}"}
        diff = "".join(marks.get(op, "{}").format(text) for op, text in pair.diff)
        lines += ["", "```", diff.rstrip("\n"), "```", ""]
        if pair.tools_changed:
            lines.append(f"Tool calls: {', '.join(pair.tools_before) or 'none'}")
            lines.append(f"now: {', '.join(pair.tools_after) or 'none'}")
            lines.append("")
    return "\n".join(lines)


def _baseline_line(baseline: Any) -> str:
    state = "active" if baseline.active else ("rolled back" if baseline.rolled_back else "replaced")
    run = f"run {baseline.run_id}" if baseline.run_id else "run deleted"
    line = (
        f"{baseline.created:%Y-%m-%d %H:%M}  {baseline.branch:<12} {baseline.name} ({run}, {state})"
    )
    if baseline.reason:
        line += f"  reason: {baseline.reason}"
    return line


def cmd_baseline_promote(args: argparse.Namespace) -> int:
    """Freeze a completed run as its spec's baseline for a branch (recorded in the history)."""
    setup_django()
    from evaluations import services

    try:
        baseline = services.baseline_promote(
            run_id=args.run,
            user=_cli_user(args.by),
            name=args.name,
            branch=args.branch,
            reason=args.reason,
        )
    except services.BaselineError as exc:
        print(f"keystone baseline promote: {exc}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    previous = f", replacing {baseline.previous.name}" if baseline.previous else ""
    print(
        f"run {args.run} is the baseline {baseline.name} of {baseline.spec.slug} "
        f"on {baseline.branch}{previous}"
    )
    return 0


def _cli_user(username: str) -> Any:
    """The person `--by` names (their role in the project is checked like on the page), or
    None: the server's own command line acts without one."""
    if not username:
        return None
    from django.contrib.auth import get_user_model

    from evaluations import services

    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise services.BaselineError(f"--by: no active user {username!r}")
    return user


def _spec_of(args: argparse.Namespace, command: str) -> Any:
    from evaluations.models import Spec

    spec = Spec.objects.filter(project__slug=args.project, slug=args.spec).first()
    if spec is None:
        print(
            f"keystone baseline {command}: no spec {args.spec} in project {args.project}",
            file=sys.stderr,
        )
    return spec


def cmd_baseline_rollback(args: argparse.Namespace) -> int:
    """Undo the last promotion of a spec's branch: the baseline it replaced is active again."""
    setup_django()
    from evaluations import services

    spec = _spec_of(args, "rollback")
    if spec is None:
        return EXIT_SPEC_INVALID
    try:
        restored = services.baseline_rollback(
            spec_id=spec.pk, branch=args.branch, user=_cli_user(args.by)
        )
    except services.BaselineError as exc:
        print(f"keystone baseline rollback: {exc}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    print(f"rolled back: {restored.name} is the baseline of {spec.slug} on {restored.branch}")
    return 0


def cmd_baseline_list(args: argparse.Namespace) -> int:
    """A spec's promotions, newest first."""
    setup_django()
    from evaluations import selectors

    spec = _spec_of(args, "list")
    if spec is None:
        return EXIT_SPEC_INVALID
    history = selectors.spec_baseline_history(spec.pk)
    if not history:
        print(f"{spec.slug} has no baseline yet")
    for baseline in history:
        print(_baseline_line(baseline))
    return 0
