"""Specs: list, detail with versions, diff between versions, the editor with live
validation, the "Run" form, and trends over a spec's runs."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from checks.spec import SpecError, SpecValidationError, validate_spec_text
from checks.spec.loader import load_yaml
from evaluations import charts, selectors, services
from evaluations.access import ProjectAccess, project_for, spec_in
from evaluations.markup import escape
from evaluations.models import Role, Run, Spec, SpecVersion, Trigger
from evaluations.numbers import whole_number
from evaluations.templatetags.keystone import fixed, iso, local_minute, percent
from evaluations.views.htmx import is_htmx, page_or_region, refusal_status

# A valid spec to start from on the "New spec" page.
NEW_SPEC_TEMPLATE = """\
version: 1
id: my-agent
description: "What this agent does"
task:
  prompt: "Say hello"
agent:
  type: command
  command: "echo hello"
invariants:
  greets:
    description: "The answer greets"
    check: {type: contains, value: hello}
"""

SPEC_UPLOAD_MAX_BYTES = 1024 * 1024
RUN_REPLICAS_MAX = 100
INVARIANT_LINES_MAX = 12  # lines in the per-invariant chart; the table has them all


# --- List and detail ----------------------------------------------------------------------


@login_required
def spec_version_download(
    request: HttpRequest, project_slug: str, spec_slug: str, number: int
) -> HttpResponse:
    """One version's text exactly as stored, saved as <spec>.yaml: the file the execution
    page's reproduce command runs."""
    access = project_for(request, project_slug)
    spec = spec_in(access.project, spec_slug)
    version = SpecVersion.objects.filter(spec=spec, number=number).first()
    if version is None:
        raise Http404(f"{spec.slug} has no version {number}.")
    response = HttpResponse(version.source_yaml, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{spec_slug}.yaml"'
    return response


@login_required
def spec_list(request: HttpRequest, project_slug: str) -> HttpResponse:
    access = project_for(request, project_slug)
    context = {"access": access, "rows": selectors.spec_rows(access.project)}
    return render(request, page_or_region(request, "specs/list.html", "spec-table"), context)


@dataclass
class RunForm:
    """What the "Run" form holds: the values typed (kept on errors) and every error."""

    replicas: str = ""
    scenarios: tuple[str, ...] = ()
    labels: str = ""
    version: str = ""
    errors: tuple[str, ...] = ()


def _scenario_names(version: SpecVersion | None) -> list[str]:
    if version is None:
        return []
    matrix = version.parsed.get("chaos_matrix") or [{"name": "no-chaos"}]
    return [str(s.get("name")) for s in matrix if isinstance(s, dict) and s.get("name")]


def _detail_context(
    access: ProjectAccess, spec: Spec, run_form: RunForm | None = None
) -> dict[str, Any]:
    latest = selectors.spec_latest_version(spec)
    versions = selectors.spec_versions(spec)
    runs = selectors.latest_runs(access.project, spec=spec, limit=selectors.SPEC_RUNS)
    charts.link_run_rows(runs, access.project.slug)
    return {
        "access": access,
        "spec": spec,
        "latest": latest,
        "versions": versions,
        "runs": runs,
        "scenario_names": _scenario_names(latest),
        "run_form": run_form or RunForm(version=str(latest.number) if latest else ""),
        "replicas_max": RUN_REPLICAS_MAX,
    }


@login_required
def spec_detail(request: HttpRequest, project_slug: str, spec_slug: str) -> HttpResponse:
    """Versions, the latest YAML, diffs, the spec's runs and the "Run" form. An htmx request
    gets the runs table."""
    access = project_for(request, project_slug)
    spec = spec_in(access.project, spec_slug)
    context = _detail_context(access, spec)
    return render(request, page_or_region(request, "specs/detail.html", "spec-runs"), context)


# --- Diff -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One line of a unified diff between two spec versions, with its kind for styling."""

    kind: str  # header | hunk | added | removed | context
    text: str


def unified_diff(old: str, new: str, *, old_name: str, new_name: str) -> list[DiffLine]:
    lines = difflib.unified_diff(
        old.splitlines(), new.splitlines(), fromfile=old_name, tofile=new_name, lineterm=""
    )
    result = []
    for line in lines:
        if line.startswith(("---", "+++")):
            kind = "header"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "added"
        elif line.startswith("-"):
            kind = "removed"
        else:
            kind = "context"
        result.append(DiffLine(kind, line))
    return result


def _version_number(request: HttpRequest, name: str) -> int | None:
    """A version number from the query string; None when absent, ValueError when bad."""
    raw = request.GET.get(name, "").strip().lstrip("v")
    if not raw:
        return None
    number = whole_number(raw)
    if number is None or number < 1:
        raise ValueError(f"{name}={request.GET.get(name)!r} is not a version number (1, 2, ...)")
    return number


@login_required
def spec_diff(request: HttpRequest, project_slug: str, spec_slug: str) -> HttpResponse:
    """Unified diff of version `a` against version `b` (?a=1&b=2; by default the latest
    against the one before). A number that is no version of this spec is a 404."""
    access = project_for(request, project_slug)
    spec = spec_in(access.project, spec_slug)
    versions = selectors.spec_versions(spec)
    context: dict[str, Any] = {"access": access, "spec": spec, "versions": versions}
    try:
        a = _version_number(request, "a")
        b = _version_number(request, "b")
    except ValueError as exc:
        context.update(error=str(exc), lines=[], a=None, b=None)
        return render(
            request,
            page_or_region(request, "specs/diff.html", "diff"),
            context,
            status=refusal_status(request, 400),
        )
    latest_number = versions[0]["number"] if versions else None
    if b is None:
        b = latest_number
    if a is None and b is not None:
        a = b - 1 if b > 1 else b
    if a is None or b is None:
        raise Http404("This spec has no versions.")
    texts = selectors.spec_version_texts(spec, [a, b])
    for number in (a, b):
        if number not in texts:
            raise Http404(f"{spec.slug} has no version {number}.")
    context.update(
        a=a,
        b=b,
        lines=unified_diff(texts[a], texts[b], old_name=f"v{a}", new_name=f"v{b}"),
        error="",
    )
    return render(request, page_or_region(request, "specs/diff.html", "diff"), context)


# --- Editor and live validation -------------------------------------------------------------


def _id_mismatch(source: str, data: dict[str, Any], spec: Spec) -> SpecError | None:
    """Editing spec X with a text whose `id` is Y would silently create another spec."""
    if data.get("id") == spec.slug:
        return None
    where = load_yaml(source).mark_for(("id",))
    return SpecError(
        "id",
        f"this page edits {spec.slug!r}: the id must stay {spec.slug!r} "
        f"(to start another spec, use New spec)",
        where.line,
        where.column,
    )


def _spec_errors(source: str, spec: Spec | None, name: str) -> list[SpecError]:
    data, errors = validate_spec_text(source, source=name)
    if not errors and data is not None and spec is not None:
        mismatch = _id_mismatch(source, data, spec)
        if mismatch is not None:
            errors = [mismatch]
    return errors


def _normalise(text: str) -> str:
    # Browsers send textarea lines with CRLF; the same spec must hash the same when uploaded.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _submitted_source(request: HttpRequest) -> tuple[str, str, list[SpecError]]:
    """(text, source name, decoding errors) from the uploaded file if there is one, else
    from the textarea."""
    upload = request.FILES.get("file")
    if upload is None:
        return _normalise(request.POST.get("source", "")), "spec.yaml", []
    name = upload.name or "spec.yaml"
    if upload.size is not None and upload.size > SPEC_UPLOAD_MAX_BYTES:
        limit = SPEC_UPLOAD_MAX_BYTES // 1024
        return "", name, [SpecError("", f"{name} is larger than {limit} KiB", None, None)]
    raw = upload.read()
    try:
        return _normalise(raw.decode("utf-8-sig")), name, []
    except UnicodeDecodeError:
        # The validator reports where the bad byte is (line and column).
        _, errors = validate_spec_text(raw, source=name)
        return "", name, errors


@login_required
@require_http_methods(["GET", "POST"])
def spec_edit(
    request: HttpRequest, project_slug: str, spec_slug: str | None = None
) -> HttpResponse:
    """A new spec, or a new version of this one: upload a file or edit the YAML here. An
    invalid text is shown again with every error at its line; nothing is stored."""
    access = project_for(request, project_slug, Role.EDITOR)
    spec = spec_in(access.project, spec_slug) if spec_slug else None
    latest = selectors.spec_latest_version(spec) if spec else None
    errors: list[SpecError] = []
    status = 200
    # The version the text on the page was edited from: saving it after someone else saved
    # a newer one is refused (SpecVersionConflict) rather than silently undoing theirs.
    base = latest.number if latest is not None else None
    if request.method == "POST":
        # Not a version number (a form from before this field, or tampered with): no check.
        base = whole_number(request.POST.get("base"))
        source, name, errors = _submitted_source(request)
        if not errors:
            errors = _spec_errors(source, spec, name)
        if not errors:
            saved_from = timezone.now()
            try:
                version = services.spec_version_create(
                    project=access.project,
                    source_yaml=source,
                    author=request.user,
                    source_name=name,
                    # A spec read from files (CLI, demo) keeps its directory: its relative
                    # paths (sandbox.workspace: ../agents) resolve as they did.
                    base_dir=latest.base_dir if latest is not None else "",
                    based_on=base if spec is not None else None,
                )
            except SpecValidationError as exc:
                errors = exc.errors
            except services.SpecVersionConflict as exc:
                errors = [SpecError("", str(exc), None, None)]
                # Saving again is a decision taken knowing the newer version: it goes through.
                latest, base = exc.latest, exc.latest.number
            else:
                if version.created < saved_from:
                    messages.info(
                        request, f"No change: the text is version {version.number} already."
                    )
                else:
                    messages.success(
                        request, f"Saved {version.spec.slug} version {version.number}."
                    )
                url = reverse("spec_detail", args=[access.project.slug, version.spec.slug])
                if is_htmx(request):
                    return HttpResponseClientRedirect(url)
                return redirect(url)
        status = refusal_status(request, 422)
    else:
        source = latest.source_yaml if latest else NEW_SPEC_TEMPLATE
    context = {
        "access": access,
        "spec": spec,
        "latest": latest,
        "base": base,
        "source": source,
        "errors": errors,
        "checked": request.method == "POST",
        "upload_max_kib": SPEC_UPLOAD_MAX_BYTES // 1024,
    }
    return render(
        request, page_or_region(request, "specs/edit.html", "editor"), context, status=status
    )


@login_required
@require_POST
def spec_validate(request: HttpRequest, project_slug: str) -> HttpResponse:
    """Live validation for the editor (htmx, as you type): every error with its line,
    column and YAML path, or "valid"."""
    access = project_for(request, project_slug, Role.EDITOR)
    expected = request.POST.get("spec", "").strip()
    spec = spec_in(access.project, expected) if expected else None
    source = _normalise(request.POST.get("source", ""))
    context = {
        "access": access,
        "errors": _spec_errors(source, spec, "spec.yaml"),
        "checked": True,
    }
    return render(request, "specs/edit.html#validation", context)


# --- Run form -------------------------------------------------------------------------------


def parse_labels(text: str) -> dict[str, str]:
    """`key=value` lines (blank lines and `#` comments skipped); ValueError names the line."""
    labels: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"labels line {number}: expected key=value, got {line!r}")
        labels[key.strip()] = value.strip()
    return labels


def _read_run_form(request: HttpRequest) -> RunForm:
    return RunForm(
        replicas=request.POST.get("replicas", "").strip(),
        scenarios=tuple(request.POST.getlist("scenarios")),
        labels=request.POST.get("labels", ""),
        version=request.POST.get("version", "").strip(),
    )


@login_required
@require_POST
def spec_run(request: HttpRequest, project_slug: str, spec_slug: str) -> HttpResponse:
    """Start a run of the spec (its latest version, or the one chosen) with overrides:
    replicas, a subset of the chaos_matrix scenarios, labels. Then go to the run's page."""
    access = project_for(request, project_slug, Role.EDITOR)
    spec = spec_in(access.project, spec_slug)
    form = _read_run_form(request)
    errors: list[str] = []
    version = None
    if form.version:
        number = whole_number(form.version)
        if number is not None:
            version = SpecVersion.objects.filter(spec=spec, number=number).first()
        if version is None:
            errors.append(f"version: {spec.slug} has no version {form.version!r}")
    else:
        version = selectors.spec_latest_version(spec)
        if version is None:
            errors.append(f"version: {spec.slug} has no version to run")
    replicas: int | None = None
    if form.replicas:
        replicas = whole_number(form.replicas)
        if replicas is None or not 1 <= replicas <= RUN_REPLICAS_MAX:
            errors.append(f"replicas: expected a whole number from 1 to {RUN_REPLICAS_MAX}")
            replicas = None
    try:
        labels = parse_labels(form.labels)
    except ValueError as exc:
        errors.append(str(exc))
        labels = {}
    run: Run | None = None
    if not errors and version is not None:
        try:
            run = services.run_create(
                spec_version=version,
                trigger=Trigger.WEB,
                labels=labels,
                replicas=replicas,
                scenarios=list(form.scenarios) or None,
                created_by=request.user,
            )
        except services.RunLabelError as exc:  # it names the label
            errors.append(str(exc))
        except ValueError as exc:  # an unknown scenario name
            errors.append(f"scenarios: {exc}")
    if run is None:
        form.errors = tuple(errors)
        context = _detail_context(access, spec, run_form=form)
        template = page_or_region(request, "specs/detail.html", "run-form")
        return render(request, template, context, status=refusal_status(request, 400))
    url = reverse("run_detail", args=[access.project.slug, run.pk])
    if is_htmx(request):
        return HttpResponseClientRedirect(url)
    return redirect(url)


# --- Trends ---------------------------------------------------------------------------------


def _label_filter(raw: str) -> tuple[str, str] | None:
    raw = raw.strip()
    if not raw:
        return None
    key, sep, value = raw.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"label={raw!r}: expected key=value, e.g. env=staging")
    return key.strip(), value.strip()


def _trend_table_row(row: dict[str, Any]) -> SafeString:
    """A row of the trends page's run table as its template loop wrote it: ten values a
    row (lookups, filters, escaping) over 100 rows were the largest part of the page's
    rendering. The branch is escaped; the rest are numbers, dates and a path."""
    cost = f"${fixed(row['cost_usd'], 4)}" if row["cost_usd"] is not None else "—"
    p95 = f"{fixed(row['p95_duration_ms'], 0)} ms" if row["p95_duration_ms"] is not None else "—"
    return mark_safe(  # noqa: S308 - the branch and the path are escaped
        "\n                <tr>\n"
        f'                  <td><a href="{escape(row["url"])}">#{row["id"]}</a></td>\n'
        f"                  <td>v{row['spec_version__number']}</td>\n"
        f"                  <td>{escape(row['branch'] or '—')}</td>\n"
        f'                  <td><time datetime="{iso(row["created"])}">'
        f"{local_minute(row['created'])}</time></td>\n"
        f'                  <td class="num">{fixed(row["resilience"], 1) or "—"}</td>\n'
        f'                  <td class="num">{percent(row["pass_rate"]) or "—"}</td>\n'
        f'                  <td class="num">{fixed(row["judge_mean"], 2) or "—"}</td>\n'
        f'                  <td class="num">{cost}</td>\n'
        f'                  <td class="num">{p95}</td>\n'
        "                </tr>\n              "
    )


@login_required
def spec_trends(request: HttpRequest, project_slug: str, spec_slug: str) -> HttpResponse:
    """Resilience, pass rate, judge average, cost and p95 latency over the spec's last
    TREND_RUNS completed runs, and each invariant's pass rate; filter by branch and label.
    An htmx request (the filter form) gets the charts and table only."""
    access = project_for(request, project_slug)
    spec = spec_in(access.project, spec_slug)
    branch = request.GET.get("branch", "").strip()
    label_text = request.GET.get("label", "").strip()
    error = ""
    try:
        label = _label_filter(label_text)
    except ValueError as exc:
        error, label = str(exc), None
    rows = selectors.spec_trend_runs(spec, branch=branch, label=label)
    link = charts.run_links(access.project.slug)
    for row in rows:
        row["url"] = link(row)
    # One line per branch (runs without one together), and marks where the spec version
    # changed or a baseline was promoted.
    lines: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        lines.setdefault(row["branch"] or "no branch", []).append(row)
    marks = [
        charts.Mark(x=when, text=text, color="#1a7f37" if kind == "baseline" else "#6b7280")
        for when, text, kind in selectors.spec_trend_marks(spec, rows)
    ]
    metric_charts = [
        charts.Chart(
            id=f"trend-{metric.replace('_', '-')}",
            title=charts.METRIC_AXES[metric]["title"],
            figure=charts.metric_trend(lines, metric, link_for=link, height=240, marks=marks),
        )
        for metric in selectors.TREND_METRICS
    ]
    invariant_rates = selectors.invariant_pass_rates(rows)
    invariant_chart = charts.Chart(
        id="trend-invariants",
        title="Pass rate per invariant",
        figure=charts.lines_over_runs(
            dict(list(invariant_rates.items())[:INVARIANT_LINES_MAX]),
            rows,
            link_for=link,
            y_title="Pass rate",
            y_range=(0, 1.02),
            y_format=".0%",
            height=320,
        ),
    )
    latest_rates = {
        invariant: next((r for r in reversed(rates) if r is not None), None)
        for invariant, rates in invariant_rates.items()
    }
    context = {
        "access": access,
        "spec": spec,
        "branch": branch,
        "label": label_text,
        "error": error,
        "branches": selectors.spec_branches(spec),
        "rows": list(reversed(rows)),  # newest first
        "table_rows": [_trend_table_row(row) for row in reversed(rows)],  # newest first
        "metric_charts": metric_charts,
        "invariant_chart": invariant_chart,
        "invariant_latest": latest_rates,
        "invariants_hidden": max(0, len(invariant_rates) - INVARIANT_LINES_MAX),
        "trend_runs": selectors.TREND_RUNS,
    }
    status = refusal_status(request, 400) if error else 200
    return render(
        request, page_or_region(request, "specs/trends.html", "trends"), context, status=status
    )
