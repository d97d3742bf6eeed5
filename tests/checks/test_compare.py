"""Regression verdicts with statistics (issue 14), on hand-computed cases: Fisher's exact
test, one-sided for a drop."""

from __future__ import annotations

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
