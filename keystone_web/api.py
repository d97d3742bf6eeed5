"""The one NinjaAPI of the project. Each app adds a Router (evaluations/api.py); domain
errors become HTTP answers here, so routes just raise them.

Every error has one shape, whatever raised it:

    {"error": {"code": "not_found", "message": "No such run in this project.", "field": null}}

`field` names the input at fault (a body field, a query parameter, a spec path) when there
is one; a spec's errors are all listed in `details` with their line and column.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from ninja import NinjaAPI, Swagger
from ninja.errors import AuthenticationError, HttpError, Throttled, ValidationError

from checks.spec import SpecValidationError
from checks.wording import counted
from evaluations.api import ApiConflict, ApiInputError, TokenRateThrottle
from evaluations.api import router as evaluations_router
from evaluations.api_baselines import router as baselines_router
from evaluations.api_reviews import review_list  # noqa: F401 (its routes join the router)
from evaluations.api_runs import run_events  # noqa: F401 (its routes join the router)
from evaluations.api_specs import spec_validate  # noqa: F401 (its routes join the router)
from evaluations.api_tokens import token_list  # noqa: F401 (its routes join the router)

# The one error shape (error_response below), as JSON Schema for the OpenAPI document.
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "field"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "details": {"type": "array", "items": {"type": "object"}},
            },
        }
    },
}


class KeystoneAPI(NinjaAPI):
    """The schema says what the handlers below guarantee: any operation may answer an error
    in the one shape, so each lists those statuses with that shape."""

    def get_openapi_schema(self, *args: Any, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(*args, **kwargs)
        error = {
            "description": 'an error: {"error": {code, message, field}}',
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
        for operations in schema["paths"].values():
            for operation in operations.values():
                # ninja keys some statuses as ints, JSON makes them strings: one key each.
                responses = {str(k): v for k, v in operation.get("responses", {}).items()}
                for status in ERROR_STATUSES:
                    responses.setdefault(str(status), error)
                operation["responses"] = responses
        return schema


class Docs(Swagger):
    """Swagger UI from this server's static files, never a CDN, so /api/docs works offline.

    ninja serves its local page only when "ninja" is in INSTALLED_APPS, which would make
    django.setup() import ninja for every CLI command; its templates and static files are
    on the template and static paths instead (settings), and this renders them."""

    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        self.settings["url"] = self.get_openapi_url(api, kwargs)
        context = {
            "swagger_settings": json.dumps(self.settings, indent=1),
            "api": api,
            # As ninja decides it: a CSRF token only for an API-wide auth that needs one;
            # this API has none (its auth is per router).
            "add_csrf": False,
        }
        return render(request, self.template, context)


api = KeystoneAPI(
    title="Keystone API",
    docs=Docs(),
    version="1",
    description="Specs, runs, executions and results of Keystone. Every error answers "
    '`{"error": {"code", "message", "field"}}`.',
    urls_namespace="api",
    throttle=[TokenRateThrottle()],
)
api.add_router("/", evaluations_router)
api.add_router("/", baselines_router)

# Statuses every operation may answer with an error (401 only with auth, 429 with a token).
ERROR_STATUSES = (400, 401, 403, 404, 409, 422, 429)
# The code of an error answered with only a status (ninja's own HttpErrors).
STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    422: "invalid",
    429: "rate_limited",
}
# Where ninja says an input came from; the field name is what follows.
PARAM_SOURCES = {"body", "query", "path", "header", "cookie", "form", "file"}


def error_response(
    request: HttpRequest,
    status: int,
    message: str,
    *,
    code: str = "",
    field: str | None = None,
    details: list[dict[str, Any]] | None = None,
) -> HttpResponse:
    error: dict[str, Any] = {
        "code": code or STATUS_CODES.get(status, "error"),
        "message": message,
        "field": field,
    }
    if details is not None:
        error["details"] = details
    return api.create_response(request, {"error": error}, status=status)


def _field_of(loc: Any) -> str | None:
    """`("body", "payload", "replicas")` -> "replicas"; `("query", "limit")` -> "limit"."""
    parts = [str(part) for part in loc or ()]
    if parts and parts[0] in PARAM_SOURCES:
        parts = parts[1:]
    # A JSON body is one parameter (named after the view's argument): drop that name.
    if len(parts) > 1 and parts[0] == "payload":
        parts = parts[1:]
    return ".".join(parts) or None


@api.exception_handler(ValidationError)
def request_invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    """The request did not match the schema: 422 naming the first field, all in details."""
    details = [
        {"field": _field_of(error.get("loc")), "message": str(error.get("msg", ""))}
        for error in exc.errors
    ]
    field = details[0]["field"] if details else None
    message = str(details[0]["message"]) if details else "invalid request"
    if field:
        message = f"{field}: {message}"
    return error_response(request, 422, message, code="invalid", field=field, details=details)


@api.exception_handler(Throttled)
def throttled(request: HttpRequest, exc: Throttled) -> HttpResponse:
    wait = max(1, round(exc.wait)) if exc.wait is not None else 60
    response = error_response(
        request, 429, f"Too many requests with this token; retry in {wait} s."
    )
    response["Retry-After"] = str(wait)
    return response


@api.exception_handler(AuthenticationError)
def unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    message = "Send a valid API token (Authorization: Bearer ks_...) or sign in."
    return error_response(request, 401, message)


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja's own: a body that is not JSON (400), a method the route lacks, ...
    return error_response(request, exc.status_code, str(exc))


@api.exception_handler(Http404)
def not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return error_response(request, 404, str(exc) or "Not found.")


@api.exception_handler(PermissionDenied)
def role_too_low(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    return error_response(request, 403, str(exc) or "Forbidden.")


@api.exception_handler(ApiConflict)
def conflict(request: HttpRequest, exc: ApiConflict) -> HttpResponse:
    return error_response(request, 409, str(exc), field=exc.field)


@api.exception_handler(SpecValidationError)
def spec_invalid(request: HttpRequest, exc: SpecValidationError) -> HttpResponse:
    """Every error of the spec with where it is, as the editor shows them."""
    details = [
        {"message": e.message, "path": e.path, "line": e.line, "column": e.column}
        for e in exc.errors
    ]
    count = counted(len(details), "error")
    message = f"the spec is invalid ({count})"
    field = None
    if exc.errors:
        first = exc.errors[0]
        message += f"; first: {first.path or '(root)'}: {first.message}"
        field = first.path or None
    return error_response(request, 422, message, code="spec_invalid", field=field, details=details)


@api.exception_handler(ApiInputError)
def input_refused(request: HttpRequest, exc: ApiInputError) -> HttpResponse:
    return error_response(request, 422, exc.message, code="invalid", field=exc.path)
