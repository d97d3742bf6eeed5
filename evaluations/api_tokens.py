"""Tokens through the API. Personal tokens (`/tokens`) act as their person in every project
they belong to; project tokens (`/projects/<slug>/tokens`) in one project. Both carry scopes
(read, run, review, admin) and an optional expiry; the raw value is in the creation answer
only (stored hashed), and both are revocable.

Personal tokens are managed by their person: signed in, or with a personal token that has
the admin scope (which cannot mint a token with a scope it lacks itself). Project tokens
are managed by the project's admins; a token doing so, too, grants no scope it lacks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from ninja import Field, Schema, Status

from evaluations import selectors, services
from evaluations.api import ApiInputError, ErrorOut, RowId, _caller, require_scope, router
from evaluations.models import ApiToken, Role, TokenScope


class TokenIn(Schema):
    name: str
    scopes: list[str] = Field(
        default_factory=lambda: [TokenScope.READ.value],
        description="any of read, run, review, admin",
    )
    expires_in_days: int | None = Field(default=None, description="1..366; none: no expiry")


class ProjectTokenIn(TokenIn):
    user: str = Field(default="", description="the member it acts as (username); default: you")


class TokenOut(Schema):
    id: int
    name: str
    prefix: str
    project: str | None  # null for a personal token
    user: str
    scopes: list[str]
    created: datetime
    expires: datetime | None
    last_used: datetime | None
    revoked: bool


class TokenCreatedOut(TokenOut):
    token: str  # the raw value: shown in this answer only


def _token_out(token: ApiToken) -> dict[str, Any]:
    return {
        "id": token.pk,
        "name": token.name,
        "prefix": token.prefix,
        "project": token.project.slug if token.project else None,
        "user": token.user.get_username(),
        "scopes": list(token.scopes or []),
        "created": token.created,
        "expires": token.expires,
        "last_used": token.last_used,
        "revoked": token.revoked,
    }


def _token_error(exc: services.TokenError) -> ApiInputError:
    field, _, message = str(exc).partition(": ")
    return ApiInputError(field, message) if message else ApiInputError("token", str(exc))


def _person(request: HttpRequest) -> Any:
    """The person managing their personal tokens: signed in, or a personal admin token."""
    credential = request.auth  # type: ignore[attr-defined]
    if isinstance(credential, ApiToken):
        if credential.project is not None:
            raise PermissionDenied("A project token cannot manage personal tokens.")
        require_scope(credential, TokenScope.ADMIN)
        return credential.user
    return request.user


def _refuse_scopes_beyond(request: HttpRequest, scopes: list[str]) -> None:
    """A token may not mint a token with a scope it lacks itself, personal or project: else
    a token with only `admin` would mint one with `run` and do what its scopes refuse. A
    signed-in person has every scope."""
    credential = request.auth  # type: ignore[attr-defined]
    if isinstance(credential, ApiToken):
        beyond = [s for s in scopes if s not in (credential.scopes or [])]
        if beyond:
            raise PermissionDenied(f"This token cannot grant the {beyond[0]!r} scope it lacks.")


@router.get("/tokens", response=list[TokenOut], url_name="tokens")
def token_list(request: HttpRequest) -> list[TokenOut]:
    """Your personal tokens, newest first (never their values)."""
    user = _person(request)
    rows = ApiToken.objects.filter(project__isnull=True, user=user).select_related("user")
    return [TokenOut(**_token_out(t)) for t in rows.order_by("-created", "-id")[:100]]


@router.post("/tokens", response={201: TokenCreatedOut, 422: ErrorOut}, url_name="token_create")
def token_create(request: HttpRequest, payload: TokenIn) -> Status[TokenCreatedOut]:
    """A personal token; its value is in this answer only."""
    user = _person(request)
    _refuse_scopes_beyond(request, payload.scopes)
    try:
        token, raw = services.personal_token_issue(
            user=user,
            name=payload.name,
            scopes=payload.scopes,
            expires_in_days=payload.expires_in_days,
        )
    except services.TokenError as exc:
        raise _token_error(exc) from None
    return Status(201, TokenCreatedOut(**_token_out(token), token=raw))


@router.delete("/tokens/{token_id}", response={204: None}, url_name="token_revoke")
def token_revoke(request: HttpRequest, token_id: RowId) -> Status[None]:
    """Revoke one of your personal tokens; it stops working at once."""
    user = _person(request)
    try:
        services.personal_token_revoke(user=user, token_id=token_id)
    except services.TokenError:
        raise Http404("No such personal token of yours.") from None
    return Status(204, None)


@router.get("/projects/{slug}/tokens", response=list[TokenOut], url_name="project_tokens")
def project_token_list(request: HttpRequest, slug: str) -> list[TokenOut]:
    """The project's tokens (admins), newest first, never their values."""
    caller = _caller(request, slug, Role.ADMIN)
    return [TokenOut(**_token_out(t)) for t in selectors.project_api_tokens(caller.project)]


@router.post(
    "/projects/{slug}/tokens",
    response={201: TokenCreatedOut, 422: ErrorOut},
    url_name="project_token_create",
)
def project_token_create(
    request: HttpRequest, slug: str, payload: ProjectTokenIn
) -> Status[TokenCreatedOut]:
    """A project token acting as `user` (a member) in this project; its value is in this
    answer only."""
    caller = _caller(request, slug, Role.ADMIN)
    _refuse_scopes_beyond(request, payload.scopes)
    member = caller.user
    if payload.user:
        found = next(
            (
                m.user
                for m in selectors.project_members(caller.project)
                if m.user.get_username() == payload.user
            ),
            None,
        )
        if found is None:
            raise ApiInputError("user", f"{payload.user!r} is not a member of this project")
        member = found
    try:
        token, raw = services.token_issue(
            project=caller.project,
            user=member,
            name=payload.name,
            scopes=payload.scopes,
            expires_in_days=payload.expires_in_days,
        )
    except services.TokenError as exc:
        raise _token_error(exc) from None
    return Status(201, TokenCreatedOut(**_token_out(token), token=raw))


@router.delete(
    "/projects/{slug}/tokens/{token_id}", response={204: None}, url_name="project_token_revoke"
)
def project_token_revoke(request: HttpRequest, slug: str, token_id: RowId) -> Status[None]:
    caller = _caller(request, slug, Role.ADMIN)
    try:
        services.token_revoke(project=caller.project, token_id=token_id)
    except services.TokenError:
        raise Http404("No such token in this project.") from None
    return Status(204, None)
