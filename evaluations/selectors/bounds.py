"""The bounds the dashboard's lists keep, and the run columns a table row reads."""

from __future__ import annotations

from typing import Any

from django.db import connection

# Every list here is bounded (a slice or a per-spec window), reads only the columns its page
# shows, and never scans executions or check results: pages use the per-run aggregates that
# run_finalize writes (composite, pass_rate, resilience, cost_usd, p95_duration_ms, ...).

OVERVIEW_RUNS = 20  # latest runs on the overview
OVERVIEW_TREND_RUNS = 30  # points per spec in the overview's trend charts
OVERVIEW_TREND_WINDOW = 1000  # newest completed runs of the project those points come from
SPEC_LIST_MAX = 500
SPEC_VERSIONS_MAX = 100
SPEC_RUNS = 20
TREND_RUNS = 100  # runs per spec in the trends page
BRANCHES_MAX = 50
# Counts of rows that grow without bound (review items, a reviewer's grades) stop here and
# show as "1,000+": counting 100,000 index entries costs more than the rest of the page.
COUNT_CAP = 1000


def capped_count(queryset: Any, cap: int = COUNT_CAP) -> int:
    """The number of rows, exact up to `cap`; cap + 1 means "more than cap"."""
    return int(queryset.order_by()[: cap + 1].count())


def capped_counts(querysets: dict[str, Any], cap: int = COUNT_CAP) -> dict[str, int]:
    """capped_count of each queryset, by name, in one query: a page that shows four
    counts waits for the database once, not four times."""
    parts, params = [], []
    for queryset in querysets.values():
        sql, query_params = queryset.order_by().values("pk")[: cap + 1].query.sql_with_params()
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS counted)")
        params.extend(query_params)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(parts)}", params)  # noqa: S608 (the ORM's SQL)
        row = cursor.fetchone()
    return {name: int(count) for name, count in zip(querysets, row, strict=True)}


def capped_text(count: int, cap: int = COUNT_CAP) -> str:
    """A capped_count as people read it: "1,000+" past the cap, else the number."""
    return f"{cap:,}+" if count > cap else str(count)


# The run columns a run row in a table needs (verdict, scores, cost, latency).
RUN_ROW_FIELDS = (
    "id",
    "project_id",
    "spec_id",
    "spec_version_id",
    "status",
    "trigger",
    "branch",
    "git_sha",
    "composite",
    "pass_rate",
    "resilience",
    "overall",
    "gate_passed",
    "exit_code",
    "cost_usd",
    "p95_duration_ms",
    "execution_count",
    "executions_done",
    "created",
    "finished",
)
