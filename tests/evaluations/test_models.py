"""The tables hold their own invariants: constraints enforced by the database, immutable
spec versions, roles, hashed tokens, and the indexes the dashboard lists depend on.
Marked `embedded`: tests/run.sh runs them on PostgreSQL and again on SQLite."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.files.base import ContentFile
from django.db import IntegrityError, connection, transaction

from checks.results import CheckResult as EngineCheckResult
from checks.results import FailureCode
from evaluations.models import (
    ApiToken,
    Artifact,
    ArtifactKind,
    Baseline,
    CheckResult,
    Execution,
    ImmutableRowError,
    Membership,
    Project,
    ResultSource,
    Role,
    Run,
    Spec,
    SpecVersion,
)

pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def test_database_backend_follows_database_url() -> None:
    expected = "postgresql" if os.environ.get("DATABASE_URL") else "sqlite"
    assert connection.vendor == expected


# --- Constraints ------------------------------------------------------------------------


def _result(execution: Execution, *, source: str = ResultSource.ENGINE) -> CheckResult:
    return CheckResult(
        execution=execution,
        run=execution.run,
        invariant_id="says_refunded",
        check_type="contains",
        score=1.0,
        passed=True,
        source=source,
    )


def test_duplicate_check_result_for_same_execution_invariant_and_source_is_refused(
    execution: Execution,
) -> None:
    _result(execution).save()
    with pytest.raises(IntegrityError), transaction.atomic():
        _result(execution).save()
    assert CheckResult.objects.filter(execution=execution).count() == 1


def test_engine_and_human_results_for_one_invariant_coexist(execution: Execution) -> None:
    _result(execution, source=ResultSource.ENGINE).save()
    _result(execution, source=ResultSource.HUMAN).save()
    assert CheckResult.objects.filter(execution=execution).count() == 2


def test_duplicate_execution_cell_in_one_run_is_refused(run: Run) -> None:
    Execution.objects.create(run=run, scenario="no-chaos", prompt_index=0, replica=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        Execution.objects.create(run=run, scenario="no-chaos", prompt_index=0, replica=0)
    assert run.executions.count() == 1


def test_execution_without_invariant_is_still_unique_despite_null(run: Run) -> None:
    # NULLs are distinct in a plain unique index; the folded key must still catch this.
    Execution.objects.create(run=run, scenario="s", prompt_index=1, replica=2, invariant_id=None)
    with pytest.raises(IntegrityError), transaction.atomic():
        Execution.objects.create(
            run=run, scenario="s", prompt_index=1, replica=2, invariant_id=None
        )


def test_per_invariant_cells_and_replicas_are_distinct_executions(run: Run) -> None:
    Execution.objects.create(run=run, scenario="s", prompt_index=0, replica=0)
    Execution.objects.create(run=run, scenario="s", prompt_index=0, replica=1)
    Execution.objects.create(run=run, scenario="s", prompt_index=0, replica=0, invariant_id="a")
    Execution.objects.create(run=run, scenario="s", prompt_index=0, replica=0, invariant_id="b")
    Execution.objects.create(
        run=run, scenario="s", prompt_index=0, replica=0, pillar="mutation", mutation_type="noise"
    )
    assert run.executions.values("key").distinct().count() == 5


def test_same_cell_may_exist_in_two_runs(run: Run, spec_version: SpecVersion) -> None:
    second = Run.objects.create(project=run.project, spec_version=spec_version)
    Execution.objects.create(run=run, scenario="s", prompt_index=0, replica=0)
    Execution.objects.create(run=second, scenario="s", prompt_index=0, replica=0)
    assert Execution.objects.count() == 2


def test_execution_and_run_fill_their_denormalised_columns(execution: Execution) -> None:
    assert execution.project_id == execution.run.project_id
    assert execution.run.spec_id == execution.run.spec_version.spec_id
    assert execution.key == "contract|no-chaos|0|0||"


def test_second_active_baseline_for_a_spec_is_refused(run: Run) -> None:
    spec = run.spec
    Baseline.objects.create(project=run.project, spec=spec, run=run, name="v1", active=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        Baseline.objects.create(project=run.project, spec=spec, run=run, name="v2", active=True)
    # Inactive baselines are history: any number of them may exist.
    Baseline.objects.create(project=run.project, spec=spec, run=run, name="old1")
    Baseline.objects.create(project=run.project, spec=spec, run=run, name="old2")
    assert Baseline.objects.filter(spec=spec, active=True).count() == 1
    assert Baseline.objects.filter(spec=spec).count() == 3


def test_active_baselines_of_different_specs_do_not_conflict(run: Run) -> None:
    other = Spec.objects.create(project=run.project, slug="other-agent")
    Baseline.objects.create(project=run.project, spec=run.spec, name="a", active=True)
    Baseline.objects.create(project=run.project, spec=other, name="b", active=True)
    assert Baseline.objects.filter(active=True).count() == 2


def test_spec_slug_is_unique_per_project_only(project: Project) -> None:
    Spec.objects.create(project=project, slug="agent")
    elsewhere = Project.objects.create(name="Other", slug="other")
    Spec.objects.create(project=elsewhere, slug="agent")
    with pytest.raises(IntegrityError), transaction.atomic():
        Spec.objects.create(project=project, slug="agent")


def test_artifact_name_is_unique_per_execution_and_kind(execution: Execution) -> None:
    Artifact.objects.create(execution=execution, kind=ArtifactKind.STDOUT, file="x")
    Artifact.objects.create(execution=execution, kind=ArtifactKind.STDERR, file="y")
    with pytest.raises(IntegrityError), transaction.atomic():
        Artifact.objects.create(execution=execution, kind=ArtifactKind.STDOUT, file="z")


def test_artifact_blob_lives_in_storage_not_in_the_row(execution: Execution, settings: Any) -> None:
    payload = b"agent said: refunded\n" * 100
    artifact = Artifact(execution=execution, kind=ArtifactKind.STDOUT, size=len(payload))
    artifact.file.save("stdout.txt", ContentFile(payload), save=True)
    artifact.refresh_from_db()
    on_disk = settings.KEYSTONE_ARTIFACT_ROOT / artifact.file.name
    assert on_disk.read_bytes() == payload
    # Straight in the execution's directory: no directory per kind (one mkdir fewer a file).
    assert artifact.file.name == f"runs/{execution.run_id}/executions/{execution.pk}/stdout.txt"
    assert len(artifact.file.name) < 200


def test_a_file_the_agent_named_gets_a_directory_of_its_own(execution: Execution) -> None:
    """It can never take the name of one of Keystone's own blobs (stdout.txt, ...)."""
    artifact = Artifact(execution=execution, kind=ArtifactKind.FILE, name="out/stdout.txt")
    artifact.file.save("stdout.txt", ContentFile(b"mine"), save=True)
    folder = f"runs/{execution.run_id}/executions/{execution.pk}"
    assert artifact.file.name == f"{folder}/files/stdout.txt"


# --- Spec versions ----------------------------------------------------------------------


def test_spec_version_hashes_its_source(spec_version: SpecVersion) -> None:
    expected = hashlib.sha256(spec_version.source_yaml.encode()).hexdigest()
    assert spec_version.content_hash == expected


def test_saving_an_existing_spec_version_raises_and_changes_nothing(
    spec_version: SpecVersion,
) -> None:
    original = spec_version.source_yaml
    spec_version.source_yaml = "version: 1\nid: tampered\n"
    with pytest.raises(ImmutableRowError):
        spec_version.save()
    assert SpecVersion.objects.get(pk=spec_version.pk).source_yaml == original


def test_queryset_update_of_spec_versions_is_refused(spec_version: SpecVersion) -> None:
    with pytest.raises(ImmutableRowError):
        SpecVersion.objects.filter(pk=spec_version.pk).update(source_yaml="changed")
    assert SpecVersion.objects.get(pk=spec_version.pk).source_yaml == spec_version.source_yaml


def test_version_number_is_unique_per_spec(spec_version: SpecVersion) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        SpecVersion.objects.create(spec=spec_version.spec, number=1, source_yaml="other")
    SpecVersion.objects.create(spec=spec_version.spec, number=2, source_yaml="other")
    assert spec_version.spec.latest_version().number == 2


# --- Roles ------------------------------------------------------------------------------


def test_user_without_membership_has_no_role(project: Project, user: Any) -> None:
    assert project.role_of(user) is None
    assert not project.has_role(user, Role.VIEWER)


def test_roles_are_ordered_viewer_reviewer_editor_admin(project: Project, user: Any) -> None:
    Membership.objects.create(project=project, user=user, role=Role.REVIEWER)
    assert project.role_of(user) == Role.REVIEWER
    assert project.has_role(user, Role.VIEWER)
    assert project.has_role(user, "reviewer")
    assert not project.has_role(user, Role.EDITOR)
    assert not project.has_role(user, Role.ADMIN)


def test_membership_in_one_project_gives_nothing_in_another(project: Project, user: Any) -> None:
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    other = Project.objects.create(name="Other", slug="other")
    assert other.role_of(user) is None


def test_one_membership_per_user_and_project(project: Project, user: Any) -> None:
    Membership.objects.create(project=project, user=user, role=Role.VIEWER)
    with pytest.raises(IntegrityError), transaction.atomic():
        Membership.objects.create(project=project, user=user, role=Role.ADMIN)


def test_superuser_is_admin_and_anonymous_or_inactive_users_have_no_role(
    project: Project, user: Any, django_user_model: Any
) -> None:
    root = django_user_model.objects.create_superuser(username="root", password="pw-root-123")
    assert project.role_of(root) == Role.ADMIN
    assert project.role_of(AnonymousUser()) is None
    assert project.role_of(None) is None
    Membership.objects.create(project=project, user=user, role=Role.EDITOR)
    user.is_active = False
    user.save()
    assert not project.has_role(user, Role.VIEWER)


def test_unknown_minimum_role_is_an_error(project: Project, user: Any) -> None:
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    with pytest.raises(ValueError):
        project.has_role(user, "owner")


# --- API tokens -------------------------------------------------------------------------


def test_raw_token_is_never_stored(project: Project, user: Any) -> None:
    token, raw = ApiToken.issue(project=project, user=user, name="ci")
    row = ApiToken.objects.filter(pk=token.pk).values().get()
    assert all(raw not in str(value) for value in row.values())
    assert row["token_hash"] == hashlib.sha256(raw.encode()).hexdigest()
    assert raw.startswith(row["prefix"]) and len(row["prefix"]) < len(raw) // 3


def test_issued_tokens_are_distinct_and_found_by_raw_value(project: Project, user: Any) -> None:
    first, first_raw = ApiToken.issue(project=project, user=user, name="a")
    second, second_raw = ApiToken.issue(project=project, user=user, name="b")
    assert first_raw != second_raw
    assert ApiToken.find_active(first_raw) == first
    assert ApiToken.find_active(second_raw) == second
    assert ApiToken.find_active(first_raw + "x") is None


def test_revoked_token_or_inactive_owner_no_longer_authenticates(
    project: Project, user: Any
) -> None:
    token, raw = ApiToken.issue(project=project, user=user, name="ci")
    token.revoked = True
    token.save()
    assert ApiToken.find_active(raw) is None
    other, other_raw = ApiToken.issue(project=project, user=user, name="ci2")
    user.is_active = False
    user.save()
    assert ApiToken.find_active(other_raw) is None


# --- Results round trip -----------------------------------------------------------------


def test_engine_result_survives_a_round_trip_through_the_table(execution: Execution) -> None:
    engine = EngineCheckResult(
        invariant_id="no_pii",
        check_type="excludes_pii",
        passed=False,
        score=0.0,
        failure_code=FailureCode.PII_DETECTED,
        message="email found",
        details={"matches": ["[REDACTED:email]"]},
        severity="critical",
        weight=2.0,
        gate=True,
        dimensions=["safety"],
        source="engine",
    )
    CheckResult.from_engine(engine, execution=execution).save()
    stored = CheckResult.objects.get(execution=execution, invariant_id="no_pii")
    assert stored.run_id == execution.run_id
    assert stored.to_engine() == engine


# --- Indexes for the dashboard ----------------------------------------------------------


def _index_columns(model: Any) -> list[list[str]]:
    """The columns of each index of the model's table, unique constraints' included (a
    lookup by the columns a unique constraint begins with is answered by its index)."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, model._meta.db_table)
    return [info["columns"] for info in found.values() if info["index"] or info["unique"]]


@pytest.mark.parametrize("model", [Run, Execution])
def test_keyset_pagination_index_exists_in_the_database(model: Any) -> None:
    assert ["project_id", "created", "id"] in _index_columns(model)


def test_result_lookup_indexes_exist_in_the_database() -> None:
    columns = _index_columns(CheckResult)
    assert ["run_id", "invariant_id"] in columns
    assert any(cols[0] == "execution_id" for cols in columns)


def test_keyset_page_of_runs_uses_created_then_id(run: Run, spec_version: SpecVersion) -> None:
    # Same timestamp for all rows: id must break the tie so no row is skipped or repeated.
    for _ in range(4):
        Run.objects.create(project=run.project, spec_version=spec_version, created=run.created)
    ordered = list(Run.objects.filter(project=run.project).order_by("-created", "-id"))
    last = ordered[1]
    page = Run.objects.filter(project=run.project, created=last.created, id__lt=last.id) | (
        Run.objects.filter(project=run.project, created__lt=last.created)
    )
    assert list(page.order_by("-created", "-id")) == ordered[2:]


def test_very_long_cell_names_still_give_distinct_keys_that_fit(run: Run) -> None:
    long_scenario = "s" * 200
    first = Execution.objects.create(
        run=run, scenario=long_scenario, prompt_index=0, replica=0, invariant_id="a" * 200
    )
    second = Execution.objects.create(
        run=run, scenario=long_scenario, prompt_index=0, replica=0, invariant_id="a" * 199 + "b"
    )
    assert first.key != second.key
    assert max(len(first.key), len(second.key)) <= Execution._meta.get_field("key").max_length


def test_no_index_begins_with_another_indexs_columns() -> None:
    """An index whose columns begin another index or unique constraint of the same table
    finds nothing the longer one does not, and costs a write per row: a foreign key's own
    index goes where its column leads another (models.py). Read from the database as
    migrated, so the migration's drops are checked too. Partial indexes cover only their
    rows, and PostgreSQL's `_like` twins (Django's varchar_pattern_ops index for LIKE
    'prefix%' on a text column) answer what the plain one does not: neither kind counts."""
    from django.apps import apps

    problems = []
    with connection.cursor() as cursor:
        for model in apps.get_app_config("evaluations").get_models():
            partial = {index.name for index in model._meta.indexes if index.condition}
            partial |= {c.name for c in model._meta.constraints if getattr(c, "condition", None)}
            found = connection.introspection.get_constraints(cursor, model._meta.db_table)
            indexes = {
                name: tuple(info["columns"])
                for name, info in found.items()
                if (info["index"] or info["unique"] or info["primary_key"])
                and info["columns"]
                and name not in partial
                and not name.endswith("_like")
            }
            for name, columns in indexes.items():
                info = found[name]
                if info["unique"] or info["primary_key"]:
                    continue
                covering = [
                    other
                    for other, longer in indexes.items()
                    if other != name and longer[: len(columns)] == columns
                ]
                if covering:
                    problems.append(f"{model._meta.db_table}.{name} {columns}: {covering}")
    assert not problems, "indexes that another begins with the same columns:\n" + "\n".join(
        problems
    )
