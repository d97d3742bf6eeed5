"""Two runs of a spec side by side: the reference a run is compared with (its spec's active
baseline, or a run named), and the statistical verdicts of checks.compare."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rapidfuzz.distance import Indel

from checks.compare import DEFAULT_ALPHA, Comparison, StoredSummary, compare_summaries
from checks.report_model import RunSummary
from checks.scoring import score_run
from checks.spec.model import Spec as EngineSpec
from evaluations.models import RUN_TERMINAL_STATUSES, Execution, Run
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
        try:
            before_id = int(against)
        except ValueError:
            raise ComparisonRefused(
                f"compare against 'baseline' or a run id, not {against!r}"
            ) from None
    before = Run.objects.select_related("spec", "spec_version").filter(pk=before_id).first()
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
    run_finalize stored (rescored after every review), else scored from the stored results."""

    def summary(run: Run) -> RunSummary | StoredSummary:
        if run.summary.get("matrix") is not None and run.summary.get("groups") is not None:
            return StoredSummary.from_dict(run.summary)
        return score_run(EngineSpec.from_dict(run.spec_version.parsed), run_records(run))

    return compare_summaries(summary(before), summary(after), alpha=alpha)


# --- Executions side by side --------------------------------------------------------------
# Per execution cell (the same Execution.key: scenario, prompt, replica) the two outputs
# diffed word by word and the two tool-call sequences. Only cells that differ are shown,
# at most EXECUTION_PAIRS_MAX, so two runs of 1,000 executions stay quick to render.

EXECUTION_PAIRS_MAX = 200
_TOKEN = re.compile(r"\s+|[^\s]+")
_PAIR_FIELDS = ("pk", "key", "scenario", "prompt_index", "replica", "passed", "composite")


@dataclass(slots=True)
class ExecutionPair:
    key: str
    scenario: str
    prompt_index: int
    replica: int
    before: dict[str, Any] | None
    after: dict[str, Any]
    diff: list[tuple[str, str]]  # (equal | delete | insert, text), word by word
    tools_before: list[str]
    tools_after: list[str]

    @property
    def output_changed(self) -> bool:
        return any(op != "equal" for op, _ in self.diff)

    @property
    def tools_changed(self) -> bool:
        return self.tools_before != self.tools_after

    @property
    def verdict_changed(self) -> bool:
        return self.before is not None and self.before["passed"] != self.after["passed"]


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


def execution_pairs(
    before: Run, after: Run, *, limit: int = EXECUTION_PAIRS_MAX
) -> list[ExecutionPair]:
    """The cells of `after` whose output, tool calls or verdict differ from the same cell of
    `before`, worst first (a verdict that flipped), at most `limit`: two queries."""
    fields = (*_PAIR_FIELDS, "final_output", "tool_sequence")
    old = {row["key"]: row for row in Execution.objects.filter(run=before).values(*fields)}
    pairs = []
    for row in Execution.objects.filter(run=after).order_by("id").values(*fields):
        reference = old.get(row["key"])
        tools_after = [_tool_line(c) for c in row["tool_sequence"] or []]
        tools_before = [_tool_line(c) for c in (reference or {}).get("tool_sequence") or []]
        same = (
            reference is not None
            and reference["final_output"] == row["final_output"]
            and tools_before == tools_after
            and reference["passed"] == row["passed"]
        )
        if same:
            continue
        pairs.append(
            ExecutionPair(
                key=row["key"],
                scenario=row["scenario"],
                prompt_index=row["prompt_index"],
                replica=row["replica"],
                before=reference,
                after=row,
                diff=word_diff(reference["final_output"] if reference else "", row["final_output"]),
                tools_before=tools_before,
                tools_after=tools_after,
            )
        )
    # A verdict that flipped to failing first, then any flip, then the rest in run order.
    pairs.sort(
        key=lambda p: (not (p.verdict_changed and not p.after["passed"]), not p.verdict_changed)
    )
    return pairs[:limit]
