"""Dashboard URLs. Everything that belongs to a project lives under /p/<project_slug>/, and
every view checks membership through evaluations.access.project_for."""

from __future__ import annotations

from django.urls import path

from evaluations.views import baselines, executions, projects, reports, review, runs, specs

urlpatterns = [
    path("", projects.home, name="home"),
    path("p/", projects.project_list, name="project_list"),
    path("p/<slug:project_slug>/", projects.overview, name="overview"),
    path("p/<slug:project_slug>/members/", projects.members, name="members"),
    path("p/<slug:project_slug>/settings/", projects.project_settings, name="project_settings"),
    path("p/<slug:project_slug>/settings/tokens/", projects.project_tokens, name="project_tokens"),
    path("p/<slug:project_slug>/settings/alerts/", projects.project_alerts, name="project_alerts"),
    path(
        "p/<slug:project_slug>/settings/digest/",
        projects.project_digest_preview,
        name="project_digest_preview",
    ),
    path("p/<slug:project_slug>/regressions/", reports.regressions, name="regressions"),
    # Specs
    path("p/<slug:project_slug>/specs/", specs.spec_list, name="spec_list"),
    path("p/<slug:project_slug>/specs/new/", specs.spec_edit, name="spec_new"),
    path("p/<slug:project_slug>/specs/validate/", specs.spec_validate, name="spec_validate"),
    path("p/<slug:project_slug>/specs/<slug:spec_slug>/", specs.spec_detail, name="spec_detail"),
    path("p/<slug:project_slug>/specs/<slug:spec_slug>/edit/", specs.spec_edit, name="spec_edit"),
    path("p/<slug:project_slug>/specs/<slug:spec_slug>/diff/", specs.spec_diff, name="spec_diff"),
    path("p/<slug:project_slug>/specs/<slug:spec_slug>/run/", specs.spec_run, name="spec_run"),
    path(
        "p/<slug:project_slug>/specs/<slug:spec_slug>/v<int:number>.yaml",
        specs.spec_version_download,
        name="spec_version_download",
    ),
    path(
        "p/<slug:project_slug>/specs/<slug:spec_slug>/trends/",
        specs.spec_trends,
        name="spec_trends",
    ),
    path(
        "p/<slug:project_slug>/specs/<slug:spec_slug>/baselines/",
        baselines.spec_baselines,
        name="spec_baselines",
    ),
    path(
        "p/<slug:project_slug>/specs/<slug:spec_slug>/baselines/rollback/",
        baselines.spec_baseline_rollback,
        name="spec_baseline_rollback",
    ),
    # Runs
    path("p/<slug:project_slug>/runs/", runs.run_list, name="run_list"),
    path("p/<slug:project_slug>/runs/compare/", runs.run_compare_pick, name="run_compare_pick"),
    path("p/<slug:project_slug>/runs/<int:run_id>/", runs.run_detail, name="run_detail"),
    path("p/<slug:project_slug>/runs/<int:run_id>/cell/", runs.run_cell, name="run_cell"),
    path("p/<slug:project_slug>/runs/<int:run_id>/compare/", runs.run_compare, name="run_compare"),
    path(
        "p/<slug:project_slug>/runs/<int:run_id>/compare/<int:execution_id>/",
        runs.run_compare_pair,
        name="run_compare_pair",
    ),
    path("p/<slug:project_slug>/runs/<int:run_id>/cancel/", runs.run_cancel, name="run_cancel"),
    path(
        "p/<slug:project_slug>/runs/<int:run_id>/rerun-failed/",
        runs.run_rerun_failed,
        name="run_rerun_failed",
    ),
    path(
        "p/<slug:project_slug>/runs/<int:run_id>/baseline/",
        runs.run_baseline,
        name="run_baseline",
    ),
    path(
        "p/<slug:project_slug>/runs/<int:run_id>/export.<str:fmt>",
        runs.run_export,
        name="run_export",
    ),
    # Executions
    path(
        "p/<slug:project_slug>/executions/<int:execution_id>/",
        executions.execution_detail,
        name="execution_detail",
    ),
    path(
        "p/<slug:project_slug>/executions/<int:execution_id>/artifacts/<int:artifact_id>/",
        executions.artifact_download,
        name="artifact_download",
    ),
    # Review queue (judge scores graded by people)
    path("p/<slug:project_slug>/review/", review.queue, name="review_queue"),
    path("p/<slug:project_slug>/review/<int:item_id>/", review.item, name="review_item"),
    path("p/<slug:project_slug>/review/agreement/", review.agreement, name="review_agreement"),
    path(
        "p/<slug:project_slug>/review/grades.<str:fmt>",
        review.export_grades,
        name="review_export",
    ),
    path(
        "p/<slug:project_slug>/results/<int:result_id>/send-to-review/",
        review.send_to_review,
        name="review_send",
    ),
]
