"""Per-execution workspaces: create from the spec, snapshot, diff, remove."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

from checks import safe_files
from checks.artifact import FileChange
from evaluations.runner import owners

logger = logging.getLogger(__name__)

# Keystone's own files inside a workspace (agent output, audit, trace); never part of the diff.
KEYSTONE_DIR = ".keystone"
# What every command leaves in it when the agent added nothing: the agent's HOME, a
# directory (sandbox.HOME_DIR), and the prompt Keystone wrote for it (agents.py).
AGENT_HOME = "home"
PROMPT_FILE = "prompt.txt"

# (size, mtime_ns, sha256 hex) per workspace-relative path with forward slashes.
FileState = tuple[int, int, str]
Snapshot = dict[str, FileState]


class WorkspaceError(Exception):
    """The spec's workspace description cannot be materialised (bad path, escape attempt)."""


def create_workspace(
    root: Path,
    *,
    spec_dir: Path,
    source_dir: str | None = None,
    files: dict[str, str] | None = None,
    allow_outside_spec_dir: bool = True,
    keep: bool = False,
) -> Path:
    """A fresh, unique directory under `root` holding the spec's `sandbox.workspace` copy
    and `sandbox.files`, plus an empty `.keystone/` for Keystone's own files. It is named
    after this process (`ws-OWNER-...`), so that another process removes it should this one
    die before it could; one to `keep` is named `kept-...` and never removed."""
    root.mkdir(parents=True, exist_ok=True)
    if _looks.due(root):
        remove_orphaned_workspaces(root)
    prefix = "kept-" if keep else _workspace_prefix(_OWNER.token(root))
    workspace = Path(tempfile.mkdtemp(prefix=prefix, dir=root)).resolve()
    try:
        if source_dir:
            # A spec file on the server may name a sibling directory (`../agents`): the
            # operator laid those files out. A spec typed in the browser may not.
            source = _inside(
                spec_dir.resolve(),
                source_dir,
                what="sandbox.workspace",
                allow_outside=allow_outside_spec_dir,
            )
            if not source.is_dir():
                raise WorkspaceError(
                    f"sandbox.workspace {source_dir!r} is not a directory ({source})"
                )
            # symlinks=True: copy links as links, never follow them out of the fixture.
            shutil.copytree(source, workspace, symlinks=True, dirs_exist_ok=True)
        for relative, content in (files or {}).items():
            target = _inside(workspace, relative, what="sandbox.files")
            # Not through a link the fixture copy may hold: links are copied as links.
            safe_files.write_text(
                workspace, target.relative_to(workspace.resolve()).as_posix(), content
            )
        # Keystone's own directory: whatever the fixture put there (a link out of the
        # workspace, a file) is removed, never followed.
        own = workspace / KEYSTONE_DIR
        if own.is_symlink() or (own.exists() and not own.is_dir()):
            own.unlink()
        own.mkdir(exist_ok=True)
    except BaseException:
        remove_workspace(workspace)
        raise
    return workspace


class _Owner:
    """This process's name in each workspace root, `ws-TOKEN.lock`: a file it holds an
    exclusive `flock` on for as long as it lives, and which names its workspaces
    (`ws-TOKEN-...`). The kernel lets the lock go when the process dies, however it dies, so
    a lock that can be taken is that of a process that died: unlike a pid, this holds across
    PID namespaces and restarted containers sharing one root (docker-compose's workers share
    KEYSTONE_HOME), and no later process can take a dead one's name."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._held: dict[Path, tuple[str, int]] = {}  # root -> (token, the lock's descriptor)
        # A forked child holds its parent's lock through the descriptor it inherits: it
        # takes a name of its own, or its parent's death would go unseen while it lives.
        os.register_at_fork(after_in_child=self._forget)

    def token(self, root: Path) -> str:
        with self._guard:
            if root not in self._held:
                self._held[root] = _hold_new_name(root)
                atexit.register(self._let_go, root)
            return self._held[root][0]

    def _let_go(self, root: Path) -> None:
        """At exit: the name's file goes, unless a workspace of this process is left (a
        thread's execution cut short), for another process's look to remove with it."""
        with self._guard:
            held = self._held.pop(root, None)
        if held is None:  # a forked child's copy of its parent's handler
            return
        token, fd = held
        with contextlib.suppress(OSError):
            if not any(name.startswith(_workspace_prefix(token)) for name in os.listdir(root)):
                os.unlink(root / _lock_file(token))
        os.close(fd)

    def _forget(self) -> None:
        for _token, fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held = {}
        self._guard = threading.Lock()


# A process's name TOKEN in a root: its lock file `ws-TOKEN.lock`, its workspaces `ws-TOKEN-*`.
_NAME_PREFIX = "ws-"
_LOCK_SUFFIX = ".lock"


def _lock_file(token: str) -> str:
    return f"{_NAME_PREFIX}{token}{_LOCK_SUFFIX}"


def _workspace_prefix(token: str) -> str:
    return f"{_NAME_PREFIX}{token}-"


def _hold_new_name(root: Path) -> tuple[str, int]:
    while True:
        token = secrets.token_hex(6)
        path = root / _lock_file(token)
        try:
            fd = os.open(
                path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        except FileExistsError:  # another process's name (one chance in 2^48)
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Another process may have taken the new file for a dead one's, between its making
        # and its locking, and removed it: then this lock guards nothing; another name.
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.lstat(path), os.fstat(fd)):
                return token, fd
        os.close(fd)


_OWNER = _Owner()
# When this process last looked for the workspaces of processes that died, per root.
_looks = owners.Looks()


def remove_orphaned_workspaces(root: Path) -> None:
    """Remove the workspaces of every process that died (a SIGKILL, the OOM killer) before it
    could remove them itself: those named after a lock no process holds any more. A lock is
    removed last, once all its workspaces are gone; what could not be removed (an agent that
    still writes in it) is tried again at the next look."""
    try:
        with os.scandir(root) as entries:
            # Not through a link in a workspace's place: only directories are removed.
            directories, locks = [], []
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    directories.append(entry.name)
                elif entry.name.startswith(_NAME_PREFIX) and entry.name.endswith(_LOCK_SUFFIX):
                    locks.append(entry.name)
    except OSError:
        return
    for lock in locks:
        try:
            fd = os.open(root / lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # removed meanwhile by another process's look
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its process lives
            os.close(fd)
            continue
        try:
            prefix = _workspace_prefix(lock.removeprefix(_NAME_PREFIX).removesuffix(_LOCK_SUFFIX))
            left = False
            for name in directories:
                if not name.startswith(prefix):
                    continue
                try:
                    remove_workspace(root / name)
                except FileNotFoundError:
                    pass
                except OSError:
                    logger.warning("could not remove %s", root / name, exc_info=True)
                    left = True
            if not left:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(root / lock)
        finally:
            os.close(fd)


def _inside(base: Path, relative: str, *, what: str, allow_outside: bool = False) -> Path:
    """`base / relative`, refusing paths that leave `base` (sandbox.files must stay inside)."""
    candidate = (base / relative).resolve()
    if not allow_outside and candidate != base and base not in candidate.parents:
        raise WorkspaceError(f"{what} path {relative!r} leaves {base}")
    return candidate


def remove_workspace(path: Path) -> None:
    """Delete a workspace, also when the agent left read-only files or directories behind."""
    if _remove_untouched(path):
        return

    def make_writable_and_retry(function: Any, failed_path: str, _exc: Any) -> None:
        os.chmod(os.path.dirname(failed_path), 0o700)
        if os.path.isdir(failed_path) and not os.path.islink(failed_path):
            os.chmod(failed_path, 0o700)
        function(failed_path)

    shutil.rmtree(path, onerror=make_writable_and_retry)


def _remove_untouched(path: Path) -> bool:
    """Remove a workspace that holds nothing but Keystone's own entries, by name (six system
    calls, where rmtree opens, lists and checks every directory: ~45 for the same three
    entries). False, with whatever is left still there, when anything else is in it (a file
    the agent wrote, a link in an entry's place): rmtree's work."""
    try:
        # Not through a link the agent may have put in `.keystone`'s place; the entries
        # inside are removed relative to this descriptor, and unlinkat follows no link.
        own = os.open(path / KEYSTONE_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return not path.exists()
    except OSError:
        return False
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(PROMPT_FILE, dir_fd=own)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(AGENT_HOME, dir_fd=own)
    except OSError:
        return False
    finally:
        os.close(own)
    try:
        os.rmdir(path / KEYSTONE_DIR)
        os.rmdir(path)
    except OSError:
        return False
    return True


def snapshot(path: Path) -> Snapshot:
    """Size, mtime and SHA-256 of every regular file and symlink, except `.keystone/`."""
    state: Snapshot = {}
    for directory, dirnames, filenames in os.walk(path):
        if directory == str(path) and KEYSTONE_DIR in dirnames:
            dirnames.remove(KEYSTONE_DIR)
        for name in filenames:
            full = os.path.join(directory, name)
            relative = os.path.relpath(full, path).replace(os.sep, "/")
            try:
                info = os.lstat(full)
                if stat.S_ISLNK(info.st_mode):
                    digest = _link_digest(full)
                elif stat.S_ISREG(info.st_mode):
                    digest = _file_digest(path, relative)
                else:
                    continue  # a FIFO, socket or device: not a file the agent wrote
            except OSError:
                continue  # vanished, replaced or unreadable since the walk: not a stable file
            state[relative] = (info.st_size, info.st_mtime_ns, digest)
    return state


def _file_digest(root: Path, relative: str) -> str:
    # Opened without following links: the agent (or what it left running) may swap the file.
    digest = hashlib.sha256()
    with safe_files.open_regular(root, relative) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _link_digest(path: str) -> str:
    return hashlib.sha256(b"symlink:" + os.readlink(path).encode()).hexdigest()


def diff(
    before: Snapshot, after: Snapshot, workspace: Path, *, text_cap: int = 64 * 1024
) -> list[FileChange]:
    """Added, removed and modified files, sorted by path. Text files up to `text_cap`
    bytes carry their new content; binary or larger files carry only their size."""
    changes: list[FileChange] = []
    for relative in sorted(before.keys() | after.keys()):
        old, new = before.get(relative), after.get(relative)
        if new is None:
            assert old is not None
            changes.append(FileChange(path=relative, change="removed", size=old[0]))
        elif old is None:
            changes.append(_with_content(relative, "added", new, workspace, text_cap))
        elif old[2] != new[2]:
            changes.append(_with_content(relative, "modified", new, workspace, text_cap))
    return changes


def _with_content(
    relative: str, change: str, state: FileState, workspace: Path, text_cap: int
) -> FileChange:
    size = state[0]
    content = _read_text(workspace, relative, text_cap) if size <= text_cap else None
    return FileChange(path=relative, change=change, content=content, size=size)


def _read_text(workspace: Path, relative: str, cap: int) -> str | None:
    """The file as UTF-8 text; None when it looks binary (NUL byte or invalid UTF-8), grew
    past the cap, or is a link or not a regular file."""
    try:
        data, size = safe_files.read_bytes(workspace, relative, cap=cap)
    except OSError:
        return None
    if size > cap:
        return None
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
