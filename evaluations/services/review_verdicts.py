"""Review verdicts: a reviewer's grade, agreement between reviewers, adjudication, and the
human result that outranks the judge's (the execution and run are rescored)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from checks.results import JUDGE_CHECK_TYPES, FailureCode
from checks.scoring import score_execution
from evaluations.models import (
    CheckResult,
    Execution,
    ExecutionStatus,
    ResultChange,
    ResultSource,
    ReviewAgreementDay,
    ReviewItem,
    ReviewStatus,
    ReviewVerdict,
    Role,
    Run,
    RunStatus,
)
from evaluations.selectors.records import effective_results, execution_record
from evaluations.services.finalize import run_finalize
from evaluations.services.reviews import (
    REVIEW_EPSILON,
    REVIEW_NOTE_MAX,
    ReviewClaimError,
    ReviewError,
    ReviewInputError,
    require_role,
    review_claim_seconds,
    review_policy_for,
)
from evaluations.services.runs import engine_spec


def _checked_grade(passed: Any, score: Any, note: Any) -> tuple[bool, float, str]:
    if not isinstance(passed, bool):
        raise ReviewInputError("passed: choose pass or fail.")
    if score is None or score == "":
        score = 1.0 if passed else 0.0
    try:
        value = float(score)
    except (TypeError, ValueError):
        raise ReviewInputError(f"score: {score!r} is not a number between 0 and 1.") from None
    if isinstance(score, bool) or math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ReviewInputError(f"score: must be between 0 and 1, got {score!r}.")
    text = str(note or "").strip()
    if len(text) > REVIEW_NOTE_MAX:
        raise ReviewInputError(f"note: at most {REVIEW_NOTE_MAX} characters, got {len(text)}.")
    return passed, value, text


@dataclass(frozen=True, slots=True)
class ReviewSubmission:
    """What recording one grade did: the item, the verdict stored, and the result change when
    the grade completed the item."""

    item: ReviewItem
    verdict: ReviewVerdict
    change: ResultChange | None  # set when this verdict completed the item


def review_submit(
    *, item_id: int, user: Any, passed: Any, score: Any = None, note: Any = ""
) -> ReviewSubmission:
    """Record one reviewer's grade. The last required verdict completes the item: agreeing
    reviewers override the result (and the run is rescored), disagreeing ones send it to
    adjudication. Someone else's live claim refuses the grade; the ReviewVerdict
    constraints refuse a grade beyond `reviews_required` or a second grade by one person."""
    passed, score, note = _checked_grade(passed, score, note)
    item = ReviewItem.objects.select_related("project", "claimed_by").get(pk=item_id)
    require_role(item.project, user, Role.REVIEWER)
    if item.status != ReviewStatus.OPEN:
        raise ReviewClaimError(
            f"Review item {item.pk} is {item.get_status_display().lower()}: it takes no more grades."
        )
    if item.claimed_by_other(user):
        holder = item.claimed_by.get_username() if item.claimed_by else "someone else"
        raise ReviewClaimError(f"Review item {item.pk} is being graded by {holder}.")
    with transaction.atomic():
        verdict = _verdict_insert(item, user=user, passed=passed, score=score, note=note)
        # Lock the item only now: whichever grade locks last sees every committed verdict.
        locked = ReviewItem.objects.select_for_update().get(pk=item.pk)
        if locked.claimed_by_id == user.pk:
            locked.claimed_by = None
            locked.claim_expires = None
            locked.save(update_fields=["claimed_by", "claim_expires"])
        change = None
        verdicts = list(ReviewVerdict.objects.filter(item_id=item.pk).order_by("slot"))
        if locked.status == ReviewStatus.OPEN and len(verdicts) >= locked.reviews_required:
            if _verdicts_agree(locked, verdicts):
                change = _review_apply(
                    locked,
                    passed=verdicts[0].passed,
                    score=sum(v.score for v in verdicts) / len(verdicts),
                    user=user,
                    verdicts=verdicts,
                )
            else:
                locked.status = ReviewStatus.ADJUDICATION
                locked.save(update_fields=["status"])
    return ReviewSubmission(item=locked, verdict=verdict, change=change)


def _verdict_insert(
    item: ReviewItem, *, user: Any, passed: bool, score: float, note: str
) -> ReviewVerdict:
    """Take the next free slot. Slots are counted without a lock on purpose: grades racing
    for one slot are settled by the unique (item, slot) constraint (the loser counts again
    and takes the next slot), and a grade past the last slot is refused by the CHECK
    constraint slot <= slots_total; a second grade by one reviewer by (item, reviewer)."""
    for _attempt in range(item.reviews_required + 1):
        slot = ReviewVerdict.objects.filter(item_id=item.pk).count() + 1
        try:
            with transaction.atomic():
                return ReviewVerdict.objects.create(
                    item_id=item.pk,
                    reviewer=user,
                    slot=slot,
                    slots_total=item.reviews_required,
                    passed=passed,
                    score=score,
                    note=note,
                )
        except IntegrityError as exc:
            if _violated(exc) != "reviewverdict_unique_slot":
                raise _verdict_refused(exc, item) from exc
    raise ReviewClaimError(
        f"Review item {item.pk} already has its {item.reviews_required} grade(s)."
    )


def _violated(exc: IntegrityError) -> str:
    """The name of the constraint behind an IntegrityError (PostgreSQL reports it; on
    SQLite the message names the columns or the CHECK)."""
    diag = getattr(exc.__cause__, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if name:
        return str(name)
    text = str(exc)
    if "reviewer_id" in text:
        return "reviewverdict_one_per_reviewer"
    if "slot_in_range" in text:
        return "reviewverdict_slot_in_range"
    if "slot" in text:
        return "reviewverdict_unique_slot"
    return text


def _verdict_refused(exc: IntegrityError, item: ReviewItem) -> ReviewError:
    """Turn a ReviewVerdict constraint violation into a message for the reviewer."""
    if _violated(exc) == "reviewverdict_one_per_reviewer":
        return ReviewClaimError(f"You already graded review item {item.pk}.")
    return ReviewClaimError(
        f"Review item {item.pk} already has its {item.reviews_required} grade(s)."
    )


def _verdicts_agree(item: ReviewItem, verdicts: list[ReviewVerdict]) -> bool:
    if len({v.passed for v in verdicts}) > 1:
        return False
    run = Run.objects.select_related("spec_version", "project").get(pk=item.run_id)
    tolerance = review_policy_for(
        project=run.project, spec_raw=run.spec_version.parsed
    ).disagreement
    if tolerance is None:
        return True
    scores = [v.score for v in verdicts]
    return max(scores) - min(scores) <= tolerance + REVIEW_EPSILON


def review_adjudicate(
    *, item_id: int, user: Any, passed: Any, score: Any = None, note: Any = ""
) -> ResultChange:
    """An admin decides an item whose reviewers disagreed."""
    passed, score, note = _checked_grade(passed, score, note)
    item = ReviewItem.objects.select_related("project").get(pk=item_id)
    require_role(item.project, user, Role.ADMIN)
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update().get(pk=item.pk)
        if locked.status != ReviewStatus.ADJUDICATION:
            raise ReviewClaimError(
                f"Review item {item.pk} is {locked.get_status_display().lower()}, "
                "not waiting for adjudication."
            )
        locked.adjudicated_by = user
        verdicts = list(ReviewVerdict.objects.filter(item_id=item.pk).order_by("slot"))
        return _review_apply(
            locked, passed=passed, score=score, user=user, verdicts=verdicts, note=note
        )


def _review_apply(
    item: ReviewItem,
    *,
    passed: bool,
    score: float,
    user: Any,
    verdicts: list[ReviewVerdict],
    note: str = "",
) -> ResultChange:
    """Write the human result for the item's invariant, rescore its execution and its
    run from stored rows, and record before and after. Runs inside the caller's
    transaction, with the item locked."""

    # One recomputation of a run at a time, so none is computed from a stale read.
    run = Run.objects.select_for_update().select_related("spec_version").get(pk=item.run_id)
    execution = Execution.objects.select_for_update().get(pk=item.execution_id)
    reviewed = CheckResult.objects.get(pk=item.check_result_id)
    same_invariant = list(
        CheckResult.objects.filter(execution=execution, invariant_id=item.invariant_id)
    )
    current = effective_results(same_invariant)[0] if same_invariant else reviewed
    before = _review_snapshot(current, execution, run)

    names = [v.reviewer.get_username() if v.reviewer else "(deleted user)" for v in verdicts]
    decided_by = user.get_username()
    adjudicated = item.adjudicated_by_id is not None
    human, _ = CheckResult.objects.update_or_create(
        execution=execution,
        invariant_id=item.invariant_id,
        source=ResultSource.HUMAN,
        defaults={
            "run": run,
            "check_type": reviewed.check_type,
            "score": score,
            "passed": passed,
            "failure_code": _human_failure_code(reviewed, passed),
            "message": (
                f"{'adjudicated by ' + decided_by if adjudicated else 'reviewed by ' + ', '.join(names)}: "
                f"{'pass' if passed else 'fail'} ({score:.2f})"
            ),
            "details": {
                "review_item": item.pk,
                "reviewed_result": reviewed.pk,
                "reviewed_source": reviewed.source,
                "verdicts": [
                    {"reviewer": name, "passed": v.passed, "score": v.score, "note": v.note}
                    for name, v in zip(names, verdicts, strict=True)
                ],
                "adjudicated_by": decided_by if adjudicated else None,
                "adjudication_note": note if adjudicated else "",
            },
            "severity": reviewed.severity,
            "weight": reviewed.weight,
            "gate": reviewed.gate,
            "dimensions": list(reviewed.dimensions),
        },
    )

    item.status = ReviewStatus.COMPLETE
    item.final_passed = passed
    item.final_score = score
    item.completed = timezone.now()
    item.claimed_by = None
    item.claim_expires = None
    item.save()
    ReviewAgreementDay.tally(item, sign=1)

    _execution_rescore(execution, run, execution_record)
    if run.status == RunStatus.COMPLETED:
        # Scores, verdict, gates (and the kappa gate, now with this decision) again.
        run = run_finalize(run_id=run.pk)
    return ResultChange.objects.create(
        run=run,
        execution=execution,
        check_result=human,
        invariant_id=item.invariant_id,
        review_item=item,
        changed_by=user,
        before=before,
        after=_review_snapshot(human, execution, run),
    )


def review_undo(*, item_id: int, user: Any) -> ReviewItem:
    """Take back one's own last grade of an item, within the claim time after giving it: the
    grade is deleted, a human result it made is removed (the execution and run are rescored
    from the results left, and the change is recorded), and the item is open again, claimed
    by this reviewer. Refused once an admin adjudicated the item, once another reviewer
    graded after this one, or once the claim time has passed."""
    item = ReviewItem.objects.select_related("project").get(pk=item_id)
    require_role(item.project, user, Role.REVIEWER)
    now = timezone.now()
    window = timedelta(seconds=review_claim_seconds())
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update().get(pk=item.pk)
        verdicts = list(ReviewVerdict.objects.filter(item_id=item.pk).order_by("slot"))
        mine = next((v for v in verdicts if v.reviewer_id == user.pk), None)
        if mine is None:
            raise ReviewClaimError(f"You have no grade on review item {item.pk} to undo.")
        if mine.created < now - window:
            minutes = round(window.total_seconds() / 60)
            raise ReviewClaimError(
                f"Your grade of review item {item.pk} is older than {minutes} minutes: "
                "too late to undo."
            )
        if locked.adjudicated_by_id is not None:
            raise ReviewClaimError(f"Review item {item.pk} was adjudicated: its grades stay.")
        if mine.slot != verdicts[-1].slot:
            raise ReviewClaimError(
                f"Another reviewer graded review item {item.pk} after you: your grade stays."
            )
        if locked.status == ReviewStatus.COMPLETE:
            _review_unapply(locked, user=user)
            ReviewAgreementDay.tally(locked, sign=-1)  # while it still reads as complete
        mine.delete()
        locked.status = ReviewStatus.OPEN
        locked.final_passed = None
        locked.final_score = None
        locked.completed = None
        locked.claimed_by = user
        locked.claim_expires = now + window
        locked.save()
    return locked


def _review_unapply(item: ReviewItem, *, user: Any) -> None:
    """Remove the human result this item wrote and rescore from the results left."""
    run = Run.objects.select_for_update().select_related("spec_version").get(pk=item.run_id)
    execution = Execution.objects.select_for_update().get(pk=item.execution_id)
    human = CheckResult.objects.filter(
        execution=execution, invariant_id=item.invariant_id, source=ResultSource.HUMAN
    ).first()
    if human is None or (human.details or {}).get("review_item") != item.pk:
        raise ReviewClaimError(
            f"A later review changed the result of review item {item.pk}: your grade stays."
        )
    before = _review_snapshot(human, execution, run)
    human.delete()
    _execution_rescore(execution, run, execution_record)
    if run.status == RunStatus.COMPLETED:
        run = run_finalize(run_id=run.pk)
    left = list(CheckResult.objects.filter(execution=execution, invariant_id=item.invariant_id))
    current = effective_results(left)[0] if left else None
    execution.refresh_from_db()
    ResultChange.objects.create(
        run=run,
        execution=execution,
        check_result=current,
        invariant_id=item.invariant_id,
        review_item=item,
        changed_by=user,
        before=before,
        after=_review_snapshot(current, execution, run) if current is not None else {},
    )


def _review_snapshot(result: CheckResult, execution: Execution, run: Run) -> dict[str, Any]:
    return {
        "score": result.score,
        "passed": result.passed,
        "source": result.source,
        "execution_composite": execution.composite,
        "execution_passed": execution.passed,
        "run_composite": run.composite,
        "run_gate_passed": run.gate_passed,
        "run_exit_code": run.exit_code,
    }


def _human_failure_code(reviewed: CheckResult, passed: bool) -> str:
    """A failing human verdict keeps the reviewed result's failure code, except an error
    code (people gave a verdict where the check could not); a judge's becomes 'below
    threshold'."""
    if passed:
        return ""
    if reviewed.failure_code and not reviewed.to_engine().is_error:
        return reviewed.failure_code
    if reviewed.check_type in JUDGE_CHECK_TYPES:
        return FailureCode.JUDGE_BELOW_THRESHOLD.value
    return ""


def _execution_rescore(execution: Execution, run: Run, record_of: Any) -> None:
    """The execution's composite and verdict from its effective results."""
    spec = engine_spec(run)
    record = record_of(execution)
    if (
        execution.status == ExecutionStatus.ERROR
        and not execution.error
        and not any(r.is_error for r in record.results)
    ):
        # execution_record marks a successful execution `error` only because a check
        # could not finish (a judge parse error, say); people have now given the verdict.
        execution.status = ExecutionStatus.SUCCESS
        record.status = ExecutionStatus.SUCCESS
    score = score_execution(record, pass_threshold=spec.scoring.pass_threshold)
    execution.composite = score.composite
    execution.passed = score.passed
    execution.save(update_fields=["status", "composite", "passed"])
