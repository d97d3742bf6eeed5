"""Projects and their members, the default project and the demo."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from django.conf import settings
from django.db import IntegrityError, transaction

from checks.spec.semantics import too_long
from evaluations.models import (
    PROJECT_NAME_MAX,
    PROJECT_SLUG_MAX,
    Membership,
    Project,
    Role,
)
from evaluations.services.specs import spec_version_create
from evaluations.services.unique import Taken

# What the URLs accept as a project slug (Django's `slug` path converter).
_SLUG = re.compile(r"[-a-zA-Z0-9_]+")


class MembershipError(ValueError):
    """A project or membership change that is refused; the message says why, for people."""


def project_create(*, name: str, slug: str, created_by: Any) -> Project:
    """A new project whose creator is its first admin (a project always has one)."""
    name, slug = name.strip(), slug.strip()
    if not name:
        raise MembershipError("The project needs a name.")
    if not slug:
        raise MembershipError("The project needs a slug (letters, digits and dashes).")
    # Checked here, not by the database: PostgreSQL refused a long name or slug with a 500,
    # and a slug with a space or a slash was stored, then every link to the project (the
    # redirect after creating it first) failed to build.
    for field, value, limit in (("name", name, PROJECT_NAME_MAX), ("slug", slug, PROJECT_SLUG_MAX)):
        problem = too_long(value, limit)
        if problem:
            raise MembershipError(f"{field}: {problem}")
    if not _SLUG.fullmatch(slug):
        raise MembershipError(
            f"slug: {slug!r} may contain only letters, digits, dashes and underscores"
        )
    taken = Taken(
        lambda: Project.objects.filter(slug=slug).first(),
        lambda _: MembershipError(f"A project with the slug {slug!r} already exists."),
    )
    taken.check()
    with taken.inserting():
        project = Project.objects.create(name=name, slug=slug)
        Membership.objects.create(project=project, user=created_by, role=Role.ADMIN)
    return project


def _role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        choices = ", ".join(Role.values)
        raise MembershipError(f"Unknown role {value!r}: choose one of {choices}.") from None


def _lock_admins(project: Project) -> int:
    """Lock the project's admin memberships and count them. Two admins demoting each other
    at the same moment are serialised here, so neither can leave the project adminless."""
    return len(
        Membership.objects.select_for_update()
        .filter(project=project, role=Role.ADMIN)
        .values_list("pk", flat=True)
    )


def membership_add(*, project: Project, username: str, role: str) -> Membership:
    from django.contrib.auth import get_user_model

    new_role = _role(role)
    username = username.strip()
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise MembershipError(f"There is no active user named {username!r}.")
    taken = Taken(
        lambda: Membership.objects.filter(project=project, user=user).first(),
        lambda existing: MembershipError(
            f"{username} is already a member ({existing.role}); change the role instead."
        ),
    )
    taken.check()
    with taken.inserting():
        return Membership.objects.create(project=project, user=user, role=new_role)


def member_create(*, project: Project, username: str, role: str) -> tuple[Membership, str]:
    """A new account that joins the project with `role`, for someone who has none yet. Its
    password is random and returned once (shown to the admin to hand over; only its hash
    is stored); the person changes it at /accounts/password_change/."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.validators import UnicodeUsernameValidator
    from django.core.exceptions import ValidationError

    new_role = _role(role)
    username = username.strip()
    if not username:
        raise MembershipError("username: give the new person's username.")
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        raise MembershipError(
            f"username: {username!r} may contain only letters, digits and @ . + - _"
        ) from None
    user_model = get_user_model()
    if len(username) > (user_model._meta.get_field("username").max_length or 150):
        raise MembershipError(f"username: {username!r} is too long.")
    password = secrets.token_urlsafe(12)
    try:
        with transaction.atomic():
            user = user_model.objects.create_user(username=username, password=password)
            membership = Membership.objects.create(project=project, user=user, role=new_role)
    except IntegrityError:
        raise MembershipError(
            f"username: {username!r} is taken; add that person with 'Add a member' instead."
        ) from None
    return membership, password


def _membership_to_change(
    *, project: Project, membership_id: int, stays_admin: bool, last_admin_advice: str
) -> Membership:
    """The project's membership, locked with its admins (call inside a transaction). Refused
    when it is not in this project, or when it is the last admin and would stop being one;
    `last_admin_advice` ends that message."""
    admins = _lock_admins(project)
    membership = (
        Membership.objects.select_for_update(of=("self",))
        .select_related("user")
        .filter(project=project, pk=membership_id)
        .first()
    )
    if membership is None:
        raise MembershipError("That membership is not part of this project.")
    if membership.role == Role.ADMIN and not stays_admin and admins <= 1:
        raise MembershipError(
            f"{membership.user.get_username()} is the only admin of {project.name}: "
            + last_admin_advice
        )
    return membership


def membership_set_role(*, project: Project, membership_id: int, role: str) -> Membership:
    new_role = _role(role)
    with transaction.atomic():
        membership = _membership_to_change(
            project=project,
            membership_id=membership_id,
            stays_admin=new_role == Role.ADMIN,
            last_admin_advice="make someone else admin first.",
        )
        membership.role = new_role
        membership.save(update_fields=["role"])
        return membership


def membership_remove(*, project: Project, membership_id: int) -> None:
    with transaction.atomic():
        membership = _membership_to_change(
            project=project,
            membership_id=membership_id,
            stays_admin=False,
            last_admin_advice="make someone else admin before removing them.",
        )
        membership.delete()


def project_default() -> Project:
    """The project the CLI records its runs in when none is named."""
    project, _ = Project.objects.get_or_create(slug="default", defaults={"name": "Default"})
    return project


class DemoStep(NamedTuple):
    slug: str
    branch: str
    shows: str
    scenarios: list[str] | None = None  # None: every scenario
    buggy_release: bool = False  # the shell agent's release 2 (SHELL_AGENT_RELEASE=2)
    baseline: bool = False  # promote the run to its spec's baseline


# The demo's history, made by really running the demo specs, in this order, each to its end.
# calculator-fix on main becomes the baseline; the shell agent's buggy release 2 then loses
# its fix one replica in three: a regression against that baseline and a flaky scenario.
# refund-agent's borderline judge verdicts wait for people in the review queue.
DEMO_HISTORY = (
    DemoStep("calculator-fix", "main", "promoted to baseline", baseline=True),
    DemoStep("calculator-fix", "feature/tidy", "a second branch"),
    DemoStep("support-agent-python", "main", "a python agent under tool faults"),
    DemoStep("refund-agent", "main", "judge verdicts for review", ["no-chaos", "hostile-tool"]),
    DemoStep("calculator-fix", "main", "a regression and a flaky scenario", buggy_release=True),
)


def demo_runs_seed(*, on_step: Callable[[str], None] | None = None) -> list[str]:
    """Give the demo a history worth looking at, once (only while the default project has no
    run): each step of DEMO_HISTORY is run here to its end through the same services as a
    worker, so every page shows something true. Takes about a minute."""
    from evaluations.models import Run, SpecVersion, Trigger
    from evaluations.services.baselines import baseline_promote
    from evaluations.services.runs import run_create

    project = project_default()
    if Run.objects.filter(project=project).exists():
        return []
    lines = []
    for step in DEMO_HISTORY:
        version = (
            SpecVersion.objects.filter(spec__project=project, spec__slug=step.slug)
            .order_by("number")
            .first()
        )
        if version is None:
            continue
        if step.buggy_release:
            version = _demo_buggy_release(version)
        run = run_create(
            spec_version=version,
            trigger=Trigger.WEB,
            labels={"branch": step.branch},
            scenarios=step.scenarios,
            enqueue=False,
        )
        _demo_run_now(run.pk)
        run.refresh_from_db()
        if step.baseline:
            baseline_promote(
                run_id=run.pk,
                user=None,
                name=f"{step.branch} baseline",
                reason="the demo: the version the team trusts",
            )
        lines.append(
            f"demo run #{run.pk}: {step.slug} v{version.number} on {step.branch} "
            f"({step.shows}): {run.status}, exit code {run.exit_code}"
        )
        if on_step is not None:
            on_step(lines[-1])
    return lines


def _demo_buggy_release(version: Any) -> Any:
    """The same spec running the shell agent's release 2: a new version of the spec."""
    command = '  command: "sh agent.sh"\n'
    if command not in version.source_yaml:
        raise ValueError(f"{version.spec.slug}: no `{command.strip()}` to give release 2")
    text = version.source_yaml.replace(command, command + '  env: {SHELL_AGENT_RELEASE: "2"}\n', 1)
    return spec_version_create(
        project=version.spec.project,
        source_yaml="# The demo: release 2 of the shell agent (a regression)\n" + text,
        source_name=f"{version.spec.slug}.yaml (release 2)",
        base_dir=version.base_dir,
        read_from_files=True,  # the demo's own change to its own file
    )


def _demo_run_now(run_id: int) -> None:
    from evaluations.services.executions import execution_execute
    from evaluations.services.finalize import run_finalize_if_done
    from evaluations.services.runs import run_plan

    for execution_id in run_plan(run_id=run_id):
        execution_execute(execution_id=execution_id, worker="demo-seed")
    run_finalize_if_done(run_id=run_id)


def demo_load() -> list[str]:
    """Store the example specs in the default project (idempotent), for `keystone serve --demo`."""
    from django.contrib.auth import get_user_model

    from evaluations.models import Membership, Role

    project = project_default()
    lines = []
    examples = Path(settings.BASE_DIR) / "examples" / "specs"
    for path in sorted(examples.glob("*.yaml")):
        version = spec_version_create(
            project=project,
            source_yaml=path.read_text(encoding="utf-8"),
            source_name=str(path),
            base_dir=str(examples.resolve()),
            read_from_files=True,
        )
        lines.append(f"demo spec {version.spec.slug} v{version.number}")
    user_model = get_user_model()
    if not user_model.objects.filter(username="demo").exists():
        # A local demo only (--demo): the operator views are the way to browse runs for now.
        user = user_model.objects.create_user(
            "demo", password="demo", is_staff=True, is_superuser=True
        )
        Membership.objects.get_or_create(project=project, user=user, defaults={"role": Role.ADMIN})
        lines.append("demo user: demo / demo (admin of the default project)")
    return lines
