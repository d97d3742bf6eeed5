"""Regressions against the active baselines (each branch against its own, else main's), for
the overview and the regressions report."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import F, Max
from django.db.models.fields.json import KeyTransform
from django.utils.text import slugify

from checks.compare import p_drop
from evaluations.models import (
    DEFAULT_BASELINE_BRANCH,
    Baseline,
    Project,
    Run,
    RunStatus,
)

#
# A baseline's `data["groups"]` holds (scenario x prompt) groups in the shape of a run
# summary's `groups` (RunSummary.to_dict: key, scenario, prompt_index, passed, status,
# pass_at_1, ...); a mapping of key -> group is read too. A group *regressed* when it passed
# in the baseline and does not pass in the spec's latest completed run. Groups that are new
# or gone are not regressions. Nothing here reads executions.


@dataclass(frozen=True, slots=True)
class Regression:
    """A group (or an invariant x scenario cell) whose verdict changed between the active
    baseline and the spec's latest completed run: a regression, or an improvement."""

    spec_slug: str
    baseline_name: str
    run_id: int
    group: str
    baseline_pass_rate: float | None
    current_pass_rate: float | None
    current_status: str
    failure_codes: list[str]
    # Replicas that passed of those that ran, in the baseline and now, and Fisher's exact
    # one-sided p-value of the change (checks.compare); None where a side has no counts.
    baseline_counts: str = ""
    current_counts: str = ""
    p_value: float | None = None
    # Set for an invariant x scenario cell (the report's per-invariant rows); a group's
    # scenario is read from its summary entry.
    invariant: str = ""
    scenario: str = ""
    prompt_index: int | None = None
    # The run's, as the report shows them (its branch label as stored: "" is main).
    run_branch: str = ""
    run_finished: datetime | None = None
    run_labels: dict[str, Any] | None = None

    @property
    def compare_anchor(self) -> str:
        """The id of this change's row on the compare page (templates/runs/run_compare.html)."""
        return change_anchor("invariant" if self.invariant else "group", self.group)


@functools.lru_cache(maxsize=4096)
def change_anchor(kind: str, key: str) -> str:
    # Cached: the report slugifies every row's key, and the same few keys recur per spec.
    return f"change-{kind}-{slugify(key)}"


def group_key(group: dict[str, Any]) -> str:
    """A group's identity, as ReplicaAggregate.key writes it (for data stored without one)."""
    if group.get("key"):
        return str(group["key"])
    label = f"{group.get('scenario', 'no-chaos')} / prompt {group.get('prompt_index', 0)}"
    if group.get("mutation_type"):
        label += f" / {group['mutation_type']}"
    pillar = group.get("pillar") or "contract"
    return label if pillar in ("contract", "chaos") else f"{pillar}: {label}"


def groups_by_key(groups: Any) -> dict[str, dict[str, Any]]:
    if isinstance(groups, dict):
        return {str(k): {"key": str(k), **v} for k, v in groups.items() if isinstance(v, dict)}
    if isinstance(groups, list):
        return {group_key(g): g for g in groups if isinstance(g, dict)}
    return {}


def group_passed(group: dict[str, Any]) -> bool:
    if "passed" in group:
        return bool(group["passed"])
    rate = _group_pass_rate(group)
    return rate is not None and rate >= 1.0


def _group_pass_rate(group: dict[str, Any]) -> float | None:
    for name in ("pass_rate", "pass_at_1"):
        if isinstance(group.get(name), int | float):
            return float(group[name])
    return None


def _counts_and_p(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    def counts(group: dict[str, Any]) -> tuple[int, int] | None:
        c, n = group.get("c"), group.get("n")
        return (int(c), int(n)) if isinstance(c, int) and isinstance(n, int) and n else None

    before, after = counts(old), counts(new)
    if before is None or after is None:
        return {}
    drop = after[0] / after[1] < before[0] / before[1]
    p = p_drop(*before, *after) if drop else p_drop(*after, *before)
    return {
        "baseline_counts": f"{before[0]}/{before[1]}",
        "current_counts": f"{after[0]}/{after[1]}",
        "p_value": p,
    }


def project_regressions(project: Project) -> list[Regression]:
    """Every regression of every spec that has an active baseline: two queries."""
    return project_group_changes(project)[0]


def _latest_per_branch(project: Project, *, cells: bool) -> list[dict[str, Any]]:
    """Each (spec, branch) of the project's specs with an active baseline: the baseline that
    branch compares with (its own, else main's, as active_baseline_for decides), its group
    verdicts (and with `cells` its cells') as `compared`, and the branch's latest completed
    run with the same (as `run`). Runs with no branch label are main's. Two
    queries: the baselines, then the latest runs (found by a subquery, from
    run_spec_recent_idx)."""
    baselines = {
        (b["spec_id"], b["branch"]): {**b, "compared": _parts(b["compared"], cells=cells)}
        for b in Baseline.objects.filter(project=project, active=True)
        .annotate(compared=_verdicts_read(cells=cells))
        .values("name", "spec_id", "spec__slug", "branch", "run_id", "compared")
    }
    latest_ids = (
        Run.objects.filter(
            project=project,
            status=RunStatus.COMPLETED,
            spec_id__in={spec_id for spec_id, _ in baselines},
        )
        .values("spec_id", "branch")
        .annotate(latest_run_id=Max("id"))  # ids grow with creation: the newest run
        .values("latest_run_id")
    )
    latest = (
        Run.objects.filter(pk__in=latest_ids)
        .annotate(compared=_verdicts_read(cells=cells))
        .order_by()
        .values("id", "spec_id", "branch", "finished", "labels", "compared")
    )
    pairs: dict[tuple[int, str], dict[str, Any]] = {}
    for run in latest:
        run["compared"] = _parts(run["compared"], cells=cells)
        branch = run["branch"] or DEFAULT_BASELINE_BRANCH
        baseline = baselines.get((run["spec_id"], branch)) or baselines.get(
            (run["spec_id"], DEFAULT_BASELINE_BRANCH)
        )
        if baseline is None:
            continue  # only a branch has a baseline, and this is another branch
        scope = (run["spec_id"], branch)  # an unlabelled run and `main` are one scope
        if scope not in pairs or pairs[scope]["run"]["id"] < run["id"]:
            pairs[scope] = {**baseline, "run": run}
    return sorted(pairs.values(), key=lambda p: (p["spec__slug"], p["run"]["id"]))


def _verdicts_read(*, cells: bool) -> F | KeyTransform:
    """What is read of a run's or baseline's `verdicts`: with `cells` (the report's
    per-invariant rows) the whole of it, groups and cells, read at once (each part read
    apart unpacked the stored JSON once a part); without, its groups alone (the overview's).
    Made a mapping of part to list by _parts."""
    return F("verdicts") if cells else KeyTransform("groups", "verdicts")


def _parts(read: Any, *, cells: bool) -> dict[str, Any]:
    return (read or {}) if cells else {"groups": read}


def project_group_changes(
    project: Project, *, cells: bool = False
) -> tuple[list[Regression], list[Regression]]:
    """(regressions, improvements): groups that passed in the active baseline and do not
    pass in the latest completed run, and groups that failed there and pass now; per branch,
    each branch's latest run against its branch's baseline (else main's). With `cells`, the
    invariant x scenario cells of the matrix too (the report's per-invariant rows)."""
    baselines = _latest_per_branch(project, cells=cells)
    parts = ("groups", "cells") if cells else ("groups",)
    regressions: list[Regression] = []
    improvements: list[Regression] = []
    for baseline in baselines:
        run = baseline["run"]
        if run["id"] == baseline["run_id"]:
            continue  # nothing ran since the baseline was taken
        for part in parts:
            before = _by_key(baseline["compared"].get(part))
            after = _by_key(run["compared"].get(part))
            for key, old in before.items():
                new = after.get(key)
                if new is None or group_passed(old) == group_passed(new):
                    continue
                changed = regressions if group_passed(old) else improvements
                changed.append(
                    Regression(
                        spec_slug=baseline["spec__slug"],
                        baseline_name=baseline["name"],
                        run_id=run["id"],
                        group=key,
                        baseline_pass_rate=_group_pass_rate(old),
                        current_pass_rate=_group_pass_rate(new),
                        current_status=str(new.get("status") or "fail"),
                        failure_codes=[str(c) for c in new.get("failure_codes") or []],
                        invariant=str(new.get("invariant_id") or ""),
                        scenario=str(new.get("scenario") or ""),
                        prompt_index=new.get("prompt_index"),
                        run_branch=run["branch"],
                        run_finished=run["finished"],
                        run_labels=run["labels"],
                        **_counts_and_p(old, new),
                    )
                )
    return regressions, improvements


def _by_key(verdicts: Any) -> dict[str, dict[str, Any]]:
    return {v["key"]: v for v in verdicts or [] if isinstance(v, dict) and "key" in v}


# What the comparison above reads of a group or cell; the rest (invariant scores, execution
# ids, outputs, latency) is what made a summary's groups and matrix ~26 kB.
_COMPARED = ("status", "failure_codes", "c", "n", "invariant_id", "scenario", "prompt_index")


def compared_verdicts(summary: Any) -> dict[str, list[dict[str, Any]]]:
    """The groups and the invariant x scenario cells of a run summary (or of a baseline's
    data) as the regressions comparison reads them, in their order: key, passed, pass rate,
    status, failure codes, counts, invariant, scenario and prompt. What Run.verdicts and
    Baseline.verdicts store; migration 0015 has a copy of this for the rows before it."""
    summary = summary if isinstance(summary, dict) else {}

    def verdict(key: str, item: dict[str, Any]) -> dict[str, Any]:
        entry: dict[str, Any] = {"key": key, "passed": group_passed(item)}
        rate = _group_pass_rate(item)
        if rate is not None:
            entry["pass_rate"] = rate
        entry.update({name: item[name] for name in _COMPARED if item.get(name) is not None})
        return entry

    return {
        "groups": [verdict(k, g) for k, g in groups_by_key(summary.get("groups")).items()],
        "cells": [verdict(k, c) for k, c in cells_by_key(summary.get("matrix")).items()],
    }


def cells_by_key(matrix: Any) -> dict[str, dict[str, Any]]:
    """A summary's invariant x scenario cells by `invariant @ scenario`, with their result
    counts as `c` of `n` (what the Fisher test and the pass rate read)."""
    cells: dict[str, dict[str, Any]] = {}
    for cell in matrix if isinstance(matrix, list) else []:
        if not isinstance(cell, dict) or not cell.get("invariant_id"):
            continue
        passed, total = cell.get("results_passed"), cell.get("results_total")
        counts = {}
        if isinstance(passed, int) and isinstance(total, int) and total:
            counts = {"c": passed, "n": total, "pass_rate": passed / total}
        cells[f"{cell['invariant_id']} @ {cell.get('scenario', '')}"] = {**cell, **counts}
    return cells


def summary_failing_keys(summary: Any) -> dict[str, list[str]]:
    """The keys of a run summary's groups and invariant x scenario cells that did not pass
    (failed or flaky), as Run.failing_keys stores them; migration 0015 has a copy of this
    for the runs finalized before it."""
    summary = summary if isinstance(summary, dict) else {}
    groups = groups_by_key(summary.get("groups"))
    cells = cells_by_key(summary.get("matrix"))
    return {
        "groups": sorted(key for key, group in groups.items() if not group_passed(group)),
        "cells": sorted(key for key, cell in cells.items() if not group_passed(cell)),
    }


def project_has_baseline(project: Project) -> bool:
    """Whether any spec of the project has an active baseline to compare runs with."""
    return Baseline.objects.filter(project=project, active=True).exists()
