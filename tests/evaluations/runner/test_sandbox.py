"""Sandboxes run real processes: local, bubblewrap and Docker."""

from __future__ import annotations

import errno
import os
import resource
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from evaluations.runner import cgroups
from evaluations.runner.egress import Endpoint
from evaluations.runner.sandbox import (
    LOCAL_FALLBACK_WARNING,
    BwrapSandbox,
    DockerSandbox,
    LocalSandbox,
    Sandbox,
    bwrap_available,
    disk_usage,
    select_backend,
)
from tests.http_peer import HttpPeer, PeerHandler

PROJECT_ROOT = Path(__file__).resolve().parents[3]


def _processes_with(marker: str) -> list[str]:
    """Command lines of live processes (any namespace) that mention `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            found.append(f"{entry}: {cmdline}")
    return found


def _unique_sleep() -> tuple[str, str]:
    """A `sleep` argument no other process uses, to find leftovers by command line."""
    seconds = f"1000.{uuid.uuid4().int % 10**6:06d}"
    return seconds, f"sleep {seconds}"


# --------------------------------------------------------------------------- local and bwrap


def test_command_gets_stdin_and_reports_exit_code_and_both_streams(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    result = process_sandbox.run(
        'read line; echo "got $line"; echo oops >&2; exit 3',
        workspace=workspace,
        env={},
        stdin="hello\n",
        timeout=10,
    )
    assert result.exit_code == 3
    assert result.stdout == "got hello\n"
    assert result.stderr == "oops\n"
    assert not result.timed_out and result.error is None


def test_command_runs_in_the_workspace_and_can_write_there(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    result = process_sandbox.run(
        "pwd; echo made > out.txt", workspace=workspace, env={}, timeout=10
    )
    assert result.stdout.strip() == str(workspace)
    assert (workspace / "out.txt").read_text() == "made\n"


def test_environment_holds_only_what_is_passed(
    process_sandbox: Sandbox, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEYSTONE_TEST_SERVER_SECRET", "s3cr3t-value")
    result = process_sandbox.run("env", workspace=workspace, env={"GIVEN": "yes"}, timeout=10)
    variables = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert variables["GIVEN"] == "yes"
    assert variables["KEYSTONE_WORKSPACE"] == str(workspace)
    assert "s3cr3t-value" not in result.stdout
    assert "KEYSTONE_TEST_SERVER_SECRET" not in variables
    assert set(variables) <= {
        "GIVEN",
        "KEYSTONE_WORKSPACE",
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",  # local only: in the workspace (bwrap has a private /tmp)
        "PWD",
        "SHLVL",
        "_",
    }


_ENVIRONMENTS = "tr '\\0' '\\n' < /proc/$$/environ; echo ---; env"


@pytest.mark.parametrize("given", [{}, {"LC_ALL": "C.UTF-8"}])
def test_local_shell_starts_with_the_commands_own_environment(
    workspace: Path, given: dict[str, str]
) -> None:
    """No launcher between the worker and the command's shell (as_uid.py), so nothing to
    start under an environment of its own: the shell is exec'd with the one the command
    sees, LC_ALL only where the spec set it."""
    result = LocalSandbox().run(_ENVIRONMENTS, workspace=workspace, env=given, timeout=10)
    launched, _, seen = result.stdout.partition("---\n")
    assert result.exit_code == 0, result.stderr
    at_start = dict(line.split("=", 1) for line in launched.splitlines() if "=" in line)
    variables = dict(line.split("=", 1) for line in seen.splitlines() if "=" in line)
    assert at_start.get("LC_ALL") == variables.get("LC_ALL") == given.get("LC_ALL")
    assert at_start["LANG"] == variables["LANG"] == "C.UTF-8"


def test_temporary_files_stay_out_of_the_host_s_tmp(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    """bwrap gives the agent a private /tmp; the local backend its HOME in the workspace:
    either way nothing an agent leaves there outlives its workspace or meets another's."""
    result = process_sandbox.run(
        "mktemp && python3 -c 'import tempfile; print(tempfile.mkstemp()[1])'",
        workspace=workspace,
        env={},
        timeout=10,
    )
    made = [Path(line) for line in result.stdout.split()]
    assert len(made) == 2, result
    for path in made:
        assert path.is_relative_to(workspace) or not path.exists(), path
    if isinstance(process_sandbox, LocalSandbox):
        assert all(path.parent == workspace / ".keystone" / "home" for path in made)
    given = process_sandbox.run(
        "echo $TMPDIR", workspace=workspace, env={"TMPDIR": "/var/tmp"}, timeout=10
    )
    assert given.stdout == "/var/tmp\n"


def test_timeout_kills_the_whole_process_tree(process_sandbox: Sandbox, workspace: Path) -> None:
    seconds, marker = _unique_sleep()
    started = time.monotonic()
    result = process_sandbox.run(
        f"sleep {seconds} & sleep {seconds}; echo never", workspace=workspace, env={}, timeout=1
    )
    assert result.timed_out
    assert time.monotonic() - started < 5
    assert "never" not in result.stdout
    time.sleep(0.2)
    assert _processes_with(marker) == []


def test_background_children_do_not_outlive_a_finished_command(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    seconds, marker = _unique_sleep()
    result = process_sandbox.run(
        f"sleep {seconds} >/dev/null 2>&1 & echo started", workspace=workspace, env={}, timeout=10
    )
    assert result.exit_code == 0 and result.stdout == "started\n"
    assert result.duration_ms < 3000  # the open pipe of the child must not hold the run
    time.sleep(0.2)
    assert _processes_with(marker) == []


def test_flooding_stdout_is_capped_without_holding_the_output_in_memory(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    flood = 200 * 1024 * 1024
    cap = 1024 * 1024
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = process_sandbox.run(
        f"yes | head -c {flood}; yes err | head -c {flood // 4} >&2",
        workspace=workspace,
        env={},
        timeout=60,
        max_output_bytes=cap,
    )
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout_truncated and result.stderr_truncated
    assert result.stdout.startswith("y\ny\n")
    assert result.stdout.endswith(f"\n[... truncated {flood - cap} bytes by Keystone]")
    assert len(result.stdout) < cap + 100
    assert result.stderr.endswith(f"\n[... truncated {flood // 4 - cap} bytes by Keystone]")
    assert (peak_after - peak_before) * 1024 < 64 * 1024 * 1024  # ru_maxrss is in KiB


def test_large_input_is_delivered_and_unread_input_does_not_block(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    big = "x" * (3 * 1024 * 1024)
    counted = process_sandbox.run("wc -c", workspace=workspace, env={}, stdin=big, timeout=20)
    assert counted.stdout.strip() == str(len(big))
    ignored = process_sandbox.run(
        "echo ignoring", workspace=workspace, env={}, stdin=big, timeout=20
    )
    assert ignored.exit_code == 0 and ignored.stdout == "ignoring\n" and not ignored.timed_out


def test_file_size_limit_stops_a_runaway_write(process_sandbox: Sandbox, workspace: Path) -> None:
    result = process_sandbox.run(
        "head -c 5000000 /dev/zero > big.bin",
        workspace=workspace,
        env={},
        timeout=10,
        max_file_bytes=1_000_000,
    )
    assert result.exit_code != 0
    assert (workspace / "big.bin").stat().st_size <= 1_000_000


def test_memory_limit_stops_a_hungry_process(process_sandbox: Sandbox, workspace: Path) -> None:
    result = process_sandbox.run(
        "python -c 'block = bytearray(600 * 1024 * 1024); print(len(block))'",
        workspace=workspace,
        env={},
        timeout=20,
        memory_mb=300,
    )
    assert result.exit_code != 0
    assert "MemoryError" in result.stderr


def test_cpu_time_of_the_command_is_measured(process_sandbox: Sandbox, workspace: Path) -> None:
    busy = process_sandbox.run(
        "python -c 'import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass'",
        workspace=workspace,
        env={},
        timeout=20,
    )
    assert busy.exit_code == 0
    assert busy.cpu_ms is not None and busy.cpu_ms >= 250
    idle = process_sandbox.run("sleep 0.3", workspace=workspace, env={}, timeout=20)
    assert idle.cpu_ms is not None and idle.cpu_ms < 100
    assert idle.duration_ms >= 300


def test_stop_all_kills_running_commands(process_sandbox: Sandbox, workspace: Path) -> None:
    seconds, marker = _unique_sleep()
    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            process_sandbox.run(f"sleep {seconds}", workspace=workspace, env={}, timeout=60)
        )
    )
    worker.start()
    deadline = time.monotonic() + 5
    while not _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    process_sandbox.stop_all()
    worker.join(timeout=5)
    assert not worker.is_alive()
    assert results[0].exit_code != 0 and not results[0].timed_out
    assert _processes_with(marker) == []


def test_a_command_started_after_stop_all_is_killed_at_once(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    """A run cancelled while its execution was about to start the agent: stop_all came
    first, and the agent must not run on until its timeout."""
    seconds, marker = _unique_sleep()
    process_sandbox.stop_all()
    started = time.monotonic()
    result = process_sandbox.run(f"sleep {seconds}", workspace=workspace, env={}, timeout=30)
    assert time.monotonic() - started < 10
    assert result.exit_code != 0 and not result.timed_out
    assert _processes_with(marker) == []


def test_command_runner_runs_checks_in_the_same_sandbox(
    process_sandbox: Sandbox, workspace: Path
) -> None:
    (workspace / "data.txt").write_text("42\n")
    run = process_sandbox.command_runner(workspace, {"EXPECTED": "42"})
    passed = run('test "$(cat data.txt)" = "$EXPECTED"', timeout=10)
    failed = run("cat missing.txt", timeout=10)
    slow = run("sleep 5", timeout=0.5)
    assert passed.exit_code == 0
    assert failed.exit_code != 0 and "missing.txt" in failed.stderr
    assert slow.timed_out


def test_unknown_network_mode_is_refused(process_sandbox: Sandbox, workspace: Path) -> None:
    with pytest.raises(ValueError, match="unknown network mode"):
        process_sandbox.run("true", workspace=workspace, env={}, timeout=5, network="internet")


# --------------------------------------------------------------------------- bwrap isolation


@pytest.fixture
def neighbour(tmp_path: Path, workspace: Path) -> Path:
    """Another execution's workspace next to ours, with a file the agent must not read."""
    other = workspace.parent / "ws-other"
    other.mkdir()
    (other / "secret.txt").write_text("neighbour-secret-contents\n")
    return other


_SNOOP = (
    "cat {other}/secret.txt; ls {root}; cat {settings}; cat {pyproject}; env; "
    "echo SERVER_SECRET=$KEYSTONE_TEST_SERVER_SECRET"
)


def _snoop(sandbox: Sandbox, workspace: Path, other: Path) -> str:
    command = _SNOOP.format(
        other=other,
        root=workspace.parent,
        settings=PROJECT_ROOT / "keystone_web" / "settings.py",
        pyproject=PROJECT_ROOT / "pyproject.toml",
    )
    result = sandbox.run(command, workspace=workspace, env={}, timeout=10)
    return result.stdout


def test_local_sandbox_does_not_hide_the_host_which_is_why_bwrap_exists(
    workspace: Path, neighbour: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same snooping agent reads everything without bwrap: proof the bwrap test can fail.
    monkeypatch.setenv("KEYSTONE_TEST_SERVER_SECRET", "s3cr3t-value")
    seen = _snoop(LocalSandbox(), workspace, neighbour)
    assert "neighbour-secret-contents" in seen
    assert "ws-other" in seen
    assert "[project]" in seen


def test_bwrap_agent_sees_no_other_workspace_no_server_files_and_no_server_environment(
    bwrap_sandbox: BwrapSandbox, workspace: Path, neighbour: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEYSTONE_TEST_SERVER_SECRET", "s3cr3t-value")
    assert (PROJECT_ROOT / "pyproject.toml").exists()
    seen = _snoop(bwrap_sandbox, workspace, neighbour)
    assert "neighbour-secret-contents" not in seen
    assert "ws-other" not in seen
    assert "[project]" not in seen and "INSTALLED_APPS" not in seen
    assert "s3cr3t-value" not in seen


def test_bwrap_system_is_read_only_and_tmp_is_private(
    bwrap_sandbox: BwrapSandbox, workspace: Path
) -> None:
    marker = f"keystone-private-{uuid.uuid4().hex}"
    result = bwrap_sandbox.run(
        f"touch /usr/{marker} || echo usr-readonly; echo x > /tmp/{marker} && echo tmp-writable",
        workspace=workspace,
        env={},
        timeout=10,
    )
    assert "usr-readonly" in result.stdout and "tmp-writable" in result.stdout
    assert not Path(f"/usr/{marker}").exists()
    assert not Path(f"/tmp/{marker}").exists()


def test_bwrap_has_its_own_pid_namespace(bwrap_sandbox: BwrapSandbox, workspace: Path) -> None:
    result = bwrap_sandbox.run("ls /proc", workspace=workspace, env={}, timeout=10)
    pids = [entry for entry in result.stdout.split() if entry.isdigit()]
    assert 0 < len(pids) <= 4  # sh and ls, nothing of the host
    assert len([e for e in os.listdir("/proc") if e.isdigit()]) > len(pids)


def test_bwrap_runs_python_agents(bwrap_sandbox: BwrapSandbox, workspace: Path) -> None:
    result = bwrap_sandbox.run(
        "python -c 'import json, ssl, sqlite3; print(json.dumps({\"ok\": True}))'",
        workspace=workspace,
        env={},
        timeout=20,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == '{"ok": true}'


@pytest.fixture
def loopback_server() -> tuple[int, threading.Event]:
    return _listening_server()


def _listening_server() -> tuple[int, threading.Event]:
    """A TCP listener on 127.0.0.1 that notes whether anybody connected."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    connected = threading.Event()

    def accept() -> None:
        server.settimeout(10)
        try:
            connection, _ = server.accept()
            connected.set()
            connection.close()
        except OSError:
            pass
        server.close()

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1], connected


_CONNECT = 'python -c \'import socket; socket.create_connection(("127.0.0.1", {port}), timeout=3); print("connected")\''


def test_bwrap_network_none_cuts_the_agent_off_from_the_host(
    bwrap_sandbox: BwrapSandbox, workspace: Path, loopback_server: tuple[int, threading.Event]
) -> None:
    port, connected = loopback_server
    result = bwrap_sandbox.run(
        _CONNECT.format(port=port), workspace=workspace, env={}, timeout=10, network="none"
    )
    assert result.exit_code != 0 and "connected" not in result.stdout
    assert not connected.wait(0.5)


def test_bwrap_network_services_reaches_the_declared_endpoints_only(
    bwrap_sandbox: BwrapSandbox, workspace: Path, loopback_server: tuple[int, threading.Event]
) -> None:
    port, connected = loopback_server
    declared = [Endpoint("127.0.0.1", port)]
    result = bwrap_sandbox.run(
        _CONNECT.format(port=port),
        workspace=workspace,
        env={},
        timeout=10,
        network="services",
        egress=declared,
    )
    assert result.exit_code == 0, result.stderr
    assert connected.wait(5)

    # Another port the host listens on, not declared: a trap answers in the sandbox (it
    # closes without a byte, and the attempt is recorded); the host's server never sees it.
    other_port, other_connected = _listening_server()
    talk = (
        'python -c \'import socket; s = socket.create_connection(("127.0.0.1", {port}), 3); '
        'print("answer", s.recv(10))\''
    )
    result = bwrap_sandbox.run(
        talk.format(port=other_port),
        workspace=workspace,
        env={},
        timeout=10,
        network="services",
        egress=declared,
    )
    assert result.stdout.strip() == "answer b''", result.stderr
    assert [a["port"] for a in result.refused_connections] == [other_port]
    assert not other_connected.wait(0.5)
    # A port nothing on the host listens on, nor trapped: refused, as a closed port is.
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    free_port = free.getsockname()[1]
    free.close()
    result = bwrap_sandbox.run(
        _CONNECT.format(port=free_port),
        workspace=workspace,
        env={},
        timeout=10,
        network="services",
        egress=declared,
    )
    assert result.exit_code != 0 and "Connection refused" in result.stderr


def test_bwrap_read_only_binds_are_readable_but_not_writable(
    bwrap_sandbox: BwrapSandbox, workspace: Path, tmp_path: Path
) -> None:
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "agent.sh").write_text("echo from-spec-dir\n")
    result = bwrap_sandbox.run(
        f"sh {spec_dir}/agent.sh; echo no > {spec_dir}/new.txt || echo spec-readonly",
        workspace=workspace,
        env={},
        timeout=10,
        ro_binds=[spec_dir],
    )
    assert "from-spec-dir" in result.stdout and "spec-readonly" in result.stdout
    assert not (spec_dir / "new.txt").exists()


def test_read_only_binds_that_hold_the_workspace_are_dropped(
    bwrap_sandbox: BwrapSandbox, workspace: Path, neighbour: Path
) -> None:
    # A spec directory that contains the workspaces root must not reveal the neighbours.
    result = bwrap_sandbox.run(
        f"cat {neighbour}/secret.txt",
        workspace=workspace,
        env={},
        timeout=10,
        ro_binds=[workspace.parent],
    )
    assert result.exit_code != 0
    assert "neighbour-secret-contents" not in result.stdout


# --------------------------------------------------------------------------- backend selection


def test_select_backend_defaults_to_bwrap_where_it_works_else_local_with_a_warning() -> None:
    sandbox, warning = select_backend(None)
    if bwrap_available():
        assert isinstance(sandbox, BwrapSandbox) and warning is None
    else:
        assert isinstance(sandbox, LocalSandbox) and warning == LOCAL_FALLBACK_WARNING


def test_select_backend_honours_an_explicit_local_choice_without_warning() -> None:
    sandbox, warning = select_backend("local")
    assert isinstance(sandbox, LocalSandbox) and warning is None


def test_select_backend_refuses_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        select_backend("chroot")


# --------------------------------------------------------------------------- docker


def _keystone_containers(**filters: str) -> list[str]:
    import docker

    client = docker.from_env()
    return [
        c.id
        for c in client.containers.list(all=True, filters={"label": "keystone.sandbox", **filters})
    ]


def test_docker_runs_the_command_in_the_mounted_workspace(
    docker_sandbox: DockerSandbox, workspace: Path
) -> None:
    result = docker_sandbox.run(
        'read line; echo "got $line $GIVEN"; pwd; echo oops >&2; echo made > out.txt; exit 4',
        workspace=workspace,
        env={"GIVEN": "yes"},
        stdin="hello\n",
        timeout=30,
        network="none",
    )
    assert result.error is None, result.error
    assert result.exit_code == 4
    assert result.stdout == "got hello yes\n/workspace\n"
    assert result.stderr == "oops\n"
    assert (workspace / "out.txt").read_text() == "made\n"
    assert _keystone_containers() == []


def test_docker_environment_holds_only_what_is_passed(
    docker_sandbox: DockerSandbox, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEYSTONE_TEST_SERVER_SECRET", "s3cr3t-value")
    result = docker_sandbox.run(
        "env", workspace=workspace, env={"GIVEN": "yes"}, timeout=30, network="none"
    )
    assert "GIVEN=yes" in result.stdout and "KEYSTONE_WORKSPACE=/workspace" in result.stdout
    assert "s3cr3t-value" not in result.stdout


def test_docker_timeout_kills_and_removes_the_container(
    docker_sandbox: DockerSandbox, workspace: Path
) -> None:
    started = time.monotonic()
    result = docker_sandbox.run(
        "sleep 1000 & sleep 1000", workspace=workspace, env={}, timeout=1.5, network="none"
    )
    assert result.timed_out
    assert time.monotonic() - started < 15
    assert _keystone_containers() == []


def test_docker_output_is_capped(docker_sandbox: DockerSandbox, workspace: Path) -> None:
    result = docker_sandbox.run(
        "yes | head -c 5000000",
        workspace=workspace,
        env={},
        timeout=60,
        max_output_bytes=100_000,
        network="none",
    )
    assert result.exit_code == 0
    assert result.stdout_truncated
    assert result.stdout.endswith("\n[... truncated 4900000 bytes by Keystone]")


def test_docker_applies_cpu_and_memory_limits(
    docker_sandbox: DockerSandbox, workspace: Path
) -> None:
    result = docker_sandbox.run(
        "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max 2>/dev/null || "
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        workspace=workspace,
        env={},
        timeout=30,
        cpus=0.5,
        memory_mb=128,
        network="none",
    )
    lines = result.stdout.split()
    assert str(128 * 1024 * 1024) in lines
    assert "50000" in lines


def test_docker_kills_a_container_that_fills_its_workspace(
    docker_sandbox: DockerSandbox, workspace: Path
) -> None:
    """Issue 13 (disk): the workspace is a bind mount, which `--storage-opt` does not limit;
    the same watch as under bubblewrap kills the container once it holds more than disk_mb."""
    fill = "i=0; while true; do head -c 1048576 /dev/zero > fill-$i || exit 9; i=$((i+1)); done"
    result = docker_sandbox.run(
        fill, workspace=workspace, env={}, timeout=60, disk_mb=20, network="none"
    )
    assert result.limit_exceeded is not None, result.stdout + result.stderr
    assert result.limit_exceeded.startswith("disk limit 20 MB exceeded")
    assert disk_usage(workspace) < 170 * 1024 * 1024


def test_docker_network_none_leaves_only_loopback(
    docker_sandbox: DockerSandbox, workspace: Path
) -> None:
    isolated = docker_sandbox.run(
        "cat /proc/net/dev", workspace=workspace, env={}, timeout=30, network="none"
    )
    shared = docker_sandbox.run(
        "cat /proc/net/dev", workspace=workspace, env={}, timeout=30, network="host"
    )
    isolated_interfaces = {
        line.split(":")[0].strip() for line in isolated.stdout.splitlines() if ":" in line
    }
    shared_interfaces = {
        line.split(":")[0].strip() for line in shared.stdout.splitlines() if ":" in line
    }
    assert isolated_interfaces == {"lo"}
    assert shared_interfaces > {"lo"}


def test_docker_network_services_reaches_the_declared_endpoints_only(
    docker_sandbox: DockerSandbox, workspace: Path
) -> None:
    with HttpPeer(_Hello) as declared, HttpPeer(_Hello) as undeclared:
        result = docker_sandbox.run(
            f"wget -q -O - {declared.url}/ && echo; "
            f"wget -q -O - {undeclared.url}/ || echo undeclared-refused",
            workspace=workspace,
            env={},
            timeout=30,
            network="services",
            egress=[Endpoint("127.0.0.1", declared.port)],
        )
    assert result.error is None, result.error
    assert "hello from the host" in result.stdout, result.stdout + result.stderr
    assert "undeclared-refused" in result.stdout
    assert result.stdout.count("hello from the host") == 1


class _Hello(PeerHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        body = b"hello from the host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_command_exit_gives_no_verdict_when_the_sandbox_cannot_start_the_command(
    docker_image: str, workspace: Path
) -> None:
    """The engine cannot start the command (here: an image it does not have). Read as an
    exit code, the failure was a mismatch, which `negate: true` turned into a pass."""
    from checks.artifact import RunArtifact
    from checks.context import CheckContext
    from checks.engine import evaluate_invariant
    from checks.results import FailureCode
    from checks.spec.model import Invariant

    runner = DockerSandbox("keystone-no-such-image:missing").command_runner(workspace, {})
    invariant = Invariant(
        id="no_secret_in_log",
        description="the log does not contain the secret",
        check={"type": "command_exit", "command": "grep -q hunter2 app.log"},
        negate=True,
    )
    result = evaluate_invariant(
        invariant, RunArtifact(), CheckContext(workspace=workspace, run_command=runner)
    )
    assert not result.passed and result.failure_code is FailureCode.CHECK_ERROR, result
    assert "keystone-no-such-image" in result.message


def test_docker_kills_a_container_started_after_stop_all_at_once(
    docker_sandbox: DockerSandbox, workspace: Path
) -> None:
    docker_sandbox.stop_all()
    started = time.monotonic()
    result = docker_sandbox.run(
        "sleep 1000", workspace=workspace, env={}, timeout=60, network="none"
    )
    assert time.monotonic() - started < 30
    assert result.exit_code != 0 and not result.timed_out, result
    assert _keystone_containers() == []


def test_docker_stop_all_kills_running_containers(
    docker_sandbox: DockerSandbox, workspace: Path
) -> None:
    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            docker_sandbox.run(
                "sleep 1000", workspace=workspace, env={}, timeout=60, network="none"
            )
        )
    )
    worker.start()
    deadline = time.monotonic() + 20
    while not _keystone_containers(status="running") and time.monotonic() < deadline:
        time.sleep(0.05)
    docker_sandbox.stop_all()
    worker.join(timeout=20)
    assert not worker.is_alive()
    assert results[0].exit_code != 0 and not results[0].timed_out
    assert _keystone_containers() == []


def test_a_command_its_cgroups_cannot_admit_never_runs(
    process_sandbox: Sandbox, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker could not put the command's shell in its cgroups (a group removed under
    it): the shell, waiting at its gate, is killed before it runs anything, and the result
    says why."""
    if not cgroups.support()[0]:
        pytest.skip(f"no cgroups to admit to here: {cgroups.support()[1]}")

    def refuse(self: cgroups.CommandCgroup, pid: int) -> None:
        raise OSError(errno.ENOENT, "No such file or directory", "cgroup.procs")

    monkeypatch.setattr(cgroups.CommandCgroup, "admit", refuse)
    result = process_sandbox.run("touch ran", workspace=workspace, env={}, timeout=10)
    assert result.error is not None and "could not limit the command" in result.error
    assert not (workspace / "ran").exists()


def test_handing_the_workspace_over_changes_each_entry_once_and_follows_no_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every entry of the workspace becomes the execution's uid's, each with one lchown (a
    directory used to be changed twice: as its parent's entry and again when walked), links
    as links."""
    from evaluations.runner import sandbox as sandbox_module

    workspace = tmp_path / "ws"
    (workspace / ".keystone" / "home").mkdir(parents=True)
    (workspace / ".keystone" / "prompt.txt").write_text("p")
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("x")
    (workspace / "out").symlink_to(tmp_path)  # a link out: changed itself, never entered
    changed: list[str] = []
    monkeypatch.setattr(os, "lchown", lambda path, uid, gid: changed.append(str(path)))
    sandbox_module._hand_to(workspace, 1900004321)
    relative = sorted(os.path.relpath(path, workspace) for path in changed)
    assert relative == [
        ".",
        ".keystone",
        ".keystone/home",
        ".keystone/prompt.txt",
        "out",
        "src",
        "src/app.py",
    ]
    assert (workspace.stat().st_mode & 0o777) == 0o700
