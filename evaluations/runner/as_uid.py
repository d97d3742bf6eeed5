"""Starting an execution's command as its uid from the worker (root), without a program in
between and without forking the worker.

`setpriv` did it before: one more program to load per command, 1.3 ms of CPU of the ~7 a
no-op execution costs (issue 18). Popen's own `user=` and a preexec function both make
Python fork the whole worker instead of vforking it: slower still. What makes the
difference: Linux keeps a process's user and group ids, capabilities and no_new_privs per
thread. glibc's setuid() and its kind change every thread of the
process together (they signal each one to make the same call); the system calls themselves
change only the thread that makes them.

So `run_as` starts a thread for the purpose, which gives everything up for good, the way
setpriv did (every capability out of its bounding set, no_new_privs, no supplementary
group, every user and group id the execution's, no capability left), then calls `job` and
ends. What `job` starts there (Popen vforks, and the child execs the command) inherits
exactly that identity; the worker's other threads never change.

While that thread lives, a process of the uid may signal it (the kernel checks a signal
against its target thread's ids), and a fatal signal to one thread kills the whole worker.
So no other process of the uid may run meanwhile: the local backend runs an execution's
commands one at a time, and none outlives its command (its cgroup kills what it leaves;
without cgroups, the next command's start does: local_uids.UidLease.uncontained). The
command started in the thread runs nothing of the agent's until its shell reads the gate
line (cgroups.py), which the caller writes after `run_as` has returned, and `run_as`
returns only once the thread is gone from the kernel's tables.

Once a thread has changed its ids, the kernel marks the worker's process as not dumpable
(fs.suid_dumpable, 0 by default): no core dump, and no ptrace but root's. It stays so.

Linux on x86-64, arm64 and riscv64 (the system call numbers below).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

# (setgroups, setresgid, setresuid, capset): x86-64's own table, and the generic one of
# arm64 and riscv64.
_CALLS = {
    "x86_64": (116, 119, 117, 126),
    "aarch64": (159, 149, 147, 91),
    "riscv64": (159, 149, 147, 91),
}
_MACHINE = os.uname().machine
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAPABILITY_VERSION_3 = 0x20080522


class AsUidUnavailable(OSError):
    """This machine's architecture is not one whose system call numbers we know."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


# PyDLL: the calls keep the interpreter lock. Each is a short system call; releasing the
# lock around each of the ~50 would hand it to another thread and back every time.
_libc = ctypes.PyDLL(None, use_errno=True)
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _syscall(number: int, *args: object, what: str) -> None:
    _check(_libc.syscall(ctypes.c_long(number), *args), what)


def _prctl(option: int, value: int, what: str) -> None:
    # prctl is a plain system call in glibc: it changes the calling thread only.
    _check(_libc.prctl(option, value, 0, 0, 0), what)


@functools.cache
def _last_capability() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        return int(handle.read())


def _become(uid: int) -> None:
    """Give the calling thread `uid`'s identity (its group too) and nothing else, for good."""
    calls = _CALLS.get(_MACHINE)
    if calls is None:
        raise AsUidUnavailable(
            f"running agents as their own uids is not supported on {_MACHINE} "
            "(use sandbox.backend: bwrap)"
        )
    setgroups, setresgid, setresuid, capset = calls
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, "clearing the ambient capabilities")
    for capability in range(_last_capability() + 1):
        _prctl(_PR_CAPBSET_DROP, capability, f"dropping capability {capability}")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, "setting no_new_privs")
    _syscall(setgroups, ctypes.c_long(0), None, what="clearing the supplementary groups")
    ids = ctypes.c_long(uid)
    _syscall(setresgid, ids, ids, ids, what=f"setting the group ids to {uid}")
    # Every user id non-zero now: the kernel clears the permitted and effective sets.
    _syscall(setresuid, ids, ids, ids, what=f"setting the user ids to {uid}")
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    nothing = (_CapData * 2)()  # and the inheritable set too
    _syscall(capset, ctypes.byref(header), nothing, what="clearing the capabilities")


def run_as(uid: int, job: Callable[[], T]) -> T:
    """`job()` called in a thread of its own that holds only `uid`'s identity; its result,
    or its exception raised here. Returns once that thread no longer exists."""
    outcome: list[T] = []
    failure: list[BaseException] = []
    native_id: list[int] = []

    def thread() -> None:
        native_id.append(threading.get_native_id())
        try:
            _become(uid)
            outcome.append(job())
        except BaseException as exc:  # handed to the caller
            failure.append(exc)

    worker = threading.Thread(target=thread, name=f"as-uid-{uid}", daemon=True)
    with _collector_paused():
        worker.start()
        worker.join()
    _wait_until_gone(native_id[0])
    if failure:
        raise failure[0]
    return outcome[0]


def _wait_until_gone(native_id: int) -> None:
    """join() returns when the thread's Python part is over; the kernel's task ends a moment
    later, and until then the uid could still signal it."""
    while os.path.exists(f"/proc/self/task/{native_id}"):
        time.sleep(0)


_paused = 0
_paused_lock = threading.Lock()
_was_enabled = False


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No garbage collection while a thread of the uid runs Python: a collection would run
    the finalizers of whatever it found, in that thread, as that uid."""
    global _paused, _was_enabled
    with _paused_lock:
        if _paused == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _was_enabled:
                gc.enable()
