"""Projects: the home redirect, the project list, a project's overview, its members and its
settings (the review policy)."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import slugify
from django.views.decorators.http import require_http_methods, require_POST

from evaluations import charts, policy, queue, selectors, services
from evaluations.access import ProjectAccess, project_for, projects_of
from evaluations.markup import escape
from evaluations.models import RUN_TERMINAL_STATUSES, AlertWindow, ChannelKind, Role
from evaluations.numbers import whole_number
from evaluations.templatetags.keystone import fixed, local_minute, percent
from evaluations.views.htmx import is_htmx, page_or_region, refusal_status


def home(request: HttpRequest) -> HttpResponse:
    """Signed-in people go to their project (or the list when they have several)."""
    if not request.user.is_authenticated:
        return render(request, "home.html")
    projects = projects_of(request)
    if len(projects) == 1:
        return redirect("overview", project_slug=projects[0].slug)
    return redirect("project_list")


@login_required
@require_http_methods(["GET", "POST"])
def project_list(request: HttpRequest) -> HttpResponse:
    """The user's projects with their role; a superuser may create one here."""
    form: dict[str, str] = {"name": "", "slug": ""}
    error = ""
    status = 200
    if request.method == "POST":
        if not request.user.is_superuser:
            raise PermissionDenied("Only a superuser may create projects.")
        form = {
            "name": request.POST.get("name", "").strip(),
            "slug": request.POST.get("slug", "").strip(),
        }
        slug = form["slug"] or slugify(form["name"])
        try:
            project = services.project_create(name=form["name"], slug=slug, created_by=request.user)
        except services.MembershipError as exc:
            error, status = str(exc), 400
        else:
            messages.success(request, f"Project {project.name} created; you are its admin.")
            return redirect("overview", project_slug=project.slug)
    projects = projects_of(request)
    roles = selectors.membership_roles(request.user, [p.pk for p in projects])
    context = {
        "rows": [(project, roles.get(project.pk)) for project in projects],
        "can_create": request.user.is_superuser,
        "form": form,
        "error": error,
    }
    template = page_or_region(request, "projects/list.html", "project-list")
    return render(request, template, context, status=status)


def _overview_charts(
    access: ProjectAccess,
) -> tuple[list[charts.Chart], list[SafeString]]:
    """The charts, and the same points as table rows (spec, run, link) for people who do not
    read charts."""
    points = selectors.project_trend_points(access.project)
    link = charts.run_links(access.project.slug)
    # The table's rows as HTML, made here with the filters the template applied to their
    # cells: six values a row over 150 rows were ~5 ms of the template's rendering.
    table = [
        mark_safe(  # noqa: S308 - the spec is escaped; the rest are numbers, dates, a path
            f'\n                  <tr><td>{escape(spec)}</td><td><a href="{escape(link(row))}">'
            f'#{row["id"]}</a></td><td class="nowrap">{local_minute(row["created"])}</td>\n'
            f'                    <td class="num">{fixed(row["resilience"], 1) or "—"}</td>'
            f'<td class="num">{percent(row["pass_rate"]) or "—"}</td></tr>\n                '
        )
        for spec, rows in points.items()
        for row in rows
    ]
    return [
        charts.Chart(
            id="chart-resilience",
            title="Resilience score per spec",
            figure=charts.metric_trend(points, "resilience", link_for=link),
        ),
        charts.Chart(
            id="chart-pass-rate",
            title="Pass rate per spec",
            figure=charts.metric_trend(points, "pass_rate", link_for=link),
        ),
    ], table


@login_required
def overview(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Latest runs and their verdicts, regressions against each spec's active baseline, and
    resilience / pass-rate trends per spec. An htmx request gets the latest-runs table,
    which polls itself while a run is still going."""
    access = project_for(request, project_slug)
    runs = selectors.latest_runs(access.project)
    charts.link_run_rows(runs, access.project.slug)
    context: dict[str, Any] = {
        "access": access,
        "runs": runs,
        "runs_active": any(run.status not in RUN_TERMINAL_STATUSES for run in runs),
    }
    if is_htmx(request):
        return render(request, "projects/overview.html#latest-runs", context)
    context["regressions"] = selectors.project_regressions(access.project)
    context["has_baseline"] = bool(context["regressions"]) or selectors.project_has_baseline(
        access.project
    )
    context["charts"], context["trend_rows"] = _overview_charts(access)
    # The charts are bounded: the page says how, and where the longer history is.
    context["overview_trend_runs"] = selectors.OVERVIEW_TREND_RUNS
    context["trend_runs"] = selectors.TREND_RUNS
    return render(request, "projects/overview.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def members(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Members and roles; admins add people by username, change roles and remove members.
    Refusals (unknown user, the last admin) come back as a message on the page."""
    access = project_for(request, project_slug)
    notice, error, password = "", "", ""
    status = 200
    if request.method == "POST":
        access = project_for(request, project_slug, Role.ADMIN)
        try:
            notice, password = _member_action(request, access)
        except services.MembershipError as exc:
            error, status = str(exc), 400
        # A new account's password is shown on this answer only: no redirect then.
        if not is_htmx(request) and not error and not password:
            messages.success(request, notice)
            return redirect("members", project_slug=access.project.slug)
        status = refusal_status(request, status)
    context = {
        "access": access,
        "memberships": selectors.project_members(access.project),
        "roles": Role.choices,
        "notice": notice,
        "error": error,
        "new_password": password,
        "username": request.POST.get("username", "") if error else "",
        "new_username": request.POST.get("new_username", "") if error else "",
    }
    template = page_or_region(request, "projects/members.html", "member-list")
    return render(request, template, context, status=status)


def _member_action(request: HttpRequest, access: ProjectAccess) -> tuple[str, str]:
    """(what was done, the new account's password when one was created)."""
    action = request.POST.get("action", "")
    project = access.project
    if action == "add":
        membership = services.membership_add(
            project=project,
            username=request.POST.get("username", ""),
            role=request.POST.get("role", Role.VIEWER),
        )
        return f"{membership.user.get_username()} added as {membership.role}.", ""
    if action == "create":
        membership, password = services.member_create(
            project=project,
            username=request.POST.get("new_username", ""),
            role=request.POST.get("role", Role.VIEWER),
        )
        name = membership.user.get_username()
        return f"Account {name} created and added as {membership.role}.", password
    membership_id = whole_number(request.POST.get("membership"))
    if membership_id is None:
        raise services.MembershipError("No member was chosen.")
    if action == "set_role":
        membership = services.membership_set_role(
            project=project, membership_id=membership_id, role=request.POST.get("role", "")
        )
        return f"{membership.user.get_username()} is now {membership.role}.", ""
    if action == "remove":
        services.membership_remove(project=project, membership_id=membership_id)
        return "Member removed.", ""
    raise services.MembershipError(f"Unknown action {action!r}: add, create, set_role or remove.")


# --- Settings: the project's review policy ---------------------------------------------------


def _rate_field(help_text: str) -> forms.FloatField:
    return forms.FloatField(required=False, min_value=0.0, max_value=1.0, help_text=help_text)


class ReviewPolicyForm(forms.Form):
    """The keys of a spec's `review:` block, for the whole project. An empty number or an
    unticked box stores nothing: Keystone's default applies, and a spec's block wins."""

    all = forms.BooleanField(required=False, help_text="Every judge result goes to people.")
    sample_rate = _rate_field("Share of judge results sampled at random, 0 to 1.")
    borderline_margin = _rate_field(
        "Judge scores within this distance of the pass threshold, 0 to 1."
    )
    check_disagreement = forms.BooleanField(
        required=False, help_text="The judge and the deterministic checks disagree."
    )
    spread_max = _rate_field("Judge samples spread more than this, 0 to 1.")
    failing_gates = forms.BooleanField(
        required=False, help_text="Judge results that make a gate fail."
    )
    reviewers_per_item = forms.IntegerField(
        required=False, min_value=1, help_text="People who grade each item."
    )
    blind = forms.BooleanField(
        required=False, help_text="Hide the judge's score and reasoning until graded."
    )
    disagreement = _rate_field(
        "Reviewers' scores further apart than this disagree, even on the same verdict."
    )

    FIELDSETS = (
        (
            "What goes to people",
            (
                "all",
                "sample_rate",
                "borderline_margin",
                "check_disagreement",
                "spread_max",
                "failing_gates",
            ),
        ),
        ("How items are reviewed", ("reviewers_per_item", "blind", "disagreement")),
    )

    def fieldsets(self) -> list[tuple[str, list[forms.BoundField]]]:
        return [(legend, [self[name] for name in names]) for legend, names in self.FIELDSETS]

    def policy(self) -> dict[str, Any]:
        return {
            name: value
            for name, value in self.cleaned_data.items()
            if value is not None and value is not False
        }

    def error_lines(self) -> list[str]:
        """Every error as "field: message", the field named as in a spec's review block."""
        return [
            str(message) if name == NON_FIELD_ERRORS else f"{name}: {message}"
            for name, errors in self.errors.items()
            for message in errors
        ]


@login_required
@require_http_methods(["GET", "POST"])
def project_settings(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Admins set which judge results go to people (the project's review policy); each
    spec's `review:` block overrides it key by key. Invalid values come back with the
    field named; htmx requests get the form region."""
    access = project_for(request, project_slug, Role.ADMIN)
    project = access.project
    status = 200
    notice = ""
    if request.method == "POST":
        form = ReviewPolicyForm(request.POST)
        if form.is_valid():
            try:
                services.project_review_policy_set(project=project, policy=form.policy())
            except services.ReviewInputError as exc:
                form.add_error(None, f"review policy not saved: {exc}")
        if form.is_valid():
            notice = "Review policy saved."
            if not is_htmx(request):
                messages.success(request, notice)
                return redirect("project_settings", project_slug=project.slug)
            form = ReviewPolicyForm(initial=project.review_policy)
        else:
            # htmx swaps 2xx only: the errors are in the fragment.
            status = refusal_status(request, 400)
    else:
        form = ReviewPolicyForm(initial=project.review_policy)
    context = _settings_context(request, access, form=form, notice=notice)
    template = page_or_region(request, "projects/settings.html", "policy-form")
    return render(request, template, context, status=status)


def _settings_context(
    request: HttpRequest,
    access: ProjectAccess,
    *,
    form: ReviewPolicyForm | None = None,
    **extra: Any,
) -> dict[str, Any]:
    project = access.project
    return {
        "access": access,
        "form": form or ReviewPolicyForm(initial=project.review_policy),
        "policy_json": json.dumps(project.review_policy or {}, sort_keys=True),
        "defaults_json": json.dumps(services.REVIEW_POLICY_DEFAULTS, sort_keys=True),
        "tokens": selectors.project_api_tokens(project),
        "memberships": selectors.project_members(project),
        "token_user_id": request.user.pk,
        # The operator's policy: read-only here, it is set in the server's environment.
        "server_policy": policy.current().rows(),
        "alert_rules": selectors.project_alert_rules(project.pk),
        "alert_channels": list(project.alert_channels.all()),
        "alert_firings": selectors.project_alert_firings(project.pk),
        "alert_windows": AlertWindow.choices,
        "channel_kinds": ChannelKind.choices,
        **_digest_schedule(),
        # The alert forms, empty (a refused one comes back filled: project_alerts).
        "channel_form": {"digest": True},
        "rule_form": {"channels": []},
        **extra,
    }


# --- Settings: API tokens for machines -------------------------------------------------------


@login_required
@require_POST
def project_tokens(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Admins issue a token (it acts with the chosen member's role in this project only) or
    revoke one. A new token's raw value is in this answer only: it is never stored, so the
    page is rendered here rather than redirected to."""
    access = project_for(request, project_slug, Role.ADMIN)
    project = access.project
    action = request.POST.get("action", "")
    extra: dict[str, Any] = {"token_error": "", "token_notice": "", "new_token": ""}
    status = 200
    try:
        if action == "issue":
            user_id = request.POST.get("user", "")
            member = next(
                (m.user for m in selectors.project_members(project) if str(m.user_id) == user_id),
                request.user if not user_id else None,
            )
            if member is None:
                raise services.TokenError("acts as: choose a member of this project")
            token, raw = services.token_issue(
                project=project, user=member, name=request.POST.get("name", "")
            )
            extra["new_token"] = raw
            extra["token_notice"] = (
                f"Token {token.name} issued. Copy it now: it is not shown again."
            )
        elif action == "revoke":
            token_id = whole_number(request.POST.get("token"))
            if token_id is None:
                raise services.TokenError("no token was chosen")
            token = services.token_revoke(project=project, token_id=token_id)
            extra["token_notice"] = f"Token {token.name} revoked."
        else:
            raise services.TokenError(f"unknown action {action!r}: issue or revoke")
    except services.TokenError as exc:
        extra["token_error"] = str(exc)
        status = refusal_status(request, 400)
    context = _settings_context(request, access, **extra)
    template = page_or_region(request, "projects/settings.html", "api-tokens")
    response = render(request, template, context, status=status)
    response["Cache-Control"] = "no-store"  # the raw token must not sit in a cache
    return response


# --- Settings: alert rules, channels and firings ----------------------------------------------


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.replace("\n", ",").split(",") if part.strip()]


def _channel_ids(request: HttpRequest) -> list[int]:
    """The channels ticked (a value that is no row id matches no channel)."""
    ids = (whole_number(value) for value in request.POST.getlist("channels"))
    return [i for i in ids if i is not None]


def _alert_action(request: HttpRequest, access: ProjectAccess) -> str:
    """Do what the form asks; returns the notice. Raises services.AlertError when refused."""
    project, post = access.project, request.POST
    action = post.get("action", "")
    if action == "channel_add":
        channel = services.alert_channel_create(
            project=project,
            name=post.get("name", ""),
            kind=post.get("kind", ""),
            target=post.get("target", ""),
            secret=post.get("secret", ""),
            digest=post.get("digest") == "on",
        )
        return f"Channel {channel.name} added."
    if action == "rule_add":
        channel_ids = _channel_ids(request)
        rule = services.alert_rule_create(
            project=project,
            name=post.get("name", ""),
            condition=post.get("condition", ""),
            window=post.get("window", ""),
            specs=_split(post.get("specs", "")),
            branches=_split(post.get("branches", "")),
            channel_ids=channel_ids,
        )
        return f"Rule {rule.name} added."
    target = whole_number(post.get("id"))
    if target is None:
        raise services.AlertError(f"unknown action {action!r} or no row chosen")
    if action == "rule_delete":
        services.alert_rule_delete(project=project, rule_id=target)
        return "Rule deleted."
    if action == "channel_delete":
        services.alert_channel_delete(project=project, channel_id=target)
        return "Channel deleted (with its rules' firings to it)."
    if action == "resend":
        if not services.firing_resend(project=project, firing_id=target):
            raise services.AlertError("only a failed firing can be sent again")
        queue.firing_deliver_later(target)
        return "Firing queued to be sent again."
    raise services.AlertError(f"unknown action {action!r}")


def _refused_alert_form(request: HttpRequest) -> dict[str, Any]:
    """The refused channel or rule form as it was typed: the page used to come back empty,
    so a typo in a condition cost the name, the scopes and the channels chosen too. The
    secret is not among them: it is never written into a page."""
    post = request.POST
    action = post.get("action", "")
    if action == "channel_add":
        return {
            "channel_form": {
                "name": post.get("name", ""),
                "kind": post.get("kind", ""),
                "target": post.get("target", ""),
                "digest": post.get("digest") == "on",
            }
        }
    if action == "rule_add":
        return {
            "rule_form": {
                "name": post.get("name", ""),
                "condition": post.get("condition", ""),
                "window": post.get("window", ""),
                "specs": post.get("specs", ""),
                "branches": post.get("branches", ""),
                "channels": _channel_ids(request),
            }
        }
    return {}


@login_required
@require_POST
def project_alerts(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Admins add and delete alert channels and rules, and send a failed firing again."""
    access = project_for(request, project_slug, Role.ADMIN)
    extra: dict[str, Any] = {"alert_error": "", "alert_notice": ""}
    status = 200
    try:
        extra["alert_notice"] = _alert_action(request, access)
    except services.AlertError as exc:
        extra["alert_error"] = str(exc)
        status = refusal_status(request, 400)
        extra.update(_refused_alert_form(request))
    context = _settings_context(request, access, **extra)
    template = page_or_region(request, "projects/settings.html", "alerts")
    return render(request, template, context, status=status)


@login_required
def project_digest_preview(request: HttpRequest, project_slug: str) -> HttpResponse:
    """The weekly digest as it would go out now (nothing is sent or stored): the settings
    page with it, or for htmx (the page's button) its region alone, which needs none of
    the page's lists."""
    access = project_for(request, project_slug, Role.ADMIN)
    preview = selectors.digest_markdown(
        access.project, end=timezone.now(), base_url=settings.KEYSTONE_BASE_URL
    )
    if is_htmx(request):
        context = {"access": access, "digest_preview": preview, **_digest_schedule()}
        return render(request, "projects/settings.html#digest-preview", context)
    context = _settings_context(request, access, digest_preview=preview)
    return render(request, "projects/settings.html", context)


def _digest_schedule() -> dict[str, Any]:
    return {
        "digest_day": settings.KEYSTONE_DIGEST_DAY,
        "digest_hour": settings.KEYSTONE_DIGEST_HOUR,
    }
