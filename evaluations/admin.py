"""Admin pages for every table: an operator's view, not the product's UI."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from evaluations.models import (
    ApiToken,
    Artifact,
    Baseline,
    CheckResult,
    Execution,
    JudgeCacheEntry,
    Membership,
    Project,
    ResultChange,
    ReviewAgreementDay,
    ReviewItem,
    ReviewVerdict,
    Run,
    Spec,
    SpecVersion,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["project", "user", "role", "created"]
    list_filter = ["role", "project"]
    raw_id_fields = ["user"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "project", "user", "created", "last_used", "revoked"]
    list_filter = ["revoked", "project"]
    # Tokens are issued through the app (the raw value is shown once); here only revoked.
    readonly_fields = ["prefix", "token_hash", "created", "last_used"]
    raw_id_fields = ["user"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class SpecVersionInline(admin.TabularInline):
    model = SpecVersion
    extra = 0
    fields = ["number", "content_hash", "author", "created"]
    readonly_fields = ["number", "content_hash", "author", "created"]
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Spec)
class SpecAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "project", "created"]
    list_filter = ["project"]
    search_fields = ["slug", "name"]
    inlines = [SpecVersionInline]


@admin.register(SpecVersion)
class SpecVersionAdmin(admin.ModelAdmin):
    list_display = ["spec", "number", "content_hash", "author", "created"]
    list_filter = ["spec__project"]
    readonly_fields = ["spec", "number", "source_yaml", "parsed", "content_hash", "author"]

    # Versions are immutable: created by uploading a spec, never edited here.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "project",
        "spec",
        "status",
        "trigger",
        "branch",
        "overall",
        "gate_passed",
        "exit_code",
        "created",
    ]
    list_filter = ["status", "trigger", "gate_passed", "project"]
    search_fields = ["git_sha", "branch"]
    raw_id_fields = ["spec_version", "created_by"]
    date_hierarchy = "created"


@admin.register(Execution)
class ExecutionAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "scenario", "prompt_index", "replica", "pillar", "status"]
    list_filter = ["status", "pillar"]
    search_fields = ["scenario", "key"]
    raw_id_fields = ["run", "project"]
    # Listing executions must not count millions of rows on every page view.
    show_full_result_count = False


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ["id", "execution", "kind", "name", "size", "truncated"]
    list_filter = ["kind", "truncated"]
    raw_id_fields = ["execution"]
    show_full_result_count = False


@admin.register(CheckResult)
class CheckResultAdmin(admin.ModelAdmin):
    list_display = ["id", "execution", "invariant_id", "check_type", "passed", "score", "source"]
    list_filter = ["passed", "source", "severity", "check_type"]
    search_fields = ["invariant_id", "failure_code"]
    raw_id_fields = ["execution", "run"]
    show_full_result_count = False


@admin.register(Baseline)
class BaselineAdmin(admin.ModelAdmin):
    list_display = ["name", "spec", "project", "active", "run", "created"]
    list_filter = ["active", "project"]
    raw_id_fields = ["run", "created_by"]


class ReviewVerdictInline(admin.TabularInline):
    model = ReviewVerdict
    extra = 0
    raw_id_fields = ["reviewer"]


@admin.register(ReviewItem)
class ReviewItemAdmin(admin.ModelAdmin):
    list_display = ["id", "project", "run", "invariant_id", "reason", "status", "claimed_by"]
    list_filter = ["status", "reason"]
    raw_id_fields = ["run", "execution", "check_result", "claimed_by", "sent_by"]
    inlines = [ReviewVerdictInline]

    def save_model(self, request: HttpRequest, obj: ReviewItem, form: Any, change: bool) -> None:
        # An operator may change an item's status or grades here: agreement's daily tallies
        # take back what the item counted for before and count what it is now.
        if change:
            ReviewAgreementDay.tally(ReviewItem.objects.get(pk=obj.pk), sign=-1)
        super().save_model(request, obj, form, change)
        ReviewAgreementDay.tally(obj, sign=1)


@admin.register(ResultChange)
class ResultChangeAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "invariant_id", "changed_by", "created"]
    raw_id_fields = ["run", "execution", "check_result", "review_item"]


@admin.register(JudgeCacheEntry)
class JudgeCacheEntryAdmin(admin.ModelAdmin):
    list_display = ["key", "model", "hits", "created"]
    search_fields = ["key", "model"]
