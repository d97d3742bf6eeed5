"""Baselines in the API (mounted beside evaluations/api.py's router by keystone_web/api.py):
promote a run, a spec's history, roll the last promotion of a branch back. Same auth and
roles as the rest of the API: viewers read, editors change."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status

from evaluations import selectors, services
from evaluations.access import spec_in
from evaluations.api import ApiInputError, BrowserSession, ProjectTokenAuth, _caller, _run
from evaluations.models import Baseline, Role

router = Router(tags=["baselines"], auth=[ProjectTokenAuth(), BrowserSession()])


class BaselineOut(Schema):
    id: int
    spec: str
    branch: str
    name: str
    reason: str
    run_id: int | None
    active: bool
    previous_id: int | None
    created: datetime
    created_by: str | None
    rolled_back: datetime | None
    rolled_back_by: str | None
    cells: int


class PromoteIn(Schema):
    name: str = Field("", max_length=200)
    branch: str | None = Field(None, description="default: the run's branch label, else main")
    reason: str = ""


class RollbackIn(Schema):
    branch: str = "main"


def _out(baseline: Baseline, spec_slug: str, cells: int) -> BaselineOut:
    return BaselineOut(
        id=baseline.pk,
        spec=spec_slug,
        branch=baseline.branch,
        name=baseline.name,
        reason=baseline.reason,
        run_id=baseline.run_id,
        active=baseline.active,
        previous_id=baseline.previous_id,
        created=baseline.created,
        created_by=baseline.created_by.get_username() if baseline.created_by else None,
        rolled_back=baseline.rolled_back,
        rolled_back_by=baseline.rolled_back_by.get_username() if baseline.rolled_back_by else None,
        cells=cells,
    )


@router.post(
    "/projects/{slug}/runs/{run_id}/baseline",
    response={201: BaselineOut},
    url_name="baseline_promote",
)
def baseline_promote(
    request: HttpRequest, slug: str, run_id: int, payload: PromoteIn
) -> Status[BaselineOut]:
    """Make a completed run the baseline of its spec for a branch; recorded in the history."""
    caller = _caller(request, slug, Role.EDITOR)
    run = _run(caller, run_id)
    try:
        baseline = services.baseline_promote(
            run_id=run.pk,
            user=caller.user,
            name=payload.name,
            branch=payload.branch,
            reason=payload.reason,
        )
    except services.BaselineError as exc:
        raise ApiInputError("run_id", str(exc)) from exc
    return Status(201, _out(baseline, run.spec.slug, baseline.cells.count()))


@router.get(
    "/projects/{slug}/specs/{spec_slug}/baselines",
    response=list[BaselineOut],
    url_name="baseline_history",
)
def baseline_history(request: HttpRequest, slug: str, spec_slug: str) -> list[BaselineOut]:
    """Every promotion of the spec, newest first (active, replaced or rolled back)."""
    caller = _caller(request, slug, Role.VIEWER)
    spec = spec_in(caller.project, spec_slug)
    history = selectors.spec_baseline_history(spec.pk)
    return [_out(b, spec.slug, b.cell_count) for b in history]  # type: ignore[attr-defined]


@router.post(
    "/projects/{slug}/specs/{spec_slug}/baselines/rollback",
    response=BaselineOut,
    url_name="baseline_rollback",
)
def baseline_rollback(
    request: HttpRequest, slug: str, spec_slug: str, payload: RollbackIn
) -> BaselineOut:
    """Undo the branch's last promotion; answers the baseline that is active again."""
    caller = _caller(request, slug, Role.EDITOR)
    spec = spec_in(caller.project, spec_slug)
    try:
        restored = services.baseline_rollback(
            spec_id=spec.pk, branch=payload.branch, user=caller.user
        )
    except services.BaselineError as exc:
        raise ApiInputError("branch", str(exc)) from exc
    return _out(restored, spec.slug, restored.cells.count())
