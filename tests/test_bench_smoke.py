"""The benchmark suite still runs (issue 18): `bench/run_all.py --smoke` runs every benchmark
at its smallest size and writes the table. It checks that each runs and reports its figure,
not that it is fast (speed is measured in bench/, never in a timed test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    # The machine's speed before and after, in the header: tables of two machines compare.
    speed = re.search(
        r'`python -m timeit "sum\(range\(10\*\*6\)\)"` \(best of 5\) took ([\d.]+) ms before '
        r"the first benchmark and ([\d.]+) ms after the last",
        out.read_text(),
    )
    assert speed is not None, out.read_text()[:2000]
    assert all(0 < float(ms) < 10_000 for ms in speed.groups()), speed.groups()
    rows = [
        line for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line
    ]
    figures = rows[1:]  # after the header
    assert len(figures) == 17, out.read_text()
    for row in figures:
        if "not measured" in row:
            # Only the Docker engine may be missing (a machine without one, or without the
            # right to start it); the row then says why instead of vanishing.
            assert row.startswith("| platform overhead per execution, docker |"), row
            assert "not measured: docker" in row.lower(), row
            continue
        low, median, high = (float(n) for n in row.split(" | ")[2].split()[0:5:2])
        assert low <= median <= high, row  # figures were read, not a placeholder
        # An overhead is a difference of two medians: at the smoke sizes, on a busy machine,
        # it can come out below zero. Every other figure is a size, a time or a rate.
        assert low > 0 or "overhead per call" in row, row


def load_run_all(monkeypatch: Any) -> Any:
    """bench/run_all.py as a module (bench/ is not a package)."""
    import importlib.util

    loaded = importlib.util.spec_from_file_location("run_all", REPO / "bench" / "run_all.py")
    assert loaded is not None and loaded.loader is not None
    run_all = importlib.util.module_from_spec(loaded)
    monkeypatch.setitem(sys.modules, "run_all", run_all)  # its dataclasses look it up
    loaded.loader.exec_module(run_all)
    return run_all


def test_measuring_some_rows_again_keeps_the_written_sections_once(monkeypatch: Any) -> None:
    """`run_all.py --only X` replaces X's row in the table and keeps the sections people
    wrote below it as they are, once, tables of their own included."""
    run_all = load_run_all(monkeypatch)
    doc = (
        "# Performance\n\n| figure | target | measured | command |\n|---|---|---|---|\n"
        "| a | 1 | 5 / 5 / 5 ms | x |\n| b | 2 | 7 / 7 / 7 ms | y |\n\n"
        "A paragraph about the table,\nwritten on two lines.\n\n"
        "## Written by hand\n\n| page | before | after |\n|---|---|---|\n| run list | 9 | 8 |\n"
    )
    measured, written = run_all.split_doc(doc)
    merged = run_all.merge(
        measured, [("b", "2", "6 / 6 / 6 ms", "y")], "python run_all --only b", (12.5, 14.0)
    )
    result = merged + written
    assert result.count("## Written by hand") == 1
    assert "| run list | 9 | 8 |" in result
    assert "| a | 1 | 5 / 5 / 5 ms | x |" in result
    assert "| b | 2 | 6 / 6 / 6 ms | y |" in result and "7 / 7 / 7" not in result
    assert result.index("measured by `python run_all --only b`") < result.index("## Written")
    # The note of the rows measured again says how fast the machine was meanwhile.
    assert "took 12.5 ms before the first benchmark and 14.0 ms after the last" in result
    assert "A paragraph about the table,\nwritten on two lines.\n\n" in result  # as it was
    assert "The row measured by `python run_all --only b` is from " in result  # one row


def test_the_note_of_rows_measured_again_counts_them(monkeypatch: Any) -> None:
    """Two rows measured again are "the 2 rows", one is "the row" (not "the 1 rows")."""
    run_all = load_run_all(monkeypatch)
    table = (
        "# P\n\n| figure | target | measured | command |\n|---|---|---|---|\n| a | 1 | 5 ms | x |\n"
    )
    rows = [("a", "1", "4 ms", "x"), ("b", "2", "6 ms", "y")]
    both = run_all.merge(table, rows, "run_all --only a --only b", (12.5, 14.0))
    assert "The 2 rows measured by `run_all --only a --only b` are from " in both


def test_the_pages_benchmark_shows_its_slowest_statements_with_their_plans() -> None:
    """`bench_pages.py --explain N`: the N slowest statements over every page, slowest
    first, each with its page and PostgreSQL's plan of it as run (what docs/performance.md
    shows of the pages' queries)."""

    env = {
        k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    done = subprocess.run(
        [sys.executable, "bench/bench_pages.py", "--explain", "2", "--runs", "60", "--reseed",
         "--database-url", "postgresql://postgres@127.0.0.1:5432/keystone_bench_pages_explain"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    headings = re.findall(
        r"^(\d)\. ([^:]+): ([\d.]+) ms in the page, ([\d.]+) ms in the server$",
        done.stdout,
        re.MULTILINE,
    )
    assert [number for number, *_ in headings] == ["1", "2"], done.stdout[-3000:]
    in_page = [float(ms) for _, _, ms, _ in headings]
    assert in_page == sorted(in_page, reverse=True)  # slowest first
    sections = re.split(r"^\d\. ", done.stdout, flags=re.MULTILINE)[1:]
    for (_, _, _, server_ms), section in zip(headings, sections, strict=True):
        assert "\nSELECT " in section  # the statement itself
        assert re.search(r"\(actual time=[\d.]+\.\.[\d.]+ rows=\d+ loops=\d+\)", section)
        executed = re.search(r"^Execution Time: ([\d.]+) ms$", section, re.MULTILINE)
        assert executed is not None, section
        assert f"{float(executed.group(1)):.2f}" == server_ms  # the plan the figure is from
