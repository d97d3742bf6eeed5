"""The evaluations router of the API, mounted at /api/ by keystone_web/api.py.

Machines (CI jobs) send `Authorization: Bearer ks_...`: a project token acts in its project
only, a personal token in every project of its user; either with its user's role there and
only within its scopes (read, run, review, admin), and at most
KEYSTONE_API_TOKEN_RATE_PER_MINUTE requests a minute (429 with Retry-After beyond). The
browser uses its session (with CSRF).
Like the dashboard, someone outside a project gets a 404 for anything in it and a member
whose role is too low gets a 403.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from ninja import Field, Query, Router, Schema, Status
from ninja.security import HttpBearer, SessionAuth
from ninja.throttling import BaseThrottle

from checks import reporters
from checks.spec.semantics import too_long
from evaluations import policy, selectors, services
from evaluations.access import NO_SUCH_PROJECT, member_project, spec_in
from evaluations.models import (
    ROLE_RANK,
    ApiToken,
    Project,
    Role,
    Run,
    RunStatus,
    SpecVersion,
    TokenScope,
    Trigger,
)

RUN_REPLICAS_MAX = 100
# Row ids and numbers the API takes: larger ones are no row, and some databases cannot even
# compare them (SQLite overflows), so they are refused as input (422 naming the field).
ROW_ID_MAX = 2**63 - 1
RowId = Annotated[int, Field(ge=1, le=ROW_ID_MAX)]


class ApiInputError(ValueError):
    """A request the schema accepted but the domain refuses (an unknown version, scenario,
    cursor...); answered 422 with the field named (keystone_web/api.py)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class ApiConflict(Exception):
    """A request that contradicts the state it meets (the same Idempotency-Key with another
    body, a claim someone else holds); answered 409."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ErrorBody(Schema):
    code: str
    message: str
    field: str | None = None
    details: list[dict[str, Any]] | None = None


class ErrorOut(Schema):
    """The shape of every error answer (keystone_web/api.py)."""

    error: ErrorBody


class ProjectTokenAuth(HttpBearer):
    """`Authorization: Bearer ks_...`, looked up by its hash; a revoked or unknown token is
    no credential at all (401)."""

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken | None:
        return ApiToken.find_active(token)


class TokenRateThrottle(BaseThrottle):
    """At most KEYSTONE_API_TOKEN_RATE_PER_MINUTE requests per token and clock minute: a
    fixed window counted with the cache's atomic increment, so concurrent requests cannot
    both slip under the limit. Sessions are not limited here."""

    def allow_request(self, request: HttpRequest) -> bool:
        token = getattr(request, "auth", None)
        limit = settings.KEYSTONE_API_TOKEN_RATE_PER_MINUTE
        if not isinstance(token, ApiToken) or limit <= 0:
            return True
        now = time.time()
        window = int(now // 60)
        key = f"keystone:api-rate:{token.pk}:{window}"
        cache.add(key, 0, timeout=120)
        try:
            count = cache.incr(key)
        except ValueError:  # expired between add and incr: this request opens the window
            cache.set(key, 1, timeout=120)
            count = 1
        return count <= limit

    def wait(self) -> float | None:
        # Until the next window (one instance serves every request: no state kept here).
        return 60 - (time.time() % 60)


class BrowserSession(SessionAuth):
    """The signed-in person (with Django's CSRF check), but never for a request that brings
    a token: a revoked or unknown token is a 401, not a session that fails its CSRF check."""

    def __call__(self, request: HttpRequest) -> Any:
        if request.headers.get("Authorization"):
            return None
        return super().__call__(request)


AUTH = [ProjectTokenAuth(), BrowserSession()]
router = Router(tags=["evaluations"], auth=AUTH)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who acts in the project and with which role."""

    project: Project
    user: Any
    role: Role


# The scope a token needs for an action that needs this role: reading, running (specs and
# runs), reviewing, administering. A token acts within its scopes AND its user's role.
SCOPE_FOR_ROLE = {
    Role.VIEWER: TokenScope.READ,
    Role.REVIEWER: TokenScope.REVIEW,
    Role.EDITOR: TokenScope.RUN,
    Role.ADMIN: TokenScope.ADMIN,
}


def require_scope(credential: Any, scope: str) -> None:
    """A token without `scope` is refused (403); a browser session has every scope."""
    if isinstance(credential, ApiToken) and scope not in (credential.scopes or []):
        raise PermissionDenied(f"This token lacks the {str(scope)!r} scope.")


def _caller(request: HttpRequest, slug: str, minimum: Role) -> Caller:
    credential = request.auth  # type: ignore[attr-defined]
    user: Any
    if isinstance(credential, ApiToken):
        # A project token reaches its own project only: another is as unknown as a missing one.
        if credential.project is not None and credential.project.slug != slug:
            raise Http404(NO_SUCH_PROJECT)
        user = credential.user
    else:  # a session
        user = request.user
    project, role = member_project(slug, user)
    if ROLE_RANK[role] < ROLE_RANK[minimum]:
        raise PermissionDenied(f"This needs the {minimum.label.lower()} role in {project.slug}.")
    require_scope(credential, SCOPE_FOR_ROLE[minimum])
    return Caller(project=project, user=user, role=role)


def _run(caller: Caller, run_id: int) -> Run:
    run = selectors.run_in_project(caller.project, run_id)
    if run is None:
        raise Http404("No such run in this project.")
    return run


def _run_api_url(request: HttpRequest, run: Run) -> str:
    return request.build_absolute_uri(
        reverse("api:run_detail", kwargs={"slug": run.project.slug, "run_id": run.pk})
    )


def _run_web_url(request: HttpRequest, run: Run) -> str:
    return request.build_absolute_uri(reverse("run_detail", args=[run.project.slug, run.pk]))


# --- Health -------------------------------------------------------------------------------


class HealthOut(Schema):
    status: str
    database: str
    tasks: str


@router.get("/health", response=HealthOut, auth=None)
def health(request: HttpRequest) -> HealthOut:
    """Liveness plus a real round trip to the database (load balancers and compose use it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    tasks = "in-process" if settings.CELERY_TASK_ALWAYS_EAGER else "broker"
    return HealthOut(status="ok", database=connection.vendor, tasks=tasks)


# --- Specs --------------------------------------------------------------------------------


class SpecUploadIn(Schema):
    source_yaml: str


class SpecUploadOut(Schema):
    spec: str
    version: int
    created: bool


@router.post(
    "/projects/{slug}/specs", response={200: SpecUploadOut, 201: SpecUploadOut}, url_name="specs"
)
def spec_upload(request: HttpRequest, slug: str, payload: SpecUploadIn) -> Status[SpecUploadOut]:
    """Store a spec's text: 201 with version N+1, or 200 when the text is the latest
    version already. An invalid text is a 422 listing every error with its line."""
    caller = _caller(request, slug, Role.EDITOR)
    source = payload.source_yaml.replace("\r\n", "\n")
    started = timezone.now()
    version = services.spec_version_create(
        project=caller.project, source_yaml=source, author=caller.user
    )
    created = version.created >= started
    out = SpecUploadOut(spec=version.spec.slug, version=version.number, created=created)
    return Status(201 if created else 200, out)


class RunOptionsIn(Schema):
    """What a run may change of its spec version, as `keystone run`'s flags do."""

    replicas: int | None = Field(default=None, ge=1, le=RUN_REPLICAS_MAX)
    scenarios: list[str] | None = None
    labels: dict[str, str] = Field(
        default_factory=dict, description="e.g. git_sha, branch, pr (any key=value)"
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="for faults and mutations")
    judge_cache: bool = Field(default=True, description="false: ask the judge again")


class RunCreateIn(RunOptionsIn):
    version: RowId | None = None


class RunCreatedOut(Schema):
    id: int
    status: str
    url: str  # the run in this API, to poll
    web_url: str  # the run's page in the dashboard


@router.post(
    "/projects/{slug}/specs/{spec_slug}/runs",
    response={202: RunCreatedOut, 409: ErrorOut},
    url_name="spec_runs",
)
def run_start(
    request: HttpRequest, slug: str, spec_slug: str, payload: RunCreateIn
) -> Status[RunCreatedOut]:
    """Queue a run of the spec's latest version (or `version`); workers execute it. With an
    `Idempotency-Key` header a retried request gets the run the first one made, never a
    second run; the same key with another body is a 409."""
    caller = _caller(request, slug, Role.EDITOR)
    spec = spec_in(caller.project, spec_slug)
    if payload.version is not None:
        version = SpecVersion.objects.filter(spec=spec, number=payload.version).first()
        if version is None:
            raise ApiInputError("version", f"{spec.slug} has no version {payload.version}")
    else:
        version = selectors.spec_latest_version(spec)
        if version is None:
            raise ApiInputError("version", f"{spec.slug} has no version to run")
    return _run_queue(request, caller, version, payload)


class RunInlineIn(RunOptionsIn):
    source_yaml: str


@router.post(
    "/projects/{slug}/runs", response={202: RunCreatedOut, 409: ErrorOut}, url_name="runs_inline"
)
def run_start_inline(
    request: HttpRequest, slug: str, payload: RunInlineIn
) -> Status[RunCreatedOut]:
    """Store the spec text given (as POST .../specs does: the same text is the same version)
    and queue a run of it, with the same overrides, labels and Idempotency-Key as above."""
    caller = _caller(request, slug, Role.EDITOR)
    version = services.spec_version_create(
        project=caller.project,
        source_yaml=payload.source_yaml.replace("\r\n", "\n"),
        author=caller.user,
    )
    return _run_queue(request, caller, version, payload)


def _run_queue(
    request: HttpRequest, caller: Caller, version: SpecVersion, payload: RunOptionsIn
) -> Status[RunCreatedOut]:
    options = payload.dict()
    key = request.headers.get("Idempotency-Key", "").strip()
    # Stored whole, never cut: two long keys sharing their start would be one.
    problem = too_long(key, Run._meta.get_field("idempotency_key").max_length or 0)
    if problem:
        raise ApiInputError("Idempotency-Key", problem)
    # What the request asks for: the same key with another body is a conflict, not a replay.
    digest = hashlib.sha256(
        json.dumps([version.pk, options], sort_keys=True, default=str).encode()
    ).hexdigest()
    try:
        run = services.run_create(
            spec_version=version,
            trigger=Trigger.API,
            labels=options["labels"],
            replicas=options["replicas"],
            scenarios=options["scenarios"] or None,
            seed=options["seed"],
            judge_cache=options["judge_cache"],
            created_by=caller.user,
            idempotency_key=key,
            request_digest=digest if key else "",
        )
    except services.IdempotencyConflict as exc:
        raise ApiConflict(str(exc), field="Idempotency-Key") from None
    except policy.PolicyError as exc:  # more executions than this server allows
        raise ApiInputError("replicas", str(exc)) from None
    except services.RunLabelError as exc:  # "labels.branch: at most 255 characters, ..."
        field, _, message = str(exc).partition(": ")
        raise ApiInputError(field, message) from None
    except ValueError as exc:  # an unknown scenario name
        raise ApiInputError("scenarios", str(exc)) from None
    return Status(202, run_created_out(request, run))


def run_created_out(request: HttpRequest, run: Run) -> RunCreatedOut:
    return RunCreatedOut(
        id=run.pk,
        status=run.status,
        url=_run_api_url(request, run),
        web_url=_run_web_url(request, run),
    )


# --- Runs ---------------------------------------------------------------------------------


class RunOut(Schema):
    id: int
    spec: str
    version: int
    status: str
    composite: float | None
    pass_rate: float | None
    resilience: float | None
    overall: float | None
    gate_passed: bool | None
    exit_code: int | None
    cost_usd: float | None
    created: datetime


class RunListOut(Schema):
    items: list[RunOut]
    next_cursor: str | None


class RunListQuery(Schema):
    spec: str = ""
    status: str = ""
    branch: str = ""
    cursor: str = ""
    limit: int = Field(default=selectors.RUN_PAGE_SIZE, ge=1, le=selectors.RUN_PAGE_SIZE)


def _run_out(run: Run) -> RunOut:
    return RunOut(
        id=run.pk,
        spec=run.spec.slug,
        version=run.spec_version.number,
        status=run.status,
        composite=run.composite,
        pass_rate=run.pass_rate,
        resilience=run.resilience,
        overall=run.overall,
        gate_passed=run.gate_passed,
        exit_code=run.exit_code,
        cost_usd=run.cost_usd,
        created=run.created,
    )


@router.get("/projects/{slug}/runs", response=RunListOut, url_name="runs")
def run_list(request: HttpRequest, slug: str, query: Query[RunListQuery]) -> RunListOut:
    """The project's runs, newest first, a page at a time: pass `next_cursor` back as
    `cursor` for the next page (null on the last)."""
    caller = _caller(request, slug, Role.VIEWER)
    if query.status and query.status not in RunStatus.values:
        raise ApiInputError("status", f"expected one of {', '.join(RunStatus.values)}")
    after = None
    if query.cursor:
        try:
            after = selectors.RunCursor.decode(query.cursor)
        except ValueError as exc:
            raise ApiInputError("cursor", str(exc)) from None
    filters = selectors.RunFilters(spec=query.spec, status=query.status, branch=query.branch)
    page = selectors.run_page(caller.project, filters, after=after, size=query.limit)
    return RunListOut(
        items=[_run_out(run) for run in page.runs],
        next_cursor=page.next_cursor.encode() if page.next_cursor else None,
    )


class ProgressOut(Schema):
    executions_done: int
    execution_count: int


class RunDetailOut(RunOut):
    trigger: str
    labels: dict[str, str]
    branch: str
    git_sha: str
    verdict: str | None
    started: datetime | None
    finished: datetime | None
    progress: ProgressOut
    pillar_scores: dict[str, float | None]
    gates: list[dict[str, Any]]
    warnings: list[str]
    url: str


@router.get("/projects/{slug}/runs/{run_id}", response=RunDetailOut, url_name="run_detail")
def run_detail(request: HttpRequest, slug: str, run_id: RowId) -> RunDetailOut:
    """One run: its scores, gates and pillar scores once finalised, and its progress."""
    caller = _caller(request, slug, Role.VIEWER)
    found = selectors.run_for_page(caller.project, run_id)
    if found is None:
        raise Http404("No such run in this project.")
    run, summary = found
    return RunDetailOut(
        **_run_out(run).dict(),
        trigger=run.trigger,
        labels=run.labels,
        branch=run.branch,
        git_sha=run.git_sha,
        verdict=summary.get("verdict"),
        started=run.started,
        finished=run.finished,
        progress=ProgressOut(
            executions_done=run.executions_done, execution_count=run.execution_count
        ),
        pillar_scores=summary.get("pillar_scores") or {},
        gates=summary.get("gates") or [],
        warnings=list(run.warnings or []),
        url=_run_web_url(request, run),
    )


REPORT_FORMATS = {
    "json": (reporters.render_json, "application/json"),
    "junit": (reporters.render_junit, "application/xml"),
    "md": (reporters.render_markdown, "text/markdown; charset=utf-8"),
}


@router.get("/projects/{slug}/runs/{run_id}/report", url_name="run_report")
def run_report(
    request: HttpRequest,
    slug: str,
    run_id: RowId,
    format: Literal["json", "junit", "md"] = "json",  # noqa: A002 (the query parameter's name)
) -> HttpResponse:
    """The run's report as `keystone run` writes it, scored from the stored results.

    Blind review: the check results waiting in an open blind review item that you have not
    graded count in the run's scores but are left out of the report's executions (with the
    reasons and failure codes that would tell them), and a warning says so."""
    caller = _caller(request, slug, Role.VIEWER)
    run = _run(caller, run_id)
    render, content_type = REPORT_FORMATS[format]
    hidden = selectors.blind_hidden_results(caller.user, run_id=run.pk)
    return HttpResponse(render(selectors.run_report(run, hidden)), content_type=content_type)


class RunCancelOut(Schema):
    id: int
    status: str


@router.post(
    "/projects/{slug}/runs/{run_id}/cancel", response={202: RunCancelOut}, url_name="run_cancel"
)
def run_cancel(request: HttpRequest, slug: str, run_id: RowId) -> Status[RunCancelOut]:
    """Stop the run (nothing pending starts); a run that had ended keeps its status."""
    caller = _caller(request, slug, Role.EDITOR)
    run = _run(caller, run_id)
    services.run_cancel(run_id=run.pk)
    status = Run.objects.values_list("status", flat=True).get(pk=run.pk)
    return Status(202, RunCancelOut(id=run.pk, status=status))


# --- Regressions and alert rules (docs/alerts.md) ------------------------------------------


@router.get("/projects/{slug}/regressions", url_name="regressions")
def regressions(
    request: HttpRequest,
    slug: str,
    since: str = "",
    spec: str = "",
    branch: str = "",
    label: str = "",
    format: Literal["json", "md", "csv"] = "json",  # noqa: A002 (the query parameter's name)
) -> HttpResponse:
    """What regressed against the active baselines, as the regressions page shows it."""
    from evaluations.selectors.reports import parse_since

    caller = _caller(request, slug, Role.VIEWER)
    try:
        moment = parse_since(since)
    except ValueError as exc:
        raise ApiInputError("since", str(exc)) from None
    if label and "=" not in label:
        raise ApiInputError("label", f"{label!r}: write key=value, e.g. model=gpt-4o")
    report = selectors.regression_report(
        caller.project, since=moment, spec=spec, branch=branch, label=label
    )
    if format == "md":
        body = selectors.report_markdown(report, base_url=settings.KEYSTONE_BASE_URL)
        return HttpResponse(body, content_type="text/markdown; charset=utf-8")
    if format == "csv":
        return HttpResponse(selectors.report_csv(report), content_type="text/csv; charset=utf-8")
    return HttpResponse(selectors.report_json(report), content_type="application/json")


class AlertRuleIn(Schema):
    name: str
    condition: str
    window: str = "last_run"
    specs: list[str] = Field(default_factory=list)
    branches: list[str] = Field(default_factory=list)
    channels: list[str] = Field(default_factory=list, description="channel names")


class AlertRuleOut(Schema):
    id: int
    name: str
    condition: str
    window: str
    specs: list[str]
    branches: list[str]
    channels: list[str]
    enabled: bool


def _rule_out(rule: Any) -> AlertRuleOut:
    return AlertRuleOut(
        id=rule.pk,
        name=rule.name,
        condition=rule.condition,
        window=rule.window,
        specs=rule.specs,
        branches=rule.branches,
        channels=[channel.name for channel in rule.channels.all()],
        enabled=rule.enabled,
    )


@router.get("/projects/{slug}/alert-rules", response=list[AlertRuleOut], url_name="alert_rules")
def alert_rule_list(request: HttpRequest, slug: str) -> list[AlertRuleOut]:
    caller = _caller(request, slug, Role.VIEWER)
    return [_rule_out(rule) for rule in selectors.project_alert_rules(caller.project.pk)]


@router.post("/projects/{slug}/alert-rules", response={201: AlertRuleOut})
def alert_rule_create(
    request: HttpRequest, slug: str, payload: AlertRuleIn
) -> Status[AlertRuleOut]:
    """A new rule (admins). A bad condition is a 422 naming the unknown metric or operator."""
    caller = _caller(request, slug, Role.ADMIN)
    channels = dict(caller.project.alert_channels.values_list("name", "id"))
    unknown = [name for name in payload.channels if name not in channels]
    if unknown:
        raise ApiInputError("channels", f"no channel named {', '.join(unknown)} in this project")
    try:
        rule = services.alert_rule_create(
            project=caller.project,
            name=payload.name,
            condition=payload.condition,
            window=payload.window,
            specs=payload.specs,
            branches=payload.branches,
            channel_ids=[channels[name] for name in payload.channels],
        )
    except services.AlertError as exc:
        # AlertError names its field first: "condition: unknown metric ...".
        field, _, rest = str(exc).partition(" ")
        raise ApiInputError(field.rstrip(":"), rest) from None
    return Status(201, _rule_out(rule))


@router.delete("/projects/{slug}/alert-rules/{rule_id}", response={204: None})
def alert_rule_delete(request: HttpRequest, slug: str, rule_id: RowId) -> Status[None]:
    caller = _caller(request, slug, Role.ADMIN)
    if not caller.project.alert_rules.filter(pk=rule_id).exists():
        raise Http404("No such alert rule in this project.")
    services.alert_rule_delete(project=caller.project, rule_id=rule_id)
    return Status(204, None)


class AlertFiringOut(Schema):
    id: int
    rule: str
    channel: str
    run_id: int
    spec: str
    value: float | None
    message: str
    status: str
    attempts: int
    last_error: str
    created: datetime
    delivered: datetime | None


# A URL in a delivery error, split into what may be shown (scheme and host) and the rest.
_URL_IN_ERROR = re.compile(r"(https?://)(?:[^/\s@]*@)?([^/\s?#]+)[^\s]*")


def _error_for_members(error: str) -> str:
    """A firing's delivery error with each URL cut down to its scheme and host. A Slack or
    webhook channel's URL is its credential (its path and query carry the token; whoever
    has it posts to the channel), and channels are the admins' (settings page only), but
    firings are read by every member: a failed delivery names the channel's URL."""
    return _URL_IN_ERROR.sub(r"\1\2/…", error)


@router.get(
    "/projects/{slug}/alert-firings", response=list[AlertFiringOut], url_name="alert_firings"
)
def alert_firing_list(request: HttpRequest, slug: str) -> list[AlertFiringOut]:
    """The project's latest firings (newest first) with their delivery status."""
    caller = _caller(request, slug, Role.VIEWER)
    return [
        AlertFiringOut(
            id=firing.pk,
            rule=firing.rule.name,
            channel=firing.channel.name,
            run_id=firing.run_id,
            spec=firing.run.spec.slug,
            value=firing.value,
            message=firing.message,
            status=firing.status,
            attempts=firing.attempts,
            last_error=_error_for_members(firing.last_error),
            created=firing.created,
            delivered=firing.delivered,
        )
        for firing in selectors.project_alert_firings(caller.project.pk)
    ]


@router.post(
    "/projects/{slug}/alert-firings/{firing_id}/resend",
    response={202: None, 409: ErrorOut},
    url_name="alert_firing_resend",
)
def alert_firing_resend(request: HttpRequest, slug: str, firing_id: RowId) -> Status[None]:
    """Send a failed firing again (admins), as "send again" in the settings; 409 for one
    that is not failed (a delivered firing is never sent twice)."""
    from evaluations import queue

    caller = _caller(request, slug, Role.ADMIN)
    if not caller.project.alert_firings.filter(pk=firing_id).exists():
        raise Http404("No such alert firing in this project.")
    if not services.firing_resend(project=caller.project, firing_id=firing_id):
        raise ApiConflict("only a failed firing can be sent again")
    queue.firing_deliver_later(firing_id)
    return Status(202, None)
