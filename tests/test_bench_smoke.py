"""The benchmark suite still runs (issue 18): `bench/run_all.py --smoke` runs every benchmark
at its smallest size and writes the table. It checks that each runs and reports its figure,
not that it is fast (speed is measured in bench/, never in a timed test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_benchmark_runs_and_reports_its_figure(tmp_path: Path) -> None:
    out = tmp_path / "performance.md"
    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    done = subprocess.run(
        [sys.executable, "bench/run_all.py", "--smoke", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [
        line for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line
    ]
    figures = rows[1:]  # after the header
    assert len(figures) == 13, out.read_text()
    for row in figures:
        measured = row.split(" | ")[2]
        low = float(measured.split(" / ")[0])
        assert low > 0, row  # a figure was read, not a placeholder
