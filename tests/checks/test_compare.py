"""Regression verdicts with statistics (issue 14), on hand-computed cases: Fisher's exact
test, one-sided for a drop."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from checks.compare import CellChange, compare_counts, needed_replicas, p_drop


def _verdict(
    before: tuple[int, int], after: tuple[int, int], new_codes: frozenset[str] = frozenset()
) -> CellChange:
    return compare_counts(
        "invariant", "x @ s", before, after, before_codes=set(), after_codes=set(new_codes)
    )


def test_9_of_10_down_to_3_of_10_is_a_significant_regression() -> None:
    # P(X <= 3) for X ~ hypergeometric(20 replicas, 12 passes, 10 drawn) = 0.00988.
    assert p_drop(9, 10, 3, 10) == pytest.approx(0.0098833, rel=1e-4)
    change = _verdict((9, 10), (3, 10))
    assert change.verdict == "regressed" and change.counts() == "9/10 -> 3/10"


def test_9_of_10_down_to_8_of_10_is_not_significant() -> None:
    assert p_drop(9, 10, 8, 10) == pytest.approx(0.5)
    change = _verdict((9, 10), (8, 10))
    assert change.verdict == "unchanged" and change.needed_replicas is None


def _scipy_p_drop(
    before_passed: int, before_total: int, after_passed: int, after_total: int
) -> float:
    from scipy.stats import fisher_exact  # the reference implementation (a dev dependency)

    table = [
        [after_passed, after_total - after_passed],
        [before_passed, before_total - before_passed],
    ]
    return float(fisher_exact(table, alternative="less").pvalue)


def test_the_test_gives_scipy_s_p_value_for_every_table() -> None:
    """Every table with up to 9 executions a side, summed in exact integers; then larger ones
    up to a million a side, whose terms are floats past EXACT_UP_TO executions (scipy itself
    is only as close as 1e-9 there), with p down to 1e-250."""
    small = [
        (bp, bt, ap, at)
        for bt in range(10)
        for at in range(10)
        for bp in range(bt + 1)
        for ap in range(at + 1)
    ]
    for counts in small:
        assert p_drop(*counts) == pytest.approx(_scipy_p_drop(*counts), rel=1e-13), counts
    draw = random.Random(18)
    large = []
    for per_side in (100, 1000, 5000, 100_000, 1_000_000):
        for _ in range(20):
            bt, at = draw.randint(1, per_side), draw.randint(1, per_side)
            bp = draw.randint(0, bt)
            # A drop, as the comparison tests it (a rise is tested the other way round).
            ap = draw.randint(0, at * bp // bt)
            large.append((bp, bt, ap, at))
    large += [(90_000, 100_000, 85_000, 100_000), (5000, 5000, 4600, 5000)]
    for counts in large:
        assert p_drop(*counts) == pytest.approx(_scipy_p_drop(*counts), rel=1e-8, abs=1e-300), (
            counts
        )
    assert 1e-260 < p_drop(90_000, 100_000, 85_000, 100_000) < 1e-240


def test_a_p_value_exactly_at_alpha_is_not_below_it() -> None:
    # 3 of 3 down to 0 of 3: p = 1/C(6, 3) = 1/20, which a float sum could put under 0.05.
    assert p_drop(3, 3, 0, 3) == 0.05
    assert _verdict((3, 3), (0, 3)).verdict == "not_enough_replicas"


def test_comparing_counts_imports_neither_scipy_nor_numpy() -> None:
    """scipy.stats took 0.65 s and 89 MB to import, once in each web or worker process that
    showed a regression: the test is computed without it (and so without numpy)."""
    code = (
        "import sys\n"
        "from checks.compare import compare_counts\n"
        "change = compare_counts('invariant', 'x @ s', (9, 10), (3, 10), before_codes=set(),"
        " after_codes=set())\n"
        "assert change.verdict == 'regressed', change\n"
        "print(sorted(m for m in ('scipy', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_1_of_1_down_to_0_of_1_cannot_tell_and_says_how_many_would() -> None:
    change = _verdict((1, 1), (0, 1))
    assert change.verdict == "not_enough_replicas"
    # all pass against none pass: p = 1/C(6,3) = 0.05 with 3 each (not below), 1/70 with 4.
    assert change.needed_replicas == 4
    assert needed_replicas(10, 10, 0.05) is None


def test_a_rise_is_improved_and_a_new_failure_code_is_named() -> None:
    assert _verdict((3, 10), (9, 10)).verdict == "improved"
    change = _verdict((5, 5), (5, 5), frozenset({"TIMEOUT"}))
    assert change.verdict == "new_failure_code" and change.new_failure_codes == ["TIMEOUT"]
