"""as_uid.run_as: a job run in a thread of its own with an execution's uid and nothing else,
while every other thread of the worker keeps root's identity."""

from __future__ import annotations

import gc
import os
import subprocess
import threading
from collections.abc import Iterator

import pytest

from evaluations.runner import local_uids
from evaluations.runner.as_uid import run_as

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs root to become another user")


@pytest.fixture
def uid() -> Iterator[int]:
    """A uid of KEYSTONE_LOCAL_UIDS held for the test, as an execution holds its own: no
    other execution's processes run as it meanwhile."""
    lease = local_uids.acquire()
    yield lease.uid
    lease.release()


IDENTITY = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")


def _identity(status: str) -> dict[str, str]:
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {name: " ".join(fields[name].split()) for name in IDENTITY}


def _thread_identity(native_id: int | None = None) -> dict[str, str]:
    tid = threading.get_native_id() if native_id is None else native_id
    with open(f"/proc/self/task/{tid}/status") as handle:
        return _identity(handle.read())


def _nothing_but(uid: int) -> dict[str, str]:
    return {
        "Uid": f"{uid} {uid} {uid} {uid}",
        "Gid": f"{uid} {uid} {uid} {uid}",
        "Groups": "",
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
    }


def test_the_job_runs_as_the_uid_with_nothing_else_and_no_other_thread_changes(uid: int) -> None:
    caller = threading.get_native_id()
    before = _thread_identity()
    assert before["Uid"] == "0 0 0 0"

    def job() -> tuple[int, dict[str, str], dict[str, str]]:
        # Read from inside: the caller is waiting meanwhile, still root.
        return threading.get_native_id(), _thread_identity(), _thread_identity(caller)

    native_id, inside, caller_meanwhile = run_as(uid, job)
    assert native_id != caller
    assert inside == _nothing_but(uid)
    assert caller_meanwhile == before
    assert _thread_identity() == before
    assert os.getresuid() == (0, 0, 0)


def test_a_process_started_in_the_job_is_the_uid_s_and_can_gain_nothing(uid: int) -> None:
    script = "grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs)' /proc/self/status"
    process = run_as(
        uid, lambda: subprocess.Popen(["/bin/sh", "-c", script], stdout=subprocess.PIPE)
    )
    out, _ = process.communicate(timeout=10)  # reaped from this thread: a child of the worker
    assert process.returncode == 0
    assert _identity(out.decode()) == _nothing_but(uid)


def test_it_returns_once_the_thread_is_gone_and_raises_what_the_job_raised(uid: int) -> None:
    seen: list[int] = []

    def job() -> None:
        seen.append(threading.get_native_id())
        raise LookupError("the job's own error")

    with pytest.raises(LookupError, match="the job's own error"):
        run_as(uid, job)
    assert not os.path.exists(f"/proc/self/task/{seen[0]}")
    assert run_as(uid, lambda: 42) == 42


def test_no_garbage_collection_runs_in_the_uid_s_thread(uid: int) -> None:
    """A collection there would run the finalizers of whatever it found as the uid."""
    assert gc.isenabled()
    assert run_as(uid, gc.isenabled) is False
    assert gc.isenabled()
    gc.disable()  # switched off by someone else: left off
    try:
        run_as(uid, gc.isenabled)
        assert not gc.isenabled()
    finally:
        gc.enable()
