"""Per-execution platform overhead of the sandboxes.

One execution = fresh workspace, snapshot, a no-op `command` agent (`true`) through the agent
adapter, workspace diff, three deterministic invariants, workspace removal. Overhead is the
wall time of all that minus the agent's own process time (its user+sys CPU). Two caveats,
both making the figure conservative or easy to check: Docker reports no CPU time, so there the
whole wall time counts as overhead; under bwrap the measured CPU includes bwrap's own setup,
so compare the wall column too (it bounds the overhead from above). Median over --runs.
The local backend in its default isolation: run as root, each execution's agent as a uid of
its own, the workspaces where that uid can reach them (home.py); a measurement that finds the
agent ran as root instead stops with the reason.

    /work/venv/bin/python bench/bench_overhead.py [--runs 50] [--backends local,bwrap,docker]

Targets (issue 18): local <= 30 ms, bwrap <= 5 ms, docker <= 300 ms. Exit codes: 0 every
backend measured met its target, 1 one missed it, 3 a backend asked for cannot run here (the
reason is printed; the others are still measured).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from home import RAN_AS_ROOT, traversable_tmpdir  # noqa: E402

from checks.artifact import RunArtifact  # noqa: E402
from checks.context import CheckContext  # noqa: E402
from checks.engine import evaluate_invariant  # noqa: E402
from checks.spec.model import Invariant  # noqa: E402
from evaluations.runner.agents import invoke_agent  # noqa: E402
from evaluations.runner.sandbox import (  # noqa: E402
    BwrapSandbox,
    DockerSandbox,
    LocalSandbox,
    Sandbox,
    build_busybox_image,
    bwrap_status,
    docker_status,
)
from evaluations.runner.workspace import create_workspace, diff, remove_workspace, snapshot  # noqa: E402

TARGETS_MS = {"local": 30.0, "bwrap": 5.0, "docker": 300.0}
EXIT_CANNOT_RUN = 3

INVARIANTS = [
    Invariant.from_dict(
        "completes", {"description": "agent completes", "check": {"type": "completes"}}
    ),
    Invariant.from_dict(
        "short", {"description": "short output", "check": {"type": "max_length", "max": 10_000}}
    ),
    Invariant.from_dict(
        "no_secrets_file",
        {"description": "no secrets file", "check": {"type": "file_absent", "path": "secrets.txt"}},
    ),
]


def one_execution(sandbox: Sandbox, root: Path, spec_dir: Path) -> tuple[float, float, float]:
    """(wall ms, agent cpu ms, overhead ms) of one complete execution."""
    started = time.perf_counter()
    workspace = create_workspace(root, spec_dir=spec_dir, files={"README.md": "hello\n"})
    try:
        before = snapshot(workspace)
        result = invoke_agent(
            {"type": "command", "command": "true"},
            prompt="do nothing",
            sandbox=sandbox,
            workspace=workspace,
            env={},
            timeout=60,
            max_output_bytes=1024 * 1024,
            network="services",
            spec_dir=spec_dir,
            context={},
        )
        if result.status != "success":
            raise RuntimeError(
                f"{sandbox.name}: no-op agent did not succeed: {result.error} {result.stderr}"
            )
        weaker = [w for w in sandbox.run_warnings(workspace) if RAN_AS_ROOT in w]
        if weaker:  # measured in a weaker isolation than the default's
            raise SystemExit(f"{sandbox.name}: {weaker[0]}")
        artifact = RunArtifact(
            final_output=result.final_output,
            status=result.status,
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            workspace_diff=diff(before, snapshot(workspace), workspace),
        )
        context = CheckContext(workspace=workspace, spec_dir=spec_dir, prompt="do nothing")
        outcomes = [evaluate_invariant(invariant, artifact, context) for invariant in INVARIANTS]
        if not all(outcome.passed for outcome in outcomes):
            raise RuntimeError(
                f"invariants failed: {[o.message for o in outcomes if not o.passed]}"
            )
    finally:
        remove_workspace(workspace)
        sandbox.release()  # as the harness does at the end of each execution
    wall = (time.perf_counter() - started) * 1000
    agent = result.agent_cpu_ms or 0.0
    return wall, agent, wall - agent


def measure(sandbox: Sandbox, runs: int) -> dict[str, float]:
    # Where the executions' uids can reach their workspaces (home.py): the local backend's
    # default isolation, not its fallback to running the agent as root.
    scratch = traversable_tmpdir("keystone-bench-")
    try:
        root, spec_dir = scratch / "workspaces", scratch / "spec"
        spec_dir.mkdir()
        for _ in range(3):  # warm caches (page cache, docker image layers, imports)
            one_execution(sandbox, root, spec_dir)
        samples = [one_execution(sandbox, root, spec_dir) for _ in range(runs)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    overheads = sorted(sample[2] for sample in samples)
    return {
        "median_overhead_ms": statistics.median(overheads),
        "p95_overhead_ms": overheads[min(len(overheads) - 1, int(len(overheads) * 0.95))],
        "median_wall_ms": statistics.median(sample[0] for sample in samples),
        "median_agent_cpu_ms": statistics.median(sample[1] for sample in samples),
    }


def sandboxes(names: list[str], docker_image: str | None) -> list[tuple[str, Sandbox | None, str]]:
    chosen: list[tuple[str, Sandbox | None, str]] = []
    for name in names:
        if name == "local":
            chosen.append((name, LocalSandbox(), ""))
        elif name == "bwrap":
            ok, reason = bwrap_status()
            chosen.append((name, BwrapSandbox() if ok else None, reason))
        elif name == "docker":
            ok, reason = docker_status()
            if ok:
                chosen.append((name, DockerSandbox(docker_image or build_busybox_image()), ""))
            else:
                chosen.append((name, None, reason))
        else:
            raise SystemExit(f"unknown backend {name!r}")
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--backends", default="local,bwrap,docker")
    parser.add_argument(
        "--docker-image",
        default=None,
        help="default: a local busybox image built with docker import",
    )
    args = parser.parse_args()

    print(
        f"per-execution platform overhead, median of {args.runs} runs (no-op agent, 3 deterministic invariants)"
    )
    print(
        f"{'backend':8} {'overhead':>10} {'p95':>10} {'wall':>10} {'agent cpu':>10} {'target':>8}  verdict"
    )
    failed = missing = False
    for name, sandbox, reason in sandboxes(args.backends.split(","), args.docker_image):
        if sandbox is None:
            print(f"{name:8} not measured: {reason}")
            missing = True
            continue
        figures = measure(sandbox, args.runs)
        target = TARGETS_MS[name]
        ok = figures["median_overhead_ms"] <= target
        failed = failed or not ok
        print(
            f"{name:8} {figures['median_overhead_ms']:8.1f}ms {figures['p95_overhead_ms']:8.1f}ms "
            f"{figures['median_wall_ms']:8.1f}ms {figures['median_agent_cpu_ms']:8.1f}ms {target:6.0f}ms  "
            f"{'OK' if ok else 'OVER TARGET'}"
        )
    return EXIT_CANNOT_RUN if missing else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
