"""Issue 13, item 8 (local backend): the agent never shares the worker's uid when that can be
avoided. The attack is an agent under `backend: local` that signals the worker, kills one of
the worker's own processes and reads a file only the worker may read. With the worker root,
the agent runs as a uid of its own (KEYSTONE_LOCAL_UIDS) and each attempt fails; with a worker that is not root, the run says
that the agent shares its uid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evaluations.runner import cgroups, local_uids
from evaluations.runner.sandbox import NOBODY, LocalSandbox

CANARY = "keystone-worker-only-6c2e"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.getuid() != 0, reason="the worker is not root: the agent keeps its uid")
def test_a_local_agent_cannot_signal_the_worker_or_read_its_files(reachable: Path) -> None:
    secret = reachable / "worker-secret"
    secret.write_text(CANARY)
    os.chmod(secret, 0o600)
    workspace = reachable / "ws"
    workspace.mkdir()
    worker_child = subprocess.Popen(["sleep", "60"])  # one of the worker's own processes
    try:
        command = (
            f"kill -0 {os.getpid()}; echo signal-worker=$?; "
            f"kill -KILL {worker_child.pid}; echo kill-child=$?; "
            f"cat {secret}; echo read=$?; echo uid=$(id -u)"
        )
        sandbox = LocalSandbox()
        result = sandbox.run(command, workspace=workspace, env={}, timeout=30)
        out = result.stdout
        assert "signal-worker=1" in out, out + result.stderr
        assert "kill-child=1" in out
        assert worker_child.poll() is None  # still running
        assert "read=1" in out and CANARY not in out + result.stderr
        # The execution's own uid, of the reserved range: neither root's nor nobody's.
        assert sandbox.uid in local_uids.configured_range()
        assert f"uid={sandbox.uid}" in out
        sandbox.release()
        assert not any("own user" in w for w in sandbox.run_warnings(workspace))
    finally:
        worker_child.kill()
        worker_child.wait()


@pytest.mark.skipif(os.getuid() != 0, reason="the worker is not root: the agent keeps its uid")
def test_the_workspace_stays_writable_for_the_agent(reachable: Path) -> None:
    workspace = reachable / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "app.py").write_text("print('v1')\n")
    result = LocalSandbox().run(
        "echo \"print('v2')\" > src/app.py && mkdir -p out && echo done > out/r.txt "
        "&& echo home > $HOME/h && mktemp > /dev/null && echo ok",
        workspace=workspace,
        env={},
        timeout=30,
    )
    assert result.stdout.strip() == "ok", result.stderr
    assert (workspace / "out" / "r.txt").read_text() == "done\n"
    # Its TMPDIR is its HOME: the file it wrote there and the one mktemp made.
    assert len(list((workspace / ".keystone" / "home").iterdir())) == 2


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_a_worker_that_is_not_root_warns_that_the_agent_shares_its_uid(reachable: Path) -> None:
    # A real worker that is not root: this process, forked, gives up root for nobody (the
    # interpreter is already loaded, wherever it is installed), then runs an agent that
    # signals its worker.
    workspace = reachable / "ws"
    workspace.mkdir()
    os.chown(workspace, NOBODY, NOBODY)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker, as nobody
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            sandbox = LocalSandbox()
            result = sandbox.run(
                f"kill -0 {os.getpid()}; echo signal-worker=$?",
                workspace=workspace,
                env={},
                timeout=30,
                # The parent's (root's) cgroups are not this worker's to use.
                max_processes=None,
                memory_mb=None,
            )
            report = {"warnings": sandbox.run_warnings(workspace), "stdout": result.stdout}
            os.write(write_end, json.dumps(report).encode())
        except BaseException as exc:
            os.write(write_end, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        report = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert "error" not in report, report
    # The agent shares the worker's uid (it can signal it), and the run says so.
    assert "signal-worker=0" in report["stdout"]
    assert any(f"worker's own user (uid {NOBODY})" in w for w in report["warnings"])


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
def test_rlimits_above_the_workers_own_hard_limits_still_start_the_agent(reachable: Path) -> None:
    """The agent's shell sets its rlimits once started as its uid, so it cannot raise
    them: asked for more than the worker's own hard limits (an operator's `ulimit -H`), it
    gets those limits instead of failing to start."""
    workspace = reachable / "ws"
    workspace.mkdir()
    script = f"""
import json, resource, sys
from pathlib import Path
from evaluations.runner.sandbox import LocalSandbox
resource.setrlimit(resource.RLIMIT_CPU, (20, 20))
resource.setrlimit(resource.RLIMIT_FSIZE, (4096 * 512, 4096 * 512))
sandbox = LocalSandbox()
result = sandbox.run("id -u; ulimit -H -t; ulimit -f", workspace=Path({str(workspace)!r}),
                     env={{}}, timeout=60, max_file_bytes=1024 * 1024 * 1024)
print(json.dumps([sandbox.uid, result.exit_code, result.stdout, result.stderr]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    uid, exit_code, stdout, stderr = json.loads(done.stdout.strip().splitlines()[-1])
    assert exit_code == 0, stderr
    ran_as, cpu_hard, file_blocks = stdout.split()
    assert int(ran_as) == uid != 0  # dropped to the execution's uid before setting them
    assert (int(cpu_hard), int(file_blocks)) == (20, 4096)


# A process the agent leaves behind, sending SIGKILL to every thread of the worker over and
# over (tgkill: the kernel checks it against each target thread's own ids). A thread of the
# worker that ran as the agent's uid meanwhile (as_uid.py starts each command so) would die,
# and the whole worker with it. perl: found on every Debian, with a raw `syscall`.
_TGKILL = {"x86_64": 234, "aarch64": 131, "riscv64": 131}[os.uname().machine]
_THREAD_KILLER = (  # in a session of its own: out of reach of the kill of its command's group
    'setsid perl -e \'$w = 0 + shift; while (opendir(my $d, "/proc/$w/task")) {'
    f" syscall({_TGKILL}, $w, 0 + $_, 9) for grep {{ /^\\d+$/ }} readdir $d }}' $PPID"
    " </dev/null >/dev/null 2>&1 &"
)
_WORKER = """
import json, sys, time
from pathlib import Path
from evaluations.runner import cgroups
if sys.argv[2] == "uncontained":  # a host without cgroups: no group kills what it leaves
    cgroups._controllers = lambda: ((), "none in this test")
from evaluations.runner.sandbox import LocalSandbox
sandbox = LocalSandbox()
workspace = Path(sys.argv[1])
# The pause: long enough for the killer to leave its command's process group, which the
# end of the command kills.
first = sandbox.run(sys.argv[3] + " sleep 0.3; echo left", workspace=workspace, env={},
                    timeout=30)
time.sleep(0.5)  # the killer, if it survived its command, spins meanwhile
runs = [sandbox.run("id -u", workspace=workspace, env={}, timeout=30) for _ in range(20)]
print(json.dumps([first.stdout, [r.stdout for r in runs], sandbox.uid]), flush=True)
sandbox.release()
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")
@pytest.mark.parametrize("hosting", ["contained", "uncontained"])
def test_what_an_agent_leaves_running_cannot_kill_the_worker_at_its_next_command(
    reachable: Path, hosting: str
) -> None:
    """Each command starts as the execution's uid from a thread of the worker's, which that
    uid could signal while it lives: no process of the uid outlives its command, so none is
    there to try. In a cgroup, the group kills it when its command ends; without cgroups,
    the next command's start does (local_uids.UidLease.uncontained)."""
    if hosting == "contained" and not cgroups.support()[0]:
        pytest.skip("this host has no cgroups the worker may use")
    workspace = reachable / "ws"
    workspace.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(workspace), hosting, _THREAD_KILLER],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    first, later, uid = json.loads(done.stdout)
    assert first == "left\n"
    assert later == [f"{uid}\n"] * 20
