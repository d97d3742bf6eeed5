"""The review queue's services on real PostgreSQL: which judge results are queued, claims
and their expiry, reviewers_per_item enforced by the database (also under concurrent
grades), blind items, overrides that rescore the execution and the run (gates included),
the history of changes, and the judge_human_kappa_min gate."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from evaluations import selectors, services
from evaluations.models import (
    CheckResult,
    Execution,
    ExecutionStatus,
    Membership,
    Project,
    ResultChange,
    ReviewItem,
    ReviewReason,
    ReviewStatus,
    ReviewVerdict,
    Role,
    Run,
)
from tests.evaluations.review_world import (
    JUDGE_MODEL,
    add_check,
    add_execution,
    add_judge,
    make_run,
)


@pytest.fixture
def project(db: None) -> Project:
    return Project.objects.create(name="Review", slug="review")


@pytest.fixture
def people(project: Project, django_user_model: Any) -> dict[str, Any]:
    """One user per role in the project, plus an outsider."""
    users = {}
    for role in ("viewer", "reviewer", "reviewer2", "reviewer3", "admin"):
        user = django_user_model.objects.create_user(username=role)
        Membership.objects.create(project=project, user=user, role=Role(role.rstrip("23")))
        users[role] = user
    users["outsider"] = django_user_model.objects.create_user(username="outsider")
    return users


def reasons(run: Run) -> dict[int, str]:
    """result id -> why it was queued."""
    return dict(ReviewItem.objects.filter(run=run).values_list("check_result_id", "reason"))


# --- Policy ---------------------------------------------------------------------------------


def test_spec_review_block_wins_over_the_project_policy_key_by_key(project: Project) -> None:
    services.project_review_policy_set(
        project=project, policy={"sample_rate": 0.5, "blind": True, "reviewers_per_item": 3}
    )
    run = make_run(project, review={"sample_rate": 0.2})
    policy = services.review_policy_for(project=project, spec_raw=run.spec_version.parsed)
    assert policy.sample_rate == 0.2  # the spec's value
    assert policy.blind is True and policy.reviewers_per_item == 3  # the project's
    assert policy.borderline_margin is None and policy.failing_gates is False  # defaults


def test_project_policy_is_checked_against_the_spec_schema(project: Project) -> None:
    with pytest.raises(services.ReviewInputError, match="sample_rate"):
        services.project_review_policy_set(project=project, policy={"sample_rate": 3})
    with pytest.raises(services.ReviewInputError, match="blinded"):
        services.project_review_policy_set(project=project, policy={"blinded": True})
    project.refresh_from_db()
    assert project.review_policy == {}


def test_no_policy_queues_nothing(project: Project) -> None:
    run = make_run(project)
    add_judge(add_execution(run, 0), score=0.71)
    services.run_finalize(run_id=run.pk)
    assert not ReviewItem.objects.exists()


# --- Selection, one policy at a time (through run_finalize, as a worker finalizes) -----------


def test_all_queues_every_judge_result_and_nothing_else(project: Project) -> None:
    run = make_run(project, review={"all": True})
    judged = [add_judge(add_execution(run, i), score=s) for i, s in enumerate([0.9, 0.2])]
    add_check(Execution.objects.get(run=run, replica=0), passed=True)
    services.run_finalize(run_id=run.pk)
    assert reasons(run) == {judged[0].pk: "all", judged[1].pk: "all"}
    item = ReviewItem.objects.get(check_result=judged[1])
    assert (item.judge_model, item.judge_score, item.judge_passed) == (JUDGE_MODEL, 0.2, False)
    assert item.criteria.startswith("Is the answer polite")
    assert item.status == ReviewStatus.OPEN and item.reviews_required == 1


def test_sample_is_deterministic_per_seed_and_close_to_the_rate(project: Project) -> None:
    run = make_run(project, review={"sample_rate": 0.25}, seed=7)
    executions = Execution.objects.bulk_create(
        [
            Execution(
                run=run,
                project=project,
                key=Execution.build_key(scenario="no-chaos", prompt_index=0, replica=i),
                scenario="no-chaos",
                replica=i,
                status=ExecutionStatus.SUCCESS,
            )
            for i in range(400)
        ]
    )
    for execution in executions:
        add_judge(execution, score=0.9)
    first = services.review_items_select(run_id=run.pk)
    # 400 draws at p = 0.25: mean 100, standard deviation ~8.7.
    assert 65 <= len(first) <= 135
    assert {i.reason for i in first} == {ReviewReason.SAMPLE}
    chosen = {i.check_result_id for i in first}
    # Same seed, same results: selecting again (or finalizing again) adds nothing.
    assert services.review_items_select(run_id=run.pk) == []
    services.run_finalize(run_id=run.pk)
    assert ReviewItem.objects.filter(run=run).count() == len(first)
    # Another seed draws other results.
    ReviewItem.objects.all().delete()
    Run.objects.filter(pk=run.pk).update(options={"seed": 8})
    other = {i.check_result_id for i in services.review_items_select(run_id=run.pk)}
    assert other != chosen


def test_queueing_a_large_run_sends_no_statement_that_grows_with_it(project: Project) -> None:
    """`all` on runs of 600 and 1,200 judged executions: every result gets its item, and the
    statements that write and read the items back take as many parameters either way."""
    params: list[int] = []

    def count(execute: Any, sql: str, values: Any, many: bool, context: Any) -> Any:
        params.append(len(values or ()))
        return execute(sql, values, many, context)

    largest = {}
    for size in (600, 1200):
        run = make_run(project, spec_id=f"review-{size}", review={"all": True})
        judged = [add_judge(add_execution(run, i), score=0.9) for i in range(size)]
        params.clear()
        with connection.execute_wrapper(count):
            items = services.review_items_select(run_id=run.pk)
        assert [item.check_result_id for item in items] == [result.pk for result in judged]
        largest[size] = max(params)
    assert largest[600] == largest[1200], largest


def test_borderline_queues_scores_within_the_margin_of_the_threshold(project: Project) -> None:
    run = make_run(project, review={"borderline_margin": 0.1})
    # threshold 0.7: 0.75 and 0.62 are within 0.1, 0.8 exactly at the margin; 0.95 and 0.3 not.
    scores = [0.75, 0.62, 0.8, 0.95, 0.3]
    judged = [add_judge(add_execution(run, i), score=s) for i, s in enumerate(scores)]
    services.run_finalize(run_id=run.pk)
    assert reasons(run) == {judged[i].pk: "borderline" for i in (0, 1, 2)}


def test_disagreement_with_a_check_on_a_shared_dimension(project: Project) -> None:
    run = make_run(project, review={"check_disagreement": True})
    cases = [
        # (judge score, check passed, check dimensions, queued?)
        (0.9, False, ("tone",), True),  # judge pass, check fail
        (0.2, True, ("tone",), True),  # judge fail, check pass
        (0.9, True, ("tone",), False),  # they agree
        (0.9, False, ("format",), False),  # disagree, but no shared dimension
    ]
    judged = []
    for index, (score, check_passed, dims, _) in enumerate(cases):
        execution = add_execution(run, index)
        judged.append(add_judge(execution, score=score))
        add_check(execution, passed=check_passed, dimensions=dims)
    services.run_finalize(run_id=run.pk)
    expected = {judged[i].pk: "disagreement" for i, case in enumerate(cases) if case[3]}
    assert reasons(run) == expected


def test_high_judge_spread(project: Project) -> None:
    run = make_run(project, review={"spread_max": 0.25})
    wide = add_judge(add_execution(run, 0), score=0.9, spread=0.4)
    add_judge(add_execution(run, 1), score=0.9, spread=0.1)
    add_judge(add_execution(run, 2), score=0.9)  # one sample: no spread recorded
    services.run_finalize(run_id=run.pk)
    assert reasons(run) == {wide.pk: "spread"}


def test_every_failing_gate_judge_result(project: Project) -> None:
    run = make_run(project, review={"failing_gates": True})
    failing_gate = add_judge(add_execution(run, 0), score=0.3)
    # A gate holds only at a full score (checks.scoring): 0.95 fails it, 1.0 does not.
    below_full = add_judge(add_execution(run, 1), score=0.95)
    add_judge(add_execution(run, 3), score=1.0)
    errored = add_judge(
        add_execution(run, 2), score=0.0, passed=False, failure_code="JUDGE_PARSE_ERROR"
    )
    services.run_finalize(run_id=run.pk)
    assert reasons(run) == {failing_gate.pk: "gate", below_full.pk: "gate", errored.pk: "gate"}
    # The judge could not answer: no judge verdict to compare people with.
    assert ReviewItem.objects.get(check_result=errored).judge_passed is None


def test_non_gate_failures_are_not_queued_as_gates(project: Project) -> None:
    run = make_run(project, review={"failing_gates": True}, gate=False)
    add_judge(add_execution(run, 0), score=0.3, gate=False)
    services.run_finalize(run_id=run.pk)
    assert reasons(run) == {}


def test_the_most_telling_reason_is_kept(project: Project) -> None:
    run = make_run(project, review={"all": True, "borderline_margin": 0.1, "failing_gates": True})
    gate = add_judge(add_execution(run, 0), score=0.65)  # failing gate and borderline
    # (Rows of a non-gate invariant: below 1.0 a gate invariant fails its gate.)
    border = add_judge(add_execution(run, 1), score=0.75, gate=False)  # borderline, passing
    plain = add_judge(add_execution(run, 2), score=0.95, gate=False)
    services.run_finalize(run_id=run.pk)
    assert reasons(run) == {gate.pk: "gate", border.pk: "borderline", plain.pk: "all"}


def test_results_people_already_decided_are_not_queued_again(
    project: Project, people: dict[str, Any]
) -> None:
    run = make_run(project, review={"all": True})
    judged = add_judge(add_execution(run, 0), score=0.3)
    services.run_finalize(run_id=run.pk)
    item = ReviewItem.objects.get()
    services.review_submit(item_id=item.pk, user=people["reviewer"], passed=True)
    services.run_finalize(run_id=run.pk)
    services.review_items_select(run_id=run.pk)
    assert list(ReviewItem.objects.values_list("check_result_id", flat=True)) == [judged.pk]
    # The human row (check type llm_as_judge, source human) is never queued itself.
    assert CheckResult.objects.filter(source="human").count() == 1


# --- Manual sends ---------------------------------------------------------------------------


def test_send_any_result_to_review(project: Project, people: dict[str, Any]) -> None:
    run = make_run(project)
    execution = add_execution(run, 0)
    check = add_check(execution, passed=False)
    item = services.review_send(result_id=check.pk, user=people["reviewer"])
    assert item.reason == ReviewReason.MANUAL and item.sent_by == people["reviewer"]
    assert item.judge_model == "" and item.judge_passed is None  # not a judge result
    # Sending it again returns the pending item.
    assert services.review_send(result_id=check.pk, user=people["admin"]).pk == item.pk
    with pytest.raises(services.ReviewPermissionError):
        services.review_send(result_id=check.pk, user=people["viewer"])
    with pytest.raises(services.ReviewPermissionError):
        services.review_send(result_id=check.pk, user=people["outsider"])


def test_a_completed_result_can_be_sent_again(project: Project, people: dict[str, Any]) -> None:
    run = make_run(project)
    judged = add_judge(add_execution(run, 0), score=0.3)
    first = services.review_send(result_id=judged.pk, user=people["reviewer"])
    services.review_submit(item_id=first.pk, user=people["reviewer"], passed=True)
    second = services.review_send(result_id=judged.pk, user=people["reviewer"])
    assert second.pk != first.pk and second.status == ReviewStatus.OPEN


def test_a_second_pending_item_for_one_result_is_refused_by_the_database(
    project: Project,
) -> None:
    run = make_run(project, review={"all": True})
    add_judge(add_execution(run, 0), score=0.3)
    services.run_finalize(run_id=run.pk)
    item = ReviewItem.objects.get()
    with pytest.raises(IntegrityError), transaction.atomic():
        ReviewItem.objects.create(
            project=project,
            spec=item.spec,
            run=run,
            execution=item.execution,
            check_result=item.check_result,
            invariant_id="polite",
            reason=ReviewReason.MANUAL,
        )


# --- Claims ---------------------------------------------------------------------------------


@pytest.fixture
def open_item(project: Project) -> ReviewItem:
    run = make_run(project, review={"all": True})
    add_judge(add_execution(run, 0), score=0.3)
    services.run_finalize(run_id=run.pk)
    return ReviewItem.objects.get()


def test_a_claim_blocks_a_second_reviewer_until_it_expires(
    open_item: ReviewItem, people: dict[str, Any], settings: Any
) -> None:
    settings.KEYSTONE_REVIEW_CLAIM_SECONDS = 300
    first, second = people["reviewer"], people["reviewer2"]
    claimed = services.review_claim(item_id=open_item.pk, user=first)
    assert claimed.claimed_by == first
    assert claimed.claim_expires is not None
    assert timedelta(seconds=290) < claimed.claim_expires - timezone.now() <= timedelta(seconds=300)
    with pytest.raises(services.ReviewClaimError, match="being graded by reviewer"):
        services.review_claim(item_id=open_item.pk, user=second)
    with pytest.raises(services.ReviewClaimError, match="being graded by reviewer"):
        services.review_submit(item_id=open_item.pk, user=second, passed=True)
    assert services.review_next(project=open_item.project, user=second) is None
    # The holder may claim again (renewing the lock).
    assert services.review_claim(item_id=open_item.pk, user=first).claimed_by == first

    # The claim runs out (the first reviewer walked away): the item can be taken over.
    ReviewItem.objects.filter(pk=open_item.pk).update(
        claim_expires=timezone.now() - timedelta(seconds=1)
    )
    taken = services.review_next(project=open_item.project, user=second)
    assert taken is not None and taken.pk == open_item.pk and taken.claimed_by == second
    # ...and now the first reviewer is the one refused.
    with pytest.raises(services.ReviewClaimError):
        services.review_submit(item_id=open_item.pk, user=first, passed=False)
    services.review_submit(item_id=open_item.pk, user=second, passed=True)
    assert ReviewVerdict.objects.get().reviewer == second


def test_release_gives_the_item_back(open_item: ReviewItem, people: dict[str, Any]) -> None:
    services.review_claim(item_id=open_item.pk, user=people["reviewer"])
    services.review_release(item_id=open_item.pk, user=people["reviewer2"])  # not theirs
    open_item.refresh_from_db()
    assert open_item.claimed_by == people["reviewer"]
    services.review_release(item_id=open_item.pk, user=people["reviewer"])
    open_item.refresh_from_db()
    assert open_item.claimed_by is None
    assert services.review_claim(item_id=open_item.pk, user=people["reviewer2"]).claimed_by


def test_only_reviewers_and_above_claim_and_grade(
    open_item: ReviewItem, people: dict[str, Any]
) -> None:
    for name in ("viewer", "outsider"):
        with pytest.raises(services.ReviewPermissionError):
            services.review_claim(item_id=open_item.pk, user=people[name])
        with pytest.raises(services.ReviewPermissionError):
            services.review_submit(item_id=open_item.pk, user=people[name], passed=True)
        with pytest.raises(services.ReviewPermissionError):
            services.review_next(project=open_item.project, user=people[name])
    assert services.review_claim(item_id=open_item.pk, user=people["admin"]).claimed_by


def test_review_next_prefers_the_held_item_then_the_oldest_open_one(
    project: Project, people: dict[str, Any]
) -> None:
    run = make_run(project, review={"all": True, "reviewers_per_item": 2})
    for i in range(3):
        add_judge(add_execution(run, i), score=0.9)
    services.run_finalize(run_id=run.pk)
    oldest, middle, newest = ReviewItem.objects.order_by("id")
    reviewer = people["reviewer"]
    services.review_claim(item_id=middle.pk, user=reviewer)
    assert services.review_next(project=project, user=reviewer).pk == middle.pk
    services.review_submit(item_id=middle.pk, user=reviewer, passed=True)
    assert services.review_next(project=project, user=reviewer).pk == oldest.pk
    services.review_submit(item_id=oldest.pk, user=reviewer, passed=True)
    # The only one left that this reviewer has not graded; skipping excludes it.
    assert services.review_next(project=project, user=reviewer).pk == newest.pk
    assert services.review_next(project=project, user=reviewer, exclude=(newest.pk,)) is None
    # Another reviewer still sees the items that need a second grade.
    assert services.review_next(project=project, user=people["reviewer2"]).pk == oldest.pk


def test_review_next_follows_the_filters(project: Project, people: dict[str, Any]) -> None:
    from evaluations.selectors import ReviewFilters

    run_a = make_run(project, review={"all": True})
    add_judge(add_execution(run_a, 0), score=0.9)
    run_b = make_run(project, spec_id="other-spec", review={"all": True})
    add_judge(add_execution(run_b, 0), score=0.9)
    for run in (run_a, run_b):
        services.run_finalize(run_id=run.pk)
    picked = services.review_next(
        project=project, user=people["reviewer"], filters=ReviewFilters(spec="other-spec")
    )
    assert picked is not None and picked.run_id == run_b.pk
    picked = services.review_next(
        project=project, user=people["reviewer2"], filters=ReviewFilters(run=run_a.pk)
    )
    assert picked is not None and picked.run_id == run_a.pk
    none = services.review_next(
        project=project, user=people["reviewer3"], filters=ReviewFilters(criteria="no_such")
    )
    assert none is None


# --- Grades and the database constraints ----------------------------------------------------


@pytest.mark.parametrize(
    ("score", "message"),
    [
        (1.5, "score: must be between 0 and 1"),
        ("-0.1", "score: must be between 0 and 1"),
        ("high", "score: 'high' is not a number"),
        (float("nan"), "score: must be between"),
    ],
)
def test_scores_outside_0_1_are_refused(
    open_item: ReviewItem, people: dict[str, Any], score: Any, message: str
) -> None:
    with pytest.raises(services.ReviewInputError, match=message):
        services.review_submit(
            item_id=open_item.pk, user=people["reviewer"], passed=True, score=score
        )
    assert not ReviewVerdict.objects.exists()


def test_a_grade_needs_pass_or_fail(open_item: ReviewItem, people: dict[str, Any]) -> None:
    with pytest.raises(services.ReviewInputError, match="passed: choose pass or fail"):
        services.review_submit(item_id=open_item.pk, user=people["reviewer"], passed=None)


def test_the_database_refuses_extra_slots_duplicate_reviewers_and_bad_scores(
    project: Project, people: dict[str, Any]
) -> None:
    run = make_run(project, review={"all": True, "reviewers_per_item": 2})
    add_judge(add_execution(run, 0), score=0.9)
    services.run_finalize(run_id=run.pk)
    item = ReviewItem.objects.get()
    ReviewVerdict.objects.create(
        item=item, reviewer=people["reviewer"], slot=1, slots_total=2, passed=True, score=1.0
    )
    bad_rows = [
        # a third slot of two
        {"reviewer": people["reviewer2"], "slot": 3, "slots_total": 2},
        # slot 0
        {"reviewer": people["reviewer2"], "slot": 0, "slots_total": 2},
        # the same slot twice
        {"reviewer": people["reviewer2"], "slot": 1, "slots_total": 2},
        # the same reviewer twice
        {"reviewer": people["reviewer"], "slot": 2, "slots_total": 2},
        # a score above 1
        {"reviewer": people["reviewer2"], "slot": 2, "slots_total": 2, "score": 1.5},
    ]
    for row in bad_rows:
        values = {"item": item, "passed": True, "score": 1.0, **row}
        with pytest.raises(IntegrityError), transaction.atomic():
            ReviewVerdict.objects.create(**values)
    assert ReviewVerdict.objects.count() == 1


def test_a_reviewer_grades_an_item_once(project: Project, people: dict[str, Any]) -> None:
    run = make_run(project, review={"all": True, "reviewers_per_item": 2})
    add_judge(add_execution(run, 0), score=0.9)
    services.run_finalize(run_id=run.pk)
    item = ReviewItem.objects.get()
    services.review_submit(item_id=item.pk, user=people["reviewer"], passed=True)
    with pytest.raises(services.ReviewClaimError, match="You already graded"):
        services.review_submit(item_id=item.pk, user=people["reviewer"], passed=False)
    with pytest.raises(services.ReviewClaimError, match="You already graded"):
        services.review_claim(item_id=item.pk, user=people["reviewer"])


def test_a_graded_item_takes_no_more_grades(open_item: ReviewItem, people: dict[str, Any]) -> None:
    services.review_submit(item_id=open_item.pk, user=people["reviewer"], passed=True)
    with pytest.raises(services.ReviewClaimError, match="complete"):
        services.review_submit(item_id=open_item.pk, user=people["reviewer2"], passed=True)


# --- Completion, override and rescoring ----------------------------------------------------


def test_a_human_pass_overrides_the_judge_and_the_failed_gate_passes(
    project: Project, people: dict[str, Any]
) -> None:
    run = make_run(project, review={"failing_gates": True}, gates={"pass_rate_min": 1.0})
    good = add_execution(run, 0)
    add_judge(good, score=1.0)  # a gate invariant needs a full score
    add_check(good, passed=True)
    bad = add_execution(run, 1)
    judged = add_judge(bad, score=0.4, reasoning="Too curt.")  # the gate invariant fails
    add_check(bad, passed=True)
    run = services.run_finalize(run_id=run.pk)
    assert (run.exit_code, run.gate_passed, run.pass_rate) == (1, False, 0.0)
    gates_before = {g["name"]: g["passed"] for g in run.summary["gates"]}
    assert gates_before["pass_rate_min"] is False
    item = ReviewItem.objects.get()
    assert item.check_result_id == judged.pk and item.reason == "gate"

    submission = services.review_submit(
        item_id=item.pk, user=people["reviewer"], passed=True, score=1.0, note="Polite enough"
    )

    run.refresh_from_db()
    assert (run.exit_code, run.gate_passed, run.pass_rate) == (0, True, 1.0)
    assert {g["name"]: g["passed"] for g in run.summary["gates"]}["pass_rate_min"] is True
    bad.refresh_from_db()
    # Both invariants now score 1.0: composite (1 x 1.0 + 1 x 1.0) / 2 = 1.0, and it passes.
    assert (bad.composite, bad.passed) == (1.0, True)
    human = CheckResult.objects.get(execution=bad, source="human")
    assert (human.score, human.passed, human.failure_code, human.gate) == (1.0, True, "", True)
    assert human.details["reviewed_result"] == judged.pk
    assert human.details["verdicts"][0]["note"] == "Polite enough"
    # The judge's own row is kept, untouched.
    judged.refresh_from_db()
    assert (judged.score, judged.passed, judged.source) == (0.4, False, "judge")

    item.refresh_from_db()
    assert (item.status, item.final_passed, item.final_score) == ("complete", True, 1.0)
    change = submission.change
    assert change is not None
    assert change == ResultChange.objects.get()
    assert change.changed_by == people["reviewer"] and change.check_result == human
    assert change.before == {
        "score": 0.4,
        "passed": False,
        "source": "judge",
        "execution_composite": None,  # never scored per execution before (built by hand)
        "execution_passed": None,
        "run_composite": 0.5,
        "run_gate_passed": False,
        "run_exit_code": 1,
    }
    assert change.after == {
        "score": 1.0,
        "passed": True,
        "source": "human",
        "execution_composite": 1.0,
        "execution_passed": True,
        "run_composite": 1.0,
        "run_gate_passed": True,
        "run_exit_code": 0,
    }


def test_a_human_fail_overrides_a_passing_judge(project: Project, people: dict[str, Any]) -> None:
    run = make_run(
        project,
        review={"all": True},
        gates={"pass_rate_min": 1.0},
        gate=False,
        pass_threshold=0.8,
    )
    execution = add_execution(run, 0)
    add_judge(execution, score=0.9, gate=False)
    add_check(execution, passed=True)
    run = services.run_finalize(run_id=run.pk)
    assert run.exit_code == 0
    item = ReviewItem.objects.get()
    services.review_submit(item_id=item.pk, user=people["reviewer"], passed=False, score=0.2)
    run.refresh_from_db()
    execution.refresh_from_db()
    # Composite (0.9 + 1.0) / 2 = 0.95 passed 0.8; now (0.2 + 1.0) / 2 = 0.6 does not.
    assert execution.composite == pytest.approx(0.6) and execution.passed is False
    assert (run.exit_code, run.gate_passed, run.pass_rate) == (1, False, 0.0)
    human = CheckResult.objects.get(source="human")
    assert human.failure_code == "JUDGE_BELOW_THRESHOLD"


def test_people_settle_a_judge_that_could_not_answer(
    project: Project, people: dict[str, Any]
) -> None:
    run = make_run(project, review={"failing_gates": True})
    execution = add_execution(run, 0)
    add_judge(execution, score=0.0, passed=False, failure_code="PROVIDER_ERROR")
    Execution.objects.filter(pk=execution.pk).update(status=ExecutionStatus.ERROR)
    run = services.run_finalize(run_id=run.pk)
    assert run.exit_code == 3  # provider error
    item = ReviewItem.objects.get()
    services.review_submit(item_id=item.pk, user=people["reviewer"], passed=True)
    run.refresh_from_db()
    execution.refresh_from_db()
    assert execution.status == ExecutionStatus.SUCCESS and execution.passed is True
    assert run.exit_code == 0


def test_two_agreeing_reviewers_complete_the_item_with_their_mean_score(
    project: Project, people: dict[str, Any]
) -> None:
    run = make_run(project, review={"all": True, "reviewers_per_item": 2, "disagreement": 0.3})
    add_judge(add_execution(run, 0), score=0.3)
    services.run_finalize(run_id=run.pk)
    item = ReviewItem.objects.get()
    first = services.review_submit(item_id=item.pk, user=people["reviewer"], passed=True, score=0.8)
    assert first.item.status == ReviewStatus.OPEN and first.change is None
    assert not CheckResult.objects.filter(source="human").exists()
    second = services.review_submit(
        item_id=item.pk, user=people["reviewer2"], passed=True, score=1.0
    )
    assert second.item.status == ReviewStatus.COMPLETE
    human = CheckResult.objects.get(source="human")
    assert human.score == pytest.approx(0.9) and human.passed is True
    assert [v["reviewer"] for v in human.details["verdicts"]] == ["reviewer", "reviewer2"]


@pytest.mark.parametrize(
    ("first", "second"),
    [((True, 1.0), (False, 0.0)), ((True, 1.0), (True, 0.5))],  # verdicts; scores 0.5 apart
)
def test_disagreeing_reviewers_send_the_item_to_an_admin(
    project: Project, people: dict[str, Any], first: tuple[bool, float], second: tuple[bool, float]
) -> None:
    run = make_run(
        project,
        review={"all": True, "reviewers_per_item": 2, "disagreement": 0.3},
        gates={"pass_rate_min": 1.0},
    )
    add_judge(add_execution(run, 0), score=0.3)
    run = services.run_finalize(run_id=run.pk)
    item = ReviewItem.objects.get()
    services.review_submit(
        item_id=item.pk, user=people["reviewer"], passed=first[0], score=first[1]
    )
    services.review_submit(
        item_id=item.pk, user=people["reviewer2"], passed=second[0], score=second[1]
    )
    item.refresh_from_db()
    assert item.status == ReviewStatus.ADJUDICATION
    assert not CheckResult.objects.filter(source="human").exists()
    assert services.review_next(project=project, user=people["reviewer3"]) is None

    with pytest.raises(services.ReviewPermissionError):
        services.review_adjudicate(item_id=item.pk, user=people["reviewer3"], passed=True)
    change = services.review_adjudicate(
        item_id=item.pk, user=people["admin"], passed=True, score=1.0, note="Polite."
    )
    item.refresh_from_db()
    assert item.status == ReviewStatus.COMPLETE and item.adjudicated_by == people["admin"]
    assert change.changed_by == people["admin"] and change.after["run_exit_code"] == 0
    human = CheckResult.objects.get(source="human")
    assert human.details["adjudicated_by"] == "admin"
    assert human.details["adjudication_note"] == "Polite."
    with pytest.raises(services.ReviewClaimError, match="not waiting for adjudication"):
        services.review_adjudicate(item_id=item.pk, user=people["admin"], passed=False)


def test_a_second_review_of_the_same_result_keeps_both_changes(
    project: Project, people: dict[str, Any]
) -> None:
    run = make_run(project)
    judged = add_judge(add_execution(run, 0), score=0.3)
    services.run_finalize(run_id=run.pk)
    first = services.review_send(result_id=judged.pk, user=people["reviewer"])
    services.review_submit(item_id=first.pk, user=people["reviewer"], passed=True, score=0.9)
    second = services.review_send(result_id=judged.pk, user=people["admin"])
    services.review_submit(item_id=second.pk, user=people["reviewer2"], passed=False, score=0.1)
    changes = list(ResultChange.objects.order_by("id"))
    assert [(c.before["source"], c.before["score"]) for c in changes] == [
        ("judge", 0.3),
        ("human", 0.9),
    ]
    assert [(c.after["source"], c.after["score"]) for c in changes] == [
        ("human", 0.9),
        ("human", 0.1),
    ]
    assert [c.changed_by.username for c in changes] == ["reviewer", "reviewer2"]
    # One human row per invariant and execution, holding the latest decision.
    human = CheckResult.objects.get(source="human")
    assert (human.score, human.passed) == (0.1, False)
    # What the execution page reads: newest change first, nothing pending any more.
    execution = judged.execution
    assert [c.pk for c in selectors.result_changes(execution)] == [changes[1].pk, changes[0].pk]
    assert selectors.pending_review_items(execution) == {}
    third = services.review_send(result_id=judged.pk, user=people["reviewer"])
    assert selectors.pending_review_items(execution) == {judged.pk: third}


def test_finalizing_again_keeps_the_time_the_run_finished(
    open_item: ReviewItem, people: dict[str, Any]
) -> None:
    finished = Run.objects.get(pk=open_item.run_id).finished
    assert finished is not None
    time.sleep(0.01)
    services.review_submit(item_id=open_item.pk, user=people["reviewer"], passed=True)
    assert Run.objects.get(pk=open_item.run_id).finished == finished


# --- The kappa gate ---------------------------------------------------------------------------


def _graded_run(
    project: Project,
    people: dict[str, Any],
    judge_scores: list[float],
    human_passes: list[bool],
    *,
    gates: dict[str, Any],
) -> Run:
    run = make_run(project, review={"all": True}, gates=gates, gate=False)
    for i, score in enumerate(judge_scores):
        add_judge(add_execution(run, i), score=score, gate=False)
    services.run_finalize(run_id=run.pk)
    for item, passed in zip(
        ReviewItem.objects.filter(run=run).order_by("id"), human_passes, strict=True
    ):
        services.review_submit(item_id=item.pk, user=people["reviewer"], passed=passed)
    run.refresh_from_db()
    return run


def test_the_kappa_gate_fails_a_run_whose_judge_people_disagree_with(
    project: Project, people: dict[str, Any]
) -> None:
    # judge:  pass pass fail fail pass      (scores 0.9 / 0.2 against threshold 0.7)
    # people: pass fail fail fail pass
    # both pass 2, both fail 2, judge-only pass 1: p_o = 4/5 = 0.8;
    # P(judge pass) = 3/5, P(people pass) = 2/5: p_e = 0.6 x 0.4 + 0.4 x 0.6 = 0.48;
    # kappa = (0.8 - 0.48) / (1 - 0.48) = 0.32 / 0.52 = 0.6154 < 0.7.
    run = _graded_run(
        project,
        people,
        [0.9, 0.9, 0.2, 0.2, 0.9],
        [True, False, False, False, True],
        gates={"judge_human_kappa_min": 0.7},
    )
    gate = next(g for g in run.summary["gates"] if g["name"] == "judge_human_kappa_min")
    assert gate["actual"] == pytest.approx(0.32 / 0.52)
    assert gate["passed"] is False
    assert run.summary["kappa"] == pytest.approx(0.6154, abs=1e-4)
    assert (run.exit_code, run.gate_passed) == (1, False)


def test_the_kappa_gate_passes_when_people_agree_with_the_judge(
    project: Project, people: dict[str, Any]
) -> None:
    run = _graded_run(
        project,
        people,
        [0.9, 0.2, 0.9],
        [True, False, True],
        # pass_rate_min is always evaluated, and the one group (three replicas, one judged
        # 0.2) fails: this test is about the kappa gate alone.
        gates={"judge_human_kappa_min": 0.7, "pass_rate_min": 0},
    )
    gate = next(g for g in run.summary["gates"] if g["name"] == "judge_human_kappa_min")
    assert gate["actual"] == pytest.approx(1.0) and gate["passed"] is True
    assert run.exit_code == 0


def test_the_kappa_gate_counts_only_this_judge_model(
    project: Project, people: dict[str, Any]
) -> None:
    # Disagreement recorded for another judge model does not count against this one.
    other = make_run(project, review={"all": True}, gate=False)
    for i in range(2):
        add_judge(add_execution(other, i), score=0.9, gate=False, model="other-model")
    services.run_finalize(run_id=other.pk)
    for item in ReviewItem.objects.filter(run=other):
        services.review_submit(item_id=item.pk, user=people["reviewer"], passed=False)
    run = make_run(project, review={"all": False}, gates={"judge_human_kappa_min": 0.7}, gate=False)
    add_judge(add_execution(run, 0), score=0.9, gate=False)
    run = services.run_finalize(run_id=run.pk)
    gate = next(g for g in run.summary["gates"] if g["name"] == "judge_human_kappa_min")
    assert gate["actual"] is None and gate["passed"] is True and gate["empty"] is True


# --- Concurrent grades (real PostgreSQL, separate connections) ---------------------------------


def _wait_for_lock_waiters(count: int, timeout: float = 20.0) -> None:
    """Until `count` other sessions wait on a lock in this database."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            # pg_stat_activity is read from a snapshot kept for the whole transaction.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] >= count:
                return
            time.sleep(0.05)
    raise AssertionError(f"{count} grades never reached the verdict table at the same time")


def _grade_concurrently(item_id: int, users: list[Any]) -> list[Any]:
    """Every user grades the item at the same moment. The verdict table is locked until
    each grade has counted the slots and waits to insert, so all of them race for the
    same slot; then the lock goes and the database decides."""
    outcomes: list[Any] = [None] * len(users)

    def grade(index: int, user: Any) -> None:
        try:
            outcomes[index] = services.review_submit(item_id=item_id, user=user, passed=True)
        except Exception as exc:  # recorded and asserted by the test
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=grade, args=(i, u)) for i, u in enumerate(users)]
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("LOCK TABLE evaluations_reviewverdict IN SHARE ROW EXCLUSIVE MODE")
            for thread in threads:
                thread.start()
            _wait_for_lock_waiters(len(users))
    finally:
        # Also when the wait failed: no grade may outlive the test and its database.
        for thread in threads:
            thread.join(timeout=60)
    return outcomes


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("required", "graders"), [(1, 2), (2, 3)])
def test_concurrent_grades_never_exceed_reviewers_per_item(
    django_user_model: Any, required: int, graders: int
) -> None:
    project = Project.objects.create(name="Race", slug="race")
    users = []
    for i in range(graders):
        user = django_user_model.objects.create_user(username=f"racer{i}")
        Membership.objects.create(project=project, user=user, role=Role.REVIEWER)
        users.append(user)
    run = make_run(project, review={"all": True, "reviewers_per_item": required})
    add_judge(add_execution(run, 0), score=0.3)
    services.run_finalize(run_id=run.pk)
    item = ReviewItem.objects.get()

    outcomes = _grade_concurrently(item.pk, users)

    accepted = [o for o in outcomes if isinstance(o, services.ReviewSubmission)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(accepted) == required and len(refused) == graders - required
    for error in refused:
        assert isinstance(error, services.ReviewClaimError)
        assert f"already has its {required} grade(s)" in str(error)
    assert sorted(ReviewVerdict.objects.values_list("slot", flat=True)) == list(
        range(1, required + 1)
    )
    item.refresh_from_db()
    assert item.status == ReviewStatus.COMPLETE
    # Exactly one completion: one human row and one history entry.
    assert CheckResult.objects.filter(source="human").count() == 1
    assert ResultChange.objects.count() == 1
    assert Run.objects.get(pk=run.pk).exit_code == 0
