"""Comparing two runs of a spec: did it get worse than the version we trust, where, and how
sure are we? Pure functions of two RunSummary objects (no Django), used by
`keystone compare` and the pages.

Every invariant x scenario cell of the matrix and every scenario x prompt group is compared
by its pass counts with Fisher's exact test, one-sided for a drop (a rise is tested the other
way). A cell is:

- `regressed`: fewer passes, p below alpha (default 0.05);
- `new_failure_code`: a failure code the reference never had (a new way to fail), whatever p;
- `improved`: more passes, p below alpha;
- `not_enough_replicas`: the counts differ, but even the most extreme outcome with this many
  replicas could not reach alpha; `needed_replicas` says how many would;
- `unchanged`: otherwise.

A gate that passed in the reference and fails now is `gate_flipped`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from checks.report_model import GateResult, MatrixCell, ReplicaAggregate, RunSummary

DEFAULT_ALPHA = 0.05
MAX_REPLICAS_SEARCHED = 1000
# Cells that make `keystone compare` exit 1.
WORSE = ("regressed", "new_failure_code", "gate_flipped")


@dataclass(slots=True)
class CellChange:
    """One matrix cell, replica group or gate of a run against the same one in the reference:
    the pass counts of both, the verdict (see the module docstring) and its p-value."""

    kind: str  # invariant (an invariant x scenario cell) | group (a scenario x prompt group) | gate
    key: str
    verdict: str
    before_passed: int = 0
    before_total: int = 0
    after_passed: int = 0
    after_total: int = 0
    p_value: float | None = None
    needed_replicas: int | None = None
    new_failure_codes: list[str] = field(default_factory=list)

    def counts(self) -> str:
        return f"{self.before_passed}/{self.before_total} -> {self.after_passed}/{self.after_total}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Comparison:
    """Every cell, group and gate of two runs compared, at significance level `alpha`."""

    alpha: float
    cells: list[CellChange]

    @property
    def regressed(self) -> bool:
        return any(cell.verdict in WORSE for cell in self.cells)

    def changed(self) -> list[CellChange]:
        return [cell for cell in self.cells if cell.verdict != "unchanged"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "regressed": self.regressed,
            "cells": [cell.to_dict() for cell in self.cells],
        }


# Up to this many executions in both runs together, the p-value is summed in exact integers
# (under a millisecond): a p-value exactly at alpha, 1/20 with 3 replicas a side, stays exactly
# there. Above, the integers would run to thousands of digits (0.6 s at 100,000 a side): the
# terms are floats relative to the first, which lgamma gives (relative error ~1e-11 at 10,000
# a side, ~5e-10 at 100,000; scipy's own was ~1e-11 there).
EXACT_UP_TO = 2000


# Cached: a compare page tests ~100 cells and groups, most with the same few counts (every
# replica passing, the needed_replicas search).
@functools.lru_cache(maxsize=4096)
def p_drop(before_passed: int, before_total: int, after_passed: int, after_total: int) -> float:
    """One-sided Fisher's exact p-value that the pass rate dropped from before to after: with
    the passes of both runs together fixed, the chance that the `after_total` executions of
    the second run hold `after_passed` passes or fewer (the hypergeometric lower tail).

    The sum starts at `after_passed` and goes down: each term, C(passed, k) * C(failed,
    after_total - k), is the one above it times a ratio of small integers. It stops where
    what is left could no longer change a double. (scipy.stats, which did this before, took
    0.65 s and 89 MB to import in every web and worker process that showed a regression.)"""
    passed = before_passed + after_passed
    failed = before_total + after_total - passed
    total = passed + failed
    fewest = max(0, after_total - failed)  # the second run's passes cannot go below this
    exact = total <= EXACT_UP_TO
    term: int | float = (  # an exact integer up to EXACT_UP_TO, else relative to the first
        math.comb(passed, after_passed) * math.comb(failed, after_total - after_passed)
        if exact
        else 1.0
    )
    tail = term
    for k in range(after_passed, fewest, -1):  # the term of k - 1 from that of k
        above, below = k * (failed - after_total + k), (passed - k + 1) * (after_total - k + 1)
        term = term * above // below if exact else term * above / below
        tail += term
        # Below the mode the terms only fall: the k - fewest left are each at most this one.
        if term * (k - fewest) * 2**64 < tail:
            break
    if exact:
        return tail / math.comb(total, after_total)  # integers of any size, to the nearest float
    first = _log_comb(passed, after_passed) + _log_comb(failed, after_total - after_passed)
    return min(1.0, math.exp(first - _log_comb(total, after_total)) * tail)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def needed_replicas(before_total: int, after_total: int, alpha: float) -> int | None:
    """The fewest replicas per side at which a change could reach significance at all (all
    pass against none pass), when these counts cannot; None when they can."""
    if after_total and before_total and p_drop(before_total, before_total, 0, after_total) < alpha:
        return None
    for n in range(1, MAX_REPLICAS_SEARCHED + 1):
        if p_drop(n, n, 0, n) < alpha:
            return n
    return None


def compare_counts(
    kind: str,
    key: str,
    before: tuple[int, int],
    after: tuple[int, int],
    *,
    before_codes: set[str],
    after_codes: set[str],
    alpha: float = DEFAULT_ALPHA,
) -> CellChange:
    (bp, bt), (ap, at) = before, after
    change = CellChange(kind, key, "unchanged", bp, bt, ap, at)
    change.new_failure_codes = sorted(after_codes - before_codes)
    if not bt or not at:
        change.verdict = "new_failure_code" if change.new_failure_codes and bt else "unchanged"
        return change
    before_rate, after_rate = bp / bt, ap / at
    if after_rate < before_rate:
        change.p_value = p_drop(bp, bt, ap, at)
    elif after_rate > before_rate:
        change.p_value = p_drop(ap, at, bp, bt)  # the same test, the other way
    significant = change.p_value is not None and change.p_value < alpha
    if significant and after_rate < before_rate:
        change.verdict = "regressed"
    elif change.new_failure_codes:
        change.verdict = "new_failure_code"
    elif significant:
        change.verdict = "improved"
    elif change.p_value is not None:
        change.needed_replicas = needed_replicas(bt, at, alpha)
        if change.needed_replicas is not None:
            change.verdict = "not_enough_replicas"
    return change


@dataclass(slots=True)
class StoredSummary:
    """The parts of a RunSummary a comparison reads, rebuilt from its `to_dict` (the summary
    run_finalize stores): comparing two stored runs then needs no rescoring."""

    matrix: list[MatrixCell]
    groups: list[ReplicaAggregate]
    gates: list[GateResult]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StoredSummary:
        def build(kind: Any, row: dict[str, Any]) -> Any:
            return kind(**{k: v for k, v in row.items() if k in kind.__dataclass_fields__})

        return cls(
            matrix=[build(MatrixCell, row) for row in data.get("matrix") or []],
            groups=[build(ReplicaAggregate, row) for row in data.get("groups") or []],
            gates=[build(GateResult, row) for row in data.get("gates") or []],
        )


def compare_summaries(
    before: RunSummary | StoredSummary,
    after: RunSummary | StoredSummary,
    *,
    alpha: float = DEFAULT_ALPHA,
) -> Comparison:
    """Every matrix cell, replica group and gate of `after` against `before`."""
    cells: list[CellChange] = []
    reference = {(c.invariant_id, c.scenario): c for c in before.matrix}
    for cell in after.matrix:
        old = reference.get((cell.invariant_id, cell.scenario))
        cells.append(
            compare_counts(
                "invariant",
                f"{cell.invariant_id} @ {cell.scenario}",
                (old.results_passed, old.results_total) if old else (0, 0),
                (cell.results_passed, cell.results_total),
                before_codes=set(old.failure_codes) if old else set(),
                after_codes=set(cell.failure_codes),
                alpha=alpha,
            )
        )
    groups = {g.key: g for g in before.groups}
    for group in after.groups:
        old_group = groups.get(group.key)
        cells.append(
            compare_counts(
                "group",
                group.key,
                (old_group.c, old_group.n) if old_group else (0, 0),
                (group.c, group.n),
                before_codes=set(old_group.failure_codes) if old_group else set(),
                after_codes=set(group.failure_codes),
                alpha=alpha,
            )
        )
    gates = {g.name: g for g in before.gates}
    for gate in after.gates:
        old_gate = gates.get(gate.name)
        flipped = old_gate is not None and old_gate.passed and not gate.passed
        cells.append(CellChange("gate", gate.name, "gate_flipped" if flipped else "unchanged"))
    return Comparison(alpha, cells)


def render_comparison(comparison: Comparison, before_label: str, after_label: str) -> str:
    """The terminal text (and the body of the Markdown): what changed, worst first."""
    order = {v: i for i, v in enumerate((*WORSE, "not_enough_replicas", "improved"))}
    changed = sorted(comparison.changed(), key=lambda c: (order.get(c.verdict, 9), c.key))
    lines = [
        f"{after_label} against {before_label}: "
        + ("REGRESSED" if comparison.regressed else "no regression")
        + f" (Fisher's exact test, one-sided, alpha {comparison.alpha:g})"
    ]
    for cell in changed:
        line = f"  {cell.verdict.upper():<20} {cell.kind:<9} {cell.key}"
        if cell.kind != "gate":
            line += f"  {cell.counts()}"
        if cell.p_value is not None:
            line += f"  p={cell.p_value:.4g}"
        if cell.needed_replicas is not None:
            line += f"  (not enough replicas to tell: {cell.needed_replicas} per side would be)"
        if cell.new_failure_codes:
            line += f"  new: {', '.join(cell.new_failure_codes)}"
        lines.append(line)
    if not changed:
        lines.append("  nothing changed")
    return "\n".join(lines) + "\n"
