"""Issue 13, item 2 (docker): the container keeps no capability, gains none, cannot write
its root filesystem, and never runs as root on the host's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluations.runner.sandbox import DockerSandbox, build_busybox_image, docker_status

IMAGE = "keystone-busybox:test"


@pytest.fixture(scope="module")
def sandbox() -> DockerSandbox:
    ok, reason = docker_status()
    if not ok:
        pytest.skip(f"DOCKER SECURITY TESTS SKIPPED: no Docker engine could be reached: {reason}")
    return DockerSandbox(build_busybox_image(IMAGE))


def _attack(sandbox: DockerSandbox, tmp_path: Path, command: str) -> str:
    workspace = tmp_path / "ws"
    (workspace / ".keystone").mkdir(parents=True)
    result = sandbox.run(command, workspace=workspace, env={}, timeout=60, network="none")
    assert result.error is None, result.error
    return result.stdout + result.stderr


def test_the_container_has_no_capability_and_is_not_root(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    out = _attack(sandbox, tmp_path, "grep -E 'CapEff|NoNewPrivs' /proc/self/status; id -u")
    assert "CapEff:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    assert out.strip().splitlines()[-1] != "0"


def test_the_root_filesystem_is_read_only_and_the_workspace_writable(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    out = _attack(
        sandbox,
        tmp_path,
        "touch /etc/owned && echo ROOT-WRITABLE; echo ok > result.txt && echo workspace-ok;"
        " touch /tmp/t && echo tmp-ok",
    )
    assert "ROOT-WRITABLE" not in out
    assert "workspace-ok" in out and "tmp-ok" in out
    assert (tmp_path / "ws" / "result.txt").read_text() == "ok\n"
