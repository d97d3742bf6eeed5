"""Without a broker, executions of a run go several at a time: `keystone run --jobs N`
(default two per core) and the embedded worker's pollers under `keystone serve` / `keystone
worker`. Each execution still runs exactly once and every result is stored once, on the
embedded SQLite default as on PostgreSQL (issue 18)."""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path

import pytest

from evaluations.runner.cgroups import CGROUP_ROOT, usable_cpus
from tests.cli_helpers import REPO_ROOT, embedded_env, run_keystone
from tests.http_peer import HttpPeer, PeerHandler

# The `keystone run` tests run a subprocess on a real SQLite file (the embedded default) in
# both passes. The pollers' test runs in this process, on the test database: on PostgreSQL
# only, since the SQLite pass's test database is in memory with a shared cache, where a
# second writer fails at once ("database table is locked") instead of waiting its turn as
# it does on the file the embedded default uses.
pytestmark = [pytest.mark.slow]


# Six executions of an agent that takes a moment, so executions that run at once overlap.
SPEC = """\
version: 1
id: jobs
task: {prompts: ["a", "b"]}
agent: {type: command, command: "sleep 0.4; echo done", timeout: 30}
sandbox: {backend: local}
replicas: 3
invariants:
  answers: {description: answers, check: {type: contains, value: done}}
"""


def _run(
    tmp_path: Path,
    jobs: int,
    *options: str,
    processes: int | None = None,
    prefix: Sequence[str] = (),
) -> list[tuple[datetime, datetime, int]]:
    """`keystone run --jobs N` of SPEC (after `prefix`, a command that starts it: in a
    cgroup, on one CPU), checked to have stored every result once, shared out over
    `processes` processes (default: one per CPU this test process may use)."""
    home = tmp_path / f"home-{jobs}"
    spec = tmp_path / "jobs.yaml"
    spec.write_text(SPEC)
    result = run_keystone(
        "run", str(spec), "--jobs", str(jobs), *options, env=embedded_env(home), prefix=prefix
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "execution 6/6" in result.stdout
    with sqlite3.connect(home / "keystone.sqlite3") as db:
        rows = db.execute(
            "SELECT started, finished, attempt FROM evaluations_execution ORDER BY started"
        ).fetchall()
        results = db.execute(
            "SELECT COUNT(*), COUNT(DISTINCT execution_id) FROM evaluations_checkresult"
        ).fetchone()
        claimed = db.execute("SELECT COUNT(DISTINCT claimed_by) FROM evaluations_execution")
        (claimed_by,) = claimed.fetchone()
    assert results == (6, 6), "each execution's result is stored exactly once"
    # Threads in this process and in one forked process per further core (`cli:<pid>`).
    assert claimed_by == min(jobs, processes or usable_cpus()), claimed_by
    return [(datetime.fromisoformat(s), datetime.fromisoformat(f), a) for s, f, a in rows]


def _overlapping(spans: list[tuple[datetime, datetime, int]]) -> int:
    """How many executions started before the one before them had finished."""
    return sum(1 for before, after in itertools.pairwise(spans) if after[0] < before[1])


@pytest.mark.embedded
def test_jobs_run_executions_at_once_each_exactly_once(tmp_path: Path) -> None:
    at_once = _run(tmp_path, jobs=3)
    assert len(at_once) == 6 and all(attempt == 1 for _, _, attempt in at_once)
    assert _overlapping(at_once) >= 2

    one_by_one = _run(tmp_path, jobs=1)
    assert len(one_by_one) == 6
    assert _overlapping(one_by_one) == 0


@pytest.mark.embedded
def test_one_process_runs_every_job_on_its_own_threads(tmp_path: Path) -> None:
    """`--processes 1`: no forked process (the least memory), the jobs still at once."""
    at_once = _run(tmp_path, 3, "--processes", "1", processes=1)
    assert _overlapping(at_once) >= 2


@pytest.mark.embedded
def test_a_run_allowed_one_cpu_forks_no_process(tmp_path: Path) -> None:
    """Its processes are sized to the CPUs it may run on, not to the host's."""
    assert (os.cpu_count() or 1) >= 2, "this test needs a host with two CPUs or more"
    at_once = _run(tmp_path, 3, processes=1, prefix=["taskset", "-c", "0"])
    assert _overlapping(at_once) >= 2


@contextlib.contextmanager
def _cgroup_of_one_cpu() -> Iterator[Path]:
    """A control group of this host's whose quota is one CPU (cgroup v2 `cpu.max`, v1
    `cpu.cfs_quota_us`); its `cgroup.procs` is yielded."""
    unified = (CGROUP_ROOT / "cgroup.controllers").exists()
    group = (CGROUP_ROOT if unified else CGROUP_ROOT / "cpu") / f"keystone-test-{os.getpid()}"
    group.mkdir()
    try:
        if unified:
            (group / "cpu.max").write_text("100000 100000")
        else:
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text("100000")
        yield group / "cgroup.procs"
    finally:
        group.rmdir()  # its processes have ended


@pytest.mark.embedded
def test_a_run_in_a_cgroup_with_a_quota_of_one_cpu_forks_no_process(tmp_path: Path) -> None:
    """A container given one CPU on a larger host: its quota, not the host's CPUs."""
    assert len(os.sched_getaffinity(0)) >= 2, "this test needs a host with two CPUs or more"
    with _cgroup_of_one_cpu() as procs:
        join = f'echo $$ > {procs} && exec "$@"'
        at_once = _run(tmp_path, 3, processes=1, prefix=["/bin/sh", "-c", join, "sh"])
    assert _overlapping(at_once) >= 2


@pytest.mark.django_db(transaction=True)
def test_the_embedded_workers_pollers_share_a_run_each_execution_once(project: object) -> None:
    from evaluations import services
    from evaluations.embedded_worker import start_pollers
    from evaluations.models import CheckResult, Execution, Run, RunStatus

    version = services.spec_version_create(project=project, source_yaml=SPEC)
    run = services.run_create(spec_version=version, spec_dir=str(REPO_ROOT), enqueue=False)
    stop = threading.Event()
    pollers = start_pollers(stop, 3)
    try:
        deadline = time.monotonic() + 60
        while Run.objects.get(pk=run.pk).status != RunStatus.COMPLETED:
            assert time.monotonic() < deadline, "the pollers did not finish the run"
            time.sleep(0.1)
    finally:
        stop.set()
        for poller in pollers:
            poller.join(timeout=10)
    executions = list(Execution.objects.filter(run=run))
    assert len(executions) == 6 and all(e.attempt == 1 for e in executions)
    # More than one poller took executions: they ran side by side, not one after another.
    assert len({e.claimed_by for e in executions}) >= 2
    assert CheckResult.objects.filter(run=run).count() == 6


SLOW_AGENT = SPEC.replace("sleep 0.4", "sleep 120").replace("timeout: 30", "timeout: 300")


def _two_agents_running(
    tmp_path: Path, source: str = SLOW_AGENT
) -> tuple[subprocess.Popen[str], Path]:
    """`keystone run --jobs 2` of `source` (by default, agents that sleep 120 s), once two
    executions are running; and the run's SQLite database."""
    home = tmp_path / "home"
    spec = tmp_path / "slow.yaml"
    spec.write_text(source)
    process = subprocess.Popen(
        [sys.executable, "-m", "evaluations.cli", "run", str(spec), "--jobs", "2"],
        cwd=REPO_ROOT,
        env=embedded_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    database = home / "keystone.sqlite3"
    deadline = time.monotonic() + 60
    running = 0
    while running < 2:
        assert time.monotonic() < deadline, "the executions never started"
        time.sleep(0.2)
        if database.exists():
            with sqlite3.connect(database) as db, contextlib.suppress(sqlite3.OperationalError):
                running = db.execute(  # no such table yet while the schema is made
                    "SELECT COUNT(*) FROM evaluations_execution WHERE status = 'running'"
                ).fetchone()[0]
    return process, database


def _cancelled_with_nothing_left(database: Path) -> bool:
    """The run (the database's only one) is cancelled, and no execution is pending or
    running."""
    with sqlite3.connect(database) as db:
        status = db.execute("SELECT status FROM evaluations_run").fetchone()[0]
        left = db.execute(
            "SELECT COUNT(*) FROM evaluations_execution WHERE status IN ('pending', 'running')"
        ).fetchone()[0]
    return bool(status == "cancelled" and left == 0)


@pytest.fixture
def hanging_http_server() -> Iterator[str]:
    """The URL of a server that answers any POST after 120 s (an agent, a judge)."""

    class Handler(PeerHandler):
        def do_POST(self) -> None:
            time.sleep(120)

    with HttpPeer(Handler) as peer:  # its request threads are daemons: none holds the close
        yield f"{peer.url}/invoke"


JUDGED = """
judge:
  provider: openai
  model: gpt-4o-mini
  base_url: "{endpoint}"
invariants:
  answers: {{description: answers, check: {{type: contains, value: done}}}}
  tone: {{description: friendly, check: {{type: llm_as_judge, criteria: "It is friendly."}}}}
"""


@pytest.mark.embedded
@pytest.mark.parametrize("agent", ["command", "http", "command with a judge"])
def test_ctrl_c_cancels_the_run_without_waiting_for_the_running_agents(
    tmp_path: Path, agent: str, request: pytest.FixtureRequest
) -> None:
    import signal

    source = SLOW_AGENT
    if agent == "http":
        endpoint = request.getfixturevalue("hanging_http_server")
        source = SPEC.replace(
            'agent: {type: command, command: "sleep 0.4; echo done", timeout: 30}',
            f'agent: {{type: http, endpoint: "{endpoint}", timeout: 300}}',
        )
        assert source != SPEC
    if agent == "command with a judge":  # a judge that never answers (the same hanging server)
        endpoint = request.getfixturevalue("hanging_http_server").removesuffix("/invoke")
        head, _ = SLOW_AGENT.split("invariants:")
        source = head.rstrip("\n") + JUDGED.format(endpoint=f"{endpoint}/v1")
    process, database = _two_agents_running(tmp_path, source)
    process.send_signal(signal.SIGINT)
    # Far less than the agents' 120 s, and than the next lease round (20 s) of either
    # process: the interrupt stops their agents at once.
    _, err = process.communicate(timeout=15)
    assert process.returncode == 4 and "interrupted" in err, err
    assert _cancelled_with_nothing_left(database)


# `keystone run` with a real SIGINT sent to itself at one moment of its start (sys.argv[1]):
# `planned`, once the run is planned, before anything is forked (multiprocessing.get_context
# wrapped to send it), or `threads`, just after it has started the thread that runs its
# executions (Thread.start wrapped). A user's Ctrl-C hits there when it comes as a run begins.
# `other thread`: once both agents run, to a thread other than the main one, where the kernel
# may deliver a signal sent to the process (a thread started for it signals itself).
INTERRUPT_AT = """
import multiprocessing, os, signal, sys, threading, time

moment, parent = sys.argv.pop(1), os.getpid()
get_context, start = multiprocessing.get_context, threading.Thread.start


def interrupt():
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def get_context_then_interrupt(*args):
    context = get_context(*args)
    if moment == "planned":
        interrupt()
    return context


def interrupt_another_thread():
    time.sleep(3)  # both agents started (their 120 s sleep), the main thread waiting
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


def start_then_interrupt(thread):
    start(thread)
    if moment in ("threads", "other thread") and os.getpid() == parent:
        if thread._target.__name__ == "execute_until_done":
            if moment == "threads":
                interrupt()
            else:
                start(threading.Thread(target=interrupt_another_thread, daemon=True))


multiprocessing.get_context = get_context_then_interrupt
threading.Thread.start = start_then_interrupt
from evaluations.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.embedded
@pytest.mark.parametrize("moment", ["planned", "threads", "other thread"])
def test_ctrl_c_as_the_run_begins_cancels_it_too(tmp_path: Path, moment: str) -> None:
    """The interrupt came before the code that cancels the run: the command said
    "interrupted", then waited at exit for its thread's agent (120 s) or left nothing
    running at all, and in both cases left the run unfinished for good, with executions no
    one would run. Taken by another thread, it went unseen while the main thread waited for
    the agents (120 s; CI failed once on test_ctrl_c_cancels_the_run_without_waiting_...)."""
    home = tmp_path / "home"
    spec = tmp_path / "slow.yaml"
    spec.write_text(SLOW_AGENT)
    wrapper = tmp_path / "interrupt.py"
    wrapper.write_text(INTERRUPT_AT)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(wrapper), moment, "run", str(spec), "--jobs", "2"],
        cwd=REPO_ROOT,
        env={**embedded_env(home), "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert time.monotonic() - started < 60, "the command waited for its agents"
    assert done.returncode == 4 and "interrupted" in done.stderr, done.stderr
    assert _cancelled_with_nothing_left(home / "keystone.sqlite3")


def _forked_processes(database: Path, parent: int) -> list[int]:
    """The pids of the processes other than `parent` that hold a running execution, as their
    claims name them (`cli:PID`). Not read from /proc: an agent being started is a child
    named python too until its exec has loaded the agent's program."""
    with sqlite3.connect(database) as db:
        claims = db.execute(
            "SELECT DISTINCT claimed_by FROM evaluations_execution WHERE status = 'running'"
        ).fetchall()
    return [int(claim.removeprefix("cli:")) for (claim,) in claims if claim != f"cli:{parent}"]


@pytest.mark.embedded
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: keystone run forks no process")
def test_a_killed_execution_process_fails_the_run_at_once_and_says_so(tmp_path: Path) -> None:
    """`keystone run` forks a process per further core. One killed by the kernel must not
    leave the command waiting for executions nobody runs: it cancels the run, ends the dead
    process's execution as an error naming the exit code, and exits 4."""
    import signal

    process, database = _two_agents_running(tmp_path)  # one in each process
    [child] = _forked_processes(database, process.pid)
    its_agents = _agents_started_by(child)
    os.kill(child, signal.SIGKILL)
    # Not the agents' 120 s, nor the next lease round (20 s): the parent's agent stops at once.
    _, err = process.communicate(timeout=15)
    assert process.returncode == 4, err
    assert "ended with exit code -9" in err, err
    assert _cancelled_with_nothing_left(database)
    with sqlite3.connect(database) as db:
        errors = [e for (e,) in db.execute("SELECT error FROM evaluations_execution")]
    assert errors.count("the process running it ended with exit code -9") == 1, errors
    # Its agent, which no one was left to stop, did not run on for its 120 s, and its
    # workspace, which no one was left to remove, is gone too.
    assert not [pid for pid in its_agents if _alive(pid)]
    assert _workspaces_left(database) == []


@pytest.mark.embedded
def test_a_forked_process_whose_command_was_killed_cancels_the_run_and_ends(
    tmp_path: Path,
) -> None:
    """The other way round: `keystone run` itself killed (the OOM killer, kill -9), its
    forked process went on with its agent and took the next executions, with no one to
    report them; the run stayed `running`."""
    process, database = _two_agents_running(tmp_path)  # one in each process
    [child] = _forked_processes(database, process.pid)
    agents = _agents_started_by(process.pid, 2)  # the command's own, its forked process's
    process.kill()
    process.wait()
    deadline = time.monotonic() + 15  # not the agents' 120 s, nor a lease (60 s)
    while _alive(child) or [pid for pid in agents if _alive(pid)]:
        assert time.monotonic() < deadline, "the forked process or an agent outlived the command"
        time.sleep(0.2)
    with sqlite3.connect(database) as db:
        status = db.execute("SELECT status FROM evaluations_run").fetchone()[0]
        running = db.execute(
            "SELECT claimed_by FROM evaluations_execution WHERE status = 'running'"
        ).fetchall()
    assert status == "cancelled"
    # The killed command's own execution is left to its lease; none is the forked process's.
    assert running == [(f"cli:{process.pid}",)], running
    assert _workspaces_left(database) == []  # the command's, removed by its forked process


def _workspaces_left(database: Path) -> list[str]:
    """The workspaces left in the home of the run whose database is `database`."""
    return [p.name for p in (database.parent / "work").glob("ws-*") if p.is_dir()]


def _agents_started_by(pid: int, count: int = 1) -> list[int]:
    """The agents (`sleep` processes) among the descendants of `pid`, once there are
    `count` (an execution is running before its agent has started)."""
    deadline = time.monotonic() + 30
    while True:
        processes = {}  # pid -> (parent pid, name)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError):
                name, _, rest = stat.read_text().rpartition(")")
                processes[int(stat.parent.name)] = (int(rest.split()[1]), name.partition("(")[2])
        found = []
        for candidate, (_, name) in processes.items():
            ancestor = candidate
            while ancestor in processes and ancestor != pid:
                ancestor = processes[ancestor][0]
            if ancestor == pid and name == "sleep":
                found.append(candidate)
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{pid} started {len(found)} agents, not {count}"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting for whoever inherited it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


class _DyingChild:
    """A forked process seen dying between two looks: running at the first read of its exit
    code, dead (SIGKILL) from the second on; its sentinel already says it ended."""

    def __init__(self) -> None:
        self.sentinel, writer = os.pipe()
        os.close(writer)  # the process's end closed: readable at once, as after its exit
        self.reads = itertools.count()

    @property
    def exitcode(self) -> int | None:
        return None if next(self.reads) == 0 else -9


@pytest.mark.embedded
def test_a_process_that_dies_while_outcomes_are_awaited_is_reported() -> None:
    import multiprocessing

    from evaluations.cli_commands import _Outcomes

    outcomes = _Outcomes(multiprocessing.get_context("fork"))
    child = _DyingChild()
    raised: list[BaseException] = []

    def wait_for_outcome() -> None:
        try:
            outcomes.get([child])
        except RuntimeError as exc:
            raised.append(exc)

    waiting = threading.Thread(target=wait_for_outcome, daemon=True)
    waiting.start()
    waiting.join(timeout=10)
    # It did not wait for an outcome nobody will send.
    assert not waiting.is_alive()
    assert [str(exc) for exc in raised] == ["a process running executions ended with exit code -9"]
    os.close(child.sentinel)
