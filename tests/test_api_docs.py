"""Issue 16: /api/docs works on an offline server: Swagger UI comes from this server's static
files, never a CDN, and every asset the page names is served."""

from __future__ import annotations

import re

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_api_docs_name_only_local_assets_and_each_is_served(client: Client) -> None:
    response = client.get("/api/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
    assert assets, html
    for asset in assets:
        assert asset.startswith("/static/"), f"{asset} is not served by this server"
        served = client.get(asset)
        assert served.status_code == 200, asset
        body = b"".join(served.streaming_content) if served.streaming else served.content
        assert len(body) > 1000, asset
    assert "cdn." not in html and "unpkg" not in html


def test_the_schema_has_no_duplicate_keys(client: Client) -> None:
    """Swagger UI refuses a document with a key twice (an int and a str status, say)."""
    import json

    def refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate keys: {keys}"
        return dict(pairs)

    response = client.get("/api/openapi.json")
    assert response.status_code == 200
    schema = json.loads(response.content, object_pairs_hook=refuse_duplicates)
    assert "/api/projects/{slug}/runs/{run_id}/events" in schema["paths"]
