"""The local backend keeps concurrent executions apart when the worker is root: each one's
agent runs as a uid of its own (KEYSTONE_LOCAL_UIDS), held for the execution's life and
given back afterwards, and its workspace is that uid's with mode 0700. The attack is an agent
that reads a neighbouring execution's workspace file and its processes' environment (the
execution's secrets), and writes into its workspace, while that execution runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evaluations.runner import local_uids
from evaluations.runner.sandbox import LocalSandbox, ProcessResult
from evaluations.runner.workspace import create_workspace, remove_workspace

pytestmark = pytest.mark.skipif(
    os.getuid() != 0, reason="the worker is not root: the agent keeps the worker's uid"
)

SECRET = "neighbour-secret-4b1d"
ENV_SECRET = "neighbour-env-secret-77aa"
# Ranges of their own, far from the default one, so that executions running on the host
# meanwhile (other test sessions, a worker) neither take these uids nor lose theirs.
TEST_UIDS = range(1_899_990_000, 1_899_990_008)


def _read_when_written(path: Path, timeout: float = 20.0) -> str:
    """The line the other execution writes to `path`, once it is all there."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return text
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)


def test_a_local_agent_cannot_reach_a_concurrent_execution(reachable: Path) -> None:
    root = reachable / "work"
    spec_dir = reachable / "spec"
    spec_dir.mkdir()
    first_ws = create_workspace(root, spec_dir=spec_dir, files={"mine.txt": "mine\n"})
    second_ws = create_workspace(root, spec_dir=spec_dir, files={"secret.txt": SECRET + "\n"})
    # One sandbox per execution, as the worker makes them.
    first, second = LocalSandbox(), LocalSandbox()
    results: dict[str, ProcessResult] = {}

    def second_execution() -> None:
        # Runs until the test says `done`: its pid is written where the test (root) reads it.
        results["second"] = second.run(
            'echo $$ > .keystone/pid; echo "env=$NEIGHBOUR_SECRET"; '
            "while [ ! -e .keystone/done ]; do sleep 0.05; done; echo finished",
            workspace=second_ws,
            env={"NEIGHBOUR_SECRET": ENV_SECRET},
            timeout=60,
        )

    thread = threading.Thread(target=second_execution)
    thread.start()
    try:
        pid = int(_read_when_written(second_ws / ".keystone" / "pid"))
        attack = (
            f"cat {second_ws}/secret.txt; echo read=$?; "
            f"ls {second_ws}; echo list=$?; "
            f"tr '\\0' '\\n' < /proc/{pid}/environ; echo environ=$?; "
            f"echo pwned > {second_ws}/pwned.txt; echo write=$?; "
            f"echo pwned >> {second_ws}/secret.txt; echo append=$?; "
            f"kill -0 {pid}; echo signal=$?; "
            "cat mine.txt; echo uid=$(id -u)"
        )
        result = first.run(attack, workspace=first_ws, env={}, timeout=30)
        out = result.stdout + result.stderr
    finally:
        (second_ws / ".keystone" / "done").touch()
        thread.join(timeout=60)

    assert result.error is None, result.error
    assert "mine" in result.stdout  # its own workspace is its to read
    assert "read=1" in result.stdout and "list=" in result.stdout and "list=0" not in out
    assert "environ=1" in result.stdout or "environ=2" in result.stdout, out
    assert "write=2" in result.stdout or "write=1" in result.stdout, out
    assert "append=0" not in out and "signal=0" not in out
    assert SECRET not in out and ENV_SECRET not in out, out
    assert not (second_ws / "pwned.txt").exists()
    assert (second_ws / "secret.txt").read_text() == SECRET + "\n"
    # The neighbour really ran meanwhile, with its secret, and ended as it meant to.
    assert f"env={ENV_SECRET}" in results["second"].stdout
    assert "finished" in results["second"].stdout, results["second"]
    # Two uids of the range, neither nobody's nor root's; each workspace its own uid's, 0700.
    uids = local_uids.configured_range()
    assert first.uid in uids and second.uid in uids and first.uid != second.uid
    assert f"uid={first.uid}" in result.stdout
    for sandbox, workspace in ((first, first_ws), (second, second_ws)):
        info = os.stat(workspace)
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (sandbox.uid, sandbox.uid, 0o700)

    # Keystone (root) reads what the agent left, and removes it; the uids are given back.
    assert (second_ws / ".keystone" / "pid").read_text().strip() == str(pid)
    held = [first.uid, second.uid]
    first.release(first_ws)  # kept on disk: handed back to root before the uid goes
    assert os.stat(first_ws).st_uid == 0 and os.stat(first_ws / "mine.txt").st_uid == 0
    remove_workspace(second_ws)
    second.release()
    assert not second_ws.exists()
    for uid in held:
        assert not (local_uids.LOCK_DIR / str(uid)).exists()


_HOLDER = """
import os, subprocess, sys
from pathlib import Path
from evaluations.runner import local_uids
lease = local_uids.acquire(range({first}, {last} + 1))
workspace = Path(sys.argv[1]) / str(lease.uid)
workspace.mkdir()
os.chown(workspace, lease.uid, lease.uid)
lease.record_workspace(workspace)
# A process of the uid left running, as an agent's daemon would be where no cgroup kills
# what a command leaves behind.
lease.uncontained()
daemon = subprocess.Popen(
    ["setpriv", f"--reuid={{lease.uid}}", f"--regid={{lease.uid}}", "--clear-groups",
     "sleep", "300"], start_new_session=True)
print(lease.uid, daemon.pid, flush=True)
if sys.stdin.readline().strip() == "release":
    lease.release()
    print("released", flush=True)
    sys.stdin.readline()
"""


def _holder(uids: range, directory: Path) -> tuple[subprocess.Popen[str], int, int]:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.format(first=uids[0], last=uids[-1]), str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert process.stdout is not None
    uid, daemon = map(int, process.stdout.readline().split())
    return process, uid, daemon


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def test_uids_are_unique_across_processes_and_threads_and_given_back(reachable: Path) -> None:
    uids = TEST_UIDS[:2]
    one, one_uid, one_daemon = _holder(uids, reachable)
    two, two_uid, two_daemon = _holder(uids, reachable)
    try:
        assert {one_uid, two_uid} == set(uids)  # two processes at once: two uids
        with pytest.raises(local_uids.LocalUidsUnavailable):
            local_uids.acquire(uids)  # a third holder finds none left

        # A clean release: the uid's processes are killed, its lock file removed.
        assert one.stdin is not None and one.stdout is not None
        one.stdin.write("release\n")
        one.stdin.flush()
        assert one.stdout.readline().strip() == "released"
        assert not _alive(one_daemon)
        assert not (local_uids.LOCK_DIR / str(one_uid)).exists()
        lease = local_uids.acquire(uids)
        assert lease.uid == one_uid
        lease.release()

        # A holder that dies holding its uid: the kernel lets the lock go; the next holder
        # kills the uid's leftovers and takes its workspace back before using it.
        os.kill(two.pid, signal.SIGKILL)
        two.wait(timeout=30)
        assert _alive(two_daemon)
        assert os.stat(reachable / str(two_uid)).st_uid == two_uid
        taken = [local_uids.acquire(uids) for _ in uids]
        assert sorted(lease.uid for lease in taken) == sorted(uids)
        deadline = time.monotonic() + 10
        while _alive(two_daemon) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(two_daemon)
        assert os.stat(reachable / str(two_uid)).st_uid == 0
        for lease in taken:
            lease.release()
    finally:
        for process in (one, two):
            process.kill()
            process.wait()
        for daemon in (one_daemon, two_daemon):
            if _alive(daemon):
                os.kill(daemon, signal.SIGKILL)

    # Threads of one process: each of eight takes a different uid of eight.
    got: list[local_uids.UidLease] = []
    lock = threading.Lock()

    def take() -> None:
        lease = local_uids.acquire(TEST_UIDS)
        with lock:
            got.append(lease)

    threads = [threading.Thread(target=take) for _ in TEST_UIDS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert sorted(lease.uid for lease in got) == list(TEST_UIDS)
    finally:
        for lease in got:
            lease.release()
    assert not any((local_uids.LOCK_DIR / str(uid)).exists() for uid in TEST_UIDS)


def test_a_holder_that_died_is_cleaned_after_without_its_uid_being_handed_out(
    reachable: Path,
) -> None:
    """Where no cgroup contains the agents, what a killed holder's agent left running ran on
    until its uid happened to be handed out again: at random among 65,536, maybe never."""
    holder, uid, daemon = _holder(TEST_UIDS[4:5], reachable)
    try:
        holder.kill()
        holder.wait(timeout=30)
        assert _alive(daemon)
        local_uids.release_dead_holders()
        deadline = time.monotonic() + 10
        while _alive(daemon) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(daemon)
        assert os.stat(reachable / str(uid)).st_uid == 0  # its workspace taken back
        assert not (local_uids.LOCK_DIR / str(uid)).exists()
    finally:
        if _alive(daemon):
            os.kill(daemon, signal.SIGKILL)


def test_a_full_range_is_a_clear_error_naming_the_setting(reachable: Path) -> None:
    uids = TEST_UIDS[2:3]
    holder, uid, daemon = _holder(uids, reachable)  # another process holds the only uid
    try:
        workspace = reachable / "ws"
        workspace.mkdir()
        sandbox = LocalSandbox(uids=uids)
        result = sandbox.run("echo ran", workspace=workspace, env={}, timeout=30)
        assert result.exit_code is None and "ran" not in result.stdout
        assert result.error is not None
        assert "KEYSTONE_LOCAL_UIDS" in result.error and "every uid" in result.error
        assert f"{uid}-{uid}" in result.error
        assert sandbox.uid is None
    finally:
        holder.kill()
        holder.wait()
        os.kill(daemon, signal.SIGKILL)
    # Once it is given back (its holder died), the execution gets it.
    result = sandbox.run("id -u", workspace=workspace, env={}, timeout=30)
    assert result.stdout.strip() == str(uid), result
    sandbox.release()


# Three uids held and given back, by a process of its own (nothing else of the test session
# writes meanwhile): what it has written that will reach the disk, bytes written to page-cache
# pages less those dropped before being written (a deleted file's).
_HOLD_AND_GIVE_BACK = """
import sys
from pathlib import Path
from evaluations.runner import local_uids

def sent_to_storage():
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["write_bytes"]) - int(fields["cancelled_write_bytes"])

def hold_and_give_back():
    local_uids.acquire(range({uid}, {uid} + 1), lock_dir=Path(sys.argv[1])).release()

hold_and_give_back()  # the directory's own blocks, written once however many locks
before = sent_to_storage()
for _ in range(3):
    hold_and_give_back()
print(sent_to_storage() - before)
"""


def test_holding_and_giving_back_a_uid_writes_nothing_to_disk(reachable: Path) -> None:
    # Every execution takes a uid and gives it back: its lock file is made, written, deleted.
    # On ext4, a file truncated to nothing is written out when it is closed (auto_da_alloc):
    # the empty new lock file, truncated before it was written, had a disk block allocated
    # and written at each release, just before it was deleted. On a file system that keeps
    # no count (tmpfs), the figure stays 0.
    lock_dir = reachable / "locks" / "uids"
    lock_dir.parent.mkdir(mode=0o755)
    done = subprocess.run(
        [sys.executable, "-c", _HOLD_AND_GIVE_BACK.format(uid=TEST_UIDS[3]), str(lock_dir)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 0
    assert not list(lock_dir.iterdir())


def test_the_range_setting_is_checked() -> None:
    assert local_uids.parse_range("1900000000-1900000009") == range(1900000000, 1900000010)
    for bad in ("", "12", "2000000000-1900000000", "1000-2000", "1900000000-4294967294", "a-b"):
        with pytest.raises(ValueError, match="KEYSTONE_LOCAL_UIDS"):
            local_uids.parse_range(bad)


def test_what_an_agent_leaves_running_dies_before_its_uid_is_given_back(reachable: Path) -> None:
    # Without a cgroup (no limit asks for one), a process that left the agent's session
    # outlives the command: it would reach the next execution holding the uid.
    workspace = reachable / "ws"
    workspace.mkdir()
    sandbox = LocalSandbox()
    result = sandbox.run(
        # (The pause: once in its own session, the group's killing no longer reaches it.)
        "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $!; sleep 0.3",
        workspace=workspace,
        env={},
        timeout=30,
        max_processes=None,
        memory_mb=None,
    )
    left = int(result.stdout.split()[-1])
    assert _alive(left), result
    sandbox.release()
    deadline = time.monotonic() + 10
    while _alive(left) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(left)
