"""Spec uploads: validated text stored as immutable, numbered versions."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from checks.spec import SpecError, SpecValidationError, validate_spec_text
from evaluations import policy
from evaluations.models import (
    Project,
    Spec,
    SpecVersion,
    sha256_hex,
)


def spec_version_create(
    *,
    project: Project,
    source_yaml: str,
    author: Any = None,
    source_name: str = "spec.yaml",
    base_dir: str = "",
    read_from_files: bool = False,
) -> SpecVersion:
    """Validate and store a spec's text. The same text again returns the existing version;
    a changed text under the same `id` becomes version N+1. Invalid text is never stored."""
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
