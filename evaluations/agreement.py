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
    """How far the judge and people agreed over a set of pairs: the 2x2 counts, percent
    agreement, Cohen's kappa and the mean absolute error of the scores."""

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


@dataclass(frozen=True, slots=True)
class Tally:
    """The counts an Agreement is computed from. Tallies add up, so the database can count
    per group and day and a cumulative trend is one running sum."""

    both_pass: int = 0
    both_fail: int = 0
    judge_pass_human_fail: int = 0
    judge_fail_human_pass: int = 0
    absolute_error: float = 0.0  # summed over the scored pairs
    scored: int = 0

    @classmethod
    def of(cls, pairs: Iterable[Pair]) -> Tally:
        counts = [0, 0, 0, 0]
        absolute_error, scored = 0.0, 0
        for p in pairs:
            counts[_cell(p)] += 1
            if p.judge_score is not None and p.human_score is not None:
                absolute_error += abs(p.judge_score - p.human_score)
                scored += 1
        both_pass, both_fail, judge_only, human_only = counts
        return cls(both_pass, both_fail, judge_only, human_only, absolute_error, scored)

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.both_pass + other.both_pass,
            self.both_fail + other.both_fail,
            self.judge_pass_human_fail + other.judge_pass_human_fail,
            self.judge_fail_human_pass + other.judge_fail_human_pass,
            self.absolute_error + other.absolute_error,
            self.scored + other.scored,
        )

    @property
    def n(self) -> int:
        return (
            self.both_pass
            + self.both_fail
            + self.judge_pass_human_fail
            + self.judge_fail_human_pass
        )

    def agreement(self) -> Agreement:
        n, agreed = self.n, self.both_pass + self.both_fail
        return Agreement(
            n=n,
            agreed=agreed,
            both_pass=self.both_pass,
            both_fail=self.both_fail,
            judge_pass_human_fail=self.judge_pass_human_fail,
            judge_fail_human_pass=self.judge_fail_human_pass,
            percent=agreed / n if n else None,
            kappa=_kappa(
                self.both_pass,
                self.both_fail,
                self.judge_pass_human_fail,
                self.judge_fail_human_pass,
            ),
            mae=self.absolute_error / self.scored if self.scored else None,
            scored=self.scored,
        )


def _cell(pair: Pair) -> int:
    """The pair's cell of the 2x2 table, in Tally's field order."""
    if pair.judge_passed:
        return 0 if pair.human_passed else 2
    return 3 if pair.human_passed else 1


def percent_agreement(pairs: Sequence[Pair]) -> float | None:
    return Tally.of(pairs).agreement().percent


def cohen_kappa(pairs: Sequence[Pair]) -> float | None:
    return Tally.of(pairs).agreement().kappa


def _kappa(both_pass: int, both_fail: int, judge_only: int, human_only: int) -> float | None:
    n = both_pass + both_fail + judge_only + human_only
    if n == 0:
        return None
    judge_pass, judge_fail = both_pass + judge_only, both_fail + human_only
    human_pass, human_fail = both_pass + human_only, both_fail + judge_only
    # Everything multiplied by n^2 so the counts stay integers until the one division.
    observed = (both_pass + both_fail) * n
    chance = judge_pass * human_pass + judge_fail * human_fail
    if chance == n * n:
        return None
    return (observed - chance) / (n * n - chance)


def mean_absolute_error(pairs: Sequence[Pair]) -> float | None:
    return Tally.of(pairs).agreement().mae


def agreement(pairs: Iterable[Pair]) -> Agreement:
    return Tally.of(pairs).agreement()


@dataclass(frozen=True, slots=True)
class TrendPoint:
    """The agreement as it stood at the end of one day with decisions."""

    day: date
    added: int  # pairs decided that day
    cumulative: Agreement  # everything decided up to and including that day


def agreement_trend(dated: Iterable[tuple[date, Pair]]) -> list[TrendPoint]:
    """Agreement as it stood at the end of each day with decisions. Cumulative, because a
    kappa over one day's handful of items says little."""
    by_day: dict[date, list[Pair]] = {}
    for day, pair in dated:
        by_day.setdefault(day, []).append(pair)
    return tally_trend((day, Tally.of(pairs)) for day, pairs in by_day.items())


def tally_trend(daily: Iterable[tuple[date, Tally]]) -> list[TrendPoint]:
    """The cumulative trend from each day's tally (a day may come more than once)."""
    by_day: dict[date, Tally] = {}
    for day, tally in daily:
        by_day[day] = by_day.get(day, Tally()) + tally
    points: list[TrendPoint] = []
    seen = Tally()
    for day in sorted(by_day):
        seen += by_day[day]
        points.append(TrendPoint(day=day, added=by_day[day].n, cumulative=seen.agreement()))
    return points
