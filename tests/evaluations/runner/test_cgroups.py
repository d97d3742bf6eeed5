"""cgroups.py's choice of hierarchy and the files it writes, against temporary directories laid
out like cgroup v1 and v2 hierarchies. This machine has cgroup v1, so the v2 path cannot be
exercised against the kernel here (docs/security.md says so); what can be checked without
it is which group the worker uses, what it writes there, and that a command is admitted to it
before it runs (tests/security/test_resource_limits.py runs commands in real v1 groups)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from evaluations.runner import cgroups, owners
from evaluations.runner.cgroups import GATE_LINE, CommandCgroup, find_hierarchies

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
        out, _, pid = _run_admitted(group, group.wrap(["/bin/sh", "-c", "echo $$"]))
        # The worker wrote the waiting shell's PID into the group (_run_admitted checks it),
        # and the command runs in that process.
        assert out.strip() == str(pid)
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


def _write(files: dict[str, str], root: Path) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_v2_cpu_quota_is_the_smallest_on_the_way_up_from_the_own_group(tmp_path: Path) -> None:
    base = _v2_tree(tmp_path)
    _write({"cpu.max": "max 100000\n"}, base)
    _write({"system.slice/cpu.max": "150000 100000\n"}, tmp_path)
    assert cgroups.cpu_quota(tmp_path, V2_SELF) == 1.5
    _write({"cpu.max": "50000 100000\n"}, base)
    assert cgroups.cpu_quota(tmp_path, V2_SELF) == 0.5


def test_v2_without_a_quota_anywhere_there_is_none(tmp_path: Path) -> None:
    base = _v2_tree(tmp_path)
    _write({"cpu.max": "max 100000\n"}, base)
    assert cgroups.cpu_quota(tmp_path, V2_SELF) is None


def test_v1_cpu_quota_is_read_from_the_cpu_hierarchy(tmp_path: Path) -> None:
    own = "3:cpu,cpuacct:/docker/abc\n" + V1_SELF
    _write(
        {
            "cpu/cpu.cfs_quota_us": "-1\n",
            "cpu/cpu.cfs_period_us": "100000\n",
            "cpu/docker/abc/cpu.cfs_quota_us": "200000\n",
            "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
        },
        tmp_path,
    )
    assert cgroups.cpu_quota(tmp_path, own) == 2.0
    assert cgroups.cpu_quota(tmp_path, V1_SELF) is None  # no cpu line: the root's, unlimited


def test_v1_in_a_container_the_hierarchy_root_is_its_own_group(tmp_path: Path) -> None:
    """/proc/self/cgroup names the group's path on the host, which the container's view of
    the hierarchy does not have: its root is the container's group."""
    own = "3:cpu,cpuacct:/docker/abc\n"
    _write({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, tmp_path)
    assert cgroups.cpu_quota(tmp_path, own) == 3.0


def test_usable_cpus_are_the_affinity_mask_capped_by_the_quota_rounded_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    quotas = {"quota": None}
    monkeypatch.setattr(cgroups, "cpu_quota", lambda root, own: quotas["quota"])
    assert cgroups.usable_cpus() == 4
    quotas["quota"] = 1.5
    assert cgroups.usable_cpus() == 2
    quotas["quota"] = 0.2
    assert cgroups.usable_cpus() == 1
    quotas["quota"] = 16.0
    assert cgroups.usable_cpus() == 4


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
    monkeypatch.setattr(cgroups, "_looks", owners.Looks())
    cgroups._remove_stale(parent)
    # Only a group of Keystone's that has been empty for long: a young one may be about to
    # receive its command, and the worker's own leaf is not Keystone's to remove.
    assert not dead.exists() and young.exists() and other.exists()
    later = group("keystone-later", old)
    clock[0] += owners.LOOK_SECONDS / 2
    cgroups._remove_stale(parent)  # looked not long ago: not again yet
    assert later.exists()
    clock[0] += owners.LOOK_SECONDS
    cgroups._remove_stale(parent)
    assert not later.exists() and young.exists()


def _v1_groups(root: Path) -> tuple[cgroups._Hierarchy, ...]:
    for name in ("pids", "memory"):
        (root / name / "workers").mkdir(parents=True)
    found, _ = find_hierarchies(root, V1_SELF)
    return found


def _run_admitted(
    group: CommandCgroup,
    argv: list[str],
    *,
    stdin: bytes = b"",
    gate: bool = True,
    env: dict[str, str] | None = None,
) -> tuple[str, int, int]:
    """Start `argv` as the sandbox does: admitted to the group, then the gate line (unless
    `gate` is False: a worker that died first) and `stdin`. (stdout, exit code, pid); every
    group's cgroup.procs is checked to hold that pid."""
    process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    group.admit(process.pid)
    out, err = process.communicate((GATE_LINE if gate else b"") + stdin, timeout=10)
    for path in group.paths:
        assert (path / "cgroup.procs").read_text() == str(process.pid)
        (path / "cgroup.procs").write_text("")  # not a real group: nothing to kill at exit
    return out.decode(), process.returncode, process.pid


def test_a_shell_command_runs_in_the_admitted_shell_itself(tmp_path: Path) -> None:
    """In place: the shell the worker admitted runs the prologue, then the command (no second
    shell), and the command sees what `/bin/sh -c COMMAND` shows it: $0, no positional
    parameter, its environment as given (the gate's variable is gone), its own exit code."""
    command = 'echo "$0|$#|${n-unset}|${keystone_gate-unset}|$$"; exit 7'
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        argv = group.wrap(["/bin/sh", "-c", command], then="ulimit -f 8 && ", in_place=True)
        out, code, pid = _run_admitted(group, argv, env={**os.environ, "n": "5"})
    assert code == 7
    assert out.strip().split("|") == ["/bin/sh", "0", "5", "unset", str(pid)]


def test_gate_holds_the_command_back_without_any_group() -> None:
    """`gate`: a caller with its own reason to hold the command back (the local backend,
    until the thread that started it as the execution's uid is gone) gets the gate where
    the host has no cgroup: nothing runs before the line, nothing at all without it."""
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=()) as group:
        assert not group.kills_leftovers
        assert group.wrap(["/bin/sh", "-c", "echo ran"], in_place=True) == [
            "/bin/sh",
            "-c",
            "echo ran",
        ]
        argv = group.wrap(["/bin/sh", "-c", "echo ran"], in_place=True, gate=True)
        assert _run_admitted(group, argv)[:2] == ("ran\n", 0)
        assert _run_admitted(group, argv, gate=False)[:2] == ("", 125)


def test_a_program_that_execs_the_shell_in_place_keeps_its_argv_before_it(tmp_path: Path) -> None:
    # As `env` execs the shell here: the prologue goes to the closing shell, after them.
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        argv = group.wrap(["/usr/bin/env", "/bin/sh", "-c", "echo $$"], in_place=True)
        assert argv[:3] == ["/usr/bin/env", "/bin/sh", "-c"] and len(argv) == 4
        out, code, pid = _run_admitted(group, argv)
    assert code == 0 and out.strip() == str(pid)


def test_nothing_runs_before_the_gate_line(tmp_path: Path) -> None:
    """A worker that died between starting the command and admitting it closes the pipe:
    the shell reads end-of-file and exits 125, the command never starts."""
    marker = tmp_path / "ran"
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        for in_place in (True, False):
            argv = group.wrap(["/bin/sh", "-c", f"touch {marker}"], in_place=in_place)
            _, code, _ = _run_admitted(group, argv, gate=False)
            assert code == 125 and not marker.exists()


def test_the_commands_input_follows_the_gate_line_whole(tmp_path: Path) -> None:
    data = b"first line\nsecond\x00line\n" + b"x" * 100_000  # more than one pipe write
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        for in_place in (True, False):
            argv = group.wrap(["/bin/sh", "-c", "od -An -c | md5sum"], in_place=in_place)
            out, code, _ = _run_admitted(group, argv, stdin=data)
            expected = subprocess.run(
                ["/bin/sh", "-c", "od -An -c | md5sum"], input=data, capture_output=True
            ).stdout.decode()
            assert code == 0 and out == expected


def test_a_failing_shell_step_keeps_the_command_from_starting(tmp_path: Path) -> None:
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        for in_place in (True, False):
            argv = group.wrap(
                ["/bin/sh", "-c", "echo started"], then="ulimit -f nonsense && ", in_place=in_place
            )
            out, code, _ = _run_admitted(group, argv)
            assert code != 0
            assert "started" not in out


def test_a_program_that_is_not_a_shell_command_is_execd_after_admission(tmp_path: Path) -> None:
    with CommandCgroup(max_processes=7, memory_mb=64, hierarchies=_v1_groups(tmp_path)) as group:
        argv = group.wrap(["/usr/bin/env", "sh", "-c", 'echo "$$ ${n-unset}"'])
        out, _, admitted = _run_admitted(group, argv, env={**os.environ, "n": "5"})
    pid, n = out.split()
    assert pid == str(admitted)  # the program the admitted shell exec'd
    assert n == "5"  # the environment reaches the program as it was given
