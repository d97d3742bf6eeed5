"""The one NinjaAPI of the project. Each app adds a Router (evaluations/api.py); domain
errors become HTTP answers here, so routes just raise them."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI

from checks.spec import SpecValidationError
from evaluations.api import ApiInputError
from evaluations.api import router as evaluations_router
from evaluations.api_baselines import router as baselines_router

api = NinjaAPI(
    title="Keystone API",
    version="1",
    description="Specs, runs, executions and results of Keystone.",
    urls_namespace="api",
)
api.add_router("/", evaluations_router)
api.add_router("/", baselines_router)


@api.exception_handler(PermissionDenied)
def role_too_low(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
    return api.create_response(request, {"detail": str(exc) or "Forbidden"}, status=403)


@api.exception_handler(SpecValidationError)
def spec_invalid(request: HttpRequest, exc: SpecValidationError) -> HttpResponse:
    """Every error of the spec with where it is, as the editor shows them."""
    errors = [
        {"message": e.message, "path": e.path, "line": e.line, "column": e.column}
        for e in exc.errors
    ]
    detail = f"the spec is invalid: {len(errors)} error{'s' if len(errors) != 1 else ''}"
    return api.create_response(request, {"detail": detail, "errors": errors}, status=422)


@api.exception_handler(ApiInputError)
def input_refused(request: HttpRequest, exc: ApiInputError) -> HttpResponse:
    error = {"message": exc.message, "path": exc.path, "line": None, "column": None}
    return api.create_response(request, {"detail": str(exc), "errors": [error]}, status=422)
