"""Who may see and do what in a project. Every dashboard view goes through `project_for`.

Someone who is not a member gets a 404 for anything in the project (its existence is not
leaked); a member whose role is too low for an action gets a 403.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import Http404, HttpRequest

from evaluations.models import ROLE_RANK, Membership, Project, Role, Spec, role_given

# The one answer for a project someone may not see, whether it exists or not.
NO_SUCH_PROJECT = "No such project."


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


def member_project(slug: str, user: Any) -> tuple[Project, Role]:
    """The project named by `slug` and `user`'s role there, if they are a member, read in
    one query with their membership (every page asks). A project that does not exist and
    one they are not a member of get the same 404, word for word."""
    membership = Membership.objects.filter(project=OuterRef("pk"), user_id=user.pk)
    project = (
        Project.objects.filter(slug=slug)
        .annotate(member_role=Subquery(membership.values("role")[:1]))
        .first()
    )
    role = role_given(user, lambda: project.member_role) if project is not None else None
    if project is None or role is None:
        raise Http404(NO_SUCH_PROJECT)
    return project, role


def spec_in(project: Project, slug: str) -> Spec:
    """The project's spec named by `slug`, or a 404 that names it (another project's spec
    is one that does not exist here)."""
    spec = Spec.objects.filter(project=project, slug=slug).first()
    if spec is None:
        raise Http404(f"No spec {slug!r} in this project.")
    return spec


def project_for(request: HttpRequest, slug: str, minimum: Role = Role.VIEWER) -> ProjectAccess:
    """The project named by `slug` if the signed-in user is a member with at least `minimum`."""
    project, role = member_project(slug, request.user)
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
