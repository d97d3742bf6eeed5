"""Two runs of a spec side by side: the reference a run is compared with (its spec's active
baseline, or a run named), and the statistical verdicts of checks.compare."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Q
from rapidfuzz.distance import Indel

from checks.compare import DEFAULT_ALPHA, Comparison, StoredSummary, compare_summaries
from checks.report_model import RunSummary
from checks.scoring import score_run
from checks.spec.model import Spec as EngineSpec
from evaluations.models import RUN_TERMINAL_STATUSES, Execution, Run, run_large_fields
from evaluations.numbers import whole_number
from evaluations.selectors.baselines import active_baseline_for
from evaluations.selectors.records import run_records


class ComparisonRefused(ValueError):
    """The two runs cannot be compared; the message says why, for people."""


def comparison_reference(after: Run, against: str) -> Run:
    """The run `after` is compared with: `baseline` (its spec's active one) or a run id."""
    if against == "baseline":
        baseline = active_baseline_for(after.spec_id, after.branch)
        if baseline is None:
            raise ComparisonRefused(
                f"spec {after.spec.slug} has no active baseline for branch "
                f"{after.branch or 'main'} (nor main): promote a run on its page, "
                "or compare with another run"
            )
        if baseline.run_id is None:
            raise ComparisonRefused(f"the baseline {baseline.name!r} has lost its run (deleted)")
        before_id = baseline.run_id
    else:
        number = whole_number(against)
        if number is None:
            raise ComparisonRefused(f"compare against 'baseline' or a run id, not {against!r}")
        before_id = number
    before = (
        Run.objects.select_related("spec", "spec_version")
        .defer(*run_large_fields(), "spec_version__source_yaml")
        .filter(pk=before_id)
        .first()
    )
    if before is None or before.project_id != after.project_id:
        raise ComparisonRefused(f"no run {before_id}")
    if before.spec_id != after.spec_id:
        raise ComparisonRefused(
            f"run {before.pk} is of spec {before.spec.slug} and run {after.pk} of "
            f"{after.spec.slug}: only runs of one spec compare"
        )
    for run in (before, after):
        if run.status not in RUN_TERMINAL_STATUSES:
            raise ComparisonRefused(f"run {run.pk} is still {run.status}")
    return before


def run_comparison(before: Run, after: Run, *, alpha: float = DEFAULT_ALPHA) -> Comparison:
    """Every cell, group and gate of `after` against `before`: from the summaries
    run_finalize stored (rescored after every review), else scored from the stored results.
    Only the summaries' matrix, groups and gates are read: the rest (each execution's line,
    ~300 kB for 1,000 executions) would cost more to load than the whole comparison."""
    parts = ("matrix", "groups", "gates")
    stored = {
        row["pk"]: row
        for row in Run.objects.filter(pk__in=(before.pk, after.pk)).values(
            "pk", *(f"summary__{part}" for part in parts)
        )
    }

    def summary(run: Run) -> RunSummary | StoredSummary:
        row = stored[run.pk]
        if row["summary__matrix"] is not None and row["summary__groups"] is not None:
            return StoredSummary.from_dict({part: row[f"summary__{part}"] for part in parts})
        return score_run(EngineSpec.from_dict(run.spec_version.parsed), run_records(run))

    return compare_summaries(summary(before), summary(after), alpha=alpha)


# --- Executions side by side --------------------------------------------------------------
# Per execution cell (the same Execution.key: scenario, prompt, replica) the two outputs
# diffed word by word and the two tool-call sequences. Only cells that differ are shown,
# flipped verdicts first, a page at a time: the database finds the cells that differ and
# orders them, so a page of two 1,000-execution runs reads and diffs only its own rows.

EXECUTION_PAIRS_PAGE = 20
_TOKEN = re.compile(r"\s+|[^\s]+")
_PAIR_FIELDS = (
    "pk",
    "key",
    "scenario",
    "prompt_index",
    "replica",
    "passed",
    "composite",
    "final_output",
    "tool_sequence",
)
# The order pairs are shown in: a verdict that flipped to failing (or to none), then one
# that flipped to passing, then the rest (a changed output or tool call, a cell the
# reference run lacks).
RANK_TO_FAILING, RANK_TO_PASSING, RANK_OTHER = 0, 1, 2


@dataclass(slots=True)
class ExecutionPair:
    """One cell of both runs. The word diff and the tool-call lines are worked out when
    read: the compare page lists pairs by their summary and loads each one's diff when it
    is opened (run_compare_pair); `keystone compare --markdown` reads them all."""

    key: str
    scenario: str
    prompt_index: int
    replica: int
    before: dict[str, Any] | None
    after: dict[str, Any]

    @property
    def output_changed(self) -> bool:
        return self._output(self.before) != self._output(self.after)

    @property
    def tools_changed(self) -> bool:
        """The calls themselves, not their lines (which cut long arguments)."""
        return self._sequence(self.before) != self._sequence(self.after)

    @property
    def verdict_changed(self) -> bool:
        return self.before is not None and self.before["passed"] != self.after["passed"]

    @property
    def diff(self) -> list[tuple[str, str]]:
        """(equal | delete | insert, text), word by word."""
        return word_diff(self._output(self.before), self._output(self.after))

    @property
    def tools_before(self) -> list[str]:
        return [_tool_line(call) for call in self._sequence(self.before)]

    @property
    def tools_after(self) -> list[str]:
        return [_tool_line(call) for call in self._sequence(self.after)]

    @staticmethod
    def _output(row: dict[str, Any] | None) -> str:
        """A missing cell's output reads as empty, as the diff shows it."""
        return str((row or {}).get("final_output", ""))

    @staticmethod
    def _sequence(row: dict[str, Any] | None) -> list[Any]:
        return (row or {}).get("tool_sequence") or []


@dataclass(frozen=True, slots=True)
class PairPage:
    """One page of the cells that differ between two runs, how many differ from it on, and
    the cursor of the next."""

    pairs: list[ExecutionPair]
    remaining: int  # the executions that differ from this page on, this page's included
    next_cursor: str | None  # what `cursor=` takes for the page after this one; None: last


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """The two texts as runs of equal, deleted and inserted words (whitespace kept)."""
    left, right = _TOKEN.findall(before), _TOKEN.findall(after)
    segments: list[tuple[str, str]] = []

    def add(op: str, tokens: list[str]) -> None:
        if not tokens:
            return
        text = "".join(tokens)
        if segments and segments[-1][0] == op:
            segments[-1] = (op, segments[-1][1] + text)
        else:
            segments.append((op, text))

    # Between two equal runs, everything removed is shown before everything added.
    removed: list[str] = []
    added: list[str] = []
    for block in Indel.opcodes(left, right):
        if block.tag == "equal":
            add("delete", removed)
            add("insert", added)
            removed, added = [], []
            add("equal", left[block.src_start : block.src_end])
        else:
            removed.extend(left[block.src_start : block.src_end])
            added.extend(right[block.dest_start : block.dest_end])
    add("delete", removed)
    add("insert", added)
    return segments


def _tool_line(call: Any) -> str:
    if not isinstance(call, dict):
        return str(call)
    arguments = json.dumps(call.get("arguments") or {}, sort_keys=True, default=str)
    return f"{call.get('name', '?')}({arguments[:200]})"


def pair_cursor(text: str) -> tuple[int, int]:
    """A `cursor=` value (RANK-ID, as PairPage.next_cursor gives it) read back; ValueError
    with a message naming what is wrong."""
    rank_text, _, pk_text = text.partition("-")
    rank, pk = whole_number(rank_text), whole_number(pk_text)
    if rank is None or pk is None or rank > RANK_OTHER:
        raise ValueError(f"cursor={text!r} is not a page of this comparison (RANK-ID)")
    return rank, pk


def _differing_sql() -> str:
    """Each execution of the run compared (second parameter) ranked against its cell in the
    reference run (first parameter): RANK_* when it differs, -1 when it does not. The
    reference is read by a correlated subquery, one probe of the (run, key) index per
    execution, which the planner keeps whatever its statistics say (an anti-join it chose
    on a fresh run's stale statistics compared every pair of rows: 1,000,000 for two runs
    of 1,000). A verdict is compared as 1 / 0 / -1, null-safely on both databases."""
    table = connection.ops.quote_name(Execution._meta.db_table)
    verdict = "COALESCE(CAST({0}.passed AS INTEGER), -1)"
    return f"""
        SELECT id, rank FROM (
            SELECT compared.id AS id, COALESCE((
                SELECT CASE
                    WHEN {verdict.format("reference")} <> {verdict.format("compared")}
                        THEN CASE WHEN compared.passed THEN {RANK_TO_PASSING}
                            ELSE {RANK_TO_FAILING} END
                    WHEN reference.final_output = compared.final_output
                        AND reference.tool_sequence = compared.tool_sequence THEN -1
                    ELSE {RANK_OTHER} END
                FROM {table} reference
                WHERE reference.run_id = %s AND reference.key = compared.key
            ), {RANK_OTHER}) AS rank
            FROM {table} compared WHERE compared.run_id = %s
        ) ranked WHERE rank >= 0"""  # noqa: S608 (no value of a user's in the text)


def execution_pairs(
    before: Run,
    after: Run,
    *,
    cursor: tuple[int, int] | None = None,
    size: int = EXECUTION_PAIRS_PAGE,
) -> PairPage:
    """A page of the cells of `after` that differ from the same cell of `before`, flipped
    verdicts first, then in run order, from `cursor` (pair_cursor) on, and how many differ:
    two queries (the page's ids and the count, then its rows with their cells in
    `before`), whatever the size of the runs."""
    sql, params = _differing_sql(), [before.pk, after.pk]
    if cursor is not None:
        sql += " AND (rank > %s OR (rank = %s AND id > %s))"
        params += [cursor[0], cursor[0], cursor[1]]
    with connection.cursor() as db:
        # The count comes with the page (a window over every row that differs, before the
        # LIMIT), not from a second pass over the runs.
        db.execute(
            f"SELECT id, rank, COUNT(*) OVER () FROM ({sql}) differing ORDER BY rank, id LIMIT %s",
            [*params, size + 1],
        )
        counted = db.fetchall()
    ranked = [(pk, rank) for pk, rank, _ in counted]
    remaining = counted[0][2] if counted else 0
    more = len(ranked) > size
    ranked = ranked[:size]
    ids = [pk for pk, _ in ranked]
    by_id = {pair.after["pk"]: pair for pair in _pairs(before, Q(pk__in=ids))}
    pairs = [by_id[pk] for pk in ids]
    next_cursor = None
    if more:
        last_id, last_rank = ranked[-1]
        next_cursor = f"{last_rank}-{last_id}"
    return PairPage(pairs=pairs, remaining=remaining, next_cursor=next_cursor)


def execution_pair(before: Run, after: Run, execution_id: int) -> ExecutionPair | None:
    """The execution `execution_id` of `after` beside the same cell of `before` (None when
    `after` has no such execution): one query."""
    found = _pairs(before, Q(pk=execution_id, run_id=after.pk))
    return found[0] if found else None


def _pairs(before: Run, compared: Q) -> list[ExecutionPair]:
    """The executions `compared` selects (none of `before`'s), each beside its cell in
    `before`, in one query: a key of `before`'s rows matches only a selected cell's."""
    keys = Execution.objects.filter(compared).values("key")
    rows = list(
        Execution.objects.filter(compared | Q(run_id=before.pk, key__in=keys))
        .order_by()
        .values(*_PAIR_FIELDS, "run_id")
    )
    old = {row["key"]: row for row in rows if row["run_id"] == before.pk}
    return [_pair(row, old.get(row["key"])) for row in rows if row["run_id"] != before.pk]


def _pair(row: dict[str, Any], reference: dict[str, Any] | None) -> ExecutionPair:
    return ExecutionPair(
        key=row["key"],
        scenario=row["scenario"],
        prompt_index=row["prompt_index"],
        replica=row["replica"],
        before=reference,
        after=row,
    )
