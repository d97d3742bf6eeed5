"""Security drills: the attacks of issue 13 run by a real `keystone run`, under every sandbox
backend that works on this host, and a table of what happened (docs/security.md).

    python bench/drills/run_drills.py [--backends local,bwrap,docker] [--docker-image IMAGE]

The agent is the attacker: it tries to read the worker's environment and the host's files,
reach the server's PostgreSQL (as its admin), Redis and the cloud metadata address, keep a
capability, start far more processes than allowed and fill the disk. Each attempt is reported
by the agent and judged here: `blocked` or `NOT BLOCKED`; one more row says whether the
refused connections were recorded as evidence (forbidden violations naming host:port). A
backend that cannot run here (no Docker engine, no image with Python) gets one row saying why. The worker's environment carries a canary
secret, so a leak is seen, not guessed. Needs PostgreSQL on 127.0.0.1:5432 for the database
service (KEYSTONE_POSTGRES_URL).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CANARY = "keystone-drill-canary-5b1f"

ATTACK = r"""
import json, os, socket, subprocess
seen = {}
def attempt(name, action):
    try:
        seen[name] = str(action())[:200]
    except Exception as exc:
        seen[name] = "refused: " + type(exc).__name__

def environ_of_others():
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                entries = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            found += [e.decode(errors="replace") for e in entries if b"SECRET" in e]
    return " ".join(found) or "refused: no other process's secrets readable"
attempt("worker_environment", environ_of_others)
attempt("host_file", lambda: open("/etc/shadow").read())
def server_db():
    import psycopg
    return psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=3).execute("SELECT 1").fetchone()
attempt("server_database", server_db)
def talk(host, port):
    # Only an answer is a reach: the sandbox's traps accept and close without a byte.
    with socket.create_connection((host, port), timeout=3) as conn:
        conn.sendall(b"PING\r\n")
        answer = conn.recv(100)
    return answer if answer else "refused: closed without a byte"
attempt("redis", lambda: talk("127.0.0.1", 6379))
attempt("metadata", lambda: talk("169.254.169.254", 80))
attempt("capabilities", lambda: open("/proc/self/status").read().split("CapEff:")[1].split()[0])
def burst():
    started = 0
    children = []
    for _ in range(600):
        try:
            children.append(subprocess.Popen(["sleep", "5"]))
            started += 1
        except OSError:
            break
    for child in children:
        child.kill()
    return started
attempt("process_burst", burst)
print(json.dumps(seen), flush=True)
# Last: fill the disk, one megabyte file after another, until the sandbox stops it.
import itertools
for i in itertools.count():
    with open(f"fill-{i}", "wb") as f:
        f.write(b"x" * 1024 * 1024)
"""

SPEC = """
version: 1
id: drill
task: {prompt: "attack"}
agent: {type: command, command: "python attack.py", timeout: 120}
sandbox: {backend: BACKEND, IMAGEnetwork: services, workspace: ./ws, resources: {max_processes: 100, disk_mb: 50}}
services:
  - {name: shop, type: postgres, sql: "CREATE TABLE t (id int);"}
forbidden: {http_except: []}
invariants:
  reported: {description: "the agent reported", check: {type: contains, value: capabilities}}
"""


def judge(name: str, value: str) -> bool:
    """Whether the attack was blocked."""
    if name == "worker_environment":
        return CANARY not in value
    if name == "capabilities":
        return value.strip("0") == ""
    if name == "process_burst":
        return value.isdigit() and int(value) < 100
    if name == "disk_fill":
        return value.startswith("disk limit")
    if name == "refusals_recorded":
        return value != "none recorded"
    return value.startswith("refused")


def docker_missing_here(image: str) -> str | None:
    """Why the docker backend cannot run the drill here, or None."""
    sys.path.insert(0, str(ROOT))
    from evaluations.runner.sandbox import docker_missing

    return docker_missing({"backend": "docker", "image": image})


def drill(backend: str, home: Path, image: str) -> dict[str, str]:
    work = Path(tempfile.mkdtemp(prefix=f"drill-{backend}-"))
    (work / "ws").mkdir()
    (work / "ws" / "attack.py").write_text(ATTACK)
    spec = SPEC.replace("BACKEND", backend)
    spec = spec.replace("IMAGE", f"image: {image}, " if backend == "docker" else "")
    if backend == "local":
        # The local backend records no refused connection, and the spec has no http_mock: the
        # rule could never fire there, and validation refuses it. The row still says so.
        spec = spec.replace("forbidden: {http_except: []}\n", "")
    (work / "spec.yaml").write_text(spec)
    report = work / "report.json"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")},
        "KEYSTONE_HOME": str(home),
        "KEYSTONE_POSTGRES_URL": "postgresql://postgres@127.0.0.1:5432/postgres",
        "KEYSTONE_POLICY_MIN_BACKEND": "local",
        "KEYSTONE_DRILL_SECRET": CANARY,  # in the worker's environment: must never leak
    }
    done = subprocess.run(
        [sys.executable, "-m", "evaluations.cli", "run", str(work / "spec.yaml"), "--json", str(report)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if not report.exists():
        raise SystemExit(f"{backend}: keystone run failed: {done.stderr[-2000:]}")
    execution = json.loads(report.read_text())["executions"][0]
    seen = json.loads(execution["output"].splitlines()[0])
    error = execution.get("error") or ""
    seen["disk_fill"] = error if "disk limit" in error else f"not stopped: {error or 'no error'}"
    recorded = [
        f"{v['details']['host']}:{v['details']['port']}"
        for v in execution["forbidden_violations"]
        if "port" in v.get("details", {})
    ]
    seen["refusals_recorded"] = " ".join(recorded) or "none recorded"
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="local,bwrap,docker")
    parser.add_argument("--docker-image", default="python:3.11-slim")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="drill-home-"))
    rows = []
    for backend in args.backends.split(","):
        missing = docker_missing_here(args.docker_image) if backend == "docker" else None
        if missing is not None:
            rows.append(("all", backend, "not run", missing.replace("\n", " ")[:120]))
            continue
        for name, value in drill(backend, home, args.docker_image).items():
            outcome = "blocked" if judge(name, value) else "NOT BLOCKED"
            rows.append((name, backend, outcome, value.replace("\n", " ")[:60]))
    print("| attack | backend | outcome | what the agent got |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
