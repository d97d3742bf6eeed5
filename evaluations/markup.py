"""HTML text for the table rows that views make in Python instead of a template loop
(issue 18: a template's per-value work was most of a page with a hundred rows)."""

from __future__ import annotations

import html


def escape(value: object) -> str:
    """What `django.utils.html.escape` writes: `html.escape` of the value's text. Django's
    is the same call behind `keep_lazy`'s wrapper, which looks through its arguments for
    lazy strings on every call: half of the regressions report's row-making time. A lazy
    translation is turned into text in the active language, as a template does."""
    return html.escape(str(value))
