"""Workspaces: created fresh from the spec, snapshotted and diffed, removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checks.artifact import RunArtifact
from checks.forbidden import evaluate_forbidden
from evaluations.runner.workspace import (
    WorkspaceError,
    create_workspace,
    diff,
    remove_workspace,
    snapshot,
)


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
    assert list((tmp_path / "root").iterdir()) == []  # the half-made workspace is removed


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
    assert list((tmp_path / "root").iterdir()) == []


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
    assert list((tmp_path / "root").iterdir()) == []


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
