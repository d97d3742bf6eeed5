"""API tokens of a project: issued once, stored hashed, revocable."""

from __future__ import annotations

from typing import Any

from evaluations.models import (
    ApiToken,
    Project,
)

API_TOKEN_NAME_MAX = 100


class TokenError(ValueError):
    """A token that cannot be issued or revoked; the message says why."""


def token_issue(*, project: Project, user: Any, name: str) -> tuple[ApiToken, str]:
    """A token acting in `project` with `user`'s role there, and its raw value, which is
    shown once and never stored (only its hash is)."""
    name = name.strip()
    if not name:
        raise TokenError("name: give the token a name, e.g. the CI job that uses it")
    if len(name) > API_TOKEN_NAME_MAX:
        raise TokenError(f"name: at most {API_TOKEN_NAME_MAX} characters")
    if project.role_of(user) is None:
        raise TokenError(f"{user} is not a member of {project.name}")
    return ApiToken.issue(project=project, user=user, name=name)


def token_revoke(*, project: Project, token_id: int) -> ApiToken:
    """Revoke one of the project's tokens; it stops working at once (revoking twice is fine)."""
    token = ApiToken.objects.filter(project=project, pk=token_id).first()
    if token is None:
        raise TokenError("no such token in this project")
    ApiToken.objects.filter(pk=token.pk).update(revoked=True)
    token.revoked = True
    return token
