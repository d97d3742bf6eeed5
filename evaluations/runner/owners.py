"""Which process made what outlives a SIGKILL of the process that made it: a command's
cgroup, a Docker container, a throwaway PostgreSQL cluster. Its maker stops it when done;
should the maker be killed first (kill -9, the OOM killer), any other process of Keystone's
on the host can tell, from the pid the thing is marked with, and stop it instead. Nothing
else would: an agent left running keeps running as long as it likes, with no one left to
enforce its timeout.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path


def running(pid: int) -> bool:
    """Whether the process `pid` (of this process's PID namespace) has not ended. A zombie
    has: only its exit status is left, for its parent to read. When that cannot be told, it
    runs: what a living process made is never stopped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError):  # ProcessLookupError: ended as it was read
        return False
    except OSError:
        return True
    fields = stat.rpartition(")")[2].split()
    return not fields or fields[0] not in ("Z", "X")


@functools.cache
def _namespace() -> str | None:
    """This host's boot and this process's PID namespace: where a pid names one process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def this_process() -> str:
    """This process, as it marks what it makes where the processes of other hosts and PID
    namespaces make things too (a Docker engine): BOOT_ID/pid:[INODE]/PID."""
    return f"{_namespace() or 'unknown'}/{os.getpid()}"


def ended(owner: str) -> bool:
    """Whether `owner` (a process's `this_process()`) is a process of this host and PID
    namespace that has ended. One of elsewhere may run, as far as this process can tell."""
    namespace, _, pid = owner.rpartition("/")
    here = _namespace()
    return here is not None and namespace == here and pid.isdigit() and not running(int(pid))
