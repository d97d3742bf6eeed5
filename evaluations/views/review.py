"""The review queue: people grade the judge's results, by keyboard, one item after another.

- queue: the list with filters (spec, run, criteria) and counts; POST = "Start reviewing"
  (claims the next item for the reviewer).
- item: one item. GET only shows it; POST grades it (then the next item is claimed and,
  for htmx, swapped in; without JavaScript, a redirect to it), or claims, skips or
  adjudicates it.
- agreement: judge-human agreement per judge model, criteria and prompt version.
- send_to_review: POST from the execution page.

Viewers see the queue, items (read-only) and agreement; grading needs the reviewer role,
adjudication the admin role. Non-members get a 404 (evaluations.access.project_for).
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import truncatechars
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from evaluations import charts, selectors, services
from evaluations.access import ProjectAccess, project_for, spec_in
from evaluations.markup import escape
from evaluations.models import CheckResult, ReviewItem, ReviewStatus, ReviewVerdict, Role, Spec
from evaluations.numbers import whole_number
from evaluations.selectors import ReviewFilters
from evaluations.templatetags.keystone import fixed, local_minute
from evaluations.views.htmx import is_htmx, page_or_region, refusal_status

ITEM_TEMPLATE = "review/item.html"
QUEUE_STATUSES = (ReviewStatus.OPEN, ReviewStatus.ADJUDICATION, ReviewStatus.COMPLETE)


def _query(filters: ReviewFilters, **extra: Any) -> str:
    values = {**filters.as_dict(), **{k: str(v) for k, v in extra.items() if v}}
    return f"?{urlencode(values)}" if values else ""


def _queue_url(access: ProjectAccess, filters: ReviewFilters) -> str:
    return reverse("review_queue", args=[access.project.slug]) + _query(filters)


def _item_url(access: ProjectAccess, item_id: int, filters: ReviewFilters, **extra: Any) -> str:
    return reverse("review_item", args=[access.project.slug, item_id]) + _query(filters, **extra)


# Items this reviewer skipped, per project, kept in their session: the next item is never
# one of them until nothing else is left (then they come round again, oldest first).
SKIPPED_MAX = 500


def _skipped_key(access: ProjectAccess) -> str:
    return f"review_skipped:{access.project.pk}"


def _skipped(request: HttpRequest, access: ProjectAccess) -> list[int]:
    return [int(i) for i in request.session.get(_skipped_key(access), [])]


def _skip(request: HttpRequest, access: ProjectAccess, item_id: int) -> None:
    ids = [i for i in _skipped(request, access) if i != item_id] + [item_id]
    request.session[_skipped_key(access)] = ids[-SKIPPED_MAX:]


def _claim_next(
    request: HttpRequest, access: ProjectAccess, filters: ReviewFilters
) -> ReviewItem | None:
    """The next item for this reviewer, skipped ones last."""
    skipped = tuple(_skipped(request, access))
    following = services.review_next(
        project=access.project, user=request.user, filters=filters, exclude=skipped
    )
    if following is None and skipped:
        # Only skipped items are left: the queue is empty otherwise, so they come back.
        request.session[_skipped_key(access)] = []
        following = services.review_next(project=access.project, user=request.user, filters=filters)
    return following


# --- The queue ------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def queue(request: HttpRequest, project_slug: str) -> HttpResponse:
    if request.method == "POST":
        return _start_reviewing(request, project_slug)
    access = project_for(request, project_slug)
    filters = ReviewFilters.from_query(request.GET)
    status = request.GET.get("status") or ReviewStatus.OPEN
    if status not in QUEUE_STATUSES:
        status = ReviewStatus.OPEN
    try:
        after = (
            selectors.RunCursor.decode(request.GET["after"]) if request.GET.get("after") else None
        )
    except ValueError:
        after = None  # a mangled link starts at the first page
    page = selectors.review_queue_page(access.project, filters, status=status, after=after)
    choices = selectors.review_filter_choices(access.project)
    item_url = charts.id_paths("review_item", access.project.slug)
    for item in page.items:  # one reversed URL for the 50 rows' links
        item.url = item_url(item.pk)
    filter_query = _query(filters)
    context = {
        "access": access,
        "filters": filters,
        "filter_query": filter_query,
        "status": status,
        "statuses": [(s.value, s.label) for s in QUEUE_STATUSES],
        "counts": selectors.review_counts(access.project, filters),
        "items": page.items,
        "item_rows": _queue_rows(page.items, status=status, filter_query=filter_query),
        "paged": after is not None,
        "first_query": _query(filters, status=status),
        "next_query": (
            _query(filters, status=status, after=page.next_cursor.encode())
            if page.next_cursor is not None
            else ""
        ),
        "choices": choices,
        # The run drop-down's 100 ids as text, and which one is chosen: an int in a
        # template goes through number localization, twice an option.
        "run_choices": [(str(run_id), run_id == filters.run) for run_id in choices["runs"]],
    }
    template = page_or_region(request, "review/queue.html", "queue-region")
    return render(request, template, context)


def _queue_rows(items: list[Any], *, status: str, filter_query: str) -> list[SafeString]:
    """The queue's table rows as its template loop wrote them (every text value escaped):
    about twenty template nodes a row (lookups, conditions, filters) over 50 rows were half
    of the page's time. Each item needs `url` and `verdict_count` (the view and
    selectors.review_queue_page set them)."""
    now = timezone.now()
    return [_queue_row(item, status=status, filter_query=filter_query, now=now) for item in items]


def _badge(passed: Any) -> str:
    word = "pass" if passed else "fail"
    return f'<span class="badge {word}">{word}</span>'


def _queue_row(item: Any, *, status: str, filter_query: str, now: Any) -> SafeString:
    if item.blind and item.status == "open":
        judge = '<span class="muted">blind</span>'
    elif item.judge_score is not None:
        judge = f"{fixed(item.judge_score, 2)} {_badge(item.judge_passed)}"
    else:
        judge = "—"
    people = (
        f'<td class="num">{fixed(item.final_score, 2)} {_badge(item.final_passed)}</td>'
        if status == "complete"
        else ""
    )
    grader = (
        escape(item.claimed_by.get_username())
        if item.claim_is_live(now)
        else '<span class="muted">—</span>'
    )
    criteria = escape(truncatechars(item.criteria, 80))
    return mark_safe(  # noqa: S308 - every text value is escaped; the rest are numbers
        "\n              <tr>\n"
        f'                <td><a href="{escape(item.url)}{escape(filter_query)}">#{item.pk}</a></td>\n'
        f"                <td>{escape(item.get_reason_display())}</td>\n"
        f"                <td>{escape(item.spec.slug)}</td>\n"
        f"                <td>#{item.run_id}</td>\n"
        f'                <td><span class="mono">{escape(item.invariant_id)}</span> '
        f'<span class="muted small">{criteria}</span></td>\n'
        f'                <td class="num">{judge}</td>\n'
        f"                {people}\n"
        f'                <td class="num">{item.verdict_count}/{item.reviews_required}</td>\n'
        f"                <td>{grader}</td>\n"
        f'                <td class="small">{local_minute(item.created)}</td>\n'
        "              </tr>\n            "
    )


def _start_reviewing(request: HttpRequest, project_slug: str) -> HttpResponse:
    access = project_for(request, project_slug, Role.REVIEWER)
    filters = ReviewFilters.from_query(request.POST)
    item = _claim_next(request, access, filters)
    if item is None:
        messages.info(request, "Nothing left for you to grade with these filters.")
        return redirect(_queue_url(access, filters))
    return redirect(_item_url(access, item.pk, filters))


# --- One item ---------------------------------------------------------------------------------


def _item_or_404(access: ProjectAccess, item_id: int) -> ReviewItem:
    item = selectors.review_item_in_project(access.project, item_id)
    if item is None:
        raise Http404("No such review item in this project.")
    return item


def _reveal(access: ProjectAccess, user: Any, item_id: Any) -> dict[str, Any] | None:
    """The item just graded, judge included, once the reviewer has answered (blind mode
    hides the judge until then)."""
    number = whole_number(item_id)
    if number is None:
        return None
    verdict = (
        ReviewVerdict.objects.select_related("item__check_result")
        .filter(item_id=number, item__project=access.project, reviewer=user)
        .first()
    )
    if verdict is None:
        return None
    return {
        "item": verdict.item,
        "verdict": verdict,
        "judge": selectors.judge_view(verdict.item.check_result),
    }


def _item_context(
    request: HttpRequest,
    access: ProjectAccess,
    item: ReviewItem | None,
    filters: ReviewFilters,
    *,
    previous: dict[str, Any] | None = None,
    error: str = "",
    form: dict[str, str] | None = None,
) -> dict[str, Any]:
    context: dict[str, Any] = {
        "access": access,
        "item": item,
        "filters": filters,
        "filter_query": _query(filters),
        "previous": previous,
        "error": error,
        "form": form or {},
    }
    if item is None:
        return context
    user = request.user
    my_verdict = next((v for v in item.verdicts.all() if v.reviewer_id == user.pk), None)
    is_open = item.status == ReviewStatus.OPEN
    held_by_me = is_open and item.claim_is_live() and item.claimed_by_id == user.pk
    graded_before = (
        ReviewVerdict.objects.filter(reviewer_id=user.pk, item__project=access.project)
        .exclude(item=item)
        .order_by("-created", "-id")
        .values_list("item_id", flat=True)
        .first()
    )
    context.update(
        {
            "progress": selectors.review_progress(access.project, user, filters),
            "skipped_count": len(_skipped(request, access)),
            # The item this reviewer graded last: "Previous" opens it (read-only).
            "previous_url": (
                _item_url(access, graded_before, filters) if graded_before is not None else ""
            ),
            "view": selectors.review_item_view(item),
            "my_verdict": my_verdict,
            # Blind review: the judge's side appears once this person has answered, or
            # when nobody grades the item any more.
            "show_judge": not item.blind or my_verdict is not None or not is_open,
            "can_grade": access.can_review and held_by_me and my_verdict is None,
            "can_claim": (
                access.can_review
                and is_open
                and my_verdict is None
                and not item.claimed_by_other(user)
            ),
            "held_by_other": is_open and item.claimed_by_other(user),
            "can_adjudicate": access.is_admin and item.status == ReviewStatus.ADJUDICATION,
            # Other people's grades stay hidden while the item is open, so that each
            # reviewer grades independently.
            "show_verdicts": not is_open,
        }
    )
    return context


def _render_item(
    request: HttpRequest, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    # htmx swaps only 2xx answers, so a region that shows an error is sent as 200.
    template = page_or_region(request, ITEM_TEMPLATE, "item")
    return render(request, template, context, status=refusal_status(request, status))


@login_required
@require_http_methods(["GET", "POST"])
def item(request: HttpRequest, project_slug: str, item_id: int) -> HttpResponse:
    if request.method == "POST":
        return _item_post(request, project_slug, item_id)
    access = project_for(request, project_slug)
    review_item = _item_or_404(access, item_id)
    filters = ReviewFilters.from_query(request.GET)
    previous = _reveal(access, request.user, request.GET.get("previous"))
    return _render_item(
        request, _item_context(request, access, review_item, filters, previous=previous)
    )


def _grade_form(request: HttpRequest) -> dict[str, str]:
    return {
        "verdict": request.POST.get("verdict", ""),
        "score": request.POST.get("score", "").strip(),
        "note": request.POST.get("note", ""),
    }


def _passed(value: str) -> bool | None:
    return {"pass": True, "fail": False}.get(value)


def _item_post(request: HttpRequest, project_slug: str, item_id: int) -> HttpResponse:
    action = request.POST.get("action", "grade")
    minimum = Role.ADMIN if action == "adjudicate" else Role.REVIEWER
    access = project_for(request, project_slug, minimum)
    review_item = _item_or_404(access, item_id)
    filters = ReviewFilters.from_query(request.POST)
    user = request.user
    form = _grade_form(request)
    try:
        if action == "claim":
            services.review_claim(item_id=review_item.pk, user=user)
            return redirect(_item_url(access, review_item.pk, filters))
        if action == "undo":
            services.review_undo(item_id=review_item.pk, user=user)
            # Back on the item, claimed again, to grade it anew.
            if not is_htmx(request):
                return redirect(_item_url(access, review_item.pk, filters))
            reopened = _item_or_404(access, review_item.pk)
            response = _render_item(request, _item_context(request, access, reopened, filters))
            response["HX-Push-Url"] = _item_url(access, review_item.pk, filters)
            return response
        if action == "skip":
            services.review_release(item_id=review_item.pk, user=user)
            _skip(request, access, review_item.pk)
            return _next_item(request, access, filters)
        if action == "adjudicate":
            services.review_adjudicate(
                item_id=review_item.pk,
                user=user,
                passed=_passed(form["verdict"]),
                score=form["score"] or None,
                note=form["note"],
            )
            messages.success(request, f"Item {review_item.pk} adjudicated; the run was rescored.")
            return redirect(_item_url(access, review_item.pk, filters))
        services.review_submit(
            item_id=review_item.pk,
            user=user,
            passed=_passed(form["verdict"]),
            score=form["score"] or None,
            note=form["note"],
        )
    except services.ReviewInputError as exc:
        context = _item_context(request, access, review_item, filters, error=str(exc), form=form)
        return _render_item(request, context, status=400)
    except services.ReviewClaimError as exc:
        review_item = _item_or_404(access, item_id)
        context = _item_context(request, access, review_item, filters, error=str(exc), form=form)
        return _render_item(request, context, status=409)
    return _next_item(request, access, filters, previous_id=review_item.pk)


def _next_item(
    request: HttpRequest,
    access: ProjectAccess,
    filters: ReviewFilters,
    *,
    previous_id: int | None = None,
) -> HttpResponse:
    """Claim the reviewer's next item: swapped in for htmx (with the address bar
    following), a redirect otherwise."""
    following = _claim_next(request, access, filters)
    if following is None:
        url = _queue_url(access, filters)
    else:
        url = _item_url(access, following.pk, filters, previous=previous_id)
    if not is_htmx(request):
        if following is None:
            messages.info(request, "Nothing left for you to grade with these filters.")
        return redirect(url)
    next_item = _item_or_404(access, following.pk) if following is not None else None
    previous = _reveal(access, request.user, previous_id)
    response = _render_item(
        request, _item_context(request, access, next_item, filters, previous=previous)
    )
    response["HX-Push-Url"] = url
    return response


# --- Agreement -------------------------------------------------------------------------------


def _group_label(row: selectors.AgreementRow) -> str:
    criteria = row.criteria if len(row.criteria) <= 40 else row.criteria[:39] + "…"
    version = row.prompt_version[:8] or "no version"
    return f"{row.judge_model} · {criteria} · {version}"


@login_required
def agreement(request: HttpRequest, project_slug: str) -> HttpResponse:
    access = project_for(request, project_slug)
    spec_slug = request.GET.get("spec", "").strip()
    spec = spec_in(access.project, spec_slug) if spec_slug else None
    rows = selectors.review_agreement(access.project, spec=spec)
    kappa_series = [
        charts.Series(
            name=_group_label(row),
            x=[point.day for point in row.trend],
            y=[point.cumulative.kappa for point in row.trend],
            hover=[f"n = {point.cumulative.n}" for point in row.trend],
        )
        for row in rows
    ]
    agreement_series = [
        charts.Series(
            name=_group_label(row),
            x=[point.day for point in row.trend],
            y=[point.cumulative.percent for point in row.trend],
            hover=[f"n = {point.cumulative.n}" for point in row.trend],
        )
        for row in rows
    ]
    context = {
        "access": access,
        "rows": rows,
        "spec_slug": spec_slug,
        "specs": list(
            Spec.objects.filter(project=access.project)
            .order_by("slug")
            .values_list("slug", flat=True)
        ),
        "charts": [
            charts.Chart(
                id="kappa-trend",
                title="Cohen's kappa over time (cumulative)",
                figure=charts.line_chart(
                    kappa_series, y_title="Cohen's kappa", y_range=(-1.02, 1.02), y_format=".2f"
                ),
            ),
            charts.Chart(
                id="agreement-trend",
                title="Agreement on pass/fail over time (cumulative)",
                figure=charts.line_chart(
                    agreement_series, y_title="Agreement", y_range=(0, 1.02), y_format=".0%"
                ),
            ),
        ],
    }
    return render(request, "review/agreement.html", context)


# --- Send a result to the queue ----------------------------------------------------------------


@login_required
@require_POST
def send_to_review(request: HttpRequest, project_slug: str, result_id: int) -> HttpResponse:
    access = project_for(request, project_slug, Role.REVIEWER)
    result = CheckResult.objects.filter(pk=result_id, run__project=access.project).first()
    if result is None:
        raise Http404("No such check result in this project.")
    review_item = services.review_send(result_id=result.pk, user=request.user)
    item_url = reverse("review_item", args=[access.project.slug, review_item.pk])
    if is_htmx(request):
        return render(
            request,
            "review/sent.html",
            {"access": access, "review_item": review_item, "item_url": item_url},
        )
    messages.success(
        request, f"{result.invariant_id} sent to the review queue (item {review_item.pk})."
    )
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(target)
    return redirect(
        "execution_detail", project_slug=access.project.slug, execution_id=result.execution_id
    )


# --- Export of the grades ------------------------------------------------------------------

GRADE_COLUMNS = (
    "item",
    "run",
    "execution",
    "spec",
    "invariant",
    "judge_model",
    "judge_score",
    "judge_passed",
    "reviewer",
    "human_passed",
    "human_score",
    "note",
    "graded_at",
    "item_status",
)


def _grade_row(verdict: ReviewVerdict) -> dict[str, Any]:
    item = verdict.item
    return {
        "item": item.pk,
        "run": item.run_id,
        "execution": item.execution_id,
        "spec": item.spec.slug,
        "invariant": item.invariant_id,
        "judge_model": item.judge_model,
        "judge_score": item.judge_score,
        "judge_passed": item.judge_passed,
        "reviewer": verdict.reviewer.get_username() if verdict.reviewer else "",
        "human_passed": verdict.passed,
        "human_score": verdict.score,
        "note": verdict.note,
        "graded_at": verdict.created.isoformat(),
        "item_status": item.status,
    }


class _Line:
    """csv.writer's file: hands back each line instead of storing it (for streaming)."""

    def write(self, text: str) -> str:
        return text


@login_required
@require_GET
def export_grades(request: HttpRequest, project_slug: str, fmt: str) -> StreamingHttpResponse:
    """Every person's grade next to the judge's (CSV or JSON Lines), under the queue's
    filters: for agreement studies outside Keystone."""
    access = project_for(request, project_slug)
    if fmt not in ("csv", "jsonl"):
        raise Http404(f"Unknown export format {fmt!r}: use grades.csv or grades.jsonl.")
    rows = (
        _grade_row(v)
        for v in selectors.review_grades(access.project, ReviewFilters.from_query(request.GET))
    )
    lines: Iterator[str]
    if fmt == "csv":
        writer = csv.DictWriter(_Line(), fieldnames=GRADE_COLUMNS)
        lines = itertools.chain([writer.writeheader()], (writer.writerow(r) for r in rows))
        content_type = "text/csv; charset=utf-8"
    else:
        lines = (json.dumps(r) + "\n" for r in rows)
        content_type = "application/x-ndjson"
    response = StreamingHttpResponse(lines, content_type=content_type)
    name = f"{access.project.slug}-review-grades.{fmt}"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
