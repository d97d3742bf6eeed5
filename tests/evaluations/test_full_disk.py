"""Issue 20, item 5: a full disk while the results are stored ends the execution as `error`
at once (not `running` until its lease expires), leaves no file without its row, and the
run still finishes. The disk is a real 256 KB tmpfs (the test runs as root, as CI does).
And stdout is stored once, not again inside artifact.json."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evaluations.models import Artifact, ArtifactKind, ExecutionStatus, Project, RunStatus
from tests.evaluations.execution_helpers import run_spec

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _spec(stdout_bytes: int) -> str:
    return f"""\
version: 1
id: chatty
task: {{prompt: "p"}}
agent: {{type: command, command: "head -c {stdout_bytes} /dev/zero | tr '\\\\0' x; echo", timeout: 30}}
sandbox: {{backend: local}}
invariants:
  said: {{description: d, check: {{type: output_not_empty}}}}
"""


@pytest.fixture
def small_disk(tmp_path: Path, settings: Any) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("this test mounts a tmpfs: run it as root (CI does)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": settings.STORAGES["default"]["BACKEND"],
            "OPTIONS": {"location": disk},
        },
    }
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_full_disk_ends_the_execution_as_error_and_leaves_no_orphan(
    project: Project, tmp_path: Path, small_disk: Path
) -> None:
    run = run_spec(project, _spec(1_000_000), spec_dir=tmp_path)
    execution = run.executions.get()
    assert execution.status == ExecutionStatus.ERROR
    assert execution.error.startswith("Keystone internal error: the results could not be stored")
    assert "No space left on device" in execution.error
    assert run.status == RunStatus.COMPLETED
    assert Artifact.objects.count() == 0
    assert [p for p in small_disk.rglob("*") if p.is_file()] == []


def test_stdout_is_stored_once(project: Project, tmp_path: Path) -> None:
    run = run_spec(project, _spec(100_000), spec_dir=tmp_path)
    execution = run.executions.get()
    stored = {a.kind: a for a in Artifact.objects.filter(execution=execution)}
    assert stored[ArtifactKind.STDOUT].size == 100_001
    with stored[ArtifactKind.ARTIFACT_JSON].file.open("rb") as handle:
        summary = json.loads(handle.read())
    assert "stdout" not in summary and summary["final_output"].startswith("xxx")
    assert stored[ArtifactKind.ARTIFACT_JSON].size < 110_000  # the output once, not twice more
