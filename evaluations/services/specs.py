"""Spec uploads: validated text stored as immutable, numbered versions."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from checks.spec import SpecError, SpecValidationError, validate_spec_text
from checks.spec.semantics import too_long
from evaluations import policy
from evaluations.models import (
    SPEC_BASE_DIR_MAX,
    Project,
    Spec,
    SpecVersion,
    sha256_hex,
)


class SpecVersionConflict(ValueError):
    """The text was edited from a version that is no longer the latest: saving it would
    replace the newer version's changes without its editor having seen them."""

    def __init__(self, latest: SpecVersion, based_on: int) -> None:
        by = f" by {latest.author.get_username()}" if latest.author else ""
        super().__init__(
            f"version {latest.number} of {latest.spec.slug} was saved{by} after you opened "
            f"version {based_on}: saving your text would undo its changes. Compare "
            f"v{based_on} with v{latest.number}, then save again to keep your text as it is."
        )
        self.latest = latest
        self.based_on = based_on


def spec_version_create(
    *,
    project: Project,
    source_yaml: str,
    author: Any = None,
    source_name: str = "spec.yaml",
    base_dir: str = "",
    read_from_files: bool = False,
    based_on: int | None = None,
) -> SpecVersion:
    """Validate and store a spec's text. The same text again returns the existing version;
    a changed text under the same `id` becomes version N+1. Invalid text is never stored.
    `based_on`: the version number the text was edited from (the editor page); when a
    newer one was saved meanwhile, SpecVersionConflict, and nothing is stored."""
    problem = too_long(base_dir, SPEC_BASE_DIR_MAX)
    if problem:
        # Checked here, not by the database: PostgreSQL refused it in the middle of the write
        # (a 500, or a traceback from `keystone run`), SQLite stored it whole.
        raise SpecValidationError(
            [
                SpecError(
                    "base_dir",
                    f"the directory the spec was read from is too long to store: {problem}",
                    None,
                    None,
                )
            ],
            source_name,
        )
    data, errors = validate_spec_text(source_yaml, source=source_name)
    if errors or data is None:
        raise SpecValidationError(errors, source_name)
    refused = policy.spec_refusals(data)
    if refused:
        # Valid, but more than this server allows: never stored, the setting named.
        raise SpecValidationError(
            [
                SpecError(path, f"refused by the server's policy: {why}", None, None)
                for path, why in refused
            ],
            source_name,
        )
    content_hash = sha256_hex(source_yaml)
    with transaction.atomic():
        spec, _ = Spec.objects.get_or_create(
            project=project, slug=data["id"], defaults={"name": data.get("description", "")[:200]}
        )
        # Lock the spec row so two uploads cannot take the same version number.
        Spec.objects.select_for_update().filter(pk=spec.pk).first()
        existing = spec.versions.filter(content_hash=content_hash).order_by("-number").first()
        latest = spec.latest_version()
        if existing is not None and latest is not None and existing.pk == latest.pk:
            return existing
        # Checked under the spec's lock: of two people saving edits of one version, the
        # second is told, whichever order their requests reach the database in.
        if based_on is not None and latest is not None and latest.number != based_on:
            raise SpecVersionConflict(latest, based_on)
        number = (latest.number if latest else 0) + 1
        return SpecVersion.objects.create(
            spec=spec,
            number=number,
            source_yaml=source_yaml,
            parsed=data,
            author=author,
            base_dir=base_dir,
            read_from_files=read_from_files,
        )
