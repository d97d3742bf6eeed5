"""The review queue, one item, and judge-human agreement."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.utils import timezone

from evaluations.agreement import Pair, Tally, cohen_kappa, tally_trend
from evaluations.models import (
    Artifact,
    CheckResult,
    Execution,
    Project,
    ResultChange,
    ReviewAgreementDay,
    ReviewItem,
    ReviewStatus,
    ReviewVerdict,
    Spec,
    run_large_fields,
)
from evaluations.numbers import whole_number
from evaluations.selectors.bounds import capped_counts
from evaluations.selectors.executions import LLM_MESSAGES_SHOWN, message_line
from evaluations.selectors.runs import RunCursor

REVIEW_QUEUE_MAX = 100  # items the API's queue list returns
REVIEW_PAGE_ROWS = 50  # rows in a page of the queue table
REVIEW_CHOICES_MAX = 100  # entries per filter drop-down
TRACE_READ_MAX = 512 * 1024  # bytes of trace.json read for the transcript summary
TOOL_CALLS_SHOWN = 50


@dataclass(frozen=True, slots=True)
class ReviewFilters:
    """The queue's filters: spec slug, run id, criteria (the invariant id)."""

    spec: str = ""
    run: int | None = None
    criteria: str = ""

    @classmethod
    def from_query(cls, query: Any) -> ReviewFilters:
        run = str(query.get("run") or "").strip()
        return cls(
            spec=str(query.get("spec") or "").strip(),
            run=whole_number(run),
            criteria=str(query.get("criteria") or "").strip(),
        )

    def apply(self, items: Any) -> Any:
        if self.spec:
            items = items.filter(spec__slug=self.spec)
        if self.run is not None:
            items = items.filter(run_id=self.run)
        if self.criteria:
            items = items.filter(invariant_id=self.criteria)
        return items

    def as_dict(self) -> dict[str, str]:
        values = {"spec": self.spec, "run": str(self.run or ""), "criteria": self.criteria}
        return {k: v for k, v in values.items() if v}


@dataclass(frozen=True, slots=True)
class JudgeView:
    """A stored judge verdict, read from CheckResult.details whatever its shape: the judge
    client's `details["judge"]` block, or the older flat keys."""

    model: str
    prompt_version: str
    score: float | None
    passed: bool | None
    reasoning: str
    threshold: float
    spread: float | None
    samples: int | None
    dimensions: dict[str, Any]


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def judge_view(row: CheckResult) -> JudgeView:
    details = _mapping(row.details)
    judge = _mapping(details.get("judge"))
    errored = row.to_engine().is_error
    threshold = details.get("pass_threshold", judge.get("pass_threshold", 0.5))
    spread = judge.get("spread", details.get("spread"))
    samples = judge.get("samples", details.get("samples"))
    dimensions = judge.get("dimensions", details.get("dimensions"))
    return JudgeView(
        model=str(judge.get("model") or details.get("model") or ""),
        prompt_version=str(judge.get("prompt_version") or details.get("prompt_version") or ""),
        score=None if errored else row.score,
        passed=None if errored else row.passed,
        reasoning=str(judge.get("reasoning") or details.get("reasoning") or ""),
        threshold=float(threshold) if isinstance(threshold, int | float) else 0.5,
        spread=float(spread) if isinstance(spread, int | float) else None,
        samples=len(samples) if isinstance(samples, list) else _optional_int(samples),
        dimensions=_mapping(dimensions),
    )


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def review_counts(project: Project, filters: ReviewFilters) -> dict[str, int]:
    """Items per status, and open items someone holds a live claim on, each capped
    (capped_counts, one query): every count reads at most COUNT_CAP + 1 entries of an
    index."""
    items = filters.apply(ReviewItem.objects.filter(project=project))
    counted = {status: items.filter(status=status) for status in ReviewStatus.values}
    counted["claimed"] = items.filter(status=ReviewStatus.OPEN, claim_expires__gt=timezone.now())
    return capped_counts(counted)


def review_progress(project: Project, user: Any, filters: ReviewFilters) -> dict[str, int]:
    """This reviewer's way through the queue: items they graded, and those graded plus those
    still open for them (the total), under the queue's filters. Both capped, in one query
    (capped_counts)."""
    items = filters.apply(ReviewItem.objects.filter(project=project))
    counts = capped_counts(
        {
            "graded": ReviewVerdict.objects.filter(reviewer=user, item__in=items.values("id")),
            # An open item this reviewer graded waits for someone else's grade: not left
            # for them.
            "left": items.filter(status=ReviewStatus.OPEN).exclude(
                Exists(ReviewVerdict.objects.filter(item=OuterRef("pk"), reviewer=user))
            ),
        }
    )
    return {"graded": counts["graded"], "total": counts["graded"] + counts["left"]}


def review_grades(project: Project, filters: ReviewFilters) -> Any:
    """Every person's grade with the judge's side of its item, oldest first, for the
    CSV / JSONL export (an iterator: the export streams). Only items people have finished
    (complete or waiting for adjudication): an open item's grades stay unseen by the other
    reviewers, and a blind item's judge score by everyone."""
    items = filters.apply(ReviewItem.objects.filter(project=project))
    return (
        ReviewVerdict.objects.filter(item__in=items.exclude(status=ReviewStatus.OPEN).values("id"))
        .select_related("item__spec", "reviewer")
        .order_by("created", "id")
        .iterator(chunk_size=500)
    )


@dataclass(frozen=True, slots=True)
class ReviewPage:
    """One page of the review queue, and where the next starts."""

    items: list[Any]
    next_cursor: RunCursor | None  # where the next page starts; None on the last page


def review_queue_page(
    project: Project,
    filters: ReviewFilters,
    *,
    status: str,
    after: RunCursor | None = None,
    limit: int = REVIEW_PAGE_ROWS,
) -> ReviewPage:
    """One page of items of one status, oldest first (newest completed first), by keyset:
    `after` is the (created or completed, id) of the previous page's last row, so every
    page is a range of the (project, status, ...) indexes, never an OFFSET. Their verdict
    counts come in one more query for these rows only."""
    items = filters.apply(ReviewItem.objects.filter(project=project, status=status))
    done = status == ReviewStatus.COMPLETE
    if after is not None:
        if done:
            items = items.filter(
                Q(completed__lt=after.created) | Q(completed=after.created, id__lt=after.id)
            )
        else:
            items = items.filter(
                Q(created__gt=after.created) | Q(created=after.created, id__gt=after.id)
            )
    order = ("-completed", "-id") if done else ("created", "id")
    rows = list(items.select_related("spec", "claimed_by").order_by(*order)[: limit + 1])
    more, rows = len(rows) > limit, rows[:limit]
    verdicts = dict(
        ReviewVerdict.objects.filter(item__in=[row.pk for row in rows])
        .order_by()
        .values_list("item")
        .annotate(count=Count("*"))
    )
    for row in rows:
        row.verdict_count = verdicts.get(row.pk, 0)
    last = rows[-1] if rows and more else None
    when = None if last is None else (last.completed if done else last.created)
    return ReviewPage(
        items=rows,
        next_cursor=None if last is None or when is None else RunCursor(created=when, id=last.pk),
    )


def review_queue_items(
    project: Project, filters: ReviewFilters, *, status: str, limit: int = REVIEW_QUEUE_MAX
) -> list[Any]:
    """The first page of review_queue_page."""
    return review_queue_page(project, filters, status=status, limit=limit).items


def review_filter_choices(project: Project) -> dict[str, list[Any]]:
    """What the filter drop-downs offer: specs, recent runs and criteria that have items.
    Each from an index: specs by EXISTS, runs newest first, criteria by a skip scan of
    (project, invariant_id) that visits each distinct value once, not every item."""
    items = ReviewItem.objects.filter(project=project)
    specs = (
        Spec.objects.filter(project=project)
        .filter(Exists(items.filter(spec=OuterRef("pk"))))
        .order_by("slug")
        .values_list("slug", flat=True)[:REVIEW_CHOICES_MAX]
    )
    return {
        "specs": list(specs),
        "runs": list(
            items.order_by("-run_id")
            .values_list("run_id", flat=True)
            .distinct()[:REVIEW_CHOICES_MAX]
        ),
        "criteria": _review_criteria(project.pk),
    }


def _review_criteria(project_id: int) -> list[tuple[str, str]]:
    """(invariant id, its criteria text), the first REVIEW_CHOICES_MAX by invariant id."""
    table = ReviewItem._meta.db_table
    sql = f"""
        WITH RECURSIVE invariant AS (
            SELECT MIN(invariant_id) AS id FROM {table} WHERE project_id = %s
            UNION ALL
            SELECT (SELECT MIN(invariant_id) FROM {table}
                    WHERE project_id = %s AND invariant_id > invariant.id)
            FROM invariant WHERE invariant.id IS NOT NULL
        )
        SELECT invariant.id, (SELECT criteria FROM {table}
                              WHERE project_id = %s AND invariant_id = invariant.id
                              ORDER BY id LIMIT 1)
        FROM invariant WHERE invariant.id IS NOT NULL
        ORDER BY invariant.id LIMIT %s
    """  # noqa: S608 (the table name comes from the model)
    with connection.cursor() as cursor:
        cursor.execute(sql, [project_id, project_id, project_id, REVIEW_CHOICES_MAX])
        return [(str(invariant_id), str(criteria or "")) for invariant_id, criteria in cursor]


@dataclass(frozen=True, slots=True)
class ToolCallLine:
    """A tool call as the review item page lists it, arguments and response cut short."""

    name: str
    arguments: str
    response: str


@dataclass(frozen=True, slots=True)
class ReviewItemView:
    """Everything the item page shows about the graded result."""

    item: Any
    result: CheckResult
    judge: JudgeView
    criteria: str
    rubric: dict[str, str]
    input_from: str
    judged_input: str
    prompt: str
    final_output: str
    tool_calls: list[ToolCallLine]
    tool_calls_total: int
    verdicts: list[Any]
    # The agent's whole exchange with its model (every message of its last LLM call, then
    # the model's reply): what the agent saw and said, for the reviewer as for the judge.
    conversation: list[dict[str, str]]


def review_item_in_project(project: Project, item_id: int) -> ReviewItem | None:
    """A review item with what its page and the API show of it: its spec, execution, result,
    who claimed and adjudicated it, and its run's spec version. Not the run's summary,
    verdicts or keys (the summary alone ~0.5 kB of JSON per scenario x prompt, decompressed and
    decoded), nor the spec version's text. The two people come in a query of their own
    (none when nobody claimed it): joined in, their two outer joins made PostgreSQL's
    planner weigh eight tables' orders, 7 ms of planning for a 0.3 ms query."""
    return (
        ReviewItem.objects.select_related("run__spec_version", "spec", "execution", "check_result")
        .prefetch_related("claimed_by", "adjudicated_by")
        .defer(*run_large_fields("run__"), "run__spec_version__source_yaml")
        .filter(project=project, pk=item_id)
        .first()
    )


def review_item_view(item: Any) -> ReviewItemView:
    result = item.check_result
    execution = item.execution
    invariants = _mapping(item.run.spec_version.parsed.get("invariants"))
    check = _mapping(_mapping(invariants.get(item.invariant_id)).get("check"))
    details = _mapping(result.details)
    input_from = str(check.get("input_from") or details.get("input_from") or "agent_output")
    if input_from == "agent_output":
        judged_input = execution.final_output
    else:
        judge = _mapping(details.get("judge"))
        judged_input = str(judge.get("judged_input") or details.get("judged_input_preview") or "")
    rubric = _mapping(check.get("rubric"))
    trace = _read_trace(execution)
    calls = _trace_tool_calls(trace)
    return ReviewItemView(
        item=item,
        result=result,
        judge=judge_view(result),
        criteria=item.criteria or str(check.get("criteria") or ""),
        rubric={str(k): str(v) for k, v in rubric.items()},
        input_from=input_from,
        judged_input=judged_input,
        prompt=execution.prompt,
        final_output=execution.final_output,
        tool_calls=calls[:TOOL_CALLS_SHOWN],
        tool_calls_total=len(calls),
        verdicts=list(item.verdicts.select_related("reviewer").order_by("slot")),
        conversation=_conversation(trace),
    )


def _read_trace(execution: Execution) -> dict[str, Any]:
    """The execution's stored trace (trace.json); empty when missing, too large or
    unreadable: the page still shows the output."""
    artifact = Artifact.objects.filter(execution=execution, kind="trace").first()
    if artifact is None:
        return {}
    try:
        with artifact.file.open("rb") as handle:
            raw = handle.read(TRACE_READ_MAX + 1)
        if len(raw) > TRACE_READ_MAX:
            return {}
        trace = json.loads(raw)
    except (OSError, ValueError):
        return {}
    return trace if isinstance(trace, dict) else {}


def _conversation(trace: dict[str, Any]) -> list[dict[str, str]]:
    """Every message of the last LLM call (each call carries the history before it), then
    the model's answer to it."""
    calls = [c for c in trace.get("llm_calls") or [] if isinstance(c, dict)]
    if not calls:
        return []
    last = calls[-1]
    raw_request = last.get("request")
    request: dict[str, Any] = raw_request if isinstance(raw_request, dict) else {}
    raw_messages = request.get("messages")
    messages: list[Any] = raw_messages if isinstance(raw_messages, list) else []
    lines = [message_line(m) for m in messages[:LLM_MESSAGES_SHOWN]]
    response = last.get("response")
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reply = message_line(choices[0].get("message") or {})
        lines.append({**reply, "role": f"{reply['role'] or 'assistant'} (reply)"})
    return lines


def _trace_tool_calls(trace: dict[str, Any]) -> list[ToolCallLine]:
    """The tool calls of the execution's stored trace, compact."""
    calls = trace.get("tool_calls")
    if not calls:
        calls = [
            call
            for llm in trace.get("llm_calls") or []
            if isinstance(llm, dict)
            for call in llm.get("tool_calls") or []
        ]
    lines = []
    for call in calls or []:
        if not isinstance(call, dict):
            continue
        arguments = call.get("arguments")
        lines.append(
            ToolCallLine(
                name=str(call.get("name") or "?"),
                arguments=_short(json.dumps(arguments, ensure_ascii=False, default=str), 200),
                response=_short(str(call.get("response") or ""), 200),
            )
        )
    return lines


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class AgreementRow:
    """Judge-human agreement for one (judge model, criteria, prompt version), with its daily
    trend."""

    judge_model: str
    criteria: str
    prompt_version: str
    agreement: Any  # evaluations.agreement.Agreement
    trend: list[Any]  # evaluations.agreement.TrendPoint


def review_agreement(
    project: Project, *, spec: Spec | None = None, with_trend: bool = True
) -> list[AgreementRow]:
    """Judge-human agreement per (judge model, criteria, prompt version), from completed
    items whose judge gave a verdict, with a cumulative trend by day (an empty one without
    `with_trend`: the digest shows the totals only). One query of the daily tallies kept as
    items complete (ReviewAgreementDay): the rows read grow with the days graded, not with
    the items."""
    days = ReviewAgreementDay.objects.filter(project=project)
    if spec is not None:
        days = days.filter(spec=spec)
    # Summed per day for the trend (a day has one row per spec, and now and then two for one
    # spec); without it, per judge only: a row a judge rather than a row a day.
    per = ("day",) if with_trend else ()
    rows = (
        days.order_by()
        .values("judge_model", "criteria", "prompt_version", *per)
        .annotate(
            both_pass_sum=Sum("both_pass"),
            both_fail_sum=Sum("both_fail"),
            judge_only_sum=Sum("judge_pass_human_fail"),
            human_only_sum=Sum("judge_fail_human_pass"),
            absolute_error_sum=Sum("absolute_error"),
            scored_sum=Sum("scored"),
        )
    )
    groups: dict[tuple[str, str, str], list[tuple[Any, Tally]]] = defaultdict(list)
    for row in rows:
        tally = Tally(
            both_pass=row["both_pass_sum"],
            both_fail=row["both_fail_sum"],
            judge_pass_human_fail=row["judge_only_sum"],
            judge_fail_human_pass=row["human_only_sum"],
            absolute_error=float(row["absolute_error_sum"] or 0.0),
            scored=row["scored_sum"],
        )
        if tally.n == 0:
            continue  # every item counted that day (or at all) was reopened since: no pairs
        groups[(row["judge_model"], row["criteria"], row["prompt_version"])].append(
            (row.get("day"), tally)
        )
    return [
        AgreementRow(
            judge_model=model,
            criteria=criteria,
            prompt_version=version,
            agreement=sum((tally for _, tally in daily), Tally()).agreement(),
            trend=tally_trend(daily) if with_trend else [],
        )
        for (model, criteria, version), daily in sorted(groups.items())
    ]


def review_kappa(*, project_id: int, spec_id: int, judge_models: set[str]) -> float | None:
    """Cohen's kappa between these judge models and people on this spec's completed
    items (every criteria and prompt version together); None with no pairs or when kappa
    is undefined."""
    if not judge_models:
        return None
    rows = ReviewItem.objects.filter(
        project_id=project_id,
        spec_id=spec_id,
        status=ReviewStatus.COMPLETE,
        judge_model__in=judge_models,
        judge_passed__isnull=False,
        final_passed__isnull=False,
    ).values_list("judge_passed", "final_passed")
    return cohen_kappa([Pair(judge_passed=bool(j), human_passed=bool(h)) for j, h in rows])


def result_changes(execution: Execution) -> list[ResultChange]:
    """The history of results people changed on this execution, newest first."""
    return list(
        ResultChange.objects.filter(execution=execution)
        .select_related("changed_by", "review_item")
        .order_by("-created", "-id")
    )


def pending_review_items(execution: Execution) -> dict[int, ReviewItem]:
    """check result id -> its pending review item, for the execution page's results table."""
    return {
        item.check_result_id: item
        for item in ReviewItem.objects.filter(execution=execution).exclude(
            status=ReviewStatus.COMPLETE
        )
    }


# --- Blind review: whose judge verdicts stay hidden ------------------------------------------

BLIND_HIDDEN = "hidden: under blind review until you grade it"


def _blind_hidden_items(
    user: Any,
    *,
    run_id: int | None = None,
    execution_id: int | None = None,
    result_ids: Any = None,
) -> Any:
    """The rule: the open blind review items `user` has not graded (optionally of one run,
    one execution, or some results). The review pages apply the same (`show_judge`)."""
    items = ReviewItem.objects.filter(blind=True, status=ReviewStatus.OPEN)
    if run_id is not None:
        items = items.filter(run_id=run_id)
    if execution_id is not None:
        items = items.filter(execution_id=execution_id)
    if result_ids is not None:
        items = items.filter(check_result_id__in=list(result_ids))
    user_id = getattr(user, "pk", None)
    if user_id is not None:
        items = items.exclude(
            Exists(ReviewVerdict.objects.filter(item=OuterRef("pk"), reviewer_id=user_id))
        )
    return items.order_by()


def blind_hidden_results(
    user: Any,
    *,
    run_id: int | None = None,
    execution_id: int | None = None,
    result_ids: Any = None,
) -> dict[int, int]:
    """check result id -> the review item that hides it, for the results whose verdict
    `user` may not see yet: each has an open blind review item this person has not graded.
    The one rule every surface applies (the execution page, the cell drawer, the run page,
    the API, the exports), as the review pages do (`show_judge`): the result's score,
    pass/fail, failure code, message and details stay hidden until this person has graded
    the item, or the item is no longer open. One query, scoped to a run, an execution or
    some results."""
    items = _blind_hidden_items(
        user, run_id=run_id, execution_id=execution_id, result_ids=result_ids
    )
    return dict(items.values_list("check_result_id", "id"))


@dataclass(frozen=True, slots=True)
class BlindCells:
    """Where a run's results hidden from one person for blind review are, in the terms of
    its stored summary: per (invariant id, scenario) their failure codes, and per execution
    (its summary `where`: "scenario / prompt N / replica R") their invariant ids."""

    codes: dict[tuple[str, str], set[str]]
    invariants: dict[str, set[str]]

    def __bool__(self) -> bool:
        return bool(self.codes)


def blind_hidden_cells(user: Any, *, run_id: int) -> BlindCells:
    """The run's results hidden from `user` for blind review (the rule of
    blind_hidden_results), placed as the run page's summary parts place them. One query."""
    codes: dict[tuple[str, str], set[str]] = defaultdict(set)
    invariants: dict[str, set[str]] = defaultdict(set)
    rows = _blind_hidden_items(user, run_id=run_id).values_list(
        "invariant_id",
        "execution__scenario",
        "execution__prompt_index",
        "execution__replica",
        "check_result__failure_code",
    )
    for invariant_id, scenario, prompt_index, replica, code in rows:
        codes[(invariant_id, scenario)].update([code] if code else [])
        invariants[f"{scenario} / prompt {prompt_index} / replica {replica}"].add(invariant_id)
    return BlindCells(codes=dict(codes), invariants=dict(invariants))


def blind_summary(summary: dict[str, Any], cells: BlindCells) -> dict[str, Any]:
    """The parts of a stored run summary the run page shows, without what tells the
    verdicts of results hidden for blind review (`cells`, from blind_hidden_cells): the
    reasons that name them, and their failure codes in the matrix cells and in the groups
    of their scenario. Pass counts are aggregates and stay."""
    if not cells:
        return summary
    scenario_codes: dict[str, set[str]] = defaultdict(set)
    scenario_invariants: dict[str, set[str]] = defaultdict(set)
    for (invariant_id, scenario), hidden_codes in cells.codes.items():
        scenario_codes[scenario].update(hidden_codes)
        scenario_invariants[scenario].add(invariant_id)

    def named(where: str) -> set[str]:
        # A mutation run's `where` goes on with " / <mutation>".
        return {
            invariant
            for place, hidden in cells.invariants.items()
            if where == place or where.startswith(place + " / ")
            for invariant in hidden
        }

    def cell_codes(cell: dict[str, Any]) -> list[Any]:
        hidden = cells.codes.get((str(cell.get("invariant_id")), str(cell.get("scenario"))))
        return [c for c in cell.get("failure_codes") or [] if not hidden or c not in hidden]

    shown = dict(summary)
    shown["why_failed"] = [
        {
            **row,
            "reason": blind_reason(str(row.get("reason") or ""), named(str(row.get("where")))),
        }
        for row in summary.get("why_failed") or []
        if isinstance(row, dict)
    ]
    shown["matrix"] = [
        {**cell, "failure_codes": cell_codes(cell)}
        for cell in summary.get("matrix") or []
        if isinstance(cell, dict)
    ]
    shown["groups"] = [
        {
            **group,
            "failure_codes": [
                c
                for c in group.get("failure_codes") or []
                if c not in scenario_codes[str(group.get("scenario"))]
            ],
            "invariant_scores": {
                k: v
                for k, v in (group.get("invariant_scores") or {}).items()
                if k not in scenario_invariants[str(group.get("scenario"))]
            },
        }
        for group in summary.get("groups") or []
        if isinstance(group, dict)
    ]
    return shown


def blind_reason(reason: str, hidden_invariants: Any) -> str:
    """An execution's "why it did not pass" (checks.scoring.failure_reason), unless it
    names a result hidden for blind review: it would quote that result's score ("gate
    `polite` scored 0.3") or message. Then it says so instead."""
    if reason and any(f"`{invariant}`" in reason for invariant in hidden_invariants):
        return f"{BLIND_HIDDEN} (the reason names a result under blind review)"
    return reason
