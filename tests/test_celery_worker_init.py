"""The Celery worker's main process imports what executions need and freezes the collector
before its pool forks (keystone_web/celery.py), so the pool's children share those pages
instead of each holding a copy (bench/bench_throughput.py reports the workers' PSS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import REPO_ROOT, embedded_env

pytestmark = [pytest.mark.embedded]


def test_worker_init_imports_the_execution_path_and_freezes_the_collector(
    tmp_path: Path,
) -> None:
    code = (
        "import gc, json, os, sys\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'keystone_web.settings'\n"
        "import django; django.setup()\n"
        "from celery.signals import worker_init\n"
        "from keystone_web.celery import app\n"
        "wanted = ['evaluations.runner.harness', 'evaluations.judge']\n"
        "before = [m in sys.modules for m in wanted]\n"
        "worker_init.send(sender=None)\n"
        "print(json.dumps([before, [m in sys.modules for m in wanted], gc.get_freeze_count()]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=embedded_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    before, after, frozen = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == [False, False] and after == [True, True]
    assert frozen > 10_000  # the objects of Django and the runner, out of the collector's way
