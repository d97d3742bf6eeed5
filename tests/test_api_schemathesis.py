"""Issue 16, item 7: Schemathesis against the API's OpenAPI schema, through the WSGI app on
the test database. Every operation gets generated requests (valid and invalid) as an admin
of the project `demo` with every scope; no answer may be a 5xx, and each must match the
status codes, content types and schemas the document declares. Bounded: a fixed number of
examples per operation, derandomised, so the test takes the same time each run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.cache import cache
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from evaluations import services
from evaluations.models import Membership, Project, Role

EXAMPLES_PER_OPERATION = 15
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


# Loaded when the module is collected (pytest-django has set Django up by then).
schema = schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())


@pytest.fixture(autouse=True)
def _keep_the_test_connection() -> Iterator[None]:
    """As Django's test client does: the WSGI app must not close the test's database
    connection at the end of each request (the test's transaction lives on it)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def admin_token(django_user_model: Any) -> str:
    cache.clear()  # a fresh rate limit count
    project = Project.objects.create(name="Demo", slug="demo")
    user = django_user_model.objects.create_user(username="fuzz", password="pw-1234567")
    Membership.objects.create(project=project, user=user, role=Role.ADMIN)
    services.spec_version_create(
        project=project,
        source_yaml=(
            "version: 1\nid: fuzz\ntask: {prompt: hi}\n"
            "agent: {type: command, command: 'echo hi'}\n"
            "invariants:\n  hi: {description: d, check: {type: contains, value: hi}}\n"
        ),
    )
    return services.token_issue(project=project, user=user, name="fuzz")[1]


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_as_its_schema_says(
    case: Any,
    admin_token: str,
    settings: Any,  # noqa: F811 (pytest-django's settings)
) -> None:
    settings.KEYSTONE_API_TOKEN_RATE_PER_MINUTE = 0
    if "slug" in (case.path_parameters or {}):
        case.path_parameters["slug"] = "demo"  # most requests reach past the project lookup
    if case.path.endswith("/events"):
        case.query = {**(case.query or {}), "timeout": 0}  # one poll, not a 10-minute stream
    case.call_and_validate(headers={"Authorization": f"Bearer {admin_token}"}, checks=CHECKS)
