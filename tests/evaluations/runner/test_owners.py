"""Telling that the process which made a group, a container or a cluster has died
(evaluations/runner/owners.py)."""

from __future__ import annotations

import os
import subprocess

from evaluations.runner import owners


def test_a_running_process_runs_and_an_ended_one_does_not() -> None:
    assert owners.running(os.getpid())
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert owners.running(child.pid)
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
        assert not owners.running(child.pid)  # a zombie: only its exit status is left
    finally:
        child.wait()
    assert not owners.running(child.pid)


def test_an_owner_has_ended_only_when_it_is_of_this_host_and_namespace() -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    here = owners.this_process().rpartition("/")[0]
    assert not owners.ended(owners.this_process())
    assert owners.ended(f"{here}/{ended.pid}")
    # Another host's or PID namespace's pid says nothing of the processes this one sees.
    assert not owners.ended(f"another-boot/pid:[1]/{ended.pid}")
    assert not owners.ended(f"{here.partition('/')[0]}/pid:[1]/{ended.pid}")
    for label in ("", "garbage", f"{here}/", f"{here}/not-a-pid"):
        assert not owners.ended(label), label
