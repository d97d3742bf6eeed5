"""Judge-human agreement read from the daily tallies (ReviewAgreementDay) is what counting
the completed review items themselves gives: after grades, adjudication, undone and
re-given grades, deleted runs, in a time zone whose day is not UTC's, and after migration
0013's backfill of the items completed before it. The reference is the query agreement
was computed with before the tallies (kept here, as `agreement_from_items`)."""

from __future__ import annotations

import importlib
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Abs, Coalesce, Now, TruncDate
from django.utils import timezone

from evaluations import selectors, services
from evaluations.admin import ReviewItemAdmin
from evaluations.agreement import Tally, tally_trend
from evaluations.models import (
    Membership,
    Project,
    ReviewAgreementDay,
    ReviewItem,
    ReviewStatus,
    Role,
    Run,
    Spec,
)
from tests.evaluations.review_world import add_execution, add_judge, make_run

backfill_migration = importlib.import_module("evaluations.migrations.0013_review_agreement_day")


def agreement_from_items(project: Project, *, spec: Spec | None = None) -> list[Any]:
    """Agreement as selectors.review_agreement computed it before the tallies: the database
    counts every completed item's pair per group and day."""
    items = ReviewItem.objects.filter(
        project=project,
        status=ReviewStatus.COMPLETE,
        judge_passed__isnull=False,
        final_passed__isnull=False,
    ).exclude(judge_model="")
    if spec is not None:
        items = items.filter(spec=spec)
    scored = Q(judge_score__isnull=False, final_score__isnull=False)
    rows = (
        items.order_by()
        .annotate(day=TruncDate(Coalesce("completed", Now())))
        .values("judge_model", "criteria", "prompt_version", "day")
        .annotate(
            both_pass=Count("id", filter=Q(judge_passed=True, final_passed=True)),
            both_fail=Count("id", filter=Q(judge_passed=False, final_passed=False)),
            judge_only=Count("id", filter=Q(judge_passed=True, final_passed=False)),
            human_only=Count("id", filter=Q(judge_passed=False, final_passed=True)),
            absolute_error=Sum(Abs(F("judge_score") - F("final_score")), filter=scored),
            scored=Count("id", filter=scored),
        )
    )
    groups: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
    for row in rows:
        tally = Tally(
            row["both_pass"],
            row["both_fail"],
            row["judge_only"],
            row["human_only"],
            float(row["absolute_error"] or 0.0),
            row["scored"],
        )
        groups[(row["judge_model"], row["criteria"], row["prompt_version"])].append(
            (row["day"], tally)
        )
    return [
        selectors.AgreementRow(
            judge_model=model,
            criteria=criteria,
            prompt_version=version,
            agreement=sum((tally for _, tally in daily), Tally()).agreement(),
            trend=tally_trend(daily),
        )
        for (model, criteria, version), daily in sorted(groups.items())
    ]


def comparable(rows: list[Any]) -> list[Any]:
    """The rows as plain values; the summed absolute errors (floats added in another order)
    rounded far below what any page shows."""

    def figures(agreement: Any) -> tuple[Any, ...]:
        mae = None if agreement.mae is None else round(agreement.mae, 12)
        return (
            agreement.n,
            agreement.agreed,
            agreement.both_pass,
            agreement.both_fail,
            agreement.judge_pass_human_fail,
            agreement.judge_fail_human_pass,
            agreement.percent,
            agreement.kappa,
            mae,
            agreement.scored,
        )

    return [
        (
            row.judge_model,
            row.criteria,
            row.prompt_version,
            figures(row.agreement),
            [(p.day, p.added, figures(p.cumulative)) for p in row.trend],
        )
        for row in rows
    ]


def assert_same_agreement(project: Project) -> None:
    new, old = selectors.review_agreement(project), agreement_from_items(project)
    assert comparable(new) == comparable(old)
    for spec in project.specs.all():
        new = selectors.review_agreement(project, spec=spec)
        assert comparable(new) == comparable(agreement_from_items(project, spec=spec))


@pytest.fixture
def project(db: None) -> Project:
    return Project.objects.create(name="Tally", slug="tally")


@pytest.fixture
def people(project: Project, django_user_model: Any) -> dict[str, Any]:
    users = {}
    for name, role in [("r1", Role.REVIEWER), ("r2", Role.REVIEWER), ("boss", Role.ADMIN)]:
        users[name] = django_user_model.objects.create_user(username=name)
        Membership.objects.create(project=project, user=users[name], role=role)
    return users


def at(monkeypatch: pytest.MonkeyPatch, when: datetime) -> None:
    """Grades given from now on are given at `when`."""
    monkeypatch.setattr(timezone, "now", lambda: when)


def judged_run(project: Project, scores: list[float], **options: Any) -> list[ReviewItem]:
    """A finalized run whose judge results (one per execution) are all queued for review."""
    model = options.pop("model", "judge-model-a")
    run = make_run(project, review={"all": True, **options.pop("review", {})}, **options)
    for replica, score in enumerate(scores):
        add_judge(add_execution(run, replica), score=score, model=model, gate=False)
    services.run_finalize(run_id=run.pk)
    return list(ReviewItem.objects.filter(run=run).order_by("id"))


def grade(item: ReviewItem, user: Any, passed: bool, score: float) -> None:
    services.review_submit(item_id=item.pk, user=user, passed=passed, score=score)


def test_grades_over_days_specs_and_judges_give_the_same_agreement_as_the_items(
    project: Project, people: dict[str, Any], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # Days in New York: 03:30 UTC is still the evening before there, as TruncDate counts it.
    settings.TIME_ZONE = "America/New_York"
    first = judged_run(project, [0.9, 0.9, 0.2, 0.2, 0.9, 0.35])
    other = judged_run(project, [0.8, 0.1, 0.75], spec_id="other-spec", model="judge-model-b")
    at(monkeypatch, datetime(2026, 3, 2, 3, 30, tzinfo=UTC))  # 1 March in New York
    for item, (passed, score) in zip(
        first[:3], [(True, 0.95), (False, 0.3), (False, 0.15)], strict=True
    ):
        grade(item, people["r1"], passed, score)
    at(monkeypatch, datetime(2026, 3, 2, 15, 0, tzinfo=UTC))  # 2 March
    grade(first[3], people["r1"], True, 0.6)
    grade(first[4], people["r2"], True, 0.7)
    grade(other[0], people["r1"], False, 0.45)
    at(monkeypatch, datetime(2026, 3, 4, 9, 0, tzinfo=UTC))
    grade(first[5], people["r2"], False, 0.1)
    grade(other[1], people["r2"], True, 0.55)
    grade(other[2], people["r2"], True, 0.9)

    rows = selectors.review_agreement(project)
    assert [(r.judge_model, r.agreement.n) for r in rows] == [
        ("judge-model-a", 6),
        ("judge-model-b", 3),
    ]
    assert [str(p.day) for p in rows[0].trend] == ["2026-03-01", "2026-03-02", "2026-03-04"]
    assert [p.added for p in rows[0].trend] == [3, 2, 1]
    assert_same_agreement(project)


def test_an_undone_grade_is_taken_back_and_a_new_one_counted(
    project: Project, people: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    items = judged_run(project, [0.9, 0.2, 0.4])
    at(monkeypatch, datetime(2026, 3, 2, 12, 0, tzinfo=UTC))
    grade(items[0], people["r1"], True, 0.85)
    grade(items[1], people["r1"], True, 0.8)
    grade(items[2], people["r1"], False, 0.3)
    services.review_undo(item_id=items[1].pk, user=people["r1"])
    [row] = selectors.review_agreement(project)
    assert (row.agreement.n, row.agreement.judge_fail_human_pass) == (2, 0)
    assert_same_agreement(project)

    # Graded again, the other way, on a later day.
    at(monkeypatch, datetime(2026, 3, 3, 12, 0, tzinfo=UTC))
    grade(items[1], people["r1"], False, 0.1)
    assert_same_agreement(project)

    # Every grade of the first day taken back: that day leaves the trend.
    services.review_undo(item_id=items[0].pk, user=people["r1"])
    services.review_undo(item_id=items[2].pk, user=people["r1"])
    [row] = selectors.review_agreement(project)
    assert [(str(p.day), p.added) for p in row.trend] == [("2026-03-03", 1)]
    assert_same_agreement(project)
    services.review_undo(item_id=items[1].pk, user=people["r1"])
    assert selectors.review_agreement(project) == [] == agreement_from_items(project)


def test_adjudicated_items_count_with_the_admins_decision(
    project: Project, people: dict[str, Any]
) -> None:
    review = {"reviewers_per_item": 2, "disagreement": 0.3}
    first, second = judged_run(project, [0.9, 0.2], review=review)
    for item in (first, second):
        grade(item, people["r1"], True, 1.0)
        grade(item, people["r2"], False, 0.0)
    assert selectors.review_agreement(project) == []  # waiting for the admin
    services.review_adjudicate(item_id=first.pk, user=people["boss"], passed=False, score=0.25)
    services.review_adjudicate(item_id=second.pk, user=people["boss"], passed=True, score=0.75)
    [row] = selectors.review_agreement(project)
    assert (row.agreement.judge_pass_human_fail, row.agreement.judge_fail_human_pass) == (1, 1)
    assert row.agreement.mae == pytest.approx((0.65 + 0.55) / 2)
    assert_same_agreement(project)


def test_deleting_a_run_takes_its_graded_items_out_of_agreement(
    project: Project, people: dict[str, Any]
) -> None:
    kept = judged_run(project, [0.9, 0.2])
    deleted = judged_run(project, [0.9, 0.9])
    for item in kept + deleted:
        grade(item, people["r1"], False, 0.2)
    Run.objects.filter(pk=deleted[0].run_id).delete()
    [row] = selectors.review_agreement(project)
    assert (row.agreement.n, row.agreement.both_fail) == (2, 1)
    assert_same_agreement(project)


def graded_history(project: Project, people: dict[str, Any], monkeypatch: Any) -> None:
    """Nine items of two specs graded over three days, one of them reopened."""
    items = judged_run(project, [0.9, 0.2, 0.4, 0.75, 0.1])
    items += judged_run(project, [0.3, 0.95, 0.6, 0.8], spec_id="second", model="judge-b")
    for index, item in enumerate(items):
        at(monkeypatch, datetime(2026, 3, 1 + index % 3, 10, index, tzinfo=UTC))
        grade(item, people["r1"], index % 2 == 0, (index * 0.37) % 1)
    services.review_undo(item_id=items[4].pk, user=people["r1"])


def test_the_migration_backfills_the_tallies_of_items_completed_before_it(
    project: Project, people: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    graded_history(project, people, monkeypatch)
    expected = comparable(selectors.review_agreement(project))
    assert len(expected) == 2
    # As before migration 0013: no tallies.
    ReviewAgreementDay.objects.all().delete()
    assert selectors.review_agreement(project) == []
    monkeypatch.setattr(backfill_migration, "BATCH", 2)  # five batches for nine items
    backfill_migration.backfill(apps, None)
    assert comparable(selectors.review_agreement(project)) == expected
    assert_same_agreement(project)


def test_recount_rebuilds_the_tallies_from_the_items(
    project: Project, people: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    graded_history(project, people, monkeypatch)
    expected = comparable(selectors.review_agreement(project))
    # Items graded without the services (a bulk load): the tallies do not know them yet.
    ReviewItem.objects.filter(status=ReviewStatus.OPEN).update(
        status=ReviewStatus.COMPLETE, final_passed=True, final_score=1.0, completed=Now()
    )
    assert comparable(selectors.review_agreement(project)) == expected
    ReviewAgreementDay.recount(project)
    assert comparable(selectors.review_agreement(project)) != expected
    assert_same_agreement(project)


def test_an_item_changed_in_the_admin_is_counted_as_it_is_now(
    project: Project, people: dict[str, Any], rf: Any
) -> None:
    items = judged_run(project, [0.9, 0.2])
    grade(items[0], people["r1"], True, 1.0)
    item = ReviewItem.objects.get(pk=items[0].pk)
    item.final_passed, item.final_score = False, 0.0  # an operator corrects the grade
    ReviewItemAdmin(ReviewItem, admin.site).save_model(rf.post("/"), item, None, True)
    [row] = selectors.review_agreement(project)
    assert (row.agreement.both_pass, row.agreement.judge_pass_human_fail) == (0, 1)
    assert_same_agreement(project)
