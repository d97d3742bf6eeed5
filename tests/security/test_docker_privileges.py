"""Issue 13, item 2 (docker): the container keeps no capability, gains none, cannot write
its root filesystem, and never runs as root on the host's files."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from evaluations.runner import owners
from evaluations.runner import sandbox as sandbox_module
from evaluations.runner.sandbox import (
    OWNER_LABEL,
    DockerSandbox,
    build_busybox_image,
    docker_status,
)

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


def test_the_containers_of_a_process_that_died_are_removed_by_the_next_command(
    sandbox: DockerSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed (SIGKILL, the OOM killer) while its container ran: the container ran
    on until its command ended, as long as it liked, with no one left to enforce its timeout.
    The next command of a Keystone process removes it; the containers of a living process,
    and of a process of another host or PID namespace (the engine may serve several), are
    left."""
    import docker.errors

    ended = subprocess.Popen(["true"])
    ended.wait()
    here = owners.this_process().rpartition("/")[0]

    def sleeping(owner: str) -> Any:
        return sandbox.client.containers.run(
            IMAGE, ["sleep", "60"], labels={OWNER_LABEL: owner}, detach=True
        )

    orphan = sleeping(f"{here}/{ended.pid}")
    kept = sleeping(owners.this_process())
    elsewhere = sleeping(f"another-boot/pid:[1]/{ended.pid}")
    monkeypatch.setattr(sandbox_module, "_looks", owners.Looks())
    try:
        _attack(sandbox, tmp_path, "true")
        with pytest.raises(docker.errors.NotFound):
            orphan.reload()
        for container in (kept, elsewhere):
            container.reload()
            assert container.status == "running"
    finally:
        for container in (orphan, kept, elsewhere):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def test_keystone_run_removes_a_dead_processs_containers_at_once(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    """A process of `keystone run` that sees another die removes its containers then, not at
    the next look of a process that starts a container (up to 30 s later, or never if none
    does)."""
    import docker.errors

    ended = subprocess.Popen(["true"])
    ended.wait()
    here = owners.this_process().rpartition("/")[0]
    _attack(sandbox, tmp_path, "true")  # this process has looked: the next look is not due
    orphan = sandbox.client.containers.run(
        IMAGE, ["sleep", "60"], labels={OWNER_LABEL: f"{here}/{ended.pid}"}, detach=True
    )
    try:
        sandbox_module.remove_orphaned_containers_now()
        with pytest.raises(docker.errors.NotFound):
            orphan.reload()
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            orphan.remove(force=True)
