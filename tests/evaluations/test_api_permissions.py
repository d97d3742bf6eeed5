"""Issue 16, item 4: the permission matrix. Every route the API's URL resolver knows is
listed here with the role and token scope it needs; a route that is not listed fails
`test_every_route_is_in_the_matrix`, and each listed route is checked against every kind of
caller: nobody (401), a token or person of another project (404), a member one role too low
(403), a token without the route's scope (403), and a token with just that role and scope
(allowed). A new route without a permission check therefore fails this file."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.test import Client
from django.urls import URLPattern

from evaluations import services
from evaluations.models import (
    AlertFiring,
    ApiToken,
    Artifact,
    ChannelKind,
    FiringStatus,
    Membership,
    Project,
    ReviewItem,
    Role,
    TokenScope,
)
from keystone_web.api import api
from tests.evaluations.review_world import add_execution, add_judge, make_run, spec_source

pytestmark = pytest.mark.django_db

ROLES = [Role.VIEWER, Role.REVIEWER, Role.EDITOR, Role.ADMIN]
SCOPE = {
    Role.VIEWER: TokenScope.READ,
    Role.REVIEWER: TokenScope.REVIEW,
    Role.EDITOR: TokenScope.RUN,
    Role.ADMIN: TokenScope.ADMIN,
}
PUBLIC = "public"
PERSONAL = "personal"  # the caller's own personal tokens: a signed-in person or admin scope


@dataclass(frozen=True)
class Rule:
    needs: Role | str
    body: dict[str, Any] | None = None
    query: dict[str, Any] = field(default_factory=dict)
    allowed: tuple[int, ...] = (200,)


P = "/api/projects/{slug}"
RULES: dict[tuple[str, str], Rule] = {
    ("get", "/api/health"): Rule(PUBLIC),
    # specs
    ("get", f"{P}/specs"): Rule(Role.VIEWER),
    ("post", f"{P}/specs"): Rule(
        Role.EDITOR, {"source_yaml": spec_source(spec_id="uploaded")}, allowed=(201,)
    ),
    ("post", f"{P}/specs/validate"): Rule(Role.VIEWER, {"source_yaml": spec_source()}),
    ("get", f"{P}/specs/{{spec_slug}}/versions"): Rule(Role.VIEWER),
    ("get", f"{P}/specs/{{spec_slug}}/versions/{{number}}"): Rule(Role.VIEWER),
    ("get", f"{P}/specs/{{spec_slug}}/diff"): Rule(Role.VIEWER, query={"a": 1, "b": 1}),
    ("post", f"{P}/specs/{{spec_slug}}/runs"): Rule(Role.EDITOR, {}, allowed=(202,)),
    # runs and executions
    ("get", f"{P}/runs"): Rule(Role.VIEWER),
    ("post", f"{P}/runs"): Rule(Role.EDITOR, {"source_yaml": spec_source()}, allowed=(202,)),
    ("get", f"{P}/runs/{{run_id}}"): Rule(Role.VIEWER),
    ("get", f"{P}/runs/{{run_id}}/report"): Rule(Role.VIEWER),
    ("post", f"{P}/runs/{{run_id}}/cancel"): Rule(Role.EDITOR, {}, allowed=(202,)),
    ("post", f"{P}/runs/{{run_id}}/rerun-failed"): Rule(Role.EDITOR, {}, allowed=(202, 409)),
    ("get", f"{P}/runs/{{run_id}}/events"): Rule(Role.VIEWER, query={"timeout": 0}),
    ("get", f"{P}/runs/{{run_id}}/executions"): Rule(Role.VIEWER),
    ("get", f"{P}/runs/{{run_id}}/compare"): Rule(Role.VIEWER, query={"against": "{run_id}"}),
    ("get", f"{P}/executions/{{execution_id}}"): Rule(Role.VIEWER),
    ("get", f"{P}/executions/{{execution_id}}/artifacts/{{artifact_id}}"): Rule(Role.VIEWER),
    ("get", f"{P}/regressions"): Rule(Role.VIEWER),
    # baselines (422: the matrix's run and spec have nothing to promote or roll back, which
    # is answered only once the caller got past the role and scope checks)
    ("post", f"{P}/runs/{{run_id}}/baseline"): Rule(Role.EDITOR, {}, allowed=(201, 422)),
    ("get", f"{P}/specs/{{spec_slug}}/baselines"): Rule(Role.VIEWER),
    ("post", f"{P}/specs/{{spec_slug}}/baselines/rollback"): Rule(
        Role.EDITOR, {"branch": "main"}, allowed=(200, 422)
    ),
    # alert rules
    ("get", f"{P}/alert-rules"): Rule(Role.VIEWER),
    ("post", f"{P}/alert-rules"): Rule(
        Role.ADMIN, {"name": "r2", "condition": "pass_rate < 1"}, allowed=(201,)
    ),
    ("delete", f"{P}/alert-rules/{{rule_id}}"): Rule(Role.ADMIN, allowed=(204,)),
    ("get", f"{P}/alert-firings"): Rule(Role.VIEWER),
    ("post", f"{P}/alert-firings/{{firing_id}}/resend"): Rule(Role.ADMIN, {}, allowed=(202,)),
    # reviews
    ("get", f"{P}/reviews"): Rule(Role.VIEWER),
    ("get", f"{P}/reviews/{{item_id}}"): Rule(Role.VIEWER),
    ("post", f"{P}/reviews/next"): Rule(Role.REVIEWER, {}),
    ("post", f"{P}/reviews/{{item_id}}/claim"): Rule(Role.REVIEWER, {}),
    ("post", f"{P}/reviews/{{item_id}}/release"): Rule(Role.REVIEWER, {}, allowed=(204,)),
    ("post", f"{P}/reviews/{{item_id}}/verdict"): Rule(
        Role.REVIEWER, {"passed": True}, allowed=(201,)
    ),
    # tokens
    ("get", f"{P}/tokens"): Rule(Role.ADMIN),
    # (a token grants no scope it lacks: the one with just `admin` mints an `admin` token)
    ("post", f"{P}/tokens"): Rule(Role.ADMIN, {"name": "ci", "scopes": ["admin"]}, allowed=(201,)),
    ("delete", f"{P}/tokens/{{token_id}}"): Rule(Role.ADMIN, allowed=(204,)),
    ("get", "/api/tokens"): Rule(PERSONAL),
    ("post", "/api/tokens"): Rule(
        PERSONAL, {"name": "laptop", "scopes": ["admin"]}, allowed=(201,)
    ),
    ("delete", "/api/tokens/{token_id}"): Rule(PERSONAL, allowed=(204,)),
}
# Pages of ninja's, not routes of ours: the schema, its viewer, and the root's redirect.
NOT_ROUTES = {"/api/openapi.json", "/api/docs", "/api/"}


def _schema_routes() -> set[tuple[str, str]]:
    schema = api.get_openapi_schema()
    return {(method, path) for path, ops in schema["paths"].items() for method in ops}


def _resolver_paths() -> set[str]:
    """Every URL pattern under /api/, as `{name}` paths like the schema's."""
    patterns = api.urls[0]
    paths = set()
    for pattern in patterns:
        assert isinstance(pattern, URLPattern)
        route = str(pattern.pattern)
        paths.add("/api/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))
    return paths


def test_every_route_is_in_the_matrix() -> None:
    routes = _schema_routes()
    missing = sorted(routes - set(RULES))
    assert not missing, f"routes without a permission rule in this matrix: {missing}"
    stale = sorted(set(RULES) - routes)
    assert not stale, f"rules for routes that no longer exist: {stale}"
    # The resolver knows no route that the schema hides.
    hidden = _resolver_paths() - {path for _, path in routes} - NOT_ROUTES
    assert not hidden, f"URL patterns missing from the OpenAPI schema: {sorted(hidden)}"


@dataclass
class World:
    mine: Project
    other: Project
    ids: dict[str, Any]
    people: dict[Role, Any]
    stranger: Any  # admin of the other project only


@pytest.fixture
def world(django_user_model: Any) -> World:
    mine = Project.objects.create(name="Mine", slug="mine")
    other = Project.objects.create(name="Other", slug="other")
    people = {}
    for role in ROLES:
        person = django_user_model.objects.create_user(username=f"p-{role}", password="pw-1234567")
        Membership.objects.create(project=mine, user=person, role=role)
        people[role] = person
    stranger = django_user_model.objects.create_user(username="stranger", password="pw-1234567")
    Membership.objects.create(project=other, user=stranger, role=Role.ADMIN)

    run = make_run(mine, review={"all": True})
    execution = add_execution(run, 0)
    add_judge(execution, score=0.9)
    (item,) = services.review_items_select(run_id=run.pk)
    artifact = Artifact(execution=execution, kind="stdout", name="stdout.txt", size=5)
    artifact.file.save("stdout.txt", ContentFile(b"hello"), save=False)
    artifact.save()
    channel = services.alert_channel_create(
        project=mine, name="ops", kind=ChannelKind.EMAIL, target="ops@example.com"
    )
    rule = services.alert_rule_create(
        project=mine, name="r", condition="pass_rate < 1", channel_ids=[channel.pk]
    )
    firing = AlertFiring.objects.create(
        project=mine,
        rule=rule,
        run=run,
        channel=channel,
        idempotency_key="matrix",
        status=FiringStatus.FAILED,
    )
    victim, _ = services.token_issue(project=mine, user=people[Role.ADMIN], name="victim")
    ids = {
        "slug": "mine",
        "spec_slug": run.spec.slug,
        "number": run.spec_version.number,
        "run_id": run.pk,
        "execution_id": execution.pk,
        "artifact_id": artifact.pk,
        "item_id": item.pk,
        "rule_id": rule.pk,
        "firing_id": firing.pk,
        "token_id": victim.pk,
    }
    return World(mine, other, ids, people, stranger)


def _call(rule: Rule, method: str, url: str, raw: str | None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"} if raw else {}
    client = Client()
    if method == "get":
        return client.get(url, rule.query, **headers)
    body = json.dumps(rule.body) if rule.body is not None else ""
    return getattr(client, method)(url, body, content_type="application/json", **headers)


def _token(project: Project | None, user: Any, scopes: list[str]) -> str:
    if project is None:
        return services.personal_token_issue(user=user, name="t", scopes=scopes)[1]
    return services.token_issue(project=project, user=user, name="t", scopes=scopes)[1]


ALL = list(TokenScope.values)


def _refused(response: Any, status: int, what: str) -> None:
    assert response.status_code == status, f"{what}: {response.status_code} {response.content!r}"
    assert "error" in response.json(), what


@pytest.mark.parametrize(("method", "path"), sorted(RULES), ids=lambda v: str(v))
def test_route_checks_role_scope_and_project(method: str, path: str, world: World) -> None:
    rule = RULES[(method, path)]
    url = path.format(**world.ids)
    query = {k: v.format(**world.ids) if isinstance(v, str) else v for k, v in rule.query.items()}
    rule = Rule(rule.needs, rule.body, query, rule.allowed)
    if rule.needs == PUBLIC:
        assert _call(rule, method, url, None).status_code in rule.allowed
        return
    _refused(_call(rule, method, url, None), 401, "no credential")

    if rule.needs == PERSONAL:
        owner = world.people[Role.VIEWER]
        project_token = _token(world.mine, world.people[Role.ADMIN], ALL)
        _refused(_call(rule, method, url, project_token), 403, "a project token")
        lacking = _token(None, owner, [s for s in ALL if s != TokenScope.ADMIN])
        _refused(_call(rule, method, url, lacking), 403, "no admin scope")
        allowed = _token(None, owner, [TokenScope.ADMIN])
        if "{token_id}" in path:  # one of the owner's own tokens
            own = ApiToken.objects.filter(user=owner, project__isnull=True).first()
            assert own is not None
            url = path.format(token_id=own.pk)
        answer = _call(rule, method, url, allowed)
        assert answer.status_code in rule.allowed, answer.content
        return

    needs = Role(rule.needs)
    # Another project's admin, by project token or personal token: the project is unknown.
    _refused(_call(rule, method, url, _token(world.other, world.stranger, ALL)), 404, "other")
    _refused(_call(rule, method, url, _token(None, world.stranger, ALL)), 404, "other, personal")
    below = ROLES.index(needs) - 1
    if below >= 0:
        low = _token(world.mine, world.people[ROLES[below]], ALL)
        _refused(_call(rule, method, url, low), 403, f"role {ROLES[below]}")
    scope = SCOPE[needs]
    lacking = _token(world.mine, world.people[needs], [s for s in ALL if s != scope])
    _refused(_call(rule, method, url, lacking), 403, f"without the {scope} scope")
    if rule.needs == Role.REVIEWER and "/reviews/" in path:
        assert not ReviewItem.objects.filter(claimed_by__isnull=False).exists()

    # Just the role and the scope needed: allowed, by project token and by personal token.
    for project in (world.mine, None):
        raw = _token(project, world.people[needs], [scope])
        answer = _call(rule, method, url, raw)
        if method != "get":  # a write is checked once (a second would meet a new state)
            assert answer.status_code in rule.allowed, (project, answer.content)
            return
        assert answer.status_code in rule.allowed, (project, answer.content)
