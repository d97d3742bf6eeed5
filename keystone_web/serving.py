"""What a web server process does once, with the app loaded, before its first request."""

from __future__ import annotations

import gc


def app_loaded() -> None:
    """Import every view now (Django imports the URLconf, and the views with it, at the first
    request), and Celery's client where there is a broker (the first run a request started
    imported it and kombu's transport: 100-180 ms of that request). Then put everything
    loaded out of the collector's sight: a full collection went over all of it, adding tens
    of milliseconds to whichever request it fell in (bench/bench_pages.py, the regressions
    page: slowest of 180 requests 95-112 ms, against 26-30 ms with the app frozen)."""
    from django.conf import settings
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (the property imports the URLconf)
    if not settings.CELERY_TASK_ALWAYS_EAGER:
        from evaluations import queue

        # The producers' pool loads kombu's transport for the broker too; nothing connects
        # until the first message.
        queue.broker_client().producer_pool  # noqa: B018
    gc.collect()
    gc.freeze()
