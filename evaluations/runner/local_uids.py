"""A uid of its own for each execution of the `local` backend, when Keystone runs as root.

Without a mount namespace, the only thing between two executions on one host is the user
their agents run as: two agents of one uid read each other's workspace, write into it, and
read each other's /proc/PID/environ (the execution's secrets). So each execution takes a
uid of a range reserved for this (KEYSTONE_LOCAL_UIDS, FIRST-LAST, default
1900000000-1900065535: above the ranges distributions and systemd hand out to accounts,
services, containers and subordinate ids, below 2^31) for its whole life, and gives it back
when it ends.

A uid is held through a lock file of its own, /run/keystone/local-uids/UID, locked with
flock(LOCK_EX | LOCK_NB) by the process that holds it: unique across every process of the
host (`keystone run`'s forked processes and threads, several Celery workers), and let go by
the kernel when the process dies. The lock file says who holds the uid and which workspaces
were handed to it; a clean release kills whatever still runs as the uid, then removes the file.
A file that is still there and not locked is therefore the leftover of a holder that died:
whoever takes the uid next kills the uid's processes and gives the workspaces it lists back
to root before using it, and every process cleans after all such holders at its first
`acquire` and every 30 seconds (`release_dead_holders`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import stat
import subprocess
import threading
from pathlib import Path

from evaluations.runner import owners

SETTING = "KEYSTONE_LOCAL_UIDS"
DEFAULT_RANGE = "1900000000-1900065535"
LOCK_DIR = Path("/run/keystone/local-uids")
_SETPRIV = "/usr/bin/setpriv"
_MAX_UID = 2**31 - 1  # some tools read a uid as a signed 32-bit number


class LocalUidsUnavailable(Exception):
    """No uid of the range can be held for this execution (all in use, or no lock directory)."""


def parse_range(text: str) -> range:
    """`FIRST-LAST` (inclusive) as a range; ValueError saying what is wrong otherwise."""
    first_text, dash, last_text = text.strip().partition("-")
    try:
        first, last = int(first_text), int(last_text)
    except ValueError:
        raise ValueError(f"{SETTING}={text!r}: expected FIRST-LAST, e.g. {DEFAULT_RANGE}") from None
    if not dash or first > last:
        raise ValueError(f"{SETTING}={text!r}: expected FIRST-LAST with FIRST <= LAST")
    if first < 65536 or last > _MAX_UID:
        raise ValueError(
            f"{SETTING}={text!r}: the range must lie within 65536-{_MAX_UID}, above every "
            "account's and nobody's uid"
        )
    return range(first, last + 1)


def configured_range() -> range:
    return parse_range(os.environ.get(SETTING) or DEFAULT_RANGE)


def _lock_dir(directory: Path) -> Path:
    """The lock directory, made if missing; refused unless root's and closed to others
    (another user able to write there could hold or free uids)."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700, parents=True)
    for path in (directory, directory.parent):
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            raise LocalUidsUnavailable(
                f"{path} must be a directory of root's that no other user can write "
                f"(the locks of {SETTING})"
            )
    return directory


class UidLease:
    """One uid held by this process (its lock file locked), until `release()`."""

    def __init__(self, uid: int, fd: int, path: Path) -> None:
        self.uid = uid
        self._fd: int | None = fd
        self._path = path
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._recorded: set[str] = set()
        self._sweep = False

    def record_workspace(self, workspace: Path) -> None:
        """Note (in the lock file) a workspace handed to the uid: taken back to root by
        whoever holds the uid next, should this process die without releasing it."""
        key = str(workspace)
        with self._lock:
            if key in self._recorded or self._fd is None:
                return
            self._recorded.add(key)
            os.write(self._fd, f"workspace {key}\n".encode())

    def release(self, workspace: Path | None = None) -> None:
        """Give the uid back: first kill whatever still runs as it (unless every process it
        ran was in a group killed since: `uncontained` was never called), and give
        `workspace` (one kept on disk) back to root. Idempotent; in a forked child of the
        holder, only closes the child's copy of the lock."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if os.getpid() == self._pid:
                if self._sweep:
                    kill_all_processes_of(self.uid)
                if workspace is not None:
                    take_back(workspace, from_uid=self.uid)
                # Unlinked while still locked: a process that opened the file meanwhile
                # sees, once it has the lock, that the path no longer names its file.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path)
        finally:
            os.close(fd)

    def uncontained(self) -> None:
        """A command of the uid is about to start outside a group that kills all it leaves
        behind (no cgroup on this host): `release` will kill every process of the uid, and
        whatever an earlier command left is killed now. Such a process could signal the
        worker's thread that starts the new command as the uid (as_uid.py): none outlives
        its command here either, as none does in a group."""
        if self._sweep:
            kill_all_processes_of(self.uid)
        self._sweep = True

    def __del__(self) -> None:  # a lease nobody released: the lock goes, the file stays
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


# When this process last cleaned after the holders that died (release_dead_holders).
_looks = owners.Looks()


def acquire(uids: range | None = None, *, lock_dir: Path = LOCK_DIR) -> UidLease:
    """Hold a uid of `uids` (the configured range by default) that no other process of
    this host holds. Tries them from a random one on, so that a uid given back is seldom
    the next one handed out."""
    uids = configured_range() if uids is None else uids
    directory = _lock_dir(lock_dir)
    if _looks.due(directory):
        release_dead_holders(directory)
    start = random.randrange(len(uids))
    for index in range(len(uids)):
        uid = uids[(start + index) % len(uids)]
        lease = _try(uid, directory / str(uid))
        if lease is not None:
            return lease
    raise LocalUidsUnavailable(
        f"every uid of {SETTING} ({uids[0]}-{uids[-1]}, {len(uids)} uids) is held by an "
        "execution running on this host: widen the range, or run fewer executions at once"
    )


def release_dead_holders(lock_dir: Path = LOCK_DIR) -> None:
    """Clean after every holder that died holding its uid (its lock file left, unlocked):
    kill the uid's processes and take its workspaces back now, rather than whenever the uid
    is next handed out (at random among many: maybe never), then give the uid back. Where no
    cgroup contains the agents, nothing else stops what a killed worker's agents left
    running."""
    try:
        names = os.listdir(lock_dir)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            lease = _try(int(name), lock_dir / name)  # cleans first if its holder died
            if lease is not None:
                lease.release()


def _try(uid: int, path: Path) -> UidLease | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        mine = os.fstat(fd)
        try:
            current = os.lstat(path)
        except FileNotFoundError:
            current = None
        if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)  # its holder released it between our open and our lock
            return None
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    if mine.st_size:  # the last holder died holding it
        _clean_after_dead_holder(uid, fd)
        # Only then: on ext4, a truncate to nothing marks the file to be written to disk
        # when it is closed (auto_da_alloc), so a lock file made empty would have a block
        # allocated and written at each release, just before it is deleted.
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"pid {os.getpid()}\n".encode())
    return UidLease(uid, fd, path)


def _clean_after_dead_holder(uid: int, fd: int) -> None:
    kill_all_processes_of(uid)
    os.lseek(fd, 0, os.SEEK_SET)
    with os.fdopen(os.dup(fd), "rb") as handle:
        lines = handle.read().decode(errors="replace").splitlines()
    for line in lines:
        kind, _, value = line.partition(" ")
        if kind == "workspace" and value.startswith("/"):
            take_back(Path(value), from_uid=uid)


def take_back(workspace: Path, *, from_uid: int) -> None:
    """Give what `from_uid` owns under `workspace` to this process's user, so a later holder
    of the uid cannot enter it. Links are changed, never followed."""
    try:
        info = os.lstat(workspace)
    except OSError:
        return
    if not stat.S_ISDIR(info.st_mode):
        return
    uid, gid = os.getuid(), os.getgid()
    for directory, dirnames, filenames in os.walk(workspace):
        for path in [directory, *(os.path.join(directory, n) for n in dirnames + filenames)]:
            with contextlib.suppress(OSError):
                if os.lstat(path).st_uid == from_uid:
                    os.lchown(path, uid, gid)


def kill_all_processes_of(uid: int) -> None:
    """SIGKILL every process of `uid`: kill(-1) from a process of that uid reaches exactly
    the processes it may signal (its uid's), all at once, so none forks away meanwhile. A
    process of its own, not a thread of the worker's (as_uid.run_as): the processes it
    kills could signal such a thread, and with it the whole worker, until they die."""
    subprocess.run(
        [
            _SETPRIV,
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--",
            "/bin/sh",
            "-c",
            "kill -KILL -1 2>/dev/null; exit 0",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        check=False,
        timeout=30,
    )
