"""Every benchmark in one command, and the table in docs/performance.md.

    python bench/run_all.py [--repeat 3] [--out docs/performance.md]
    python bench/run_all.py --smoke [--out FILE]      # smallest sizes, one repeat (CI)

Each benchmark runs as its own process, `--repeat` times (a whole-process command that takes
under a second, QUICK_SAMPLES times as often); its figure is read from what it prints, and
the table gives min / median / max with the target, the command, the machine and the date.
The machine's own speed is read before the first benchmark and after the last (MACHINE_SPEED:
one core's pure Python, nothing of Keystone's), so that tables from different machines, or
from one machine that slowed down meanwhile, can be compared.
Whole-process timings (`keystone --help`, `validate`, a one-execution `run`, 1,000
executions on the embedded default) are the wall time of the command itself. The smoke run
checks that every benchmark still runs (CI), not that it is fast: its figures are printed,
not written to the docs. Needs PostgreSQL on 127.0.0.1:5432 and a redis-server binary for
the Celery benchmark (it starts its own), as the tests do.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from home import RAN_AS_ROOT, traversable_tmpdir  # noqa: E402

PYTHON = sys.executable
PG = "postgresql://postgres@127.0.0.1:5432"
QUICK_SAMPLES = 5  # runs per repeat of a whole-process command that takes under a second
# The machine's speed, in the table's header: the same statement on every machine.
MACHINE_SPEED = "sum(range(10**6))"

NOOP_SPEC = """\
version: 1
id: bench-noop
task: {{prompts: [{prompts}]}}
agent: {{type: command, command: "true"}}
sandbox: {{backend: local}}
replicas: {replicas}
invariants:
  completes: {{description: "it ran", check: {{type: completes}}}}
"""


@dataclass(frozen=True)
class Timing:
    """What one run of a benchmark's command took: wall seconds, and the CPU seconds of the
    command and every descendant it waited for (its forked processes, the agents)."""

    wall: float
    user: float
    system: float


Reader = Callable[[str, Timing], float]  # (output, timing) -> the figure


@dataclass(frozen=True)
class Figure:
    """One more row read from the same runs of a benchmark."""

    figure: str
    target: str
    read: Reader
    unit: str


@dataclass(frozen=True)
class Bench:
    figure: str
    target: str
    argv: list[str]  # {tmp}, {redis} are filled in
    read: Reader
    unit: str
    smoke_argv: list[str] | None = None  # a smaller size for --smoke
    warm_up: bool = False  # one run first, not counted (a fresh home migrates its database)
    # Runs per repeat. A command of under a second moves by tens of milliseconds from one
    # run to the next on a shared machine: its min / median / max are over more runs.
    samples: int = 1
    more: tuple[Figure, ...] = ()  # further rows from the same output
    # Not run by --smoke, for this reason (printed, so it never silently vanishes).
    not_in_smoke: str = ""
    # An exit code meaning "this benchmark cannot run on this machine": its output's last
    # lines are printed and put in the table instead of figures.
    cannot_run_exit: int | None = None


def wall_ms(_: str, timing: Timing) -> float:
    return timing.wall * 1000


def system_share(_: str, timing: Timing) -> float:
    """System time as a percentage of all the CPU time the command used."""
    return 100 * timing.system / (timing.user + timing.system)


def number_after(pattern: str) -> Reader:
    def read(output: str, _: Timing) -> float:
        found = re.search(pattern, output)
        if found is None:
            raise ValueError(f"no figure matching {pattern!r} in:\n{output[-1500:]}")
        return float(found.group(1).replace(",", ""))

    return read


def per_second(count: int) -> Reader:
    return lambda _, timing: count / timing.wall


def keystone(*args: str) -> list[str]:
    return [PYTHON, "-m", "evaluations.cli", *args]


def benches(tmp: Path) -> list[Bench]:
    one = tmp / "one.yaml"
    one.write_text(NOOP_SPEC.format(prompts='"p"', replicas=1))
    thousand = tmp / "thousand.yaml"
    thousand.write_text(
        NOOP_SPEC.format(prompts=", ".join(f'"p{i}"' for i in range(10)), replicas=100)
    )
    small = tmp / "small.yaml"
    small.write_text(NOOP_SPEC.format(prompts='"p0", "p1"', replicas=10))
    example = "examples/specs/calculator-fix.yaml"  # the commands run from the repository root
    return [
        Bench("`keystone --help`, whole process", "<= 120 ms", keystone("--help"), wall_ms, "ms",
              warm_up=True, samples=QUICK_SAMPLES),
        Bench("`keystone validate` one spec, whole process", "<= 150 ms",
              keystone("validate", example), wall_ms, "ms", warm_up=True,
              samples=QUICK_SAMPLES),
        Bench("`keystone run`, one no-op local execution, one check", "<= 400 ms",
              keystone("run", str(one)), wall_ms, "ms", warm_up=True, samples=QUICK_SAMPLES),
        Bench("1,000 no-op executions, embedded default (SQLite), `keystone run`",
              ">= 150 executions/s", keystone("run", str(thousand)), per_second(1000),
              "executions/s", smoke_argv=keystone("run", str(small)), warm_up=True,
              more=(
                  Figure("1,000 no-op executions, embedded default: system time, share of the "
                         "CPU time (the command's and its agents')", "< 25 %", system_share, "%"),
              )),
        Bench("1,000 no-op executions, PostgreSQL + Redis, 2 Celery workers",
              ">= 150 executions/s",
              [PYTHON, "bench/bench_throughput.py", "--executions", "1000",
               "--database-url", f"{PG}/keystone_bench_throughput", "--broker-url", "{redis}"],
              number_after(r"throughput: ([\d.]+) executions/s"), "executions/s",
              more=(
                  Figure("2 Celery workers: a worker's memory, PSS of its process tree "
                         "(shared pages counted once)", "<= 150 MB",
                         number_after(r"worker one: peak PSS ([\d.]+) MB"), "MB"),
                  Figure("2 Celery workers: a worker's largest process, RSS", "<= 150 MB",
                         number_after(r"worker one: .*largest process's RSS ([\d.]+) MB"),
                         "MB"),
              ),
              smoke_argv=[PYTHON, "bench/bench_throughput.py", "--executions", "20",
                          "--database-url", f"{PG}/keystone_bench_throughput_smoke",
                          "--broker-url", "{redis}"]),
        Bench("platform overhead per execution, local", "<= 30 ms",
              [PYTHON, "bench/bench_overhead.py", "--runs", "30", "--backends", "local"],
              number_after(r"local\s+([\d.]+)ms"), "ms",
              smoke_argv=[PYTHON, "bench/bench_overhead.py", "--runs", "3", "--backends", "local"]),
        Bench("platform overhead per execution, bwrap", "<= 5 ms",
              [PYTHON, "bench/bench_overhead.py", "--runs", "30", "--backends", "bwrap"],
              number_after(r"bwrap\s+([\d.]+)ms"), "ms",
              smoke_argv=[PYTHON, "bench/bench_overhead.py", "--runs", "3", "--backends", "bwrap"]),
        Bench("platform overhead per execution, docker", "<= 300 ms",
              [PYTHON, "bench/bench_overhead.py", "--runs", "30", "--backends", "docker"],
              number_after(r"docker\s+([\d.]+)ms"), "ms",
              smoke_argv=[PYTHON, "bench/bench_overhead.py", "--runs", "2", "--backends", "docker"],
              cannot_run_exit=3),
        Bench("deterministic checks, one core", ">= 20,000 checks/s",
              [PYTHON, "bench/bench_checks.py", "--seconds", "3"],
              number_after(r"([\d,]+) checks/s"), "checks/s",
              smoke_argv=[PYTHON, "bench/bench_checks.py", "--seconds", "0.3"]),
        Bench("validating a 200-invariant spec", "< 50 ms",
              [PYTHON, "bench/bench_validate.py", "--rounds", "30"],
              number_after(r"validate_spec_text median: ([\d.]+) ms"), "ms",
              smoke_argv=[PYTHON, "bench/bench_validate.py", "--rounds", "2"]),
        Bench("LLM gateway overhead per call", "<= 3 ms",
              [PYTHON, "bench/bench_gateway.py", "--calls", "500"],
              number_after(r"gateway overhead per call: (-?[\d.]+) ms"), "ms",
              smoke_argv=[PYTHON, "bench/bench_gateway.py", "--calls", "20"]),
        Bench("tool proxy overhead per call", "<= 3 ms",
              [PYTHON, "bench/bench_toolproxy.py", "500"],
              number_after(r"proxy overhead per call:\s+median (-?[\d.]+) ms"), "ms",
              smoke_argv=[PYTHON, "bench/bench_toolproxy.py", "20"]),
        Bench("compare page, two 1,000-execution runs, p95 server time", "<= 50 ms",
              [PYTHON, "bench/bench_compare.py", "--requests", "40",
               "--database-url", f"{PG}/keystone_bench_compare"],
              number_after(r"p95 ([\d.]+) ms"), "ms",
              smoke_argv=[PYTHON, "bench/bench_compare.py", "--requests", "2", "--replicas", "3",
                          "--database-url", f"{PG}/keystone_bench_compare_smoke"]),
        Bench("peers: wall time ratio `flakestorm contract run` / `keystone run`, the same job "
              "(10 invariants x 10 scenarios x 5 prompts, a local HTTP agent)", ">= 5x",
              [PYTHON, "bench/peers/run_peers.py", "--repeat", "1"],
              number_after(r"wall time ratio \(flakestorm / keystone\): ([\d.]+)x"), "x",
              more=(
                  Figure("peers: `keystone run` wall time", "-",
                         number_after(r"keystone wall time: ([\d.]+) s"), "s"),
                  Figure("peers: `flakestorm contract run` wall time", "-",
                         number_after(r"flakestorm wall time: ([\d.]+) s"), "s"),
                  Figure("peers: `keystone run` in its default isolation (50 agent calls, "
                         "same verdicts) wall time", "-",
                         number_after(r"keystone wall time, default isolation: ([\d.]+) s"),
                         "s"),
                  Figure("peers: `keystone run --processes 1` (no forked process) wall time",
                         "-", number_after(r"keystone wall time, one process: ([\d.]+) s"), "s"),
                  Figure("peers: `keystone run --processes 1` peak RSS", "-",
                         number_after(r"keystone peak RSS, one process: ([\d.]+) MB"), "MB"),
                  Figure("peers: `keystone run` peak RSS (process tree)",
                         "<= Flakestorm's", number_after(r"keystone peak RSS: ([\d.]+) MB"), "MB"),
                  Figure("peers: `flakestorm contract run` peak RSS (process tree)", "-",
                         number_after(r"flakestorm peak RSS: ([\d.]+) MB"), "MB"),
                  Figure("peers: `keystone run` peak PSS (process tree, shared pages "
                         "counted once)", "-",
                         number_after(r"keystone peak PSS: ([\d.]+) MB"), "MB"),
                  Figure("peers: `flakestorm contract run` peak PSS (process tree)", "-",
                         number_after(r"flakestorm peak PSS: ([\d.]+) MB"), "MB"),
              ),
              not_in_smoke="it installs Flakestorm from the package registry and takes about "
              "a minute at any size; run bench/peers/run_peers.py",
              cannot_run_exit=3),
        Bench("every page, worst p95 server time, 200,000 executions / 2,000,000 results",
              "<= 50 ms",
              [PYTHON, "bench/bench_pages.py", "--requests", "40",
               "--database-url", f"{PG}/keystone_bench"],
              number_after(r"worst p95: ([\d.]+) ms"), "ms",
              smoke_argv=[PYTHON, "bench/bench_pages.py", "--requests", "2", "--runs", "60",
                          "--reseed", "--database-url", f"{PG}/keystone_bench_pages_smoke"]),
    ]  # fmt: skip


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of our own on a free port (never someone else's data)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return server, f"redis://127.0.0.1:{port}/3"


class CannotRun(Exception):
    """The benchmark says it cannot run on this machine (its own exit code), and why."""


def run_bench(bench: Bench, argv: list[str], env: dict[str, str]) -> list[float]:
    """The benchmark's figures: its own, then its `more` rows'."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    timing = Timing(
        wall=time.perf_counter() - started,
        user=after.ru_utime - before.ru_utime,
        system=after.ru_stime - before.ru_stime,
    )
    output = done.stdout + done.stderr
    if bench.cannot_run_exit is not None and done.returncode == bench.cannot_run_exit:
        raise CannotRun(output.strip()[-1500:])
    # A benchmark's exit code says whether it met its own target; only a crash stops us.
    if done.returncode not in (0, 1) or "Traceback" in output:
        raise SystemExit(f"{bench.figure}: exit {done.returncode}\n{output[-3000:]}")
    if RAN_AS_ROOT in output:  # measured in a weaker isolation than the default's
        raise SystemExit(f"{bench.figure}: the agents ran as root\n{output[-3000:]}")
    return [bench.read(output, timing)] + [more.read(output, timing) for more in bench.more]


def machine_speed_ms() -> float:
    """MACHINE_SPEED's best time of 5 rounds, in ms, in a process of its own (as
    `python -m timeit`): a shared machine's speed moved by a sixth within an hour on one
    machine, and by half within minutes on another (docs/performance.md)."""
    output = subprocess.run(
        [PYTHON, "-m", "timeit", "-r", "5", MACHINE_SPEED],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.search(r"best of 5: ([\d.]+) (nsec|usec|msec|sec) per loop", output)
    if found is None:
        raise SystemExit(f"timeit printed no time: {output!r}")
    scale = {"nsec": 1e-6, "usec": 1e-3, "msec": 1.0, "sec": 1e3}[found.group(2)]
    return float(found.group(1)) * scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="smallest sizes, once each")
    parser.add_argument(
        "--out", help="where the Markdown table goes (default: docs/performance.md)"
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="TEXT",
        help="run only the benchmarks whose figure contains TEXT (repeatable); their rows "
        "replace the same rows of the existing table, the others are kept",
    )
    args = parser.parse_args()
    repeat = 1 if args.smoke else args.repeat
    tmp = traversable_tmpdir("keystone-bench-all-")  # holds KEYSTONE_HOME: see bench/home.py
    redis, redis_url = start_redis(tmp)
    # PYTHONDONTWRITEBYTECODE (a developer shell may set it) makes every process compile
    # every module it imports again, which doubles the start-up figures: benchmarks run
    # with the .pyc caches a real installation has.
    unset = ("DATABASE_URL", "CELERY_BROKER_URL", "PYTHONDONTWRITEBYTECODE")
    env = {
        **{k: v for k, v in os.environ.items() if k not in unset},
        "KEYSTONE_HOME": str(tmp / "home"),
        "KEYSTONE_POLICY_MIN_BACKEND": "local",  # the no-op specs run in the local sandbox
        "PYTHONPATH": str(ROOT),
    }
    rows = []
    speed_before = machine_speed_ms()
    chosen = [
        bench
        for bench in benches(tmp)
        if not args.only or any(t.lower() in bench.figure.lower() for t in args.only)
    ]
    if not chosen:
        raise SystemExit(f"--only {args.only}: no benchmark's figure contains that")
    try:
        for bench in chosen:
            if args.smoke and bench.not_in_smoke:
                print(f"NOT RUN in --smoke: {bench.figure}: {bench.not_in_smoke}", flush=True)
                continue
            argv = (bench.smoke_argv or bench.argv) if args.smoke else bench.argv
            argv = [part.replace("{redis}", redis_url) for part in argv]
            command = " ".join(Path(p).name if p == PYTHON else p for p in argv)
            command = f"`{command.replace(str(tmp) + '/', '')}`"
            try:
                if bench.warm_up and not args.smoke:
                    run_bench(bench, argv, env)
                samples = 1 if args.smoke else bench.samples
                runs = [run_bench(bench, argv, env) for _ in range(repeat * samples)]
            except CannotRun as reason:
                # Loudly, on the terminal and in the table: never a silently missing row.
                print(f"CANNOT RUN: {bench.figure}:\n{reason}", flush=True)
                last = str(reason).splitlines()[-1].replace("|", "/")
                rows.append((bench.figure, bench.target, f"not measured: {last}", command))
                continue
            for index, (figure, target, unit) in enumerate(
                [(bench.figure, bench.target, bench.unit)]
                + [(more.figure, more.target, more.unit) for more in bench.more]
            ):
                figures = [run[index] for run in runs]
                low, mid, high = min(figures), statistics.median(figures), max(figures)
                measured = f"{low:.4g} / {mid:.4g} / {high:.4g} {unit}"
                rows.append((figure, target, measured, command))
                print(f"{figure}: {measured} (target {target})", flush=True)
    finally:
        redis.terminate()
        shutil.rmtree(tmp, ignore_errors=True)
    speed = (speed_before, machine_speed_ms())
    print(f"machine speed ({MACHINE_SPEED}): {speed[0]:.1f} ms before, {speed[1]:.1f} ms after")
    out = Path(args.out) if args.out else (None if args.smoke else ROOT / "docs/performance.md")
    measured, written = split_doc(out.read_text() if out is not None and out.exists() else "")
    if args.only and measured:
        only = " ".join(f"--only {t!r}" if " " in t else f"--only {t}" for t in args.only)
        table = merge(measured, rows, f"python bench/run_all.py {only} --repeat {repeat}", speed)
    else:
        table = render(rows, repeat, speed, smoke=args.smoke)
    if out is not None:
        out.write_text(table + written)
        print(f"wrote {out}")
    return 0


def split_doc(text: str) -> tuple[str, str]:
    """The measured part of docs/performance.md (the table and its notes) and the sections
    people wrote below it (from the first "## " heading on, such as the pages' EXPLAIN
    output): the table is measured again, the sections are kept as they are."""
    start = text.find("\n## ")
    return (text, "") if start < 0 else (text[:start], text[start:])


def speed_text(speed: tuple[float, float]) -> str:
    return (
        f'`python -m timeit "{MACHINE_SPEED}"` (best of 5) took {speed[0]:.1f} ms before '
        f"the first benchmark and {speed[1]:.1f} ms after the last"
    )


def render(
    rows: list[tuple[str, str, str, str]], repeat: int, speed: tuple[float, float], *, smoke: bool
) -> str:
    machine = f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}"
    lines = [
        "# Performance",
        "",
        f"Measured by `python bench/run_all.py{' --smoke' if smoke else ''}` on "
        f"{datetime.date.today():%Y-%m-%d}, {machine}; min / median / max over {repeat} "
        f"run(s) of each benchmark ({repeat * (1 if smoke else QUICK_SAMPLES)} of each "
        "whole-process command that takes under a second). Commands run from the repository "
        "root; `python` is the virtualenv's. Each script's docstring says what it measures "
        f"and how. The machine's speed: {speed_text(speed)}.",
        "",
        "| figure | target | measured (min / median / max) | command |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {figure} | {target} | {measured} | {command} |"
        for figure, target, measured, command in rows
    ]
    return "\n".join(lines) + "\n"


def merge(
    existing: str, rows: list[tuple[str, str, str, str]], command: str, speed: tuple[float, float]
) -> str:
    """The existing table with `rows` in place of the rows of the same figure (new ones at
    the end), and a note saying which rows were measured when, by what."""
    lines = existing.rstrip("\n").split("\n")
    fresh = {row[0]: row for row in rows}
    table_end = max(i for i, line in enumerate(lines) if line.startswith("| "))
    merged = []
    for line in lines[: table_end + 1]:
        figure = line[2:].split(" | ")[0] if line.startswith("| ") else None
        row = fresh.pop(figure, None) if figure else None
        merged.append(line if row is None else "| " + " | ".join(row) + " |")
    merged += ["| " + " | ".join(row) + " |" for row in fresh.values()]
    # The paragraphs under the table as they were (a paragraph's lines stay together).
    notes = "\n".join(lines[table_end + 1 :]).strip("\n")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    which, are = ("The row", "is") if len(rows) == 1 else (f"The {len(rows)} rows", "are")
    note = (
        f"{which} measured by `{command}` {are} from "
        f"{datetime.date.today():%Y-%m-%d} (load average at the end {load}; {speed_text(speed)}); "
        "the others as above."
    )
    paragraphs = ["\n".join(merged), *([notes] if notes else []), note]
    return "\n\n".join(paragraphs) + "\n"


if __name__ == "__main__":
    sys.exit(main())
