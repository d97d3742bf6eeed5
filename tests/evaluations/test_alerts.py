"""Alert rules: the condition grammar, and rule evaluation on hand-built run histories
(each window, each operator, each metric, the any_regression event, scopes), and firings
created once per (rule, run, channel) when a run finalises."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import strategies as st

from evaluations import services
from evaluations.models import AlertFiring, AlertRule, ChannelKind, FiringStatus, Project
from evaluations.selectors.alerts import (
    METRICS,
    OPERATORS,
    AlertConditionError,
    parse_condition,
    rule_value,
)
from tests.evaluations.alert_history import (
    FAILING,
    NOW,
    PASSING,
    baseline_of,
    drift_result,
    finished_run,
    open_review_item,
    spec_in,
)

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


# --- The condition grammar ---------------------------------------------------------------


@pytest.mark.parametrize("op", list(OPERATORS))
def test_every_operator_parses(op: str) -> None:
    condition = parse_condition(f"pass_rate {op} 0.9")
    assert (condition.metric, condition.op, condition.threshold) == ("pass_rate", op, 0.9)


@given(
    metric=st.sampled_from(METRICS),
    op=st.sampled_from(list(OPERATORS)),
    threshold=st.floats(allow_nan=False, allow_infinity=False, width=32),
)
def test_a_condition_reads_back_what_it_prints(metric: str, op: str, threshold: float) -> None:
    condition = parse_condition(f"{metric}{op}{threshold!r}")
    assert parse_condition(str(condition)) == condition


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("pass_rat < 0.9", "unknown metric 'pass_rat'"),
        ("pass_rate =< 0.9", "unknown operator '=<'"),
        ("cost_usd <> 3", "unknown operator '<>'"),
        ("pass_rate < ninety", "value 'ninety'"),
        ("any_regression > 0", "'any_regression' is an event"),
        ("pass_rate", "is not `<metric> <op> <value>`"),
        ("   ", "condition is empty"),
    ],
)
def test_a_bad_condition_is_refused_naming_the_bad_part(text: str, named: str) -> None:
    with pytest.raises(AlertConditionError, match=named.replace("(", r"\(")):
        parse_condition(text)


def test_the_refusal_lists_what_is_allowed() -> None:
    with pytest.raises(AlertConditionError) as refused:
        parse_condition("latency > 3")
    assert "p95_latency_ms" in str(refused.value) and "any_regression" in str(refused.value)


def test_creating_a_rule_with_a_bad_condition_says_which_field(project: Project) -> None:
    with pytest.raises(services.AlertError, match=r"^condition: unknown metric 'flakiness'"):
        services.alert_rule_create(project=project, name="r", condition="flakiness > 0.1")
    with pytest.raises(services.AlertError, match=r"^window 'last_month'"):
        services.alert_rule_create(
            project=project, name="r", condition="pass_rate < 1", window="last_month"
        )
    with pytest.raises(services.AlertError, match=r"^specs: no spec nope"):
        services.alert_rule_create(
            project=project, name="r", condition="pass_rate < 1", specs=["nope"]
        )
    assert not AlertRule.objects.exists()


# --- Values over windows -------------------------------------------------------------------


def _rule(project: Project, condition: str, window: str = "last_run", **scope: Any) -> AlertRule:
    return services.alert_rule_create(
        project=project, name=f"{condition} {window}", condition=condition, window=window, **scope
    )


def _value(rule: AlertRule, run: Any) -> float | None:
    return rule_value(rule, parse_condition(rule.condition), run)


@pytest.fixture
def history(project: Project) -> list[Any]:
    """Seven runs, one every 12 hours up to NOW; pass rates 0.3 .. 0.9, oldest first."""
    spec = spec_in(project)
    return [
        finished_run(
            spec,
            finished=NOW - timedelta(hours=12 * (6 - i)),
            pass_rate=0.3 + 0.1 * i,
            cost_usd=1.0 + i,
            p95_duration_ms=100.0 * (i + 1),
        )
        for i in range(7)
    ]


@pytest.mark.parametrize(
    ("window", "pass_rates"),
    [
        ("last_run", [0.9]),
        ("last_5_runs", [0.5, 0.6, 0.7, 0.8, 0.9]),
        # finished after NOW - 24 h: the runs at -12 h and now (the one at -24 h is out).
        ("last_24h", [0.8, 0.9]),
        ("last_7d", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]),
    ],
)
def test_each_window_averages_the_pass_rate_of_its_runs(
    project: Project, history: list[Any], window: str, pass_rates: list[float]
) -> None:
    rule = _rule(project, "pass_rate < 0.95", window)
    assert _value(rule, history[-1]) == pytest.approx(sum(pass_rates) / len(pass_rates))


def test_a_window_ends_at_the_run_evaluated_not_at_the_newest(
    project: Project, history: list[Any]
) -> None:
    rule = _rule(project, "pass_rate < 0.95", "last_5_runs")
    # As of the fifth run: runs 1..5 (0.3 .. 0.7), not the two that came later.
    assert _value(rule, history[4]) == pytest.approx(0.5)


def test_cost_is_summed_and_latency_is_the_worst_run(project: Project, history: list[Any]) -> None:
    assert _value(_rule(project, "cost_usd > 10", "last_24h"), history[-1]) == 6.0 + 7.0
    assert _value(_rule(project, "p95_latency_ms > 500", "last_5_runs"), history[-1]) == 700.0


@pytest.mark.parametrize(
    ("metric", "column", "values", "expected"),
    [
        ("pass_rate", "pass_rate", [0.5, 1.0], 0.75),
        ("resilience", "resilience", [0.2, 0.4], 0.3),
        ("overall", "overall", [0.6, 0.8], 0.7),
        ("judge_mean", "judge_mean", [0.9, None], 0.9),  # a run with no judge is not a zero
        ("cost_usd", "cost_usd", [0.25, 0.5], 0.75),
        ("p95_latency_ms", "p95_duration_ms", [1200.0, 800.0], 1200.0),
    ],
)
def test_each_run_metric_over_two_runs(
    project: Project, metric: str, column: str, values: list[Any], expected: float
) -> None:
    spec = spec_in(project)
    runs = [
        finished_run(spec, finished=NOW - timedelta(hours=i), **{column: value})
        for i, value in enumerate(values)
    ]
    rule = _rule(project, f"{metric} > 0", "last_5_runs")
    assert _value(rule, runs[0]) == pytest.approx(expected)


def test_drift_max_is_the_worst_measured_drift(project: Project) -> None:
    spec = spec_in(project)
    older = finished_run(spec, finished=NOW - timedelta(hours=1))
    latest = finished_run(spec, finished=NOW)
    drift_result(older, 0.6)  # drift 0.4
    drift_result(latest, 0.9)  # drift 0.1
    drift_result(latest, 0.0, flag="no_baseline")  # measured nothing: not a drift of 1.0
    assert _value(_rule(project, "drift_max > 0.3", "last_run"), latest) == pytest.approx(0.1)
    assert _value(_rule(project, "drift_max > 0.3", "last_24h"), latest) == pytest.approx(0.4)


def test_review_backlog_counts_open_items_of_the_rules_specs(project: Project) -> None:
    run = finished_run(spec_in(project), finished=NOW)
    other = finished_run(spec_in(project, "other-spec"), finished=NOW)
    open_review_item(run)
    open_review_item(run)
    done = open_review_item(other)
    assert _value(_rule(project, "review_backlog > 1"), run) == 3.0
    scoped = _rule(project, "review_backlog >= 2", specs=["refund-agent"])
    assert _value(scoped, run) == 2.0
    done.status = "complete"
    done.save()
    assert _value(_rule(project, "review_backlog > 5", "last_7d"), run) == 2.0


def test_any_regression_counts_groups_that_passed_in_the_baseline(project: Project) -> None:
    spec = spec_in(project)
    reference = finished_run(spec, finished=NOW - timedelta(days=2), groups=PASSING)
    baseline_of(spec, reference, PASSING)
    regressed = finished_run(spec, finished=NOW, groups=FAILING)
    rule = _rule(project, "any_regression")
    assert _value(rule, regressed) == 1.0
    assert parse_condition(rule.condition).holds(1.0)
    recovered = finished_run(spec, finished=NOW + timedelta(hours=1), groups=PASSING)
    assert _value(rule, recovered) == 0.0


@pytest.mark.parametrize(
    ("op", "fires"),
    [("<", False), ("<=", True), (">", False), (">=", True), ("==", True), ("!=", False)],
)
def test_each_operator_against_a_value_equal_to_the_threshold(
    project: Project, op: str, fires: bool
) -> None:
    run = finished_run(spec_in(project), finished=NOW, pass_rate=0.5)
    condition = parse_condition(f"pass_rate {op} 0.5")
    rule = _rule(project, str(condition))
    assert condition.holds(_value(rule, run)) is fires


def test_a_window_with_nothing_to_measure_never_fires(project: Project) -> None:
    run = finished_run(spec_in(project), finished=NOW, judge_mean=None)
    condition = parse_condition("judge_mean < 0.5")
    assert _value(_rule(project, "judge_mean < 0.5"), run) is None
    assert not condition.holds(None)


# --- Firings -------------------------------------------------------------------------------


def _channel(project: Project, name: str = "ops") -> Any:
    return services.alert_channel_create(
        project=project, name=name, kind=ChannelKind.EMAIL, target="ops@example.com"
    )


def test_rules_fire_only_within_their_spec_and_branch_scope(project: Project) -> None:
    channel = _channel(project)
    spec, other = spec_in(project), spec_in(project, "other-spec")
    services.alert_rule_create(
        project=project,
        name="main only",
        condition="pass_rate < 0.9",
        specs=["refund-agent"],
        branches=["main"],
        channel_ids=[channel.pk],
    )
    on_feature = finished_run(spec, finished=NOW, branch="feature", pass_rate=0.1)
    other_spec = finished_run(other, finished=NOW, branch="main", pass_rate=0.1)
    on_main = finished_run(spec, finished=NOW, branch="main", pass_rate=0.1)
    assert services.alerts_evaluate(run_id=on_feature.pk) == []
    assert services.alerts_evaluate(run_id=other_spec.pk) == []
    assert len(services.alerts_evaluate(run_id=on_main.pk)) == 1
    # The feature run's bad pass rate is outside the scope, so the main window is 0.1 only.
    assert AlertFiring.objects.get().value == pytest.approx(0.1)


def test_a_run_evaluated_twice_fires_once_per_channel(project: Project) -> None:
    first, second = _channel(project, "a"), _channel(project, "b")
    services.alert_rule_create(
        project=project,
        name="low",
        condition="pass_rate < 0.9",
        channel_ids=[first.pk, second.pk],
    )
    run = finished_run(spec_in(project), finished=NOW, pass_rate=0.5)
    assert len(services.alerts_evaluate(run_id=run.pk)) == 2
    AlertFiring.objects.filter(channel=first).update(status=FiringStatus.DELIVERED)
    assert services.alerts_evaluate(run_id=run.pk) == [AlertFiring.objects.get(channel=second).pk]
    assert AlertFiring.objects.count() == 2
    firing = AlertFiring.objects.get(channel=first)
    assert "pass_rate = 0.5" in firing.message and f"run #{run.pk}" in firing.message
    # The database itself refuses a second firing for the same rule, run and channel.
    with pytest.raises(IntegrityError), transaction.atomic():
        AlertFiring.objects.create(
            project=project,
            rule=firing.rule,
            run=run,
            channel=first,
            idempotency_key="another-key",
        )


def test_a_disabled_rule_or_a_passing_condition_creates_nothing(project: Project) -> None:
    channel = _channel(project)
    rule = services.alert_rule_create(
        project=project, name="low", condition="pass_rate < 0.9", channel_ids=[channel.pk]
    )
    good = finished_run(spec_in(project), finished=NOW, pass_rate=0.95)
    assert services.alerts_evaluate(run_id=good.pk) == []
    rule.enabled = False
    rule.save()
    bad = finished_run(spec_in(project), finished=NOW + timedelta(hours=1), pass_rate=0.1)
    assert services.alerts_evaluate(run_id=bad.pk) == []
    assert not AlertFiring.objects.exists()


def test_evaluating_a_run_reads_none_of_its_large_columns(project: Project) -> None:
    """A rule reads the run's stored figures: its summary (~0.5 kB of JSON per scenario x prompt),
    verdicts and keys are not read, whatever the run's size."""
    services.alert_rule_create(
        project=project, name="low", condition="pass_rate < 0.9", channel_ids=[_channel(project).pk]
    )
    run = finished_run(spec_in(project), finished=NOW, pass_rate=0.5)
    with CaptureQueriesContext(connection) as queries:
        assert len(services.alerts_evaluate(run_id=run.pk)) == 1
    read = " ".join(q["sql"] for q in queries.captured_queries)
    large = ['"evaluations_run"."summary"', '"evaluations_run"."verdicts"']
    assert '"evaluations_run"' in read
    assert [column for column in large if column in read] == []
