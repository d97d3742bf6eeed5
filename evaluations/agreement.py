"""Judge-human agreement: pure functions over (judge, human) pairs, no database.

Cohen's kappa on pass/fail corrects the raw agreement for the agreement two raters would
reach by chance with their own pass rates: kappa = (p_o - p_e) / (1 - p_e), where p_o is the
share of pairs on which they agree and p_e = P(judge pass) x P(human pass) + P(judge fail) x
P(human fail). When both raters gave one label only (p_e = 1) kappa is undefined: None, never
a made-up 0 or 1. Mean absolute error compares scores where both sides have one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date


@dataclass(frozen=True, slots=True)
class Pair:
    """What the judge said and what people decided about one result."""

    judge_passed: bool
    human_passed: bool
    judge_score: float | None = None
    human_score: float | None = None


@dataclass(frozen=True, slots=True)
class Agreement:
    n: int
    agreed: int
    both_pass: int
    both_fail: int
    judge_pass_human_fail: int
    judge_fail_human_pass: int
    percent: float | None  # agreed / n, in [0, 1]
    kappa: float | None
    mae: float | None
    scored: int  # pairs with both scores, the n of the MAE


def _counts(pairs: Sequence[Pair]) -> tuple[int, int, int, int]:
    both_pass = sum(1 for p in pairs if p.judge_passed and p.human_passed)
    both_fail = sum(1 for p in pairs if not p.judge_passed and not p.human_passed)
    judge_only = sum(1 for p in pairs if p.judge_passed and not p.human_passed)
    human_only = sum(1 for p in pairs if not p.judge_passed and p.human_passed)
    return both_pass, both_fail, judge_only, human_only


def percent_agreement(pairs: Sequence[Pair]) -> float | None:
    if not pairs:
        return None
    return sum(1 for p in pairs if p.judge_passed == p.human_passed) / len(pairs)


def cohen_kappa(pairs: Sequence[Pair]) -> float | None:
    n = len(pairs)
    if n == 0:
        return None
    both_pass, both_fail, judge_only, human_only = _counts(pairs)
    judge_pass, judge_fail = both_pass + judge_only, both_fail + human_only
    human_pass, human_fail = both_pass + human_only, both_fail + judge_only
    # Everything multiplied by n^2 so the counts stay integers until the one division.
    observed = (both_pass + both_fail) * n
    chance = judge_pass * human_pass + judge_fail * human_fail
    if chance == n * n:
        return None
    return (observed - chance) / (n * n - chance)


def mean_absolute_error(pairs: Sequence[Pair]) -> float | None:
    errors = [
        abs(p.judge_score - p.human_score)
        for p in pairs
        if p.judge_score is not None and p.human_score is not None
    ]
    return sum(errors) / len(errors) if errors else None


def agreement(pairs: Iterable[Pair]) -> Agreement:
    pairs = list(pairs)
    both_pass, both_fail, judge_only, human_only = _counts(pairs)
    return Agreement(
        n=len(pairs),
        agreed=both_pass + both_fail,
        both_pass=both_pass,
        both_fail=both_fail,
        judge_pass_human_fail=judge_only,
        judge_fail_human_pass=human_only,
        percent=percent_agreement(pairs),
        kappa=cohen_kappa(pairs),
        mae=mean_absolute_error(pairs),
        scored=sum(1 for p in pairs if p.judge_score is not None and p.human_score is not None),
    )


@dataclass(frozen=True, slots=True)
class TrendPoint:
    day: date
    added: int  # pairs decided that day
    cumulative: Agreement  # everything decided up to and including that day


def agreement_trend(dated: Iterable[tuple[date, Pair]]) -> list[TrendPoint]:
    """Agreement as it stood at the end of each day with decisions. Cumulative, because a
    kappa over one day's handful of items says little."""
    by_day: dict[date, list[Pair]] = {}
    for day, pair in dated:
        by_day.setdefault(day, []).append(pair)
    points: list[TrendPoint] = []
    seen: list[Pair] = []
    for day in sorted(by_day):
        seen.extend(by_day[day])
        points.append(TrendPoint(day=day, added=len(by_day[day]), cumulative=agreement(seen)))
    return points
