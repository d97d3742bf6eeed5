"""Projects, their members and API tokens."""

from __future__ import annotations

from typing import Any

from evaluations.models import (
    ApiToken,
    Membership,
    Project,
    Role,
)


def membership_roles(user: Any, project_ids: list[int]) -> dict[int, Role]:
    """The user's role in each of these projects, in one query (admin everywhere for a
    superuser, as Project.role_of says)."""
    if getattr(user, "is_superuser", False):
        return dict.fromkeys(project_ids, Role.ADMIN)
    rows = Membership.objects.filter(user_id=user.pk, project_id__in=project_ids).values_list(
        "project_id", "role"
    )
    return {project_id: Role(role) for project_id, role in rows}


def project_members(project: Project) -> list[Membership]:
    return list(
        Membership.objects.filter(project=project)
        .select_related("user")
        .only("id", "role", "created", "user", "user__username", "user__is_active")
        .order_by("user__username")
    )


API_TOKENS_SHOWN = 200


def project_api_tokens(project: Project, *, limit: int = API_TOKENS_SHOWN) -> list[ApiToken]:
    """The project's tokens for the settings page, newest first, without their hashes."""
    return list(
        ApiToken.objects.filter(project=project)
        .select_related("user", "project")
        .only(
            *("id", "name", "prefix", "created", "last_used", "revoked", "scopes", "expires"),
            *("project__slug", "user__username"),
        )
        .order_by("-created", "-id")[:limit]
    )


def admin_count(project: Project) -> int:
    return Membership.objects.filter(project=project, role=Role.ADMIN).count()
