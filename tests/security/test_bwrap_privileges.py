"""Issue 13, item 2: inside bubblewrap the agent keeps no capability, even when the worker
runs as root. Each test is the attack: remount / read-write, open a raw AF_PACKET socket,
read the host's PID 1 environment. Each must fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluations.runner.sandbox import BwrapSandbox, bwrap_status

pytestmark = pytest.mark.skipif(
    not bwrap_status()[0], reason=f"bubblewrap does not work here: {bwrap_status()[1]}"
)


def _script(tmp_path: Path, code: str) -> str:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "attack.py").write_text(code)
    result = BwrapSandbox().run(
        "python3 attack.py",
        workspace=workspace,
        env={},
        stdin="",
        timeout=30,
        max_output_bytes=65536,
        network="services",
    )
    assert result.error is None, result.error
    return result.stdout + result.stderr


def test_no_capability_is_left(tmp_path: Path) -> None:
    out = _script(
        tmp_path,
        "import os\n"
        "status = open('/proc/self/status').read()\n"
        "print('CapEff', status.split('CapEff:')[1].split()[0])\n"
        "print('uid', os.getuid())\n",
    )
    assert "CapEff 0000000000000000" in out
    assert "uid 65534" in out


def test_remounting_root_read_write_fails(tmp_path: Path) -> None:
    out = _script(
        tmp_path,
        "import subprocess\n"
        "done = subprocess.run(['mount', '-o', 'remount,rw', '/'], capture_output=True)\n"
        "print('exit', done.returncode)\n"
        "try:\n"
        "    open('/usr/keystone-was-here', 'w')\n"
        "    print('WROTE /usr')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n",
    )
    assert "exit 0" not in out
    assert "WROTE /usr" not in out and not Path("/usr/keystone-was-here").exists()


def test_raw_packet_socket_fails(tmp_path: Path) -> None:
    out = _script(
        tmp_path,
        "import socket\n"
        "try:\n"
        "    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n"
        "    print('SNIFFING')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n",
    )
    assert "SNIFFING" not in out and "refused 1" in out


def test_the_hosts_processes_are_not_visible(tmp_path: Path) -> None:
    out = _script(
        tmp_path,
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "print('pids', len(pids))\n"
        "try:\n"
        "    print('ENV', open('/proc/1/environ').read()[:40])\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n",
    )
    # Its own PID namespace: the shell (PID 1) and python (no egress relay: this execution
    # has no endpoints), never the host's processes.
    assert "pids 2" in out
    assert "DATABASE_URL" not in out and "SECRET_KEY" not in out
