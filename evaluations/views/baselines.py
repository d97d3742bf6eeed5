"""A spec's baselines: every promotion (who, when, why, which it replaced) per branch, and
rolling the last promotion of a branch back (editors)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from evaluations import selectors, services
from evaluations.access import project_for, spec_in
from evaluations.models import Role


@login_required
def spec_baselines(request: HttpRequest, project_slug: str, spec_slug: str) -> HttpResponse:
    access = project_for(request, project_slug)
    spec = spec_in(access.project, spec_slug)
    history = selectors.spec_baseline_history(spec.pk)
    active = [b for b in history if b.active]
    context = {"access": access, "spec": spec, "history": history, "active": active}
    return render(request, "specs/baselines.html", context)


@login_required
@require_POST
def spec_baseline_rollback(request: HttpRequest, project_slug: str, spec_slug: str) -> HttpResponse:
    access = project_for(request, project_slug, Role.EDITOR)
    spec = spec_in(access.project, spec_slug)
    branch = request.POST.get("branch", "")
    try:
        restored = services.baseline_rollback(spec_id=spec.pk, branch=branch, user=request.user)
    except services.BaselineError as exc:
        messages.error(request, f"Not rolled back: {exc}.")
    else:
        messages.success(
            request,
            f"Rolled back: {restored.name} is the baseline of {spec.slug} on "
            f"{restored.branch} again.",
        )
    return redirect("spec_baselines", project_slug=project_slug, spec_slug=spec.slug)
