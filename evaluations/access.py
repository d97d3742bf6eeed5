"""Who may see and do what in a project. Every dashboard view goes through `project_for`.

Someone who is not a member gets a 404 for anything in the project (its existence is not
leaked); a member whose role is too low for an action gets a 403.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404

from evaluations.models import ROLE_RANK, Project, Role


@dataclass(frozen=True, slots=True)
class ProjectAccess:
    """The signed-in user's access to one project: the project and their role in it."""

    project: Project
    role: Role

    def allows(self, minimum: Role) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[minimum]

    @property
    def can_review(self) -> bool:
        return self.allows(Role.REVIEWER)

    @property
    def can_edit(self) -> bool:
        return self.allows(Role.EDITOR)

    @property
    def is_admin(self) -> bool:
        return self.allows(Role.ADMIN)


def project_for(request: HttpRequest, slug: str, minimum: Role = Role.VIEWER) -> ProjectAccess:
    """The project named by `slug` if the signed-in user is a member with at least `minimum`."""
    project = get_object_or_404(Project, slug=slug)
    role = project.role_of(request.user)
    if role is None:
        raise Http404("No such project.")
    access = ProjectAccess(project=project, role=role)
    if not access.allows(minimum):
        raise PermissionDenied(f"This needs the {minimum.label.lower()} role in {project.name}.")
    return access


def projects_of(request: HttpRequest) -> list[Project]:
    """Projects the user belongs to (every project for a superuser)."""
    user = request.user
    if not user.is_authenticated:
        return []
    if getattr(user, "is_superuser", False):
        return list(Project.objects.order_by("name"))
    return list(Project.objects.filter(memberships__user_id=user.pk).order_by("name"))
