"""Issue 12, item 11: the docker backend runs the spec's `sandbox.image` (every container
used python:3.11-slim, so a host with no registry could not use docker at all). The image
here is built offline with `docker import` from Debian's busybox."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.planning import PlannedExecution
from checks.spec.model import Spec
from evaluations.runner.harness import HarnessConfig, run_execution
from evaluations.runner.sandbox import build_busybox_image, docker_status

IMAGE = "keystone-busybox:test"


def test_the_specs_image_is_the_one_that_runs(tmp_path: Path) -> None:
    ok, reason = docker_status()
    if not ok:
        pytest.skip(f"DOCKER TEST SKIPPED: no Docker engine could be reached: {reason}")
    build_busybox_image(IMAGE)
    spec = Spec.from_dict(
        {
            "version": 1,
            "id": "image",
            "task": {"prompt": "p"},
            # busybox's own `uname`: only in that image, never in python:3.11-slim's PATH.
            "agent": {"type": "command", "command": "busybox | head -1", "timeout": 60},
            "sandbox": {"backend": "docker", "image": IMAGE, "network": "none"},
            "invariants": {"any": {"description": "d", "check": {"type": "completes"}}},
        }
    )
    planned = PlannedExecution(
        scenario="no-chaos", prompt_index=0, prompt="p", replica=0, pillar="contract",
        invariant_ids=["any"],
    )  # fmt: skip
    config = HarnessConfig(workspaces_root=tmp_path / "workspaces", spec_dir=tmp_path)
    outcome = run_execution(spec, planned, config, execution_key="image", seed=0)
    assert outcome.artifact.status == "success", (outcome.artifact.error, outcome.artifact.stderr)
    assert outcome.artifact.final_output.startswith("BusyBox")
