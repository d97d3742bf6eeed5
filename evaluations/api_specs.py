"""Specs through the API: validate a text without saving it, list the project's specs, a
spec's versions, one version's source and parsed form, and the diff of two versions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import Http404, HttpRequest
from ninja import Field, Query, Schema

from checks.spec import validate_spec_text
from evaluations import policy, selectors
from evaluations.access import spec_in
from evaluations.api import ApiInputError, RowId, _caller, router
from evaluations.models import Role, SpecVersion
from evaluations.views.specs import unified_diff


class SpecTextIn(Schema):
    source_yaml: str


class SpecErrorOut(Schema):
    message: str
    path: str
    line: int | None
    column: int | None


class SpecValidationOut(Schema):
    valid: bool
    spec: str | None  # the text's `id` when it has one
    errors: list[SpecErrorOut]


@router.post(
    "/projects/{slug}/specs/validate", response=SpecValidationOut, url_name="spec_validate"
)
def spec_validate(request: HttpRequest, slug: str, payload: SpecTextIn) -> SpecValidationOut:
    """Check a spec's text as an upload would (schema, semantics and this server's policy)
    and store nothing: every error with its YAML path, line and column."""
    _caller(request, slug, Role.VIEWER)
    data, errors = validate_spec_text(payload.source_yaml.replace("\r\n", "\n"))
    found = [
        SpecErrorOut(message=e.message, path=e.path, line=e.line, column=e.column) for e in errors
    ]
    if data is not None and not errors:
        found = [
            SpecErrorOut(
                message=f"refused by the server's policy: {why}", path=path, line=None, column=None
            )
            for path, why in policy.spec_refusals(data)
        ]
    spec_id = data.get("id") if isinstance(data, dict) else None
    return SpecValidationOut(
        valid=not found, spec=spec_id if isinstance(spec_id, str) else None, errors=found
    )


class SpecOut(Schema):
    slug: str
    name: str
    latest_version: int | None
    last_run_id: int | None
    last_run_status: str | None


@router.get("/projects/{slug}/specs", response=list[SpecOut], url_name="spec_list")
def spec_list(request: HttpRequest, slug: str) -> list[SpecOut]:
    """The project's specs by slug, each with its latest version and its last run."""
    caller = _caller(request, slug, Role.VIEWER)
    return [
        SpecOut(
            slug=row.spec.slug,
            name=row.spec.name,
            latest_version=row.latest_number,
            last_run_id=row.last_run.pk if row.last_run else None,
            last_run_status=row.last_run.status if row.last_run else None,
        )
        for row in selectors.spec_rows(caller.project)
    ]


class SpecVersionOut(Schema):
    number: int
    created: datetime
    content_hash: str
    author: str | None


@router.get(
    "/projects/{slug}/specs/{spec_slug}/versions",
    response=list[SpecVersionOut],
    url_name="spec_versions",
)
def spec_versions(request: HttpRequest, slug: str, spec_slug: str) -> list[SpecVersionOut]:
    """The spec's versions, newest first (no text)."""
    caller = _caller(request, slug, Role.VIEWER)
    spec = spec_in(caller.project, spec_slug)
    return [
        SpecVersionOut(
            number=row["number"],
            created=row["created"],
            content_hash=row["content_hash"],
            author=row["author__username"],
        )
        for row in selectors.spec_versions(spec)
    ]


class SpecVersionDetailOut(SpecVersionOut):
    spec: str
    source_yaml: str
    parsed: dict[str, Any]


@router.get(
    "/projects/{slug}/specs/{spec_slug}/versions/{number}",
    response=SpecVersionDetailOut,
    url_name="spec_version",
)
def spec_version(
    request: HttpRequest, slug: str, spec_slug: str, number: RowId
) -> SpecVersionDetailOut:
    """One version: its YAML as uploaded and its parsed form (what runs are planned from)."""
    caller = _caller(request, slug, Role.VIEWER)
    version = (
        SpecVersion.objects.filter(
            spec__project=caller.project, spec__slug=spec_slug, number=number
        )
        .select_related("author")
        .first()
    )
    if version is None:
        raise Http404(f"No version {number} of spec {spec_slug} in this project.")
    return SpecVersionDetailOut(
        spec=spec_slug,
        number=version.number,
        created=version.created,
        content_hash=version.content_hash,
        author=version.author.get_username() if version.author else None,
        source_yaml=version.source_yaml,
        parsed=version.parsed,
    )


class SpecDiffQuery(Schema):
    a: RowId = Field(description="the older version")
    b: RowId = Field(description="the newer version")


class SpecDiffOut(Schema):
    a: int
    b: int
    diff: str  # unified diff, empty when the texts are equal


@router.get("/projects/{slug}/specs/{spec_slug}/diff", response=SpecDiffOut, url_name="spec_diff")
def spec_diff(
    request: HttpRequest, slug: str, spec_slug: str, query: Query[SpecDiffQuery]
) -> SpecDiffOut:
    """The unified diff of version `a` against version `b`."""
    caller = _caller(request, slug, Role.VIEWER)
    spec = spec_in(caller.project, spec_slug)
    texts = selectors.spec_version_texts(spec, [query.a, query.b])
    for name, number in (("a", query.a), ("b", query.b)):
        if number not in texts:
            raise ApiInputError(name, f"{spec.slug} has no version {number}")
    lines = unified_diff(
        texts[query.a], texts[query.b], old_name=f"v{query.a}", new_name=f"v{query.b}"
    )
    return SpecDiffOut(a=query.a, b=query.b, diff="\n".join(line.text for line in lines))
