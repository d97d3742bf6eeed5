"""Reads for alert rules: the condition grammar, and a rule's value over its window as of
one run.

A condition is `<metric> <op> <value>` (`pass_rate < 0.9`, `cost_usd >= 5`) or the event
`any_regression`. Over a window of several runs a metric is reduced the way a lead reads
it: rates and scores are averaged, cost is summed (the spend of the window), drift and
p95 latency take the worst run. `review_backlog` is the number of review items not yet
complete for the rule's specs now, whatever the window.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import F, Max, Q, QuerySet

from checks.results import ERROR_CODES
from evaluations.models import (
    AlertFiring,
    AlertRule,
    AlertWindow,
    CheckResult,
    ReviewItem,
    ReviewStatus,
    Run,
    RunStatus,
)


class AlertConditionError(ValueError):
    """A condition that cannot be read; the message names the part that is wrong."""


OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}

# metric -> (Run field, reducer over the window); drift and backlog are not Run fields.
RUN_METRICS: dict[str, tuple[str, str]] = {
    "pass_rate": ("pass_rate", "mean"),
    "resilience": ("resilience", "mean"),
    "overall": ("overall", "mean"),
    "judge_mean": ("judge_mean", "mean"),
    "cost_usd": ("cost_usd", "sum"),
    "p95_latency_ms": ("p95_duration_ms", "max"),
}
METRICS = (*RUN_METRICS, "drift_max", "review_backlog")
EVENTS = ("any_regression",)

WINDOW_RUNS = {AlertWindow.LAST_RUN: 1, AlertWindow.LAST_5_RUNS: 5}
WINDOW_PERIOD = {AlertWindow.LAST_24H: timedelta(hours=24), AlertWindow.LAST_7D: timedelta(days=7)}

_CONDITION = re.compile(r"^\s*(?P<metric>[A-Za-z_][\w]*)\s*(?P<op>[<>=!]+)\s*(?P<value>\S+)\s*$")


@dataclass(frozen=True, slots=True)
class Condition:
    """An alert rule's condition, parsed: a metric compared with a threshold, or an event."""

    metric: str
    op: str = ">"
    threshold: float = 0.0

    @property
    def is_event(self) -> bool:
        return self.metric in EVENTS

    def holds(self, value: float | None) -> bool:
        return value is not None and OPERATORS[self.op](value, self.threshold)

    def __str__(self) -> str:
        if self.is_event:
            return self.metric
        # repr keeps every digit (`:g` would round 1000001 to 1e+06); "5.0" reads as "5".
        number = repr(self.threshold).removesuffix(".0")
        return f"{self.metric} {self.op} {number}"


def parse_condition(text: str) -> Condition:
    """`pass_rate < 0.9` -> Condition; refuses what it cannot read, saying what and where."""
    stripped = (text or "").strip()
    if not stripped:
        raise AlertConditionError("condition is empty: write `<metric> <op> <value>`")
    if stripped in EVENTS:
        return Condition(metric=stripped)
    match = _CONDITION.match(stripped)
    if match is None:
        raise AlertConditionError(
            f"condition {stripped!r} is not `<metric> <op> <value>` (e.g. `pass_rate < 0.9`)"
        )
    metric, op, value = match["metric"], match["op"], match["value"]
    if metric in EVENTS:
        raise AlertConditionError(f"{metric!r} is an event: write it alone, with no comparison")
    if metric not in METRICS:
        raise AlertConditionError(
            f"unknown metric {metric!r} in condition {stripped!r}: use one of "
            + ", ".join((*METRICS, *EVENTS))
        )
    if op not in OPERATORS:
        raise AlertConditionError(
            f"unknown operator {op!r} in condition {stripped!r}: use one of " + " ".join(OPERATORS)
        )
    try:
        threshold = float(value)
    except ValueError:
        raise AlertConditionError(
            f"value {value!r} in condition {stripped!r} is not a number"
        ) from None
    return Condition(metric=metric, op=op, threshold=threshold)


def rule_applies(rule: AlertRule, run: Run) -> bool:
    """Whether the run's spec and branch are in the rule's scope."""
    specs, branches = rule.specs or [], rule.branches or []
    return (not specs or run.spec.slug in specs) and (not branches or run.branch in branches)


def _scoped_runs(rule: AlertRule) -> QuerySet[Run]:
    runs = Run.objects.filter(
        project_id=rule.project_id, status=RunStatus.COMPLETED, finished__isnull=False
    )
    if rule.specs:
        runs = runs.filter(spec__slug__in=rule.specs)
    if rule.branches:
        runs = runs.filter(branch__in=rule.branches)
    return runs


def window_run_ids(rule: AlertRule, run: Run) -> list[int]:
    """The completed runs in scope that the window covers, as of `run` finishing (so a late
    evaluation gives the answer it would have given at the time)."""
    assert run.finished is not None, "only finished runs are evaluated"
    runs = _scoped_runs(rule).filter(finished__lte=run.finished)
    window = AlertWindow(rule.window)
    if window in WINDOW_PERIOD:
        runs = runs.filter(finished__gt=run.finished - WINDOW_PERIOD[window])
        return list(runs.order_by("-finished", "-id").values_list("id", flat=True))
    return list(
        runs.order_by("-finished", "-id").values_list("id", flat=True)[: WINDOW_RUNS[window]]
    )


def _reduce(values: Iterable[float | None], how: str) -> float | None:
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    if how == "sum":
        return sum(present)
    if how == "max":
        return max(present)
    return sum(present) / len(present)


def _drift_max(run_ids: list[int]) -> float | None:
    # As the drift_score_max gate measures it: drift checks that measured something.
    drift = (
        CheckResult.objects.filter(run_id__in=run_ids, check_type="drift")
        .exclude(failure_code__in=[code.value for code in ERROR_CODES])
        # Written as an OR: a NOT on a JSON key is NULL (so excluded) where the key is absent.
        .filter(Q(details__flag__isnull=True) | ~Q(details__flag="no_baseline"))
        .aggregate(worst=Max(1.0 - F("score")))
    )
    return drift["worst"]


def review_backlog(rule: AlertRule) -> int:
    items = ReviewItem.objects.filter(project_id=rule.project_id).exclude(
        status=ReviewStatus.COMPLETE
    )
    if rule.specs:
        items = items.filter(spec__slug__in=rule.specs)
    return items.count()


def rule_value(rule: AlertRule, condition: Condition, run: Run) -> float | None:
    """The measured value of the rule's metric over its window as of `run`; None when the
    window holds nothing to measure (a rule never fires on no data)."""
    if condition.metric == "review_backlog":
        return float(review_backlog(rule))
    run_ids = window_run_ids(rule, run)
    if not run_ids:
        return None
    if condition.metric == "any_regression":
        from evaluations.selectors.reports import regressions_in_runs

        return float(len(regressions_in_runs(rule.project, run_ids)))
    if condition.metric == "drift_max":
        return _drift_max(run_ids)
    field, how = RUN_METRICS[condition.metric]
    values = Run.objects.filter(pk__in=run_ids).values_list(field, flat=True)
    return _reduce(values, how)


def project_alert_rules(project_id: int) -> list[AlertRule]:
    return list(
        AlertRule.objects.filter(project_id=project_id)
        .prefetch_related("channels")
        .order_by("name")
    )


def project_alert_firings(project_id: int, limit: int = 50) -> list[AlertFiring]:
    """The newest firings, with the names of their rule and channel and their run's spec:
    only those of the joined rows (a run's summary alone is ~0.5 kB per scenario x prompt, and the
    channel's secret has no business here)."""
    return list(
        AlertFiring.objects.filter(project_id=project_id)
        .select_related("rule", "channel", "run__spec")
        .only(
            *(f.name for f in AlertFiring._meta.concrete_fields),
            "rule__name",
            "channel__name",
            "run__spec__slug",
        )
        .order_by("-created", "-id")[:limit]
    )
