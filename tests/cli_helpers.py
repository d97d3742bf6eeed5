"""Running the `keystone` command line (python -m evaluations.cli) as a real subprocess.

Plain subprocess code with no Django import, so tests/checks (which run without Django set
up) can use it as well as the Django tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# What the test process may carry that would point the subprocess at the test database, the
# test broker or the test settings (or change its output for CI) instead of the embedded default.
SERVER_VARIABLES = frozenset({"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "CI"})


def embedded_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a `keystone` on the embedded SQLite default in `home`."""
    env = {key: value for key, value in os.environ.items() if key not in SERVER_VARIABLES}
    env["KEYSTONE_HOME"] = str(home)
    env.update(extra)
    return env


def run_keystone(
    *args: str,
    env: Mapping[str, str],
    cwd: Path = REPO_ROOT,
    timeout: float = 120,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`keystone ARGS...` run to its end, with its output captured as text; `prefix` is a
    command that starts it (`taskset -c 0`, a shell that joins a cgroup first)."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "evaluations.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
