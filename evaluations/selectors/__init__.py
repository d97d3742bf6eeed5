"""Reads: what pages, the API, the CLI and the scoring need, in few queries; one module per
part of the product. The names below are what the views and the API read, so they need one
import: `from evaluations import selectors`."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evaluations.selectors.alerts import (
        AlertConditionError,
        parse_condition,
        project_alert_firings,
        project_alert_rules,
    )
    from evaluations.selectors.baselines import active_baseline_for, spec_baseline_history
    from evaluations.selectors.bounds import OVERVIEW_TREND_RUNS, SPEC_RUNS, TREND_RUNS
    from evaluations.selectors.digest import digest_markdown
    from evaluations.selectors.executions import (
        EXECUTION_PAGE_SIZE,
        EXECUTIONS_FINISHED_BATCH,
        ArtifactText,
        ExecutionPage,
        artifact_in_project,
        artifact_json,
        artifact_text,
        execution_artifacts,
        execution_for_page,
        execution_neighbours,
        execution_page,
        execution_reproducer,
        execution_results,
        execution_timeline,
        execution_transcript,
        executions_finished,
    )
    from evaluations.selectors.exports import RESULT_CSV_COLUMNS, run_report, run_result_rows
    from evaluations.selectors.projects import (
        membership_roles,
        project_api_tokens,
        project_members,
    )
    from evaluations.selectors.records import (
        effective_results,
        execution_reason,
        execution_record,
        run_progress,
        run_records,
    )
    from evaluations.selectors.regressions import (
        group_key,
        project_has_baseline,
        project_regressions,
    )
    from evaluations.selectors.reports import (
        RegressionReport,
        regression_report,
        report_csv,
        report_json,
        report_markdown,
    )
    from evaluations.selectors.reviews import (
        BLIND_HIDDEN,
        AgreementRow,
        ReviewFilters,
        blind_hidden_cells,
        blind_hidden_results,
        blind_reason,
        blind_summary,
        judge_view,
        pending_review_items,
        result_changes,
        review_agreement,
        review_counts,
        review_filter_choices,
        review_grades,
        review_item_in_project,
        review_item_view,
        review_kappa,
        review_progress,
        review_queue_items,
        review_queue_page,
    )
    from evaluations.selectors.runs import (
        RESULT_SOURCE_RANK,
        RUN_PAGE_SIZE,
        RunCursor,
        RunFilters,
        RunPage,
        executions_by_id,
        project_spec_slugs,
        run_cell_rows,
        run_execution_counts,
        run_for_page,
        run_in_project,
        run_page,
        spec_active_baseline,
    )
    from evaluations.selectors.specs import (
        latest_runs,
        spec_latest_version,
        spec_rows,
        spec_version_texts,
        spec_versions,
    )
    from evaluations.selectors.trends import (
        TREND_METRICS,
        invariant_pass_rates,
        project_trend_points,
        spec_branches,
        spec_trend_marks,
        spec_trend_runs,
    )

# Where each name is defined. A module is imported when one of its names is first used
# (PEP 562), so a command pays for the modules it calls, not for all of them (`keystone run`
# needs none of the pages' digest, regression report, trends or exports).
_NAMES = {
    "alerts": (
        "AlertConditionError",
        "parse_condition",
        "project_alert_firings",
        "project_alert_rules",
    ),
    "baselines": (
        "active_baseline_for",
        "spec_baseline_history",
    ),
    "bounds": (
        "OVERVIEW_TREND_RUNS",
        "SPEC_RUNS",
        "TREND_RUNS",
    ),
    "digest": ("digest_markdown",),
    "executions": (
        "EXECUTION_PAGE_SIZE",
        "EXECUTIONS_FINISHED_BATCH",
        "ArtifactText",
        "ExecutionPage",
        "artifact_in_project",
        "artifact_json",
        "artifact_text",
        "execution_artifacts",
        "execution_for_page",
        "execution_neighbours",
        "execution_page",
        "execution_reproducer",
        "execution_results",
        "execution_timeline",
        "execution_transcript",
        "executions_finished",
    ),
    "exports": (
        "RESULT_CSV_COLUMNS",
        "run_report",
        "run_result_rows",
    ),
    "projects": (
        "membership_roles",
        "project_api_tokens",
        "project_members",
    ),
    "records": (
        "effective_results",
        "execution_reason",
        "execution_record",
        "run_progress",
        "run_records",
    ),
    "regressions": (
        "group_key",
        "project_has_baseline",
        "project_regressions",
    ),
    "reports": (
        "RegressionReport",
        "regression_report",
        "report_csv",
        "report_json",
        "report_markdown",
    ),
    "reviews": (
        "BLIND_HIDDEN",
        "AgreementRow",
        "ReviewFilters",
        "blind_hidden_cells",
        "blind_hidden_results",
        "blind_reason",
        "blind_summary",
        "judge_view",
        "pending_review_items",
        "result_changes",
        "review_agreement",
        "review_counts",
        "review_filter_choices",
        "review_grades",
        "review_item_in_project",
        "review_item_view",
        "review_kappa",
        "review_progress",
        "review_queue_items",
        "review_queue_page",
    ),
    "runs": (
        "RESULT_SOURCE_RANK",
        "RUN_PAGE_SIZE",
        "RunCursor",
        "RunFilters",
        "RunPage",
        "executions_by_id",
        "project_spec_slugs",
        "run_cell_rows",
        "run_execution_counts",
        "run_for_page",
        "run_in_project",
        "run_page",
        "spec_active_baseline",
    ),
    "specs": (
        "latest_runs",
        "spec_latest_version",
        "spec_rows",
        "spec_version_texts",
        "spec_versions",
    ),
    "trends": (
        "TREND_METRICS",
        "invariant_pass_rates",
        "project_trend_points",
        "spec_branches",
        "spec_trend_marks",
        "spec_trend_runs",
    ),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}
# The same names again, for `import *` and for linters, which check the imports above
# against them (tests/test_cli_startup.py checks them against _NAMES).
__all__ = [
    "AgreementRow",
    "AlertConditionError",
    "BLIND_HIDDEN",
    "ArtifactText",
    "EXECUTION_PAGE_SIZE",
    "EXECUTIONS_FINISHED_BATCH",
    "ExecutionPage",
    "OVERVIEW_TREND_RUNS",
    "RESULT_CSV_COLUMNS",
    "RESULT_SOURCE_RANK",
    "RUN_PAGE_SIZE",
    "RegressionReport",
    "ReviewFilters",
    "RunCursor",
    "RunFilters",
    "RunPage",
    "SPEC_RUNS",
    "TREND_METRICS",
    "TREND_RUNS",
    "active_baseline_for",
    "artifact_in_project",
    "artifact_json",
    "artifact_text",
    "blind_hidden_cells",
    "blind_hidden_results",
    "blind_reason",
    "blind_summary",
    "digest_markdown",
    "effective_results",
    "execution_artifacts",
    "execution_for_page",
    "execution_neighbours",
    "execution_page",
    "execution_reason",
    "execution_record",
    "execution_reproducer",
    "execution_results",
    "execution_timeline",
    "execution_transcript",
    "executions_by_id",
    "executions_finished",
    "group_key",
    "invariant_pass_rates",
    "judge_view",
    "latest_runs",
    "membership_roles",
    "parse_condition",
    "pending_review_items",
    "project_alert_firings",
    "project_alert_rules",
    "project_api_tokens",
    "project_has_baseline",
    "project_members",
    "project_regressions",
    "project_spec_slugs",
    "project_trend_points",
    "regression_report",
    "report_csv",
    "report_json",
    "report_markdown",
    "result_changes",
    "review_agreement",
    "review_counts",
    "review_filter_choices",
    "review_grades",
    "review_item_in_project",
    "review_item_view",
    "review_kappa",
    "review_progress",
    "review_queue_items",
    "review_queue_page",
    "run_cell_rows",
    "run_execution_counts",
    "run_for_page",
    "run_in_project",
    "run_page",
    "run_progress",
    "run_records",
    "run_report",
    "run_result_rows",
    "spec_active_baseline",
    "spec_baseline_history",
    "spec_branches",
    "spec_latest_version",
    "spec_rows",
    "spec_trend_marks",
    "spec_trend_runs",
    "spec_version_texts",
    "spec_versions",
]


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next use finds it without this function
    return value
