"""A throwaway PostgreSQL cluster for the `postgres` services of a Keystone that has no
KEYSTONE_POSTGRES_URL: started once per process with the machine's own `initdb` and
`pg_ctl` (in a temporary directory, on a free port, trust auth on 127.0.0.1 only) the first
time an execution needs it, and stopped and deleted when the process exits. This is what lets
a demo spec with a PostgreSQL database run on a fresh machine with no setting; a deployment
sets KEYSTONE_POSTGRES_URL (or turns this off with KEYSTONE_POSTGRES_LOCAL_CLUSTER=false).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

from evaluations.runner import owners

PREFIX = "keystone-pg-"
OWNER_FILE = "owner.pid"  # the process whose cluster this is
_lock = threading.Lock()
_url: str | None = None


class LocalPostgresError(Exception):
    """The machine has no PostgreSQL binaries, or the cluster could not start."""


def postgres_bin() -> Path | None:
    """The directory of `initdb` and `pg_ctl`: on PATH, else the newest Debian-style
    /usr/lib/postgresql/<version>/bin; None when the machine has neither."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.name.split(".")],
    )
    for directory in reversed(versions):
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def local_postgres_url() -> str:
    """The URL of this process's throwaway cluster, started on first use."""
    global _url
    with _lock:
        if _url is not None:
            return _url
        binaries = postgres_bin()
        if binaries is None:
            raise LocalPostgresError(
                "no PostgreSQL binaries (initdb, pg_ctl) on this machine to start a throwaway cluster"
            )
        _sweep_orphans(binaries)
        directory = Path(tempfile.mkdtemp(prefix=PREFIX))
        (directory / OWNER_FILE).write_text(str(os.getpid()))
        port = _free_port()
        prefix = _as_owner(directory)
        try:
            _run(
                prefix,
                [
                    str(binaries / "initdb"),
                    "-D",
                    str(directory / "data"),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                ],
            )
            _run(
                prefix,
                [
                    str(binaries / "pg_ctl"),
                    "-D",
                    str(directory / "data"),
                    "-w",
                    "-l",
                    str(directory / "postgres.log"),
                    "-o",
                    f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off",
                    "start",
                ],
            )
        except LocalPostgresError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        _url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        atexit.register(_stop, binaries, directory, prefix)
        return _url


def _as_owner(directory: Path) -> list[str]:
    """initdb and postgres refuse to run as root: as root, the cluster belongs to the
    `postgres` user (or `nobody`) and the commands run as that user."""
    if os.geteuid() != 0:
        return []
    owner = "postgres"
    try:
        import pwd

        pwd.getpwnam(owner)
    except KeyError:
        owner = "nobody"
    shutil.chown(directory, user=owner)
    return ["runuser", "-u", owner, "--"]


def _run(prefix: list[str], argv: list[str]) -> None:
    try:
        subprocess.run([*prefix, *argv], check=True, capture_output=True, text=True, timeout=120)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or exc.stdout or "").strip().splitlines()[-1:]
        raise LocalPostgresError(
            f"the throwaway PostgreSQL cluster did not start ({Path(argv[0]).name}: "
            f"{' '.join(detail) or f'exit {exc.returncode}'})"
        ) from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LocalPostgresError(f"the throwaway PostgreSQL cluster did not start: {exc}") from exc


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _sweep_orphans(binaries: Path) -> None:
    """Stop and delete the clusters of processes that died without their exit handlers (a
    SIGKILL): nothing else would ever stop those servers."""
    for directory in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = int(owners.read_own_file(directory / OWNER_FILE))
        except (OSError, ValueError):
            continue
        if owners.running(owner):
            continue
        _stop(binaries, directory, _as_owner(directory))


def _stop(binaries: Path, directory: Path, prefix: list[str]) -> None:
    subprocess.run(
        [
            *prefix,
            str(binaries / "pg_ctl"),
            "-D",
            str(directory / "data"),
            "-m",
            "immediate",
            "stop",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    shutil.rmtree(directory, ignore_errors=True)
