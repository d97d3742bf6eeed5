"""cgroups.py's choice of hierarchy and the files it writes, against temporary directories laid
out like cgroup v1 and v2 hierarchies. This machine has cgroup v1, so the v2 path cannot be
exercised against the kernel here (docs/security.md says so); what can be checked without
it is which group the worker uses, what it writes there, and that a command joins it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from evaluations.runner import cgroups
from evaluations.runner.cgroups import CommandCgroup, find_hierarchies

V2_SELF = "0::/system.slice/keystone-worker.service\n"
V1_SELF = "9:name=systemd:/\n8:pids:/workers\n4:memory:/workers\n"


def _v2_tree(root: Path, *, controllers: str = "cpu io memory pids", enabled: str = "") -> Path:
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    base = root / "system.slice" / "keystone-worker.service"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text(controllers + "\n")
    (base / "cgroup.subtree_control").write_text(enabled + "\n")
    (base / "cgroup.procs").write_text("4242\n")
    return base


def test_v2_delegated_subtree_moves_the_worker_to_a_leaf_and_enables_both_controllers(
    tmp_path: Path,
) -> None:
    base = _v2_tree(tmp_path)
    found, why = find_hierarchies(tmp_path, V2_SELF)
    assert why == ""
    assert [(h.parent, h.controllers, h.version) for h in found] == [(base, ("pids", "memory"), 2)]
    assert (base / "worker" / "cgroup.procs").read_text() == "4242"
    assert (base / "cgroup.subtree_control").read_text() == "+pids +memory"


def test_v2_command_group_gets_pids_max_and_memory_max_and_the_command_joins_it(
    tmp_path: Path,
) -> None:
    base = _v2_tree(tmp_path)
    found, _ = find_hierarchies(tmp_path, V2_SELF)
    with CommandCgroup(max_processes=40, memory_mb=256, hierarchies=found) as group:
        (path,) = group.paths
        assert path.parent == base and path.name.startswith("keystone-")
        assert (path / "pids.max").read_text() == "40"
        assert (path / "memory.max").read_text() == str(256 * 1024 * 1024)
        done = subprocess.run(group.wrap(["/bin/sh", "-c", "echo $$"]), capture_output=True)
        # The prologue wrote its PID into the group, then exec'd the command (same PID).
        assert (path / "cgroup.procs").read_text().strip() == done.stdout.decode().strip()
        # The command has exited: a real group would now be empty. Emptied here too, or the
        # group's exit would signal whatever process reuses that PID.
        (path / "cgroup.procs").write_text("")


def test_v2_with_controllers_already_enabled_moves_nothing(tmp_path: Path) -> None:
    base = _v2_tree(tmp_path, enabled="memory pids")
    found, why = find_hierarchies(tmp_path, V2_SELF)
    assert found and why == ""
    assert not (base / "worker").exists()


def test_v2_without_the_pids_controller_says_what_to_delegate(tmp_path: Path) -> None:
    _v2_tree(tmp_path, controllers="cpu memory")
    found, why = find_hierarchies(tmp_path, V2_SELF)
    assert found == ()
    assert "no pids controller" in why and "Delegate=yes" in why


def test_v2_subtree_the_worker_cannot_write_is_not_used(tmp_path: Path) -> None:
    base = _v2_tree(tmp_path)
    (base / "cgroup.subtree_control").unlink()
    (base / "cgroup.subtree_control").mkdir()  # unwritable as a file, even for root
    found, why = find_hierarchies(tmp_path, V2_SELF)
    assert found == ()
    assert why.startswith("cgroup v2 without a subtree delegated to the worker")


def test_v2_process_in_no_v2_group_is_refused(tmp_path: Path) -> None:
    _v2_tree(tmp_path)
    found, why = find_hierarchies(tmp_path, V1_SELF)
    assert found == () and "in no v2 group" in why


def test_without_cgroup_controllers_at_the_root_v1_is_used(tmp_path: Path) -> None:
    for name in ("pids", "memory"):
        (tmp_path / name / "workers").mkdir(parents=True)
    found, why = find_hierarchies(tmp_path, V1_SELF)
    assert why == ""
    assert [(h.controllers, h.version) for h in found] == [(("pids",), 1), (("memory",), 1)]
    with CommandCgroup(max_processes=7, memory_mb=1, hierarchies=found) as group:
        pids, memory = group.paths
        assert (pids / "pids.max").read_text() == "7"
        assert (memory / "memory.limit_in_bytes").read_text() == str(1024 * 1024)


def test_empty_groups_dead_workers_left_are_removed_once_in_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tmp_path / "pids"
    parent.mkdir()
    old = time.time() - cgroups._STALE_SECONDS - 10

    def group(name: str, mtime: float) -> Path:
        path = parent / name
        path.mkdir()
        os.utime(path, (mtime, mtime))
        return path

    dead, young, other = (
        group("keystone-dead", old),
        group("keystone-young", time.time()),
        group("worker", old),
    )
    clock = [1000.0]
    monkeypatch.setattr(cgroups.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cgroups, "_last_sweep", {})
    cgroups._remove_stale(parent)
    # Only a group of Keystone's that has been empty for long: a young one may be about to
    # receive its command, and the worker's own leaf is not Keystone's to remove.
    assert not dead.exists() and young.exists() and other.exists()
    later = group("keystone-later", old)
    clock[0] += cgroups._SWEEP_SECONDS / 2
    cgroups._remove_stale(parent)  # looked not long ago: not again yet
    assert later.exists()
    clock[0] += cgroups._SWEEP_SECONDS
    cgroups._remove_stale(parent)
    assert not later.exists() and young.exists()


def _v1_groups(root: Path) -> tuple[cgroups._Hierarchy, ...]:
    for name in ("pids", "memory"):
        (root / name / "workers").mkdir(parents=True)
    found, _ = find_hierarchies(root, V1_SELF)
    return found


def test_the_shell_that_joins_the_groups_runs_a_shell_command_itself(tmp_path: Path) -> None:
    """One program started instead of two (`sh` joins, then execs `sh -c COMMAND`), and the
    command sees what `/bin/sh -c COMMAND` shows it: $0, no positional parameter, its
    environment as given (the joining loop once counted in `n`, overwriting an exported
    `n`), its own exit code."""
    command = 'echo "$0|$#|${n-unset}|$$"; tr "\\0" " " < /proc/$$/cmdline; exit 7'
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        done = subprocess.run(
            group.wrap(["/bin/sh", "-c", command], then="ulimit -f 8 && "),
            capture_output=True,
            text=True,
            env={**os.environ, "n": "5"},
        )
        shown, cmdline = done.stdout.split("\n", 1)
        assert done.returncode == 7, done.stderr
        assert shown.split("|")[:3] == ["/bin/sh", "0", "5"]
        for path in group.paths:  # the shell that printed was the one that joined
            assert (path / "cgroup.procs").read_text().strip() == shown.split("|")[3]
            (path / "cgroup.procs").write_text("")  # not a real group: nothing to kill
        assert "cgroup.procs" in cmdline  # the joining shell's own command line


def test_a_failing_shell_step_keeps_the_command_from_starting(tmp_path: Path) -> None:
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        done = subprocess.run(
            group.wrap(["/bin/sh", "-c", "echo started"], then="ulimit -f nonsense && "),
            capture_output=True,
            text=True,
        )
        for path in group.paths:
            (path / "cgroup.procs").write_text("")
    assert done.returncode != 0
    assert "started" not in done.stdout


def test_a_program_that_is_not_a_shell_command_is_execd_after_joining(tmp_path: Path) -> None:
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        argv = group.wrap(["/usr/bin/env", "sh", "-c", 'echo "$$ ${n-unset}"'])
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "n": "5"})
        pid, n = done.stdout.split()
        for path in group.paths:
            assert (path / "cgroup.procs").read_text().strip() == pid
            (path / "cgroup.procs").write_text("")
    assert n == "5"  # the environment reaches the program as it was given
