"""Requests that no view could store: refused before any view runs.

A NUL character cannot be stored in a PostgreSQL text column (SQLite takes it), so one in a
query parameter, a form field or a JSON string would reach the database and fail there as a
500, and only on one of the two databases. Refused here, once, for every page and endpoint,
with a 400 that names the parameter. The spec text is the one place a NUL is reported
differently: inside the spec, at its line and column (the spec validator's job), so JSON
bodies are only checked outside `source_yaml`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

# Fields whose text is validated with positions by the spec validator itself.
_VALIDATED_TEXT = frozenset({"source_yaml"})


class RefuseNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        where = _nul_in(request)
        if where is not None:
            message = f"NUL characters are not allowed (in {where})"
            if request.path.startswith("/api/"):
                error = {"code": "bad_request", "message": message, "field": where}
                return JsonResponse({"error": error}, status=400)
            return HttpResponse(message, status=400, content_type="text/plain")
        return self.get_response(request)


def _nul_in(request: HttpRequest) -> str | None:
    for source, label in ((request.GET, "query parameter"), (request.POST, "form field")):
        for key, values in source.lists():
            if "\0" in key or any("\0" in value for value in values if key not in _VALIDATED_TEXT):
                return f"{label} '{key.replace(chr(0), '')}'"
    if request.content_type == "application/json" and request.body:
        try:
            body = json.loads(request.body)
        except ValueError:
            return None  # not JSON: the endpoint's own parser says so
        for path in _nul_strings(body, "body"):
            return path
    return None


def _nul_strings(value: Any, path: str) -> Iterator[str]:
    if isinstance(value, str):
        if "\0" in value:
            yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            if "\0" in key:
                yield f"{path} key"
            elif key not in _VALIDATED_TEXT:
                yield from _nul_strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nul_strings(item, f"{path}[{index}]")
