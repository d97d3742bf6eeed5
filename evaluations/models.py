"""Keystone's tables. Writes belong in services.py and reads in selectors.py; the models
keep only the behaviour of a single row (roles, token hashing, immutability, keys).

Dashboard lists page through runs and executions by keyset on (project, created, id), so
those indexes exist; constraints make every result, execution and active baseline unique
in the database itself, not only in the code that writes them.

A foreign key whose column leads one of its table's indexes or unique constraints has no
index of its own (`db_index=False`): that index finds its rows (and the rows a delete
cascades to) as well, and every index is one more write per row. Each execution wrote its
row three times and its results once into eight indexes apiece;
tests/evaluations/test_models.py checks that no index's columns begin another's.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.text import get_valid_filename

from checks.planning import EXECUTION_KEY_MAX, execution_key
from checks.results import CheckResult as EngineCheckResult
from checks.results import FailureCode
from checks.spec.semantics import (
    INVARIANT_ID_MAX,
    JUDGE_MODEL_MAX,
    SCENARIO_NAME_MAX,
    SPEC_ID_MAX,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


def sha256_hex(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


class ImmutableRowError(Exception):
    """Raised when code tries to change a row that is written once (a SpecVersion)."""


# --- Projects, people, tokens -----------------------------------------------------------


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    REVIEWER = "reviewer", "Reviewer"
    EDITOR = "editor", "Editor"
    ADMIN = "admin", "Admin"


# Each role includes everything the roles before it may do.
ROLE_RANK = {Role.VIEWER: 1, Role.REVIEWER: 2, Role.EDITOR: 3, Role.ADMIN: 4}


# Sizes of a project's name and slug (services.projects checks them).
PROJECT_NAME_MAX = 200
PROJECT_SLUG_MAX = 100


class Project(models.Model):
    name = models.CharField(max_length=PROJECT_NAME_MAX)
    slug = models.SlugField(max_length=PROJECT_SLUG_MAX, unique=True)
    # Which judge results go to people, with the keys of a spec's `review:` block; the
    # spec's block wins key by key (services.review_policy_for).
    review_policy = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def role_of(self, user: AbstractBaseUser | AnonymousUser | None) -> Role | None:
        """The user's role here; superusers are admins of every project."""

        def membership_role() -> str | None:
            assert user is not None and user.is_authenticated  # asked only for those
            return (
                Membership.objects.filter(project=self, user_id=user.pk)
                .values_list("role", flat=True)
                .first()
            )

        return role_given(user, membership_role)

    def has_role(self, user: AbstractBaseUser | AnonymousUser | None, minimum: str) -> bool:
        needed = ROLE_RANK[Role(minimum)]  # an unknown role name is a bug: ValueError
        role = self.role_of(user)
        return role is not None and ROLE_RANK[role] >= needed


def role_given(
    user: AbstractBaseUser | AnonymousUser | None, membership_role: Callable[[], str | None]
) -> Role | None:
    """A user's role in a project whose membership row gives `membership_role()` (asked
    only for an active user who is not a superuser): superusers are admins of every
    project, and nobody else has a role without a membership."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if getattr(user, "is_superuser", False):
        return Role.ADMIN
    role = membership_role()
    return Role(role) if role else None


class Membership(models.Model):
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="memberships", db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="keystone_memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project}: {self.role}"


TOKEN_PREFIX = "ks_"
TOKEN_LAST_USED_PRECISION_SECONDS = 60


class TokenScope(models.TextChoices):
    """What a token may do, besides what its user's role allows: reading, running (specs
    and runs), reviewing, administering (tokens, alert rules)."""

    READ = "read"
    RUN = "run"
    REVIEW = "review"
    ADMIN = "admin"


def all_token_scopes() -> list[str]:
    return list(TokenScope.values)


class ApiToken(models.Model):
    """A machine credential. Only the SHA-256 of the token is stored; the raw value is shown
    once, when issued. `prefix` (the first characters) lets people tell tokens apart.

    A project token (`project` set) acts in that project only; a personal token (`project`
    null) acts in every project its user belongs to. Either acts with its user's current
    role there, and only within its `scopes`; it stops working once `expires` passes."""

    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="api_tokens", null=True, blank=True
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="keystone_api_tokens"
    )
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=16, editable=False)
    scopes = models.JSONField(default=all_token_scopes)
    expires = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_token(raw: str) -> str:
        # Tokens are 256 random bits, so a plain SHA-256 is enough (no slow KDF needed).
        return sha256_hex(raw)

    @classmethod
    def issue(
        cls,
        *,
        project: Project | None,
        user: Any,
        name: str,
        scopes: list[str] | None = None,
        expires: Any = None,
    ) -> tuple[ApiToken, str]:
        """Create a token row and return it with the raw token, which is never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            project=project,
            user=user,
            name=name,
            token_hash=cls.hash_token(raw),
            prefix=raw[: len(TOKEN_PREFIX) + 8],
            scopes=all_token_scopes() if scopes is None else list(scopes),
            expires=expires,
        )
        return token, raw

    @classmethod
    def find_active(cls, raw: str) -> ApiToken | None:
        """The live token matching a raw value. Looked up by its hash, so no raw token is compared.
        Marks it used; at most one write a minute per token, so busy CI jobs don't write each call."""
        now = timezone.now()
        token = (
            cls.objects.select_related("project", "user")
            .filter(token_hash=cls.hash_token(raw), revoked=False, user__is_active=True)
            .filter(Q(expires__isnull=True) | Q(expires__gt=now))
            .first()
        )
        if token is not None:
            stale = now - timedelta(seconds=TOKEN_LAST_USED_PRECISION_SECONDS)
            if token.last_used is None or token.last_used < stale:
                cls.objects.filter(pk=token.pk).filter(
                    Q(last_used__isnull=True) | Q(last_used__lt=stale)
                ).update(last_used=now)
                token.last_used = now
        return token


# --- Specs ------------------------------------------------------------------------------


class Spec(models.Model):
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="specs", db_index=False
    )
    slug = models.SlugField(max_length=SPEC_ID_MAX, help_text="The spec's `id` (kebab-case).")
    name = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]
        constraints = [models.UniqueConstraint(fields=["project", "slug"], name="spec_unique_slug")]

    def __str__(self) -> str:
        return self.slug

    def latest_version(self) -> SpecVersion | None:
        return self.versions.order_by("-number").first()


class SpecVersionQuerySet(models.QuerySet["SpecVersion"]):
    def update(self, **kwargs: Any) -> int:
        raise ImmutableRowError("spec versions are immutable: upload a new version instead")


# The longest directory a spec read from files can be stored with (services.specs refuses a
# longer one before anything is written).
SPEC_BASE_DIR_MAX = 1000


class SpecVersion(models.Model):
    """One uploaded text of a spec. Written once: runs point at it and must stay reproducible."""

    spec = models.ForeignKey(
        Spec, on_delete=models.CASCADE, related_name="versions", db_index=False
    )
    number = models.PositiveIntegerField()
    source_yaml = models.TextField()
    parsed = models.JSONField(default=dict)
    content_hash = models.CharField(max_length=64, editable=False)
    # The server directory the text was read from (CLI, demo), where its relative files
    # (seeds, fixtures, agents) live; a new version typed in the browser keeps it, so that
    # its relative paths still resolve. Empty for text written in the browser or the API.
    base_dir = models.CharField(max_length=SPEC_BASE_DIR_MAX, blank=True, default="")
    # The text itself was read from a file on the server (the CLI, the demo), which the
    # operator laid out: its runs may start agent.start on the host, copy a workspace from
    # outside its directory and read replay files (services.runs.host_parts_allowed).
    read_from_files = models.BooleanField(default=False)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created = models.DateTimeField(default=timezone.now, editable=False)

    objects = SpecVersionQuerySet.as_manager()

    class Meta:
        ordering = ["spec", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["spec", "number"], name="specversion_unique_number")
        ]
        # Re-uploading identical text must find the existing version quickly.
        indexes = [models.Index(fields=["spec", "content_hash"], name="specversion_hash_idx")]

    def __str__(self) -> str:
        return f"{self.spec_id} v{self.number}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRowError(f"spec version {self.pk} is immutable")
        self.content_hash = sha256_hex(self.source_yaml)
        super().save(*args, **kwargs)


# --- Runs and executions ----------------------------------------------------------------


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    PLANNING = "planning"
    RUNNING = "running"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


RUN_TERMINAL_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED})


def summary_invariant_counts(summary: dict[str, Any]) -> dict[str, list[int]]:
    """invariant id -> [results passed, results total] in a run summary: its `matrix` cells
    (one per scenario and invariant) summed over the scenarios. What Run.invariant_counts
    stores; migration 0012 has a copy of this for the runs finalized before it."""
    counts: dict[str, list[int]] = {}
    matrix = summary.get("matrix") if isinstance(summary, dict) else None
    for cell in matrix if isinstance(matrix, list) else []:
        if isinstance(cell, dict) and cell.get("invariant_id") is not None:
            sums = counts.setdefault(str(cell["invariant_id"]), [0, 0])
            sums[0] += int(cell.get("results_passed") or 0)
            sums[1] += int(cell.get("results_total") or 0)
    return counts


class Trigger(models.TextChoices):
    WEB = "web"
    CLI = "cli"
    API = "api"
    SCHEDULE = "schedule"


# The labels also stored in a column of their own, and its size (services.runs checks them).
RUN_LABEL_MAX = {"git_sha": 64, "branch": 255}


class Run(models.Model):
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    # Denormalised from spec_version so trends per spec span its versions with one index.
    spec = models.ForeignKey(Spec, on_delete=models.CASCADE, related_name="runs")
    spec_version = models.ForeignKey(SpecVersion, on_delete=models.PROTECT, related_name="runs")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.WEB)
    labels = models.JSONField(default=dict, blank=True)
    # Indexed copies of labels["git_sha"] / labels["branch"] for filtering.
    git_sha = models.CharField(max_length=RUN_LABEL_MAX["git_sha"], blank=True, default="")
    branch = models.CharField(max_length=RUN_LABEL_MAX["branch"], blank=True, default="")
    replicas_override = models.PositiveIntegerField(null=True, blank=True)
    options = models.JSONField(default=dict, blank=True)
    summary = models.JSONField(default=dict, blank=True)
    composite = models.FloatField(null=True, blank=True)
    pass_rate = models.FloatField(null=True, blank=True)
    resilience = models.FloatField(null=True, blank=True)
    overall = models.FloatField(null=True, blank=True)
    gate_passed = models.BooleanField(null=True, blank=True)
    exit_code = models.SmallIntegerField(null=True, blank=True)
    # Per-run aggregates written by run_finalize, so lists, overview and trends never
    # scan executions: total cost, p95 latency, mean judge score.
    cost_usd = models.FloatField(null=True, blank=True)
    p95_duration_ms = models.FloatField(null=True, blank=True)
    judge_mean = models.FloatField(null=True, blank=True)
    # invariant id -> [results passed, results total] over the whole run (its summary
    # matrix's cells summed over scenarios), written by run_finalize: the trends page reads
    # these few hundred bytes for each of its 100 runs instead of each summary's ~26 kB of
    # groups and matrix.
    invariant_counts = models.JSONField(default=dict, blank=True)
    # The keys of the summary's groups and invariant x scenario cells that did not pass,
    # {"groups": [...], "cells": [...]} (selectors.regressions.summary_failing_keys), written
    # by run_finalize: the regressions report walks 50 runs back per spec to find when a
    # regression began, and reads these instead of each run's ~26 kB of groups and matrix.
    failing_keys = models.JSONField(default=dict, blank=True)
    # What the regressions comparison reads of each group and cell of the summary, in its
    # order: {"groups": [...], "cells": [...]} (selectors.regressions.compared_verdicts),
    # written by run_finalize: ~100 bytes an entry instead of the summary's ~26 kB of groups
    # and matrix, which the overview, the report and the digest decoded for every spec.
    verdicts = models.JSONField(default=dict, blank=True)
    execution_count = models.PositiveIntegerField(default=0)
    executions_done = models.PositiveIntegerField(default=0)
    warnings = models.JSONField(default=list, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # The API's Idempotency-Key of the request that made the run, and a digest of what that
    # request asked for: the same key again returns this run; with another body it is a 409.
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    request_digest = models.CharField(max_length=64, blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [
            models.Index(fields=["project", "created", "id"], name="run_project_keyset_idx"),
            models.Index(fields=["project", "spec", "created"], name="run_project_spec_idx"),
            models.Index(fields=["project", "status", "created"], name="run_project_status_idx"),
            models.Index(fields=["project", "branch", "created"], name="run_project_branch_idx"),
            # The regressions report's: each spec's newest completed runs, and the newest per
            # branch, read from the index alone (the table holds each run's large JSON).
            models.Index(
                fields=["project", "status", "spec", "-finished", "-id"],
                include=["branch"],
                name="run_spec_recent_idx",
            ),
        ]
        constraints = [
            # A retried request with the same Idempotency-Key finds this run, never a second.
            models.UniqueConstraint(
                fields=["project", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="run_idempotency_key_unique",
            )
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.spec_id is None and self.spec_version_id is not None:
            self.spec_id = self.spec_version.spec_id
        super().save(*args, **kwargs)

    @property
    def is_terminal(self) -> bool:
        return self.status in RUN_TERMINAL_STATUSES


def run_large_fields(via: str = "") -> tuple[str, ...]:
    """A run's columns that grow with its scenarios, prompts and invariants (the summary
    alone is ~0.5 kB of JSON per scenario x prompt), to leave out wherever a run is read for
    its light columns: `.defer(*run_large_fields())`, or `run_large_fields("run__")` through
    a relation. A deferred column read anyway is fetched then, in a query of its own."""
    return tuple(f"{via}{name}" for name in ("summary", "verdicts", "failing_keys"))


class Pillar(models.TextChoices):
    CONTRACT = "contract"
    CHAOS = "chaos"
    MUTATION = "mutation"
    REPLAY = "replay"


class ExecutionStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INVALID = "invalid"
    PROVIDER_ERROR = "provider_error"
    ERROR = "error"


EXECUTION_ACTIVE_STATUSES = frozenset({ExecutionStatus.PENDING, ExecutionStatus.RUNNING})


class Execution(models.Model):
    """One invocation of the agent: a (scenario x prompt x replica) cell of a run, or one
    invariant's cell when the spec asks for per_invariant isolation."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="executions", db_index=False
    )
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="executions", db_index=False
    )
    # Identity of the cell within its run (see build_key); unique per run.
    key = models.CharField(max_length=EXECUTION_KEY_MAX, editable=False)
    scenario = models.CharField(max_length=SCENARIO_NAME_MAX)
    prompt_index = models.PositiveIntegerField(default=0)
    prompt = models.TextField(blank=True)
    replica = models.PositiveIntegerField(default=0, help_text="0-based replica number.")
    attempt = models.PositiveSmallIntegerField(default=1)
    pillar = models.CharField(max_length=16, choices=Pillar.choices, default=Pillar.CONTRACT)
    mutation_type = models.CharField(max_length=64, blank=True, default="")
    # NULL unless the spec asks for per_invariant isolation (one execution per invariant).
    invariant_id = models.CharField(max_length=INVARIANT_ID_MAX, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(
        max_length=16, choices=ExecutionStatus.choices, default=ExecutionStatus.PENDING
    )
    composite = models.FloatField(null=True, blank=True)
    passed = models.BooleanField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    # When a task for this execution was last sent to the broker; the requeue beat skips
    # pending executions sent recently instead of flooding the queue every tick.
    enqueued_at = models.DateTimeField(null=True, blank=True)
    # After an attempt that could not start (a service or engine away): not before this.
    retry_at = models.DateTimeField(null=True, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    agent_cpu_ms = models.FloatField(null=True, blank=True)
    cost_usd = models.FloatField(default=0.0)
    # The models of the calls the gateway could not price: cost_usd leaves them out, and a
    # cost check or gate gives no pass on it.
    unpriced_models = models.JSONField(default=list, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    tool_call_count = models.PositiveIntegerField(default=0)
    # Tool calls that errored or answered 4xx/5xx: the run's tool success rate needs them.
    tool_error_count = models.PositiveIntegerField(default=0)
    # Calls through the LLM gateway and through the tool proxy, where faults are injected: a
    # faulted scenario none of whose executions called either gets a run warning. NULL: not
    # counted (the agent never ran, or the row is older than the count).
    gateway_call_count = models.PositiveIntegerField(null=True, blank=True)
    proxy_call_count = models.PositiveIntegerField(null=True, blank=True)
    # Capped at KEYSTONE_FINAL_OUTPUT_MAX_CHARS; the full output is an Artifact.
    final_output = models.TextField(blank=True, default="")
    # The tool calls in order, [{"name", "arguments"}] (capped): drift by `tool-sequence`,
    # baseline cells and the compare page read them here, not from the trace artifact.
    tool_sequence = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    # The planned execution (checks.planning.PlannedExecution): which invariants it scores,
    # a replay session; so any worker can run it from the row alone.
    plan = models.JSONField(default=dict, blank=True)
    # `forbidden` rules this execution broke; any forces its composite to 0.
    forbidden_violations = models.JSONField(default=list, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["run", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="execution_unique_key"),
        ]
        indexes = [
            models.Index(fields=["project", "created", "id"], name="execution_project_keyset_idx"),
            # A run's executions in id order: its page's previous and next, the API's pages.
            # Without it the planner walked the primary key back from the first execution of
            # a run for one older in the same run, past every other run's (40 ms at 200,000).
            models.Index(fields=["run", "id"], name="execution_run_order_idx"),
            models.Index(fields=["run", "status"], name="execution_run_status_idx"),
            models.Index(fields=["run", "scenario"], name="execution_run_scenario_idx"),
            # Finds running executions whose worker lost its lease.
            models.Index(fields=["status", "lease_expires"], name="execution_lease_idx"),
        ]

    def __str__(self) -> str:
        return f"execution {self.pk} {self.key} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.project_id is None and self.run_id is not None:
            self.project_id = self.run.project_id
        if not self.key:
            self.key = self.build_key(
                scenario=self.scenario,
                prompt_index=self.prompt_index,
                replica=self.replica,
                invariant_id=self.invariant_id,
                pillar=self.pillar,
                mutation_type=self.mutation_type,
            )
        super().save(*args, **kwargs)

    @staticmethod
    def build_key(
        *,
        scenario: str,
        prompt_index: int,
        replica: int,
        invariant_id: str | None = None,
        pillar: str = Pillar.CONTRACT,
        mutation_type: str = "",
    ) -> str:
        # One identity for the row and the fault seed: checks.planning owns the format.
        return execution_key(
            pillar=pillar,
            scenario=scenario,
            prompt_index=prompt_index,
            replica=replica,
            mutation_type=mutation_type,
            invariant_id=invariant_id,
        )

    @property
    def is_terminal(self) -> bool:
        return self.status not in EXECUTION_ACTIVE_STATUSES

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ArtifactKind(models.TextChoices):
    STDOUT = "stdout"
    STDERR = "stderr"
    TRACE = "trace"
    WORKSPACE_DIFF = "workspace_diff"
    HTTP_LOG = "http_log"
    DB_WRITES = "db_writes"
    ARTIFACT_JSON = "artifact_json"
    FILE = "file"


def artifact_upload_to(instance: Artifact, filename: str) -> str:
    """Keystone's own blobs have a name per kind (stdout.txt, artifact.json, ...) and go
    straight into the execution's directory: a directory per kind cost each file one more
    mkdir, ~0.2 ms of an ext4 file system's kernel time, 2-4% of a short execution's CPU
    (issue 18). Files named by the agent (`file`) get a directory of their own."""
    base = get_valid_filename(os.path.basename(instance.name or filename)) or instance.kind
    execution = instance.execution
    directory = f"runs/{execution.run_id}/executions/{execution.pk}"
    return (
        f"{directory}/files/{base}" if instance.kind == ArtifactKind.FILE else f"{directory}/{base}"
    )


class Artifact(models.Model):
    """A blob an execution produced. The bytes live in Django storage, not in the row."""

    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="artifacts", db_index=False
    )
    kind = models.CharField(max_length=32, choices=ArtifactKind.choices)
    # Distinguishes several blobs of one kind (`file` artifacts: the workspace path).
    name = models.CharField(max_length=255, blank=True, default="")
    file = models.FileField(upload_to=artifact_upload_to, max_length=500)
    size = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True, default="")
    truncated = models.BooleanField(default=False)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["execution", "kind", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["execution", "kind", "name"], name="artifact_unique_name"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


# --- Results ----------------------------------------------------------------------------


class Severity(models.TextChoices):
    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class ResultSource(models.TextChoices):
    ENGINE = "engine"
    JUDGE = "judge"
    HUMAN = "human"


class CheckResult(models.Model):
    """One invariant evaluated on one execution (checks.results.CheckResult, stored)."""

    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="check_results", db_index=False
    )
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="check_results", db_index=False
    )
    invariant_id = models.CharField(max_length=INVARIANT_ID_MAX)
    check_type = models.CharField(max_length=64)
    score = models.FloatField()
    passed = models.BooleanField()
    failure_code = models.CharField(max_length=64, blank=True, default="")
    message = models.TextField(blank=True, default="")
    details = models.JSONField(default=dict, blank=True)
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.MEDIUM)
    weight = models.FloatField(default=1.0)
    gate = models.BooleanField(default=False)
    dimensions = models.JSONField(default=list, blank=True)
    source = models.CharField(
        max_length=16, choices=ResultSource.choices, default=ResultSource.ENGINE
    )
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["execution", "invariant_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["execution", "invariant_id", "source"], name="checkresult_unique_source"
            )
        ]
        indexes = [
            models.Index(fields=["run", "invariant_id"], name="checkresult_run_invariant_idx"),
            models.Index(fields=["run", "failure_code"], name="checkresult_run_failure_idx"),
            # The failing results of a run's invariants (the regressions report's examples):
            # a few in a hundred, found without reading the passing ones.
            models.Index(
                fields=["run", "invariant_id", "execution"],
                condition=models.Q(passed=False),
                name="checkresult_failing_idx",
            ),
        ]

    def __str__(self) -> str:
        verdict = "pass" if self.passed else f"fail {self.failure_code}".strip()
        return f"{self.invariant_id} [{self.source}] {verdict}"

    @classmethod
    def from_engine(cls, result: EngineCheckResult, *, execution: Execution) -> CheckResult:
        """An unsaved row for an engine result (services bulk-create them)."""
        return cls(
            execution=execution,
            run_id=execution.run_id,
            invariant_id=result.invariant_id,
            check_type=result.check_type,
            score=result.score,
            passed=result.passed,
            failure_code=result.failure_code.value if result.failure_code else "",
            message=result.message,
            details=result.details,
            severity=result.severity,
            weight=result.weight,
            gate=result.gate,
            dimensions=list(result.dimensions),
            source=result.source,
        )

    def to_engine(self, one_copy: Callable[[str], str] = str) -> EngineCheckResult:
        """Back to the engine's type, so scores can be recomputed from stored rows.
        `one_copy`: what the texts go through (the details' keys and texts too): by default
        `str`, which hands a text back as it is; selectors.records.OneCopy keeps one copy of
        each text that repeats across many rows."""
        return EngineCheckResult(
            invariant_id=one_copy(self.invariant_id),
            check_type=one_copy(self.check_type),
            passed=self.passed,
            score=self.score,
            failure_code=FailureCode(self.failure_code) if self.failure_code else None,
            message=one_copy(self.message),
            details={
                one_copy(key): one_copy(value) if type(value) is str else value
                for key, value in self.details.items()
            },
            severity=one_copy(self.severity),
            weight=self.weight,
            gate=self.gate,
            dimensions=self.dimensions,  # the row's own list, read to be converted
            source=one_copy(self.source),
        )


DEFAULT_BASELINE_BRANCH = "main"


class Baseline(models.Model):
    """A run's results frozen as the reference for drift and regressions of its spec, in one
    branch scope. Every promotion is a row (who, when, why, which it replaced); at most one
    is active per (spec, branch). A branch with no baseline of its own uses main's."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="baselines")
    spec = models.ForeignKey(Spec, on_delete=models.CASCADE, related_name="baselines")
    run = models.ForeignKey(
        Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="baselines"
    )
    branch = models.CharField(max_length=255, default=DEFAULT_BASELINE_BRANCH)
    name = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    active = models.BooleanField(default=False)
    # The baseline that was active in this scope when this one was promoted (rollback target).
    previous = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Per (scenario x prompt) group: pass rate, first passing output, failure codes,
    # latency and cost; kept here so a baseline outlives the run it came from.
    data = models.JSONField(default=dict, blank=True)
    # The compared parts of data's groups and matrix (as Run.verdicts), written when promoted.
    verdicts = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    rolled_back = models.DateTimeField(null=True, blank=True)
    rolled_back_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["spec", "branch"],
                condition=Q(active=True),
                name="baseline_one_active_per_spec_branch",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name}{' (active)' if self.active else ''}"


class BaselineCell(models.Model):
    """One execution of a baseline's run (scenario, prompt, replica), frozen at promotion:
    what drift and the compare page need once the run's artifacts are cleaned up."""

    baseline = models.ForeignKey(
        Baseline, on_delete=models.CASCADE, related_name="cells", db_index=False
    )
    key = models.CharField(max_length=EXECUTION_KEY_MAX)  # Execution.key: the match
    scenario = models.CharField(max_length=SCENARIO_NAME_MAX)
    prompt_index = models.PositiveIntegerField(default=0)
    replica = models.PositiveIntegerField(default=0)
    pillar = models.CharField(max_length=16, default=Pillar.CONTRACT)
    status = models.CharField(max_length=16, blank=True, default="")
    final_output = models.TextField(blank=True, default="")
    tool_sequence = models.JSONField(default=list, blank=True)
    # [{invariant_id, passed, score, failure_code}] of the strongest source per invariant.
    results = models.JSONField(default=list, blank=True)
    composite = models.FloatField(null=True, blank=True)
    passed = models.BooleanField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    cost_usd = models.FloatField(default=0.0)

    class Meta:
        ordering = ["baseline", "id"]
        constraints = [
            models.UniqueConstraint(fields=["baseline", "key"], name="baseline_cell_unique_key"),
        ]

    def __str__(self) -> str:
        return f"baseline {self.baseline_id} cell {self.key}"


class JudgeCacheEntry(models.Model):
    """A judge reply kept so an identical call (same model, prompt, input, temperature 0)
    is not paid twice. `key` is the SHA-256 of everything that shapes the reply."""

    key = models.CharField(max_length=64, unique=True)
    model = models.CharField(max_length=JUDGE_MODEL_MAX)
    reply = models.JSONField(default=dict)
    created = models.DateTimeField(default=timezone.now, editable=False)
    hits = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.model} {self.key[:12]}"


# --- Review: people grading the judge ---------------------------------------------------


class ReviewReason(models.TextChoices):
    ALL = "all", "Every judge result"
    SAMPLE = "sample", "Random sample"
    BORDERLINE = "borderline", "Close to the threshold"
    DISAGREEMENT = "disagreement", "Judge and checks disagree"
    SPREAD = "spread", "Judge samples spread"
    GATE = "gate", "Failing gate"
    MANUAL = "manual", "Sent by a person"


class ReviewStatus(models.TextChoices):
    OPEN = "open", "Open"
    ADJUDICATION = "adjudication", "Needs adjudication"
    COMPLETE = "complete", "Complete"


class ReviewItem(models.Model):
    """One check result (usually the judge's) waiting for, or graded by, people.

    The judge's side (model, prompt version, criteria, score) is copied here when the item
    is made, so agreement is computed from this table alone; `final_*` is what people
    decided, written when the item completes.
    """

    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="review_items", db_index=False
    )
    spec = models.ForeignKey(Spec, on_delete=models.CASCADE, related_name="review_items")
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="review_items", db_index=False
    )
    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="review_items")
    check_result = models.ForeignKey(
        CheckResult, on_delete=models.CASCADE, related_name="review_items"
    )
    invariant_id = models.CharField(max_length=INVARIANT_ID_MAX)
    criteria = models.TextField(blank=True, default="")
    judge_model = models.CharField(max_length=JUDGE_MODEL_MAX, blank=True, default="")
    prompt_version = models.CharField(max_length=64, blank=True, default="")
    judge_score = models.FloatField(null=True, blank=True)
    judge_passed = models.BooleanField(null=True, blank=True)
    reason = models.CharField(max_length=16, choices=ReviewReason.choices)
    status = models.CharField(
        max_length=16, choices=ReviewStatus.choices, default=ReviewStatus.OPEN
    )
    reviews_required = models.PositiveSmallIntegerField(default=1)
    blind = models.BooleanField(default=False)
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    claim_expires = models.DateTimeField(null=True, blank=True)
    final_passed = models.BooleanField(null=True, blank=True)
    final_score = models.FloatField(null=True, blank=True)
    sent_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    adjudicated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created = models.DateTimeField(default=timezone.now, editable=False)
    completed = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created", "id"]
        constraints = [
            # Selection is idempotent and a manual send does not duplicate a pending item;
            # a completed item does not stop the same result being sent again later.
            models.UniqueConstraint(
                fields=["check_result"],
                condition=~Q(status="complete"),
                name="reviewitem_one_pending_per_result",
            ),
            models.CheckConstraint(
                condition=Q(reviews_required__gte=1), name="reviewitem_reviews_required_min"
            ),
        ]
        indexes = [
            models.Index(
                fields=["project", "status", "created", "id"], name="reviewitem_queue_idx"
            ),
            models.Index(fields=["run", "status"], name="reviewitem_run_idx"),
            models.Index(
                fields=["project", "status", "judge_model", "completed"],
                name="reviewitem_agreement_idx",
            ),
            # The queue's "complete" tab, newest first.
            models.Index(
                fields=["project", "status", "completed", "id"], name="reviewitem_done_idx"
            ),
            # The queue's counts per status with a spec filter (and a criteria one): each
            # reads its up to COUNT_CAP + 1 entries here, not the spec's items of every status.
            models.Index(
                fields=["project", "status", "spec", "invariant_id"],
                name="reviewitem_filter_idx",
            ),
            # The criteria drop-down: a skip scan over the distinct invariant ids.
            models.Index(fields=["project", "invariant_id"], name="reviewitem_criteria_idx"),
            # "n open items being graded now": the claimed few, not every open item.
            models.Index(
                fields=["project", "claim_expires"],
                condition=Q(status="open", claim_expires__isnull=False),
                name="reviewitem_claim_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"review {self.pk} {self.invariant_id} ({self.status})"

    def claim_is_live(self, now: Any = None) -> bool:
        now = now or timezone.now()
        return (
            self.claimed_by_id is not None
            and self.claim_expires is not None
            and self.claim_expires > now
        )

    def claimed_by_other(self, user: Any, now: Any = None) -> bool:
        return self.claim_is_live(now) and self.claimed_by_id != getattr(user, "pk", None)


def counts_for_agreement(item: ReviewItem) -> bool:
    """Whether this item is one of the judge-human pairs agreement is computed from: complete,
    with a verdict from both the judge and people, by a named judge."""
    return (
        item.status == ReviewStatus.COMPLETE
        and item.judge_passed is not None
        and item.final_passed is not None
        and item.judge_model != ""
    )


class ReviewAgreementDay(models.Model):
    """The judge-human 2x2 table of the review items of one spec, judge model, criteria and
    prompt version completed on one day (the date in the current time zone, TIME_ZONE): what
    agreement and its trend are computed from, so they read a few rows per day instead of
    every completed item. Kept by `tally` when an item completes, is reopened or is deleted.

    Two completions that find no row for their day at the same moment each create one: a
    key may have more than one row, and readers sum them."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    spec = models.ForeignKey(Spec, on_delete=models.CASCADE, related_name="+")
    judge_model = models.CharField(max_length=JUDGE_MODEL_MAX)
    criteria = models.TextField(blank=True, default="")
    prompt_version = models.CharField(max_length=64, blank=True, default="")
    day = models.DateField()
    both_pass = models.IntegerField(default=0)
    both_fail = models.IntegerField(default=0)
    judge_pass_human_fail = models.IntegerField(default=0)
    judge_fail_human_pass = models.IntegerField(default=0)
    absolute_error = models.FloatField(default=0.0)  # |judge score - final score|, summed
    scored = models.IntegerField(default=0)  # items with both scores: the MAE's n

    class Meta:
        indexes = [models.Index(fields=["project", "spec", "day"], name="agreementday_idx")]

    def __str__(self) -> str:
        return f"{self.judge_model} agreement on {self.day}"

    @staticmethod
    def key_and_counts(item: ReviewItem) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The row one item's pair is counted in (its key fields) and what it adds to it;
        None when the item does not count for agreement."""
        if not counts_for_agreement(item):
            return None
        # An item completed without a time is counted on the day it is counted.
        day = timezone.localdate(item.completed or timezone.now())
        if item.judge_passed:
            cell = "both_pass" if item.final_passed else "judge_pass_human_fail"
        else:
            cell = "judge_fail_human_pass" if item.final_passed else "both_fail"
        counts: dict[str, Any] = {cell: 1}
        if item.judge_score is not None and item.final_score is not None:
            counts["absolute_error"] = abs(item.judge_score - item.final_score)
            counts["scored"] = 1
        key = {
            "project_id": item.project_id,
            "spec_id": item.spec_id,
            "judge_model": item.judge_model,
            "criteria": item.criteria,
            "prompt_version": item.prompt_version,
            "day": day,
        }
        return key, counts

    @classmethod
    def tally(cls, item: ReviewItem, *, sign: int) -> None:
        """Add (sign 1) or take back (sign -1) one item's pair, if it counts for agreement.
        Call it with the item as it is (or was) complete: after it is completed, and before a
        completed item is reopened, changed or deleted."""
        counted = cls.key_and_counts(item)
        if counted is None:
            return
        key, counts = counted
        # One row of the key, so a key with two rows is not counted twice.
        row = cls.objects.filter(**key).order_by("pk").values_list("pk", flat=True).first()
        if row is not None:
            cls.objects.filter(pk=row).update(
                **{name: F(name) + sign * value for name, value in counts.items()}
            )
        elif sign > 0:
            cls.objects.create(**key, **counts)

    @classmethod
    def recount(cls, project: Project) -> None:
        """Every daily tally of the project again from its completed items: after items
        were written without the review services (a bulk load), or TIME_ZONE changed."""
        tallies: dict[tuple[Any, ...], dict[str, Any]] = {}
        for item in ReviewItem.objects.filter(
            project=project, status=ReviewStatus.COMPLETE
        ).iterator(chunk_size=5000):
            counted = cls.key_and_counts(item)
            if counted is None:
                continue
            key, counts = counted
            row = tallies.setdefault(tuple(key.values()), {**key})
            for name, value in counts.items():
                row[name] = row.get(name, 0) + value
        with transaction.atomic():
            cls.objects.filter(project=project).delete()
            rows = [ReviewAgreementDay(**row) for row in tallies.values()]
            ReviewAgreementDay.objects.bulk_create(rows, batch_size=1000)


def _untally_deleted_item(sender: Any, instance: ReviewItem, **kwargs: Any) -> None:
    """A deleted item (its run, execution or result deleted, say) no longer counts."""
    ReviewAgreementDay.tally(instance, sign=-1)


models.signals.post_delete.connect(_untally_deleted_item, sender=ReviewItem)


class ReviewVerdict(models.Model):
    """One reviewer's grade of one item. The database, not the browser, keeps an item to
    `reviews_required` verdicts: each takes a numbered slot, slots are unique per item and
    lie in 1..slots_total, and one reviewer grades an item once."""

    item = models.ForeignKey(
        ReviewItem, on_delete=models.CASCADE, related_name="verdicts", db_index=False
    )
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="keystone_review_verdicts",
        db_index=False,
    )
    slot = models.PositiveSmallIntegerField()
    # A copy of item.reviews_required, so a CHECK constraint on this row can bound `slot`.
    slots_total = models.PositiveSmallIntegerField()
    passed = models.BooleanField()
    score = models.FloatField()
    note = models.TextField(blank=True, default="")
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["item", "slot"]
        constraints = [
            models.UniqueConstraint(
                fields=["item", "reviewer"], name="reviewverdict_one_per_reviewer"
            ),
            models.UniqueConstraint(fields=["item", "slot"], name="reviewverdict_unique_slot"),
            models.CheckConstraint(
                condition=Q(slot__gte=1) & Q(slot__lte=F("slots_total")),
                name="reviewverdict_slot_in_range",
            ),
            models.CheckConstraint(
                condition=Q(score__gte=0.0) & Q(score__lte=1.0), name="reviewverdict_score_range"
            ),
        ]
        indexes = [
            # A reviewer's grades newest first ("Previous"), and their count.
            models.Index(fields=["reviewer", "created", "id"], name="reviewverdict_reviewer_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.reviewer} on {self.item_id}: {'pass' if self.passed else 'fail'}"


class ResultChange(models.Model):
    """History of a result that people changed: who, when, and the effective result and
    scores before and after ({score, passed, source, execution_composite, ...})."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="result_changes", db_index=False
    )
    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="result_changes", db_index=False
    )
    check_result = models.ForeignKey(
        CheckResult, on_delete=models.SET_NULL, null=True, blank=True, related_name="changes"
    )
    invariant_id = models.CharField(max_length=INVARIANT_ID_MAX)
    review_item = models.ForeignKey(
        ReviewItem, on_delete=models.SET_NULL, null=True, blank=True, related_name="changes"
    )
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [
            models.Index(fields=["run", "created"], name="resultchange_run_idx"),
            models.Index(fields=["execution", "created"], name="resultchange_execution_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.invariant_id} changed by {self.changed_by} at {self.created:%Y-%m-%d %H:%M}"


# --- Alerts: rules, channels, firings ---------------------------------------------------


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook", "Webhook (signed JSON)"
    SLACK = "slack", "Slack incoming webhook"
    EMAIL = "email", "Email"


# Sizes of the alert columns people type into (services.alerts checks them).
ALERT_NAME_MAX = 100
ALERT_TARGET_MAX = 1000


class AlertChannel(models.Model):
    """Where a project's alerts go. `target` is a URL (webhook, Slack) or a comma-separated
    list of addresses (email). A webhook's signing secret is kept encrypted with a key
    derived from SECRET_KEY (the signature needs the secret itself, so no hash will do)."""

    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="alert_channels", db_index=False
    )
    name = models.CharField(max_length=ALERT_NAME_MAX)
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    target = models.CharField(max_length=ALERT_TARGET_MAX)
    secret_encrypted = models.TextField(blank=True, default="", editable=False)
    # Whether the weekly digest goes here too (rules choose their channels themselves).
    digest = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="alertchannel_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class AlertWindow(models.TextChoices):
    LAST_RUN = "last_run", "Last run"
    LAST_5_RUNS = "last_5_runs", "Last 5 runs"
    LAST_24H = "last_24h", "Last 24 hours"
    LAST_7D = "last_7d", "Last 7 days"


class AlertRule(models.Model):
    """`condition` ("pass_rate < 0.9", "any_regression") over `window`, on the completed
    runs of the project whose spec and branch are in scope (an empty list: every one)."""

    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="alert_rules", db_index=False
    )
    name = models.CharField(max_length=ALERT_NAME_MAX)
    condition = models.CharField(max_length=200)
    window = models.CharField(
        max_length=16, choices=AlertWindow.choices, default=AlertWindow.LAST_RUN
    )
    specs = models.JSONField(default=list, blank=True)
    branches = models.JSONField(default=list, blank=True)
    channels = models.ManyToManyField(AlertChannel, related_name="rules", blank=True)
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="alertrule_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.name}: {self.condition} over {self.window}"


class AlertEvaluation(models.Model):
    """That a finalised run's rules were evaluated: the sweep evaluates a completed run that
    has none (its message was lost while the broker was away)."""

    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, primary_key=True, related_name="alert_evaluation"
    )
    created = models.DateTimeField(default=timezone.now, editable=False)

    def __str__(self) -> str:
        return f"alerts evaluated for run {self.run_id}"


class FiringStatus(models.TextChoices):
    PENDING = "pending"
    SENDING = "sending"
    DELIVERED = "delivered"
    FAILED = "failed"


class AlertFiring(models.Model):
    """One rule firing for one run, to one channel. Unique per (rule, run, channel), so a
    run finalised twice (a rescore after a review) never notifies twice."""

    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="alert_firings", db_index=False
    )
    rule = models.ForeignKey(
        AlertRule, on_delete=models.CASCADE, related_name="firings", db_index=False
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="alert_firings")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="firings")
    value = models.FloatField(null=True, blank=True)
    message = models.TextField(blank=True, default="")
    idempotency_key = models.CharField(max_length=64, unique=True, editable=False)
    status = models.CharField(
        max_length=16, choices=FiringStatus.choices, default=FiringStatus.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created = models.DateTimeField(default=timezone.now, editable=False)
    # When a worker claimed it: a firing `sending` for too long lost its worker.
    sending_since = models.DateTimeField(null=True, blank=True)
    delivered = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "run", "channel"], name="alertfiring_once_per_run"
            )
        ]
        indexes = [models.Index(fields=["project", "created"], name="alertfiring_project_idx")]

    def __str__(self) -> str:
        return f"{self.rule_id} on run {self.run_id} -> {self.channel_id}: {self.status}"


class Digest(models.Model):
    """A project's weekly digest for the week ending at `period_end`, written once (the
    unique constraint: beat and the embedded worker may both find it due) with what each
    channel answered: {channel name: {status, attempts, error}}."""

    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="digests", db_index=False
    )
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    markdown = models.TextField()
    deliveries = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-period_end"]
        constraints = [
            models.UniqueConstraint(fields=["project", "period_end"], name="digest_once_per_period")
        ]

    def __str__(self) -> str:
        return f"digest of {self.project_id} to {self.period_end:%Y-%m-%d}"
