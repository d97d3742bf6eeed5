"""API tokens: project tokens (one project) and personal tokens (every project of their
user), with scopes and an optional expiry; issued once, stored hashed, revocable."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from evaluations.models import ApiToken, Project, TokenScope

API_TOKEN_NAME_MAX = 100
API_TOKEN_DAYS_MAX = 366


class TokenError(ValueError):
    """A token that cannot be issued or revoked; the message says why (field first)."""


def _checked(
    name: str, scopes: list[str] | None, expires_in_days: int | None
) -> tuple[str, list[str], Any]:
    name = name.strip()
    if not name:
        raise TokenError("name: give the token a name, e.g. the CI job that uses it")
    if len(name) > API_TOKEN_NAME_MAX:
        raise TokenError(f"name: at most {API_TOKEN_NAME_MAX} characters")
    if scopes is None:
        chosen = list(TokenScope.values)
    else:
        unknown = [s for s in scopes if s not in TokenScope.values]
        if unknown:
            raise TokenError(
                f"scopes: unknown scope {unknown[0]!r}; choose from {', '.join(TokenScope.values)}"
            )
        if not scopes:
            raise TokenError("scopes: give at least one scope")
        # In the canonical order, each once.
        chosen = [s for s in TokenScope.values if s in scopes]
    expires = None
    if expires_in_days is not None:
        if not 1 <= expires_in_days <= API_TOKEN_DAYS_MAX:
            raise TokenError(f"expires_in_days: between 1 and {API_TOKEN_DAYS_MAX}")
        expires = timezone.now() + timedelta(days=expires_in_days)
    return name, chosen, expires


def token_issue(
    *,
    project: Project,
    user: Any,
    name: str,
    scopes: list[str] | None = None,
    expires_in_days: int | None = None,
) -> tuple[ApiToken, str]:
    """A token acting in `project` with `user`'s role there (within `scopes`, all by
    default), and its raw value, which is shown once and never stored (only its hash is)."""
    name, chosen, expires = _checked(name, scopes, expires_in_days)
    if project.role_of(user) is None:
        raise TokenError(f"user: {user} is not a member of {project.name}")
    return ApiToken.issue(project=project, user=user, name=name, scopes=chosen, expires=expires)


def personal_token_issue(
    *, user: Any, name: str, scopes: list[str] | None = None, expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """A token acting as `user` in every project they belong to, with their role there."""
    name, chosen, expires = _checked(name, scopes, expires_in_days)
    return ApiToken.issue(project=None, user=user, name=name, scopes=chosen, expires=expires)


def token_revoke(*, project: Project, token_id: int) -> ApiToken:
    """Revoke one of the project's tokens; it stops working at once (revoking twice is fine)."""
    token = ApiToken.objects.filter(project=project, pk=token_id).first()
    if token is None:
        raise TokenError("no such token in this project")
    return _revoke(token)


def personal_token_revoke(*, user: Any, token_id: int) -> ApiToken:
    """Revoke one of the user's personal tokens."""
    token = ApiToken.objects.filter(project__isnull=True, user=user, pk=token_id).first()
    if token is None:
        raise TokenError("no such personal token of yours")
    return _revoke(token)


def _revoke(token: ApiToken) -> ApiToken:
    ApiToken.objects.filter(pk=token.pk).update(revoked=True)
    token.revoked = True
    return token
