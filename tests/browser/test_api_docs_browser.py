"""Issue 16: /api/docs renders in a real browser with every request to anywhere but this
server refused, as on an offline or firewalled server: Swagger UI comes from our static files
and draws the operations of the schema."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_api_docs_render_with_the_outside_network_blocked(page: Any, live_server: Any) -> None:
    ours = urlsplit(live_server.url).netloc
    refused: list[str] = []

    def only_this_server(route: Any) -> None:
        if urlsplit(route.request.url).netloc == ours:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_server)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{live_server.url}/api/docs")
    # Swagger UI draws one block per operation once it has loaded and read the schema.
    page.wait_for_selector(".swagger-ui .opblock", timeout=20_000)
    paths = page.locator(".swagger-ui .opblock-summary-path").all_inner_texts()
    assert any(
        "/api/projects/{slug}/runs/{run_id}/events" in p.replace("\u200b", "") for p in paths
    )
    assert page.locator(".swagger-ui .info .title").inner_text().startswith("Keystone API")
    assert refused == [], f"the page asked for outside resources: {refused}"
    assert errors == [], errors
