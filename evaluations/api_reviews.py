"""Reviews through the API, for labelling tools: the queue, claiming (the next item or a
given one), submitting a verdict, releasing a claim. The rules are the browser's, kept by
the same services (evaluations/services/reviews.py, review_verdicts.py): the reviewer role,
one live claim per item, `reviewers_per_item` grades per item, one grade per person, and in
blind mode the judge's verdict is hidden until this person has graded."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import Http404, HttpRequest
from ninja import Field, Query, Schema, Status

from evaluations import selectors, services
from evaluations.api import ApiConflict, ApiInputError, Caller, ErrorOut, RowId, _caller, router
from evaluations.models import ReviewItem, ReviewStatus, Role
from evaluations.selectors import ReviewFilters


class ReviewQuery(Schema):
    status: str = Field(default=ReviewStatus.OPEN, description="open, adjudication or complete")
    spec: str = ""
    run: RowId | None = None
    criteria: str = Field(default="", description="an invariant id")


class JudgeOut(Schema):
    model: str
    prompt_version: str
    score: float | None
    passed: bool | None
    reasoning: str
    threshold: float


class VerdictOut(Schema):
    reviewer: str
    passed: bool
    score: float
    note: str
    created: datetime


class ReviewItemOut(Schema):
    id: int
    status: str
    spec: str
    run_id: int
    execution_id: int
    invariant_id: str
    reason: str
    reviews_required: int
    verdict_count: int
    blind: bool
    claimed_by: str | None  # while the claim is live
    claim_expires: datetime | None
    held_by_me: bool
    url: str


class ReviewItemDetailOut(ReviewItemOut):
    criteria: str
    rubric: dict[str, str]
    prompt: str
    judged_input: str
    final_output: str
    judge: JudgeOut | None  # null in blind mode until you have graded
    my_verdict: VerdictOut | None
    verdicts: list[VerdictOut] | None  # everyone's, once the item is no longer open


class ReviewListOut(Schema):
    counts: dict[str, int]
    items: list[ReviewItemOut]


def _item_out(request: HttpRequest, caller: Caller, item: ReviewItem) -> ReviewItemOut:
    live = item.claim_is_live()
    count = getattr(item, "verdict_count", None)
    return ReviewItemOut(
        id=item.pk,
        status=item.status,
        spec=item.spec.slug,
        run_id=item.run_id,
        execution_id=item.execution_id,
        invariant_id=item.invariant_id,
        reason=item.reason,
        reviews_required=item.reviews_required,
        verdict_count=count if count is not None else item.verdicts.count(),
        blind=item.blind,
        claimed_by=item.claimed_by.get_username() if live and item.claimed_by else None,
        claim_expires=item.claim_expires if live else None,
        held_by_me=live and item.claimed_by_id == caller.user.pk,
        url=request.build_absolute_uri(f"/api/projects/{caller.project.slug}/reviews/{item.pk}"),
    )


def _verdict_out(verdict: Any) -> VerdictOut:
    return VerdictOut(
        reviewer=verdict.reviewer.get_username(),
        passed=verdict.passed,
        score=verdict.score,
        note=verdict.note,
        created=verdict.created,
    )


def _item(caller: Caller, item_id: int) -> ReviewItem:
    item = selectors.review_item_in_project(caller.project, item_id)
    if item is None:
        raise Http404("No such review item in this project.")
    return item


def _detail(request: HttpRequest, caller: Caller, item_id: int) -> ReviewItemDetailOut:
    item = _item(caller, item_id)
    view = selectors.review_item_view(item)
    mine = next((v for v in view.verdicts if v.reviewer_id == caller.user.pk), None)
    is_open = item.status == ReviewStatus.OPEN
    # The browser's rule: blind review shows the judge once this person has answered, or
    # when nobody grades the item any more; others' grades only once it is closed.
    show_judge = not item.blind or mine is not None or not is_open
    judge = view.judge
    return ReviewItemDetailOut(
        **_item_out(request, caller, item).dict(),
        criteria=view.criteria,
        rubric=view.rubric,
        prompt=view.prompt,
        judged_input=view.judged_input,
        final_output=view.final_output,
        judge=JudgeOut(
            model=judge.model,
            prompt_version=judge.prompt_version,
            score=judge.score,
            passed=judge.passed,
            reasoning=judge.reasoning,
            threshold=judge.threshold,
        )
        if show_judge
        else None,
        my_verdict=_verdict_out(mine) if mine is not None else None,
        verdicts=None if is_open else [_verdict_out(v) for v in view.verdicts],
    )


@router.get("/projects/{slug}/reviews", response=ReviewListOut, url_name="reviews")
def review_list(request: HttpRequest, slug: str, query: Query[ReviewQuery]) -> ReviewListOut:
    """The review queue with its counts (open items oldest first, complete ones newest
    first), filtered by spec, run and criteria."""
    caller = _caller(request, slug, Role.VIEWER)
    statuses = (ReviewStatus.OPEN, ReviewStatus.ADJUDICATION, ReviewStatus.COMPLETE)
    if query.status not in statuses:
        raise ApiInputError("status", f"expected one of {', '.join(statuses)}")
    filters = ReviewFilters(spec=query.spec, run=query.run, criteria=query.criteria)
    items = selectors.review_queue_items(caller.project, filters, status=query.status)
    return ReviewListOut(
        counts=selectors.review_counts(caller.project, filters),
        items=[_item_out(request, caller, item) for item in items],
    )


class ReviewNextIn(Schema):
    spec: str = ""
    run: RowId | None = None
    criteria: str = ""


@router.post(
    "/projects/{slug}/reviews/next",
    response={200: ReviewItemDetailOut, 204: None},
    url_name="review_next",
)
def review_next(
    request: HttpRequest, slug: str, payload: ReviewNextIn
) -> Status[ReviewItemDetailOut] | Status[None]:
    """Claim the next item for you (one you already hold, else the oldest open one nobody
    holds that you have not graded); 204 when nothing is left."""
    caller = _caller(request, slug, Role.REVIEWER)
    filters = ReviewFilters(spec=payload.spec, run=payload.run, criteria=payload.criteria)
    item = services.review_next(project=caller.project, user=caller.user, filters=filters)
    if item is None:
        return Status(204, None)
    return Status(200, _detail(request, caller, item.pk))


# Registered after /reviews/next, whose path it would otherwise match.
@router.get(
    "/projects/{slug}/reviews/{item_id}", response=ReviewItemDetailOut, url_name="review_item"
)
def review_item(request: HttpRequest, slug: str, item_id: RowId) -> ReviewItemDetailOut:
    """One item: what was judged, the criteria and rubric, and the judge's verdict unless
    the review is blind and you have not graded it yet."""
    caller = _caller(request, slug, Role.VIEWER)
    return _detail(request, caller, item_id)


@router.post(
    "/projects/{slug}/reviews/{item_id}/claim",
    response={200: ReviewItemDetailOut, 409: ErrorOut},
    url_name="review_claim",
)
def review_claim(request: HttpRequest, slug: str, item_id: RowId) -> ReviewItemDetailOut:
    """Lock the item for you until the claim expires (claiming again renews it); 409 when
    someone else holds it, it is closed, or you graded it already."""
    caller = _caller(request, slug, Role.REVIEWER)
    item = _item(caller, item_id)
    try:
        services.review_claim(item_id=item.pk, user=caller.user)
    except services.ReviewClaimError as exc:
        raise ApiConflict(str(exc)) from None
    return _detail(request, caller, item.pk)


@router.post(
    "/projects/{slug}/reviews/{item_id}/release", response={204: None}, url_name="review_release"
)
def review_release(request: HttpRequest, slug: str, item_id: RowId) -> Status[None]:
    """Give your claim back to the queue (someone else's claim is left as it is)."""
    caller = _caller(request, slug, Role.REVIEWER)
    item = _item(caller, item_id)
    services.review_release(item_id=item.pk, user=caller.user)
    return Status(204, None)


class VerdictIn(Schema):
    passed: bool
    score: float | None = Field(default=None, description="0..1; by default 1 or 0")
    note: str = ""


class SubmissionOut(Schema):
    item: ReviewItemDetailOut
    completed: bool  # this verdict closed the item (the result changed, the run rescored)


@router.post(
    "/projects/{slug}/reviews/{item_id}/verdict",
    response={201: SubmissionOut, 409: ErrorOut},
    url_name="review_verdict",
)
def review_verdict(
    request: HttpRequest, slug: str, item_id: RowId, payload: VerdictIn
) -> Status[SubmissionOut]:
    """Grade the item. Refused (409) when someone else's claim is live, the item is closed
    or you graded it already; a bad score or note is a 422 naming the field."""
    caller = _caller(request, slug, Role.REVIEWER)
    item = _item(caller, item_id)
    try:
        submission = services.review_submit(
            item_id=item.pk,
            user=caller.user,
            passed=payload.passed,
            score=payload.score,
            note=payload.note,
        )
    except services.ReviewInputError as exc:
        field, _, message = str(exc).partition(": ")
        raise ApiInputError(field, message or str(exc)) from None
    except services.ReviewClaimError as exc:
        raise ApiConflict(str(exc)) from None
    return Status(
        201,
        SubmissionOut(
            item=_detail(request, caller, item.pk), completed=submission.change is not None
        ),
    )
