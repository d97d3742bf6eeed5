"""Keystone and Flakestorm 2.0 doing the same job, side by side: wall time, peak RSS, verdicts.

    python bench/peers/run_peers.py [--repeat 3] [--flakestorm-venv DIR]

The job (keystone-job.yaml, flakestorm-job.yaml): 10 invariants x 10 scenarios x 5 prompts
against agent.py, a local HTTP agent that answers at once, which this script starts and
both tools call. Measured: the whole `keystone run SPEC` process (embedded default: SQLite
in a fresh KEYSTONE_HOME made for this script, migrated by one untimed run first, as a
user's second run would find it) and the whole `flakestorm contract run -c CONFIG` process,
alternately, --repeat times each: wall time and peak RSS of the process tree (the sum of
the resident sets of the command and its descendants, sampled every 50 ms from /proc; the
largest single process, from wait4, is printed too), and the agent calls each made; then
one more run of each, not timed, for the peak sum of their proportional set sizes (each page
a forked process shares with its parent counted once). The
headline ratio compares like with like: keystone-job.yaml asks for `isolation:
per_invariant`, one agent call per invariant x scenario x prompt as Flakestorm's contract
engine makes (it skips the rest of a cell's prompts after a failure: 382 calls here); the
same spec in Keystone's default isolation (one call per scenario x prompt, every invariant
checked on it) is measured too, as a third row, and the job with `--processes 1` (no forked
process: the least memory, one core's speed) as a fourth. Then both tools' invariant x
scenario verdicts side by side, and reference 001's example contract (keystone-ref001.yaml,
flakestorm-ref001.yaml) in both: Flakestorm scores it 57.1% because it ignores `when`,
Keystone 80.0.

Keystone is `python -m evaluations.cli` of the worktree this script is in, run by the
Python running this script (the worktree's virtualenv), so it measures whatever
`keystone run` does in that checkout. Flakestorm is installed from the package registry
(pip, the configured index) into its own virtualenv, ~/.cache/keystone-bench/flakestorm-2.0.0
by default, and reused while it holds that version.

Exit codes: 0 every target met (Keystone >= 5x less wall time, peak RSS <= Flakestorm's,
the same verdicts, reference 001 scored 80.0 by Keystone and 57.1 by Flakestorm); 1 a
target missed (the figures are still printed); 2 a tool crashed or printed no verdict;
3 Flakestorm cannot be installed here (the reason is printed; nothing was measured).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the shared helpers
from rss import pss, tree  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the worktree whose `keystone` is measured
FLAKESTORM_VERSION = "2.0.0"
DEFAULT_VENV = Path.home() / ".cache" / "keystone-bench" / f"flakestorm-{FLAKESTORM_VERSION}"
EXIT_TARGET_MISSED, EXIT_CRASHED, EXIT_CANNOT_INSTALL = 1, 2, 3
SAMPLE_SECONDS = 0.05
# Reference 001's example contract: what each tool must score (see the two ref001 files).
REF001_KEYSTONE, REF001_FLAKESTORM = 80.0, 57.1


class CannotInstall(Exception):
    pass


class Crashed(Exception):
    pass


# ---------------------------------------------------------------- Flakestorm's virtualenv


def ensure_flakestorm(venv: Path) -> Path:
    """The `flakestorm` command of FLAKESTORM_VERSION in `venv`, installed there if needed."""
    command = venv / "bin" / "flakestorm"
    if command.exists() and _installed_version(venv) == FLAKESTORM_VERSION:
        return command
    print(f"installing flakestorm=={FLAKESTORM_VERSION} into {venv} ...", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            f"flakestorm=={FLAKESTORM_VERSION}",
        ],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise CannotInstall(f"{' '.join(step)}: {error}") from error
        if done.returncode != 0:
            raise CannotInstall(
                f"{' '.join(step)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-2000:]}"
            )
    if _installed_version(venv) != FLAKESTORM_VERSION:
        raise CannotInstall(f"pip installed something else than flakestorm {FLAKESTORM_VERSION}")
    return command


def _installed_version(venv: Path) -> str | None:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('flakestorm'))"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


# ---------------------------------------------------------------- the agent


def start_agent() -> tuple[subprocess.Popen[str], int]:
    agent = subprocess.Popen(
        [sys.executable, str(HERE / "agent.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert agent.stdout is not None
    line = agent.stdout.readline()
    found = re.match(r"listening on (\d+)", line)
    if found is None:
        agent.kill()
        raise Crashed(f"the agent did not start: {line!r}")
    return agent, int(found.group(1))


def agent_calls(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=5) as answer:
        return int(json.load(answer)["calls"])


# ---------------------------------------------------------------- measuring a command


@dataclass(frozen=True)
class Measured:
    seconds: float
    tree_peak_rss: int  # bytes: the largest sum over the process tree seen while it ran
    # bytes: the same for the proportional set sizes, each page the processes share (a
    # forked process's, its parent's) counted once where the sum of resident sets counts it
    # once per process; 0 unless asked for (`proportional`)
    tree_peak_pss: int
    largest_process_rss: int  # bytes: ru_maxrss of the largest process of the tree (wait4)
    returncode: int
    output: str
    agent_calls: int


def measure(
    argv: list[str], *, cwd: Path, env: dict[str, str], port: int, proportional: bool = False
) -> Measured:
    """The command's wall time and memory. `proportional` also samples its tree's PSS, which
    slows the process it reads (the kernel walks its page tables under its memory lock): for
    a run that is not timed."""
    calls_before = agent_calls(port)
    peak = peak_pss = 0
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    chunks: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: chunks.append(process.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    # Sample the tree until the command has exited; WNOWAIT leaves it unreaped, so that
    # wait4 below reaps it and reads its rusage.
    while os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        members = tree(process.pid)
        peak = max(peak, sum(size for _, size in members))
        if proportional:
            peak_pss = max(peak_pss, sum(pss(pid) for pid, _ in members))
        time.sleep(SAMPLE_SECONDS)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    return Measured(
        seconds=seconds,
        tree_peak_rss=max(peak, usage.ru_maxrss * 1024),
        tree_peak_pss=peak_pss,
        largest_process_rss=usage.ru_maxrss * 1024,  # Linux reports kilobytes
        returncode=process.returncode,
        output="".join(chunks),
        agent_calls=agent_calls(port) - calls_before,
    )


# ---------------------------------------------------------------- the two tools


@dataclass(frozen=True)
class Verdicts:
    cells: dict[tuple[str, str], bool]  # (invariant, scenario) -> passed; absent: not evaluated
    score: float
    passed: bool


def keystone_argv(spec: Path, report: Path, *options: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "evaluations.cli",
        "run",
        str(spec),
        "--json",
        str(report),
        *options,
    ]


def keystone_verdicts(measured: Measured, report: Path) -> Verdicts:
    # Exit 1 is a verdict (a gate failed); anything else above 1 means it could not run.
    if measured.returncode not in (0, 1) or not report.exists():
        raise Crashed(f"keystone run exited {measured.returncode}:\n{measured.output[-3000:]}")
    printed = re.search(r"resilience ([\d.]+)%", measured.output)
    if printed is None:
        raise Crashed(f"keystone run printed no resilience score:\n{measured.output[-3000:]}")
    summary = json.loads(report.read_text())["summary"]
    cells = {(c["invariant_id"], c["scenario"]): c["passed"] for c in summary["matrix"]}
    return Verdicts(cells, float(printed.group(1)), measured.returncode == 0)


def flakestorm_argv(command: Path, config: Path) -> list[str]:
    return [str(command), "contract", "run", "-c", str(config)]


def flakestorm_verdicts(measured: Measured, command: Path, config: Path, out: Path) -> Verdicts:
    printed = re.search(r"Resilience score:\s*([\d.]+)%", measured.output)
    if measured.returncode != 0 or printed is None or "Traceback" in measured.output:
        raise Crashed(
            f"flakestorm contract run exited {measured.returncode}:\n{measured.output[-3000:]}"
        )
    # Its per-cell verdicts: `contract run` does not print them (flakestorm_cells.py says why).
    python = command.parent / "python"
    done = subprocess.run(
        [str(python), str(HERE / "flakestorm_cells.py"), str(config), str(out)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise Crashed(f"flakestorm_cells.py exited {done.returncode}:\n{done.stderr[-3000:]}")
    data = json.loads(out.read_text())
    cells = {(c["invariant_id"], c["scenario_name"]): c["passed"] for c in data["cells"]}
    if round(data["resilience_score"], 1) != float(printed.group(1)):
        raise Crashed(
            f"flakestorm's matrix scores {data['resilience_score']}, its CLI printed "
            f"{printed.group(1)}%: the verdicts compared would not be the CLI's"
        )
    return Verdicts(cells, float(printed.group(1)), "Passed: True" in measured.output)


# ---------------------------------------------------------------- printing


def mb(size: float) -> str:
    return f"{size / 1e6:.1f} MB"


def spread(values: list[float], fmt: str) -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def print_verdicts(title: str, keystone: Verdicts, flakestorm: Verdicts) -> list[str]:
    """Both tools' cells side by side; returns the cells whose verdicts differ."""
    print(f"\n{title}")
    print("  (cells passed / cells evaluated, over the scenarios)")
    invariants = list(dict.fromkeys(i for i, _ in [*keystone.cells, *flakestorm.cells]))
    scenarios = list(dict.fromkeys(s for _, s in [*keystone.cells, *flakestorm.cells]))
    width = max(len(i) for i in invariants) + 2
    print(f"  {'invariant':<{width}}{'keystone':<22}{'flakestorm':<22}")
    differ = []
    for invariant in invariants:
        columns = []
        for verdicts in (keystone, flakestorm):
            here = [verdicts.cells.get((invariant, s)) for s in scenarios]
            evaluated = [v for v in here if v is not None]
            columns.append(f"{sum(evaluated)}/{len(evaluated)} pass")
        print(f"  {invariant:<{width}}{columns[0]:<22}{columns[1]:<22}")
        for scenario in scenarios:
            mine = keystone.cells.get((invariant, scenario))
            theirs = flakestorm.cells.get((invariant, scenario))
            if mine != theirs:
                label = {True: "pass", False: "fail", None: "not evaluated"}
                differ.append(
                    f"{invariant} x {scenario}: keystone {label[mine]}, flakestorm {label[theirs]}"
                )
    print(f"  {'resilience score':<{width}}{keystone.score:<22.1f}{flakestorm.score:<22.1f}")
    yes_no = {True: "passed", False: "failed"}
    print(f"  {'contract':<{width}}{yes_no[keystone.passed]:<22}{yes_no[flakestorm.passed]:<22}")
    print(f"  cells that differ: {len(differ) or 'none'}")
    for line in differ:
        print(f"    {line}")
    return differ


# ---------------------------------------------------------------- main


def fill(template: Path, port: int, into: Path) -> Path:
    text = template.read_text()
    if "AGENT_PORT" not in text:
        raise SystemExit(f"{template}: no AGENT_PORT to fill in")
    target = into / template.name
    target.write_text(text.replace("AGENT_PORT", str(port)))
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each tool")
    parser.add_argument("--flakestorm-venv", type=Path, default=DEFAULT_VENV)
    args = parser.parse_args()
    try:
        flakestorm = ensure_flakestorm(args.flakestorm_venv)
    except CannotInstall as error:
        print(
            f"SKIPPED: Flakestorm {FLAKESTORM_VERSION} cannot be installed here, nothing was "
            f"measured:\n{error}",
            flush=True,
        )
        return EXIT_CANNOT_INSTALL
    tmp = Path(tempfile.mkdtemp(prefix="keystone-peers-"))
    agent, port = start_agent()
    keystone_env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE")
        },
        "KEYSTONE_HOME": str(tmp / "home"),  # the embedded default, on SQLite, of its own
        # The spec says `sandbox: local`; an HTTP agent runs outside any sandbox anyway.
        "KEYSTONE_POLICY_MIN_BACKEND": "local",
        "PYTHONPATH": str(ROOT),
    }
    flakestorm_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        return run(args.repeat, flakestorm, port, tmp, keystone_env, flakestorm_env)
    except Crashed as error:
        print(f"CRASHED: {error}", file=sys.stderr)
        return EXIT_CRASHED
    finally:
        agent.terminate()
        agent.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def run(
    repeat: int,
    flakestorm: Path,
    port: int,
    tmp: Path,
    keystone_env: dict[str, str],
    flakestorm_env: dict[str, str],
) -> int:
    specs = {
        name: fill(HERE / name, port, tmp)
        for name in (
            "keystone-ref001.yaml",
            "flakestorm-ref001.yaml",
            "keystone-job.yaml",
            "flakestorm-job.yaml",
        )
    }
    # The same job in Keystone's default isolation: one agent call per scenario x prompt,
    # every invariant checked on it (50 calls instead of 500), for the same verdicts.
    isolated = specs["keystone-job.yaml"].read_text()
    if "\nisolation: per_invariant\n" not in isolated:
        raise SystemExit("keystone-job.yaml: expected `isolation: per_invariant`")
    shared = tmp / "keystone-job-shared.yaml"
    shared.write_text(isolated.replace("\nisolation: per_invariant\n", "\n"))

    # Reference 001's example first: untimed, and it migrates Keystone's fresh database and
    # warms both tools' files in the page cache before the timed runs.
    report = tmp / "ref001.json"
    keystone_cold = measure(
        keystone_argv(specs["keystone-ref001.yaml"], report), cwd=ROOT, env=keystone_env, port=port
    )
    keystone_ref = keystone_verdicts(keystone_cold, report)
    config = specs["flakestorm-ref001.yaml"]
    flakestorm_cold = measure(
        flakestorm_argv(flakestorm, config), cwd=tmp, env=flakestorm_env, port=port
    )
    flakestorm_ref = flakestorm_verdicts(
        flakestorm_cold, flakestorm, config, tmp / "ref001-flakestorm.json"
    )

    print(
        f"keystone first run in a fresh home (migrates its database; reference 001, 3 "
        f"executions): {keystone_cold.seconds:.2f} s; flakestorm's first run of it: "
        f"{flakestorm_cold.seconds:.2f} s (neither is counted below)",
        flush=True,
    )

    keystone_runs: list[Measured] = []
    flakestorm_runs: list[Measured] = []
    shared_runs: list[Measured] = []
    # `--processes 1`: the same job with no forked process, its threads only (the least memory).
    single_runs: list[Measured] = []
    job_report, shared_report = tmp / "job.json", tmp / "job-shared.json"
    single_report = tmp / "job-one-process.json"
    for index in range(repeat):  # alternately, so all see the same machine load
        keystone_runs.append(
            measure(
                keystone_argv(specs["keystone-job.yaml"], job_report),
                cwd=ROOT,
                env=keystone_env,
                port=port,
            )
        )
        flakestorm_runs.append(
            measure(
                flakestorm_argv(flakestorm, specs["flakestorm-job.yaml"]),
                cwd=tmp,
                env=flakestorm_env,
                port=port,
            )
        )
        shared_runs.append(
            measure(keystone_argv(shared, shared_report), cwd=ROOT, env=keystone_env, port=port)
        )
        single_runs.append(
            measure(
                keystone_argv(specs["keystone-job.yaml"], single_report, "--processes", "1"),
                cwd=ROOT,
                env=keystone_env,
                port=port,
            )
        )
        print(
            f"run {index + 1}/{repeat}: keystone {keystone_runs[-1].seconds:.2f} s, "
            f"flakestorm {flakestorm_runs[-1].seconds:.2f} s, keystone with its default "
            f"isolation {shared_runs[-1].seconds:.2f} s, keystone in one process "
            f"{single_runs[-1].seconds:.2f} s",
            flush=True,
        )
    # Every timed run must have run to a verdict (the reports kept are the last runs').
    for name, runs, ok in [
        ("keystone run", keystone_runs + shared_runs + single_runs, (0, 1)),
        ("flakestorm contract run", flakestorm_runs, (0,)),
    ]:
        for measured in runs:
            if measured.returncode not in ok or "Traceback" in measured.output:
                raise Crashed(f"{name} exited {measured.returncode}:\n{measured.output[-3000:]}")
    keystone_job = keystone_verdicts(keystone_runs[-1], job_report)
    keystone_shared = keystone_verdicts(shared_runs[-1], shared_report)
    keystone_single = keystone_verdicts(single_runs[-1], single_report)
    config = specs["flakestorm-job.yaml"]
    flakestorm_job = flakestorm_verdicts(
        flakestorm_runs[-1], flakestorm, config, tmp / "job-flakestorm.json"
    )
    # The trees' PSS, from one more run of each tool (after the verdicts were read from the
    # timed runs' reports): reading it slows what it reads.
    extra = [
        measure(
            keystone_argv(specs["keystone-job.yaml"], job_report),
            cwd=ROOT,
            env=keystone_env,
            port=port,
            proportional=True,
        ),
        measure(
            flakestorm_argv(flakestorm, config), cwd=tmp, env=flakestorm_env, port=port,
            proportional=True,
        ),
    ]  # fmt: skip
    for measured in extra:
        if measured.returncode not in (0, 1) or "Traceback" in measured.output:
            raise Crashed(f"exited {measured.returncode}:\n{measured.output[-3000:]}")
    keystone_pss, flakestorm_pss = (measured.tree_peak_pss for measured in extra)

    print(
        "\npeers job: 10 invariants x 10 scenarios x 5 prompts, a local HTTP agent that "
        f"answers at once; min / median / max over {repeat} run(s)"
    )
    rows = [
        (f"keystone run ({ROOT.name})", keystone_runs),
        (f"flakestorm {FLAKESTORM_VERSION} contract run", flakestorm_runs),
        ("keystone run, default isolation", shared_runs),
        ("keystone run --processes 1", single_runs),
    ]
    print(
        f"  {'':<34}{'wall time':<26}{'peak RSS, process tree':<30}"
        f"{'largest process':<18}agent calls"
    )
    for name, runs in rows:
        walls = [m.seconds for m in runs]
        trees = [m.tree_peak_rss / 1e6 for m in runs]
        largest = statistics.median(m.largest_process_rss for m in runs)
        calls = sorted({m.agent_calls for m in runs})
        print(
            f"  {name:<34}{spread(walls, '{:.2f}') + ' s':<26}"
            f"{spread(trees, '{:.1f}') + ' MB':<30}{mb(largest):<18}"
            f"{', '.join(map(str, calls))}"
        )
    keystone_wall = statistics.median(m.seconds for m in keystone_runs)
    flakestorm_wall = statistics.median(m.seconds for m in flakestorm_runs)
    keystone_rss = statistics.median(m.tree_peak_rss for m in keystone_runs)
    flakestorm_rss = statistics.median(m.tree_peak_rss for m in flakestorm_runs)
    ratio = flakestorm_wall / keystone_wall
    # The lines bench/run_all.py reads (medians).
    print(f"keystone wall time: {keystone_wall:.3f} s")
    print(f"flakestorm wall time: {flakestorm_wall:.3f} s")
    print(f"wall time ratio (flakestorm / keystone): {ratio:.2f}x (target >= 5x)")
    shared_wall = statistics.median(m.seconds for m in shared_runs)
    print(
        f"keystone wall time, default isolation: {shared_wall:.3f} s "
        f"(ratio {flakestorm_wall / shared_wall:.2f}x)"
    )
    single_wall = statistics.median(m.seconds for m in single_runs)
    single_rss = statistics.median(m.tree_peak_rss for m in single_runs)
    print(
        f"keystone wall time, one process: {single_wall:.3f} s "
        f"(ratio {flakestorm_wall / single_wall:.2f}x)"
    )
    print(f"keystone peak RSS, one process: {single_rss / 1e6:.1f} MB")
    print(f"keystone peak RSS: {keystone_rss / 1e6:.1f} MB")
    print(f"flakestorm peak RSS: {flakestorm_rss / 1e6:.1f} MB (target: keystone's <= this)")
    print(f"keystone peak PSS: {keystone_pss / 1e6:.1f} MB (one more run, not timed)")
    print(f"flakestorm peak PSS: {flakestorm_pss / 1e6:.1f} MB (one more run, not timed)")

    differ = print_verdicts(
        "verdicts, the job (invariant x scenario cells)", keystone_job, flakestorm_job
    )
    differ += print_verdicts(
        "verdicts, the job, Keystone's default isolation", keystone_shared, flakestorm_job
    )
    differ += print_verdicts(
        "verdicts, the job, Keystone in one process", keystone_single, flakestorm_job
    )
    print_verdicts(
        "verdicts, reference 001's example contract (Flakestorm ignores `when`: it checks "
        "never-fabricate-when-tools-fail in every scenario)",
        keystone_ref,
        flakestorm_ref,
    )
    print(
        f"reference 001 example: keystone resilience {keystone_ref.score:.1f} "
        f"(documented {REF001_KEYSTONE}), flakestorm {flakestorm_ref.score:.1f}% "
        f"(documented {REF001_FLAKESTORM}%)"
    )

    missed = []
    if ratio < 5:
        missed.append(f"wall time ratio {ratio:.2f}x < 5x")
    if keystone_rss > flakestorm_rss:
        missed.append(f"keystone peak RSS {mb(keystone_rss)} > flakestorm's {mb(flakestorm_rss)}")
    if differ:
        missed.append(f"{len(differ)} job cell(s) with different verdicts")
    if (keystone_ref.score, flakestorm_ref.score) != (REF001_KEYSTONE, REF001_FLAKESTORM):
        missed.append("reference 001's example is not scored as documented")
    print("\ntargets: " + ("all met" if not missed else "MISSED: " + "; ".join(missed)))
    return EXIT_TARGET_MISSED if missed else 0


if __name__ == "__main__":
    sys.exit(main())
