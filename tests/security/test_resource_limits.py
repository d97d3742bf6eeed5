"""Issue 13, item 8: an agent cannot take the host's processes or memory, or leave anything
running behind it. Each test is the attack, under bubblewrap and under the local backend:
a burst of processes far above the ceiling, a process tree whose members each stay under the
per-process memory limit but together exceed the execution's, and a daemon that leaves the
agent's process group and session."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from evaluations.runner import cgroups, owners
from evaluations.runner.sandbox import BwrapSandbox, LocalSandbox, Sandbox, bwrap_status

pytestmark = pytest.mark.skipif(
    not cgroups.support()[0], reason=f"no cgroup to limit with here: {cgroups.support()[1]}"
)

BACKENDS = [
    "local",
    pytest.param("bwrap", marks=pytest.mark.skipif(not bwrap_status()[0], reason="no bwrap")),
]


def _sandbox(name: str) -> Sandbox:
    return LocalSandbox() if name == "local" else BwrapSandbox()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_burst_of_processes_stops_at_the_ceiling(backend: str, tmp_path: Path) -> None:
    # 300 sleepers against a ceiling of 40: most forks are refused, the host keeps its own.
    command = (
        "ok=0; failed=0; for i in $(seq 300); do "
        "if sleep 3 2>/dev/null & then ok=$((ok+1)); else failed=$((failed+1)); fi; done; "
        "echo started=$(jobs -p | wc -l)"
    )
    result = _sandbox(backend).run(
        command, workspace=tmp_path, env={}, timeout=30, max_processes=40
    )
    started = (
        int(result.stdout.split("started=")[1].split()[0]) if "started=" in result.stdout else 0
    )
    assert started < 40, result.stdout + result.stderr
    assert "process limit (40) was reached" in result.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_process_tree_cannot_exceed_the_executions_memory(backend: str, tmp_path: Path) -> None:
    # Four children of 150 MB each: every one is under the per-process limit (400 MB), the
    # four together are not under the execution's 400 MB.
    hog = "import time; b = bytearray(150 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); time.sleep(3); print('survived')"
    command = " & ".join([f'python3 -c "{hog}"'] * 4) + " & wait"
    result = _sandbox(backend).run(command, workspace=tmp_path, env={}, timeout=30, memory_mb=400)
    assert result.stdout.count("survived") < 4, result.stdout + result.stderr


def _groups() -> set[str]:
    return {
        name
        for controller in cgroups._controllers()[0]
        for name in os.listdir(controller.parent)
        if name.startswith("keystone-")
    }


def test_a_daemon_that_left_the_session_is_killed_with_the_execution(tmp_path: Path) -> None:
    before = _groups()
    marker = tmp_path / "still-alive"
    command = f"setsid sh -c 'sleep 2; touch {marker}' </dev/null >/dev/null 2>&1 & echo started"
    result = LocalSandbox().run(command, workspace=tmp_path, env={}, timeout=30)
    assert "started" in result.stdout
    time.sleep(3)
    assert not marker.exists()
    # And the execution's groups are gone from the host.
    assert not _groups() - before


def test_groups_dead_workers_left_are_removed_by_the_next_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The next command of a process that has not looked for them lately (a process looks
    # once every owners.LOOK_SECONDS: tests/evaluations/runner/test_cgroups.py).
    monkeypatch.setattr(cgroups, "_looks", owners.Looks())
    controller = cgroups._controllers()[0][0]
    stale = controller.parent / "keystone-left-by-a-dead-worker"
    stale.mkdir()
    old = time.time() - 3600
    os.utime(stale, (old, old))
    young = controller.parent / "keystone-a-neighbours-just-made"
    young.mkdir()
    try:
        LocalSandbox().run("true", workspace=tmp_path, env={}, timeout=30)
        assert not stale.exists()
        assert young.exists()  # may be about to receive its process: left alone
    finally:
        for path in (stale, young):
            if path.exists():
                path.rmdir()


def _group_with_a_sleeper(maker: int) -> tuple[subprocess.Popen[bytes], list[Path]]:
    """A command's groups as the process `maker` names them, with a process in them."""
    name = f"keystone-{maker}-{uuid.uuid4().hex}"
    sleeper = subprocess.Popen(["sleep", "60"])
    paths = []
    for hierarchy in cgroups._controllers()[0]:
        path = hierarchy.parent / name
        path.mkdir()
        paths.append(path)
        (path / "cgroup.procs").write_text(str(sleeper.pid))
    return sleeper, paths


def test_what_runs_in_the_groups_of_a_process_that_died_is_killed_by_the_next_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed (SIGKILL, the OOM killer) while its agent ran: the agent ran on until
    its command ended, as long as it liked, with no one left to enforce its timeout. The
    next command of a Keystone process on the host kills it; a living process's are left."""
    monkeypatch.setattr(cgroups, "_looks", owners.Looks())
    ended = subprocess.Popen(["true"])
    ended.wait()
    orphan, orphan_groups = _group_with_a_sleeper(ended.pid)
    kept, kept_groups = _group_with_a_sleeper(os.getpid())
    try:
        LocalSandbox().run("true", workspace=tmp_path, env={}, timeout=30)
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert not [path for path in orphan_groups if path.exists()]
        assert kept.poll() is None and all(path.exists() for path in kept_groups)
    finally:
        for sleeper in (orphan, kept):
            sleeper.kill()
            sleeper.wait()
        for path in orphan_groups + kept_groups:
            if path.exists():
                path.rmdir()
