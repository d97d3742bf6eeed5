"""Judge-human agreement against values computed by hand (no database)."""

from __future__ import annotations

from datetime import date

import pytest

from evaluations.agreement import (
    Pair,
    agreement,
    agreement_trend,
    cohen_kappa,
    mean_absolute_error,
    percent_agreement,
)


def pairs(both_pass: int, both_fail: int, judge_only: int, human_only: int) -> list[Pair]:
    return (
        [Pair(True, True)] * both_pass
        + [Pair(False, False)] * both_fail
        + [Pair(True, False)] * judge_only
        + [Pair(False, True)] * human_only
    )


def test_kappa_of_the_textbook_table() -> None:
    # 50 items: both pass 20, both fail 15, judge-only pass 5, people-only pass 10.
    # p_o = (20 + 15) / 50 = 0.7
    # P(judge pass) = 25/50 = 0.5, P(people pass) = 30/50 = 0.6
    # p_e = 0.5 x 0.6 + 0.5 x 0.4 = 0.5
    # kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    table = pairs(20, 15, 5, 10)
    assert cohen_kappa(table) == pytest.approx(0.4)
    assert percent_agreement(table) == pytest.approx(0.7)
    result = agreement(table)
    assert (result.n, result.agreed, result.both_pass, result.both_fail) == (50, 35, 20, 15)
    assert (result.judge_pass_human_fail, result.judge_fail_human_pass) == (5, 10)
    assert result.kappa == pytest.approx(0.4) and result.percent == pytest.approx(0.7)


def test_kappa_of_an_unbalanced_table() -> None:
    # both pass 45, both fail 15, judge-only 25, people-only 15 (n = 100)
    # p_o = 0.60; P(judge pass) = 0.70, P(people pass) = 0.60
    # p_e = 0.7 x 0.6 + 0.3 x 0.4 = 0.42 + 0.12 = 0.54
    # kappa = (0.60 - 0.54) / (1 - 0.54) = 0.06 / 0.46 = 0.130434...
    assert cohen_kappa(pairs(45, 15, 25, 15)) == pytest.approx(0.06 / 0.46)


def test_perfect_agreement_and_perfect_disagreement() -> None:
    assert cohen_kappa(pairs(3, 2, 0, 0)) == pytest.approx(1.0)
    # Every answer opposite, both raters balanced: p_o = 0, p_e = 0.5, kappa = -1.
    assert cohen_kappa(pairs(0, 0, 2, 2)) == pytest.approx(-1.0)


def test_agreement_no_better_than_chance_is_zero() -> None:
    # Judge passes half, people pass half, independently: p_o = p_e = 0.5.
    assert cohen_kappa(pairs(1, 1, 1, 1)) == pytest.approx(0.0)


def test_kappa_is_undefined_when_both_sides_give_one_answer_only() -> None:
    # p_e = 1: the formula divides by zero; say "undefined", not 0 or 1.
    assert cohen_kappa(pairs(7, 0, 0, 0)) is None
    assert cohen_kappa([]) is None
    assert agreement([]).percent is None and agreement([]).n == 0
    # Only one side unanimous is fine: judge always passes, people split.
    # p_o = 0.5, P(judge pass) = 1, P(people pass) = 0.5, p_e = 0.5: kappa = 0.
    assert cohen_kappa(pairs(1, 0, 1, 0)) == pytest.approx(0.0)


def test_mean_absolute_error_skips_pairs_without_both_scores() -> None:
    scored = [
        Pair(True, True, judge_score=0.9, human_score=1.0),  # 0.1
        Pair(False, False, judge_score=0.2, human_score=0.0),  # 0.2
        Pair(False, True, judge_score=0.6, human_score=0.3),  # 0.3
        Pair(True, True, judge_score=None, human_score=1.0),  # no judge score
    ]
    # (0.1 + 0.2 + 0.3) / 3 = 0.2
    assert mean_absolute_error(scored) == pytest.approx(0.2)
    result = agreement(scored)
    assert result.mae == pytest.approx(0.2) and result.scored == 3 and result.n == 4
    assert mean_absolute_error([Pair(True, True)]) is None


def test_the_trend_is_cumulative_by_day() -> None:
    day1, day2, day3 = date(2026, 1, 5), date(2026, 1, 6), date(2026, 1, 8)
    dated = [
        (day2, Pair(True, False)),
        (day1, Pair(True, True)),
        (day1, Pair(False, False)),
        (day3, Pair(False, True)),
    ]
    points = agreement_trend(dated)
    assert [p.day for p in points] == [day1, day2, day3]
    assert [p.added for p in points] == [1 + 1, 1, 1]
    assert [p.cumulative.n for p in points] == [2, 3, 4]
    # Day 1: two agreements of both kinds: kappa 1.
    assert points[0].cumulative.kappa == pytest.approx(1.0)
    # Day 2: + one judge-only pass. p_o = 2/3; P(judge) = 2/3, P(people) = 1/3;
    # p_e = 2/9 + 2/9 = 4/9; kappa = (2/3 - 4/9) / (5/9) = (2/9) / (5/9) = 0.4.
    assert points[1].cumulative.kappa == pytest.approx(0.4)
    # Day 3: + one people-only pass: pairs(1, 1, 1, 1): kappa 0, agreement 50%.
    assert points[2].cumulative.kappa == pytest.approx(0.0)
    assert points[2].cumulative.percent == pytest.approx(0.5)
