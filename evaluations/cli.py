"""The `keystone` command: validate specs, score stored results, and (later) run, work, serve.

`validate` and `score` use the pure engine only: this module must import nothing from Django
at import time, so they work in CI with no settings configured. Commands that need Django
(`run` through the web app's queue, `worker`, `serve`) import it inside their handlers.

Exit codes (docs/scoring.md): 0 every gate passed; 1 a gate failed; 2 a spec or report that
cannot be used (invalid, missing, not JSON); 3 provider error; 4 internal error.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from checks.exit_codes import EXIT_INTERNAL_ERROR, EXIT_OK, EXIT_SPEC_INVALID, CommandFailed
from checks.metrics import SUMMARY_METRICS, format_metric
from checks.wording import counted
from evaluations.terminal import use_color
from keystone_web.worker import LOG_LEVELS

if TYPE_CHECKING:
    from checks.report_model import RunSummary

Handler = Callable[[argparse.Namespace], int]


def command() -> None:
    """The `keystone` executable (and `python -m evaluations.cli`)."""
    # A command's start-up (imports, django.setup()) makes objects that live as long as the
    # process: the collector's passes over them while they pile up find nothing to free, and
    # took about a quarter of a one-execution `keystone run`. Collection resumes once start-up
    # is over (start_up_over).
    gc.disable()
    code = main()
    # And at exit, the interpreter's last collections would go over every object once more
    # (~0.1 s) only to free memory the process is handing back anyway.
    gc.freeze()
    sys.exit(code)


def start_up_over() -> None:
    """Collect garbage from here on, without ever looking again at what start-up made (it
    lives as long as the process). A no-op where command() did not turn collection off (a
    test calling main(), a server process)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_SPEC_INVALID
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_SPEC_INVALID
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("keystone: interrupted", file=sys.stderr)
        return EXIT_INTERNAL_ERROR
    except CommandFailed as exc:
        print(f"keystone: {exc}", file=sys.stderr)
        return exc.code
    except Exception as exc:  # the last line of defence: say what broke, exit 4
        print(f"keystone: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def _number(kind: Callable[[str], Any], accept: Callable[[Any], bool], expected: str) -> Any:
    """An argparse type: `kind(text)` when `accept` takes it; otherwise the option's usage
    error says what was expected and what it got (exit 2)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        # NaN fails every comparison, so no range accepts it.
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


COUNT = _number(int, lambda value: value >= 1, "a whole number of at least 1")
SECONDS = _number(float, lambda value: 0 < value < math.inf, "a number of seconds above 0")
ALPHA = _number(float, lambda value: 0 < value < 1, "a significance level between 0 and 1")
KAPPA = _number(float, lambda value: -1 <= value <= 1, "a kappa from -1 to 1")
PORT = _number(int, lambda value: 1 <= value <= 65535, "a port from 1 to 65535")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keystone", description="Test AI agents against specs: validate, run, score."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    validate = commands.add_parser("validate", help="check spec files without running them")
    validate.add_argument("specs", nargs="+", metavar="SPEC", help="spec YAML files")
    validate.set_defaults(handler=cmd_validate)

    score = commands.add_parser(
        "score", help="recompute scores and gates from a JSON report; exit with the verdict"
    )
    score.add_argument("results", metavar="RESULTS.json", help="a report written with --json")
    _add_report_options(score)
    score.add_argument(
        "--kappa",
        type=KAPPA,
        default=None,
        help="judge-human Cohen's kappa (overrides the report's)",
    )
    score.add_argument(
        "--metric",
        choices=SUMMARY_METRICS,
        default=None,
        help="print only this figure (for CI scripts); exit 0 whenever the report is read",
    )
    score.add_argument(
        "--resilience",
        dest="metric",
        action="store_const",
        const="resilience",
        help="print only the resilience score, 0-100 (same as --metric resilience)",
    )
    score.set_defaults(handler=cmd_score)

    # These need Django: their handlers import it (evaluations/cli_commands.py) when called.
    run = commands.add_parser(
        "run", help="run a spec (in-process without a broker, on the workers with one)"
    )
    run.add_argument("spec", metavar="SPEC")
    run.add_argument("--replicas", type=COUNT, default=None, help="override the spec's replicas")
    run.add_argument(
        "--scenario", action="append", metavar="NAME", help="run only this scenario (repeatable)"
    )
    run.add_argument(
        "--label", action="append", metavar="KEY=VALUE", help="label the run (repeatable)"
    )
    run.add_argument("--seed", type=int, default=0, help="seed for faults and mutations")
    run.add_argument(
        "--timeout",
        type=SECONDS,
        default=None,
        metavar="SECONDS",
        help="on the workers: cancel the run and exit 4 when it has not ended by then "
        "(default: every execution's sandbox timeout in a row, plus 5 minutes)",
    )
    run.add_argument(
        "--jobs",
        type=COUNT,
        default=None,
        metavar="N",
        help="without a broker: run N executions at a time (default: two per usable CPU core)",
    )
    run.add_argument(
        "--processes",
        type=COUNT,
        default=None,
        metavar="N",
        help="without a broker: share the jobs out over at most N processes (default: one per "
        "usable CPU core; 1 keeps the whole run in this process, for the least memory)",
    )
    run.add_argument(
        "--no-judge-cache",
        action="store_true",
        help="ask the judge again instead of reusing cached verdicts (nothing is cached either)",
    )
    # With --scenario and --seed these re-run exactly one execution of an earlier run (the
    # reproducer command on its execution page): same cell, same per-execution seed.
    run.add_argument(
        "--prompt-index",
        type=int,
        action="append",
        metavar="N",
        help="run only the prompt with this 0-based index (repeatable; probes count from 1000)",
    )
    run.add_argument(
        "--replica",
        type=int,
        action="append",
        metavar="N",
        help="run only this 0-based replica (repeatable)",
    )
    run.add_argument(
        "--invariant",
        action="append",
        metavar="ID",
        help="run only the executions isolated to this invariant (per_invariant isolation, probes)",
    )
    run.add_argument(
        "--remote",
        metavar="URL",
        help="run on this Keystone server's workers (default: $KEYSTONE_URL; unset: locally)",
    )
    run.add_argument("--token", help="the API token for --remote (default: $KEYSTONE_TOKEN)")
    run.add_argument(
        "--project",
        metavar="SLUG",
        help="the server's project for --remote (default: $KEYSTONE_PROJECT, else 'default')",
    )
    _add_report_options(run)
    run.set_defaults(handler=cmd_run)
    compare = commands.add_parser(
        "compare",
        help="compare a run with its spec's baseline or another run; exit 1 when something regressed",
    )
    compare.add_argument("run", type=int, metavar="RUN")
    compare.add_argument(
        "--against",
        default="baseline",
        metavar="baseline|RUN",
        help="the reference (default: baseline)",
    )
    compare.add_argument("--alpha", type=ALPHA, default=0.05, help="significance level (0.05)")
    compare.add_argument("--json", metavar="FILE", help="write the verdicts as JSON")
    compare.add_argument("--markdown", metavar="FILE", help="write a Markdown summary")
    compare.set_defaults(handler=_django_command("cmd_compare"))
    baseline = commands.add_parser("baseline", help="promote, list and roll back baselines")
    baseline_commands = baseline.add_subparsers(dest="baseline_command", metavar="ACTION")
    promote = baseline_commands.add_parser(
        "promote", help="make a completed run its spec's baseline for a branch"
    )
    promote.add_argument("run", type=int, metavar="RUN")
    promote.add_argument(
        "--branch", default=None, help="the branch it is for (default: the run's, else main)"
    )
    promote.add_argument("--reason", default="", help="why, kept in the history")
    promote.add_argument("--name", default="", help="the baseline's name (default: run #RUN)")
    promote.add_argument(
        "--by", default="", metavar="USERNAME", help="who promotes, kept in the history"
    )
    promote.set_defaults(handler=_django_command("cmd_baseline_promote"))
    rollback = baseline_commands.add_parser(
        "rollback", help="undo the last promotion of a spec's branch"
    )
    rollback.add_argument("--project", required=True, metavar="SLUG")
    rollback.add_argument("spec", metavar="SPEC")
    rollback.add_argument("--branch", default="main", help="the branch (default: main)")
    rollback.add_argument(
        "--by", default="", metavar="USERNAME", help="who rolls back, kept in the history"
    )
    rollback.set_defaults(handler=_django_command("cmd_baseline_rollback"))
    listing = baseline_commands.add_parser("list", help="a spec's baselines, newest first")
    listing.add_argument("--project", required=True, metavar="SLUG")
    listing.add_argument("spec", metavar="SPEC")
    listing.set_defaults(handler=_django_command("cmd_baseline_list"))
    replay = commands.add_parser("replay", help="replay files (regression pillar)")
    replay_commands = replay.add_subparsers(dest="replay_command", metavar="ACTION")
    export = replay_commands.add_parser(
        "export", help="write a run's failed executions as replay files"
    )
    export.add_argument("run_id", type=int, metavar="RUN_ID")
    export.add_argument("--out", required=True, metavar="DIR", help="directory for the files")
    export.add_argument(
        "--all", action="store_true", help="export every finished execution, not only failed ones"
    )
    export.set_defaults(handler=_django_command("cmd_replay_export"))
    report = commands.add_parser("report", help="project reports from the server's database")
    report_commands = report.add_subparsers(dest="report_command", metavar="REPORT")
    regressions = report_commands.add_parser(
        "regressions", help="what regressed against the active baselines (Markdown on stdout)"
    )
    regressions.add_argument("--project", required=True, metavar="SLUG")
    regressions.add_argument("--since", default="", help="24h, 7d, 2w or a date (2026-11-01)")
    regressions.add_argument("--spec", default="", metavar="SLUG", help="one spec only")
    regressions.add_argument("--branch", default="", help="one branch only")
    regressions.add_argument("--label", default="", metavar="KEY=VALUE", help="one run label only")
    regressions.add_argument("--markdown", metavar="FILE", help="write the Markdown report")
    regressions.add_argument("--json", metavar="FILE", help="write the JSON report")
    regressions.add_argument("--csv", metavar="FILE", help="write the CSV report")
    regressions.set_defaults(handler=_django_command("cmd_report_regressions"))
    worker = commands.add_parser("worker", help="start a worker that executes queued runs")
    worker.add_argument(
        "--concurrency",
        type=COUNT,
        default=None,
        help="executions at a time (default: 2 Celery processes; without a broker, two "
        "threads per CPU core)",
    )
    worker.add_argument("--loglevel", default="info", type=str.lower, choices=LOG_LEVELS)
    worker.add_argument(
        "--beat",
        action="store_true",
        help="also run the periodic jobs (exactly one process per deployment may)",
    )
    worker.add_argument(
        "--name", default=None, help="the worker's node name (default: keystone-PID@HOST)"
    )
    worker.set_defaults(handler=_django_command("cmd_worker"))
    beat = commands.add_parser(
        "beat",
        help="run the periodic jobs (requeue of dead workers' executions); one per deployment",
    )
    beat.add_argument("--loglevel", default="info", type=str.lower, choices=LOG_LEVELS)
    beat.set_defaults(handler=_django_command("cmd_beat"))
    serve = commands.add_parser("serve", help="start the web app and a worker beside it")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=PORT, default=8000)
    serve.add_argument("--demo", action="store_true", help="load the example specs and a demo user")
    serve.set_defaults(handler=_django_command("cmd_serve"))
    return parser


def _add_report_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="write the JSON report (re-scorable)")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    parser.add_argument("--markdown", metavar="FILE", help="write a Markdown summary")
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the terminal summary (auto: when stdout is a terminal and NO_COLOR is unset)",
    )


# ---------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    from checks.spec import SpecValidationError, load_spec_file

    start_up_over()

    invalid = 0
    for path in args.specs:
        try:
            spec = load_spec_file(path)
        except SpecValidationError as exc:
            invalid += 1
            for error in exc.errors:
                print(f"{path}: {error}", file=sys.stderr)
            print(f"{path}: invalid ({counted(len(exc.errors), 'error')})", file=sys.stderr)
            continue
        invariants = counted(len(spec.invariants), "invariant")
        scenarios = counted(len(spec.scenarios), "scenario")
        print(f"{path}: valid ({invariants}, {scenarios})")
    if invalid:
        print(f"{invalid} of {len(args.specs)} spec(s) invalid", file=sys.stderr)
        return EXIT_SPEC_INVALID
    return EXIT_OK


# ---------------------------------------------------------------- score


def cmd_score(args: argparse.Namespace) -> int:
    from checks.reporters import ReportError, load_report, render_terminal, write_reports
    from checks.scoring import score_run

    start_up_over()

    try:
        loaded = load_report(args.results)
    except ReportError as exc:
        print(f"keystone score: {exc}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    kappa = args.kappa if args.kappa is not None else loaded.kappa
    summary = score_run(loaded.spec, loaded.records, kappa=kappa)
    if args.metric:
        return _print_metric(summary, args)
    sys.stdout.write(render_terminal(summary, color=use_color(args.color, sys.stdout)))
    for path in write_reports(
        summary, json_path=args.json, junit_path=args.junit, markdown_path=args.markdown
    ):
        print(f"wrote {path}")
    return summary.exit_code


def _print_metric(summary: RunSummary, args: argparse.Namespace) -> int:
    """Only the number on stdout, like `flakestorm contract score`: a CI script reads it."""
    from checks.reporters import write_reports

    write_reports(summary, json_path=args.json, junit_path=args.junit, markdown_path=args.markdown)
    value = summary.metric(args.metric)
    if value is None:
        print(f"keystone score: the report has no data for {args.metric}", file=sys.stderr)
        return EXIT_SPEC_INVALID
    print(format_metric(args.metric, value))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """On a server (--remote or KEYSTONE_URL) through its API, with no Django here;
    otherwise through this machine's database and workers."""
    target = remote_target(args)
    if target is not None:
        # Imported only for a remote run: its HTTP client (urllib.request) takes ~50 ms.
        from evaluations.cli_remote import cmd_run_remote

        start_up_over()
        return cmd_run_remote(args, *target)
    return _django_command("cmd_run")(args)


def remote_target(args: argparse.Namespace) -> tuple[str, str] | None:
    """(base URL, token) when the run is remote: --remote/--token or KEYSTONE_URL and
    KEYSTONE_TOKEN; None for a local run."""
    url = getattr(args, "remote", None) or os.environ.get("KEYSTONE_URL", "")
    if not url:
        return None
    token = getattr(args, "token", None) or os.environ.get("KEYSTONE_TOKEN", "")
    return url.rstrip("/").removesuffix("/api"), token


def _django_command(name: str) -> Handler:
    def handler(args: argparse.Namespace) -> int:
        from evaluations import cli_commands

        command: Handler = getattr(cli_commands, name)
        return command(args)

    return handler


if __name__ == "__main__":
    command()
