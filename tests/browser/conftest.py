"""Browser tests: Debian's Chromium driven by Playwright against a live Keystone server.

The server is pytest-django's `live_server` (a real HTTP server in a thread, on a real
database) with the embedded worker polling beside it, exactly as `keystone serve` runs on the
embedded default: a run started in the page is planned and executed by that worker while the
page polls for progress.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Playwright's sync API keeps an asyncio loop in this thread; the ORM calls the tests make
# between page actions are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
# From the machine's notes: without the background-networking flags Chromium keeps trying
# to reach Google's hosts, which this closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Screenshots go to a temporary directory: a test run leaves the tree clean. The committed
# ones in docs/screenshots/ are regenerated on purpose, with
# KEYSTONE_SCREENSHOTS_DIR=docs/screenshots (README, "Screenshots").
SCREENSHOTS = Path(
    os.environ.get("KEYSTONE_SCREENSHOTS_DIR") or tempfile.mkdtemp(prefix="keystone-screenshots-")
).resolve()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (.ci/run does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def embedded_worker(live_server: Any, settings: Any) -> Iterator[None]:
    """The database-polling worker `keystone serve` starts, in a thread beside the server."""
    from evaluations.embedded_worker import poll_forever

    settings.KEYSTONE_EMBEDDED_WORKER = True
    stop = threading.Event()
    thread = threading.Thread(target=poll_forever, args=(stop, 0.2), daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


class Browse:
    """What every browser test does: sign in through the login form, save screenshots."""

    def __init__(self, page: Any, base_url: str) -> None:
        self.page = page
        self.base_url = base_url

    def login(self, username: str, password: str) -> None:
        self.page.goto(f"{self.base_url}/accounts/login/")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", password)
        self.page.press("input[name=password]", "Enter")
        self.page.wait_for_url(lambda url: "/accounts/login/" not in url)

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def browse(page: Any, live_server: Any) -> Browse:
    return Browse(page, live_server.url)
