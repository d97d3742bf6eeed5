"""The review queue: which judge scores people grade, and claiming items to grade."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from checks.results import JUDGE_CHECK_TYPES
from checks.spec.semantics import JUDGE_MODEL_MAX
from evaluations.models import (
    CheckResult,
    Project,
    ResultSource,
    ReviewItem,
    ReviewReason,
    ReviewStatus,
    Role,
    Run,
)
from evaluations.selectors.reviews import ReviewFilters, judge_view

#
# run_finalize calls review_items_select, which queues judge results by the review policy
# (the project's `review_policy`, overridden key by key by the spec's `review:` block).
# A reviewer claims an item (a lock with a timeout, taken by a conditional UPDATE), grades
# it, and when `reviews_required` verdicts agree the human result is written: it outranks
# the judge's in selectors.effective_results, so the execution and the run are rescored
# from stored rows, and a ResultChange keeps before and after. Disagreeing reviewers send
# the item to an admin (adjudication). The number of verdicts per item is enforced by the
# ReviewVerdict constraints, not by this code.

REVIEW_POLICY_DEFAULTS: dict[str, Any] = {
    "all": False,
    "sample_rate": 0.0,
    "borderline_margin": None,
    "check_disagreement": False,
    "spread_max": None,
    "failing_gates": False,
    "reviewers_per_item": 1,
    "blind": False,
    # Reviewers whose scores differ by more than this disagree even on the same verdict.
    "disagreement": None,
}
REVIEW_NOTE_MAX = 2000
REVIEW_NEXT_CANDIDATES = 25
# Float sums (0.7 + 0.15) must not fall outside a margin they meet on paper.
REVIEW_EPSILON = 1e-9


class ReviewError(Exception):
    """A review action that is refused; the message says why, for people."""


class ReviewPermissionError(ReviewError):
    """The user's role in the project does not allow this."""


class ReviewClaimError(ReviewError):
    """The item is held by someone else, closed, or already graded by this user."""


class ReviewInputError(ReviewError, ValueError):
    """A grade that is not valid (the message names the field)."""


@dataclass(frozen=True, slots=True)
class ReviewPolicy:
    """Which judge results are queued for people and how they are graded: the defaults, then
    the project's `review_policy`, then the spec's `review:` block."""

    all: bool
    sample_rate: float
    borderline_margin: float | None
    check_disagreement: bool
    spread_max: float | None
    failing_gates: bool
    reviewers_per_item: int
    blind: bool
    disagreement: float | None

    @property
    def selects_anything(self) -> bool:
        return (
            self.all
            or self.sample_rate > 0
            or self.borderline_margin is not None
            or self.check_disagreement
            or self.spread_max is not None
            or self.failing_gates
        )


def review_policy_for(*, project: Project, spec_raw: dict[str, Any]) -> ReviewPolicy:
    """Defaults, then the project's policy, then the spec's `review:` block (wins)."""
    merged = dict(REVIEW_POLICY_DEFAULTS)
    for layer in (project.review_policy or {}, spec_raw.get("review") or {}):
        merged.update({k: v for k, v in layer.items() if k in REVIEW_POLICY_DEFAULTS})
    return ReviewPolicy(
        all=bool(merged["all"]),
        sample_rate=float(merged["sample_rate"] or 0.0),
        borderline_margin=_optional_float(merged["borderline_margin"]),
        check_disagreement=bool(merged["check_disagreement"]),
        spread_max=_optional_float(merged["spread_max"]),
        failing_gates=bool(merged["failing_gates"]),
        reviewers_per_item=max(1, int(merged["reviewers_per_item"] or 1)),
        blind=bool(merged["blind"]),
        disagreement=_optional_float(merged["disagreement"]),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def project_review_policy_set(*, project: Project, policy: dict[str, Any]) -> Project:
    """Store a project's review policy, checked against the spec schema's `review` block."""
    from checks.json_schema import jsonschema
    from checks.spec.schema import spec_schema

    validator = jsonschema.Draft202012Validator(spec_schema()["$defs"]["review"])
    problems = sorted(validator.iter_errors(policy), key=lambda e: list(e.absolute_path))
    if problems:
        first = problems[0]
        where = ".".join(str(p) for p in first.absolute_path) or "review policy"
        raise ReviewInputError(f"{where}: {first.message}")
    project.review_policy = dict(policy)
    project.save(update_fields=["review_policy"])
    return project


def require_role(project: Project, user: Any, minimum: Role) -> None:
    if not project.has_role(user, minimum):
        raise ReviewPermissionError(
            f"This needs the {minimum.label.lower()} role in {project.name}."
        )


def review_claim_seconds() -> int:
    return int(settings.KEYSTONE_REVIEW_CLAIM_SECONDS)


def _sampled(seed: int, result_id: int, rate: float) -> bool:
    """A deterministic coin per (run seed, result): re-running the selection, or
    finalizing the run again, picks the same results."""
    digest = hashlib.sha256(f"{seed}:{result_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def _review_reason(
    row: CheckResult, policy: ReviewPolicy, seed: int, checks: list[CheckResult]
) -> str | None:
    """Why this judge result goes to people (the most telling reason), or None."""

    judge = judge_view(row)
    if policy.failing_gates and row.gate and (not row.passed or row.score < 1.0):
        return ReviewReason.GATE
    if policy.check_disagreement and judge.passed is not None:
        shared = set(row.dimensions)
        for check in checks:
            if (
                shared & set(check.dimensions)
                and not check.to_engine().is_error
                and check.passed != judge.passed
            ):
                return ReviewReason.DISAGREEMENT
    spread_max, margin = policy.spread_max, policy.borderline_margin
    spread = judge.spread
    if spread_max is not None and spread is not None and spread > spread_max + REVIEW_EPSILON:
        return ReviewReason.SPREAD
    distance = None if judge.score is None else abs(judge.score - judge.threshold)
    if margin is not None and distance is not None and distance <= margin + REVIEW_EPSILON:
        return ReviewReason.BORDERLINE
    if policy.sample_rate > 0 and _sampled(seed, row.pk, policy.sample_rate):
        return ReviewReason.SAMPLE
    if policy.all:
        return ReviewReason.ALL
    return None


def _review_item_for(
    run: Run, row: CheckResult, *, reason: str, policy: ReviewPolicy, sent_by: Any = None
) -> ReviewItem:

    invariant = (run.spec_version.parsed.get("invariants") or {}).get(row.invariant_id) or {}
    check = invariant.get("check") or {}
    is_judge = row.check_type in JUDGE_CHECK_TYPES and row.source != ResultSource.HUMAN
    judge = judge_view(row)
    return ReviewItem(
        project_id=run.project_id,
        spec_id=run.spec_id,
        run=run,
        execution_id=row.execution_id,
        check_result=row,
        invariant_id=row.invariant_id,
        criteria=str(check.get("criteria") or invariant.get("description") or row.invariant_id),
        # The spec's model names are checked; the name a judge server answers with is not.
        judge_model=judge.model[:JUDGE_MODEL_MAX] if is_judge else "",
        prompt_version=judge.prompt_version if is_judge else "",
        judge_score=judge.score if is_judge else None,
        judge_passed=judge.passed if is_judge else None,
        reason=reason,
        reviews_required=policy.reviewers_per_item,
        blind=policy.blind,
        sent_by=sent_by,
    )


def review_items_select(*, run_id: int) -> list[ReviewItem]:
    """Queue the run's judge results that the review policy asks people to grade.
    Idempotent: a result that already had an item, or already has a human verdict, is
    skipped, and the database refuses a second pending item for one result."""
    run = Run.objects.select_related("spec_version", "project").get(pk=run_id)
    policy = review_policy_for(project=run.project, spec_raw=run.spec_version.parsed)
    if not policy.selects_anything:
        return []
    judged = list(
        CheckResult.objects.filter(run=run, check_type__in=JUDGE_CHECK_TYPES)
        .exclude(source=ResultSource.HUMAN)
        .order_by("id")
    )
    if not judged:
        return []
    reviewed = set(ReviewItem.objects.filter(run=run).values_list("check_result_id", flat=True))
    humans = set(
        CheckResult.objects.filter(run=run, source=ResultSource.HUMAN).values_list(
            "execution_id", "invariant_id"
        )
    )
    checks: dict[int, list[CheckResult]] = {}
    if policy.check_disagreement:
        for check in (
            CheckResult.objects.filter(run=run, source=ResultSource.ENGINE)
            .exclude(check_type__in=JUDGE_CHECK_TYPES)
            .exclude(dimensions=[])
        ):
            checks.setdefault(check.execution_id, []).append(check)
    seed = int(run.options.get("seed", 0) or 0)
    new_items = []
    for row in judged:
        if row.pk in reviewed or (row.execution_id, row.invariant_id) in humans:
            continue
        reason = _review_reason(row, policy, seed, checks.get(row.execution_id, []))
        if reason is not None:
            new_items.append(_review_item_for(run, row, reason=reason, policy=policy))
    if not new_items:
        return []
    ReviewItem.objects.bulk_create(new_items, ignore_conflicts=True)
    # Read back 500 results' items at a time: a policy that samples every judge result of a
    # large run would otherwise list all their ids in one statement.
    wanted = [item.check_result_id for item in new_items]
    made: list[ReviewItem] = []
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        made.extend(ReviewItem.objects.filter(run=run, check_result_id__in=chunk))
    return sorted(made, key=lambda item: item.pk)


def review_send(*, result_id: int, user: Any) -> ReviewItem:
    """A person sends any check result to the queue (from the execution page). A result
    already waiting for review returns its pending item."""
    row = CheckResult.objects.select_related("run__spec_version", "run__project").get(pk=result_id)
    run = row.run
    require_role(run.project, user, Role.REVIEWER)
    pending = ReviewItem.objects.filter(check_result=row).exclude(status=ReviewStatus.COMPLETE)
    existing = pending.first()
    if existing is not None:
        return existing
    policy = review_policy_for(project=run.project, spec_raw=run.spec_version.parsed)
    item = _review_item_for(run, row, reason=ReviewReason.MANUAL, policy=policy, sent_by=user)
    try:
        with transaction.atomic():
            item.save()
    except IntegrityError:
        # Someone sent the same result at the same moment: theirs is the pending item.
        return pending.get()
    return item


def review_claim(*, item_id: int, user: Any) -> ReviewItem:
    """Lock an item for this reviewer until the claim expires. A conditional UPDATE, so of
    two reviewers claiming at once exactly one wins; an expired claim can be taken over;
    claiming again renews one's own claim."""
    item = ReviewItem.objects.select_related("project").get(pk=item_id)
    require_role(item.project, user, Role.REVIEWER)
    now = timezone.now()
    claimable = (
        ReviewItem.objects.filter(pk=item_id, status=ReviewStatus.OPEN)
        .filter(Q(claimed_by__isnull=True) | Q(claim_expires__lte=now) | Q(claimed_by=user))
        .exclude(verdicts__reviewer=user)
    )
    expires = now + timedelta(seconds=review_claim_seconds())
    if claimable.update(claimed_by=user, claim_expires=expires):
        item.refresh_from_db()
        return item
    item.refresh_from_db()
    if item.status != ReviewStatus.OPEN:
        raise ReviewClaimError(f"Review item {item.pk} is {item.get_status_display().lower()}.")
    if item.verdicts.filter(reviewer=user).exists():
        raise ReviewClaimError(f"You already graded review item {item.pk}.")
    holder = item.claimed_by.get_username() if item.claimed_by else "someone else"
    until = (
        timezone.localtime(item.claim_expires).strftime("%H:%M:%S") if item.claim_expires else ""
    )
    raise ReviewClaimError(f"Review item {item.pk} is being graded by {holder} until {until}.")


def review_release(*, item_id: int, user: Any) -> None:
    """Give a claimed item back to the queue (skip)."""
    ReviewItem.objects.filter(pk=item_id, claimed_by=user).update(
        claimed_by=None, claim_expires=None
    )


def review_next(
    *, project: Project, user: Any, filters: Any = None, exclude: tuple[int, ...] = ()
) -> ReviewItem | None:
    """The item this reviewer should grade now, claimed for them: one they already hold,
    else the oldest open one nobody holds that they have not graded. None when done."""

    require_role(project, user, Role.REVIEWER)
    filters = filters or ReviewFilters()
    mine = (
        filters.apply(ReviewItem.objects.filter(project=project, status=ReviewStatus.OPEN))
        .exclude(verdicts__reviewer=user)
        .exclude(pk__in=exclude)
    )
    now = timezone.now()
    held = mine.filter(claimed_by=user, claim_expires__gt=now).order_by("created", "id").first()
    if held is not None:
        return review_claim(item_id=held.pk, user=user)
    free = mine.filter(Q(claimed_by__isnull=True) | Q(claim_expires__lte=now)).order_by(
        "created", "id"
    )
    for item_id in free.values_list("pk", flat=True)[:REVIEW_NEXT_CANDIDATES]:
        try:
            return review_claim(item_id=item_id, user=user)
        except ReviewClaimError:
            continue  # another reviewer took it a moment ago
    return None
