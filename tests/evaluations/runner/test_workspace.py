"""Workspaces: created fresh from the spec, snapshotted and diffed, removed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checks.artifact import RunArtifact
from checks.forbidden import evaluate_forbidden
from evaluations.runner import workspace as ws
from evaluations.runner.workspace import (
    WorkspaceError,
    create_workspace,
    diff,
    remove_workspace,
    snapshot,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def _workspaces_in(root: Path) -> list[Path]:
    """What `root` holds but the lock file naming this process (`ws-TOKEN.lock`)."""
    return [p for p in root.iterdir() if not p.name.endswith(".lock")]


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    spec = tmp_path / "spec"
    fixture = spec / "fixtures" / "repo"
    (fixture / "src").mkdir(parents=True)
    (fixture / "src" / "app.py").write_text("print('hello')\n")
    (fixture / "README.md").write_text("readme\n")
    return spec


def test_workspace_copies_the_fixture_directory_and_writes_the_inline_files(
    tmp_path: Path, spec_dir: Path
) -> None:
    workspace = create_workspace(
        tmp_path / "root",
        spec_dir=spec_dir,
        source_dir="fixtures/repo",
        files={"notes/todo.txt": "fix it"},
    )
    assert (workspace / "src" / "app.py").read_text() == "print('hello')\n"
    assert (workspace / "README.md").read_text() == "readme\n"
    assert (workspace / "notes" / "todo.txt").read_text() == "fix it"
    assert (workspace / ".keystone").is_dir()
    assert workspace.parent == (tmp_path / "root").resolve()


def test_every_workspace_is_a_fresh_directory(tmp_path: Path, spec_dir: Path) -> None:
    first = create_workspace(tmp_path / "root", spec_dir=spec_dir, source_dir="fixtures/repo")
    (first / "src" / "app.py").write_text("changed by an agent\n")
    second = create_workspace(tmp_path / "root", spec_dir=spec_dir, source_dir="fixtures/repo")
    assert first != second
    assert (second / "src" / "app.py").read_text() == "print('hello')\n"


def test_workspace_without_source_holds_only_keystone_dir(tmp_path: Path, spec_dir: Path) -> None:
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir)
    assert [p.name for p in workspace.iterdir()] == [".keystone"]


def test_inline_files_may_not_leave_the_workspace(tmp_path: Path, spec_dir: Path) -> None:
    with pytest.raises(WorkspaceError, match="leaves"):
        create_workspace(tmp_path / "root", spec_dir=spec_dir, files={"../escaped.txt": "x"})
    assert not (tmp_path / "root" / "escaped.txt").exists()
    assert _workspaces_in(tmp_path / "root") == []  # the half-made workspace is removed


def test_missing_source_directory_is_a_clear_error(tmp_path: Path, spec_dir: Path) -> None:
    with pytest.raises(WorkspaceError, match="not a directory"):
        create_workspace(tmp_path / "root", spec_dir=spec_dir, source_dir="fixtures/nope")


def test_snapshot_records_size_and_hash_and_skips_keystone_files(
    tmp_path: Path, spec_dir: Path
) -> None:
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir, source_dir="fixtures/repo")
    (workspace / ".keystone" / "output").write_text("agent output")
    state = snapshot(workspace)
    assert set(state) == {"README.md", "src/app.py"}
    size, _mtime, digest = state["README.md"]
    assert size == len("readme\n") and len(digest) == 64


def test_diff_lists_added_removed_and_modified_files_with_text_content(
    tmp_path: Path, spec_dir: Path
) -> None:
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir, source_dir="fixtures/repo")
    before = snapshot(workspace)
    (workspace / "src" / "app.py").write_text("print('fixed')\n")
    (workspace / "README.md").unlink()
    (workspace / "new.txt").write_text("brand new\n")
    (workspace / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (workspace / "big.txt").write_text("a" * 70_000)
    (workspace / ".keystone" / "trace.json").write_text("{}")
    changes = {c.path: c for c in diff(before, snapshot(workspace), workspace)}

    assert set(changes) == {"src/app.py", "README.md", "new.txt", "blob.bin", "big.txt"}
    assert (changes["src/app.py"].change, changes["src/app.py"].content) == (
        "modified",
        "print('fixed')\n",
    )
    assert changes["README.md"].change == "removed" and changes["README.md"].content is None
    assert (changes["new.txt"].change, changes["new.txt"].content) == ("added", "brand new\n")
    assert changes["blob.bin"].content is None and changes["blob.bin"].size == 9
    assert changes["big.txt"].content is None and changes["big.txt"].size == 70_000


def test_diff_ignores_files_rewritten_with_the_same_content(tmp_path: Path, spec_dir: Path) -> None:
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir, source_dir="fixtures/repo")
    before = snapshot(workspace)
    (workspace / "README.md").write_text("readme\n")
    os.utime(workspace / "README.md", ns=(1, 1))
    assert diff(before, snapshot(workspace), workspace) == []


def test_diff_respects_the_text_cap(tmp_path: Path, spec_dir: Path) -> None:
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir)
    before = snapshot(workspace)
    (workspace / "small.txt").write_text("0123456789")
    assert diff(before, snapshot(workspace), workspace, text_cap=5)[0].content is None
    assert diff(before, snapshot(workspace), workspace, text_cap=10)[0].content == "0123456789"


def test_remove_workspace_deletes_read_only_leftovers(tmp_path: Path, spec_dir: Path) -> None:
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir, source_dir="fixtures/repo")
    locked = workspace / "locked"
    locked.mkdir()
    (locked / "file.txt").write_text("x")
    locked.chmod(0o500)
    remove_workspace(workspace)
    assert not workspace.exists()
    remove_workspace(workspace)  # removing twice is harmless


def test_remove_workspace_deletes_one_the_agent_left_as_it_was_made(
    tmp_path: Path, spec_dir: Path
) -> None:
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir)
    remove_workspace(workspace)
    assert not workspace.exists()
    assert _workspaces_in(tmp_path / "root") == []


def test_remove_workspace_deletes_what_the_agent_put_in_keystones_directory_or_beside_it(
    tmp_path: Path, spec_dir: Path
) -> None:
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir)
    (workspace / ".keystone" / "artifacts.json").write_text("{}")
    (workspace / "notes").mkdir()
    (workspace / "notes" / "a.txt").write_text("a")
    remove_workspace(workspace)
    assert not workspace.exists()
    other = create_workspace(tmp_path / "root", spec_dir=spec_dir)
    (other / ".keystone").rmdir()  # the agent removed Keystone's directory, left a file
    (other / "left.txt").write_text("x")
    remove_workspace(other)
    assert not other.exists()


def test_remove_workspace_never_follows_a_link_put_in_keystones_place(
    tmp_path: Path, spec_dir: Path
) -> None:
    """The agent owns its workspace: a link where `.keystone` was, to an empty directory or
    to one holding files, is removed as a link; what it points at stays."""
    for contents in ([], ["precious.txt"]):
        outside = tmp_path / f"outside-{len(contents)}"
        outside.mkdir()
        for name in contents:
            (outside / name).write_text("keep me")
        workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir)
        (workspace / ".keystone").rmdir()
        (workspace / ".keystone").symlink_to(outside)
        remove_workspace(workspace)
        assert not workspace.exists()
        assert outside.is_dir()
        assert sorted(p.name for p in outside.iterdir()) == contents


def _as_a_command_leaves_it(workspace: Path) -> Path:
    """Keystone's own entries, as every command leaves them: the prompt and the agent's HOME."""
    own = workspace / ".keystone"
    (own / "prompt.txt").write_text("the prompt")
    (own / "home").mkdir()
    return own


def test_remove_workspace_removes_keystones_own_entries_by_name(
    tmp_path: Path, spec_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a command leaves (the prompt, an empty HOME) is removed without listing a
    directory; rmtree is for what the agent added."""
    import shutil

    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir)
    _as_a_command_leaves_it(workspace)
    with monkeypatch.context() as patched:
        patched.setattr(shutil, "rmtree", lambda *a, **k: pytest.fail("rmtree was needed"))
        remove_workspace(workspace)
    assert not workspace.exists()
    added = create_workspace(tmp_path / "root", spec_dir=spec_dir)
    own = _as_a_command_leaves_it(added)
    (own / "home" / ".bash_history").write_text("ls\n")  # the agent's, in its HOME
    remove_workspace(added)
    assert not added.exists()
    assert _workspaces_in(tmp_path / "root") == []


def test_remove_workspace_never_follows_a_link_in_place_of_keystones_entries(
    tmp_path: Path, spec_dir: Path
) -> None:
    """Links the agent put where the prompt, its HOME or `.keystone` were are removed as
    links: a directory they point at keeps its own `prompt.txt` and `home`."""
    outside = tmp_path / "outside"
    (outside / "home").mkdir(parents=True)
    (outside / "prompt.txt").write_text("keep me")
    for replaced in ("prompt.txt", "home", ".keystone"):
        workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir)
        own = _as_a_command_leaves_it(workspace)
        if replaced == ".keystone":
            (own / "prompt.txt").unlink()
            (own / "home").rmdir()
            own.rmdir()
            own.symlink_to(outside)
        else:
            target = own / replaced
            target.unlink() if replaced == "prompt.txt" else target.rmdir()
            target.symlink_to(outside / replaced)
        remove_workspace(workspace)
        assert not workspace.exists(), replaced
        assert (outside / "prompt.txt").read_text() == "keep me", replaced
        assert (outside / "home").is_dir(), replaced


def test_file_writes_outside_sees_a_deleted_file(tmp_path: Path, spec_dir: Path) -> None:
    """Issue 12, item 6: deleting a file outside the allowed globs is a violation."""
    workspace = create_workspace(tmp_path / "root", spec_dir=spec_dir, source_dir="fixtures/repo")
    before = snapshot(workspace)
    (workspace / "README.md").unlink()
    (workspace / "src" / "fixed.py").write_text("ok\n")
    artifact = RunArtifact(workspace_diff=diff(before, snapshot(workspace), workspace))
    violations = evaluate_forbidden({"file_writes_outside": ["src/*"]}, artifact)
    assert [(v["rule"], v["details"]["path"], v["details"]["change"]) for v in violations] == [
        ("file_writes_outside", "README.md", "removed")
    ]
    assert violations[0]["message"] == "deleted 'README.md' outside ['src/*']"


# Makes a workspace in ROOT (kept, with "keep"), prints its pid and the workspace, then
# waits to be killed; with "fork", a forked child makes one too, and only it prints.
MAKER = """
import os, sys, time
from pathlib import Path
from evaluations.runner.workspace import create_workspace, remove_workspace
root, how = Path(sys.argv[1]), sys.argv[2]
made = create_workspace(root, spec_dir=root, keep=how == "keep")
if how != "fork":
    print(os.getpid(), made, flush=True)
elif os.fork() == 0:
    print(os.getpid(), create_workspace(root, spec_dir=root), flush=True)
if how == "exit":
    remove_workspace(made)
    sys.exit(0)
time.sleep(600)
"""


def _maker(root: Path, how: str) -> tuple[subprocess.Popen[str], int, Path]:
    """A process that made a workspace in `root`: the process, the pid of the one that
    made it (with "fork", the forked child), the workspace."""
    process = subprocess.Popen(
        [sys.executable, "-c", MAKER, str(root), how],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    pid, _, made = process.stdout.readline().strip().partition(" ")
    return process, int(pid), Path(made)


def test_the_workspaces_of_a_process_that_was_killed_are_removed_by_the_next_one(
    tmp_path: Path, spec_dir: Path
) -> None:
    """A worker or `keystone run` process killed mid-execution (kill -9, the OOM killer)
    left its workspace under KEYSTONE_WORK_DIR for good, copies of the fixtures and all the
    agent wrote: nothing removed it. Now the next process to make a workspace there does,
    and leaves the workspaces of the living and the kept ones."""
    root = tmp_path / "root"
    killed, _, orphaned = _maker(root, "wait")
    living, _, in_use = _maker(root, "wait")
    kept_by_the_dead, _, kept = _maker(root, "keep")
    (orphaned / "written-by-the-agent.txt").write_text("x")
    os.chmod(orphaned, 0o500)  # what an agent left read-only goes too
    try:
        for process in (killed, kept_by_the_dead):
            process.send_signal(signal.SIGKILL)
            process.wait()
        # A link in a workspace's place (the agent's, run as the worker's user): not followed.
        outside = tmp_path / "outside"
        (outside / ".keystone").mkdir(parents=True)
        (outside / ".keystone" / "prompt.txt").write_text("not Keystone's")
        planted = root / (orphaned.name.rpartition("-")[0] + "-planted")
        planted.symlink_to(outside)
        ws._looks.forget()  # this test process may have looked at another root lately
        mine = create_workspace(root, spec_dir=spec_dir)
        assert not orphaned.exists()
        assert (outside / ".keystone" / "prompt.txt").exists()
        assert in_use.is_dir() and kept.is_dir() and mine.is_dir()
        # The dead process's name is gone with its workspace; the living ones' stay.
        assert len([p for p in root.iterdir() if p.name.endswith(".lock")]) == 2
    finally:
        living.kill()
        living.wait()


def test_a_forked_process_has_a_name_of_its_own(tmp_path: Path) -> None:
    """A forked process (`keystone run`'s, a Celery pool's) holds its parent's lock through
    the descriptor it inherits: with the parent's name, its workspaces would outlive it for
    as long as the parent lives."""
    root = tmp_path / "root"
    parent, child, made_by_the_child = _maker(root, "fork")
    try:
        own = set(_workspaces_in(root)) - {made_by_the_child}
        os.kill(child, signal.SIGKILL)
        while not _ended(child):  # a signal is delivered after kill() returns
            time.sleep(0.01)
        ws.remove_orphaned_workspaces(root)
        assert not made_by_the_child.exists()
        assert set(_workspaces_in(root)) == own  # the parent's stays
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_process_that_ends_leaves_nothing_in_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    process, _, made = _maker(root, "exit")
    assert process.wait(timeout=30) == 0
    assert not made.exists()
    assert list(root.iterdir()) == []
