"""Replicas and scheduled jobs pages. Reads through selectors, writes through services.

Both pages poll themselves with htmx (``hx-trigger="every …"``) and are
complete without JavaScript. Coordination state is deployment-wide (not
tenant data): any member may see the replicas; the jobs page is for admins.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render

from botmesh_admin.coordination import selectors, services
from botmesh_admin.coordination.domain import CATCH_UP_POLICIES
from botmesh_admin.errors import BadRequest, DomainError, PermissionDenied, ValidationError
from botmesh_admin.formerrors import FormError, form_error
from botmesh_admin.tenancy.decorators import page_principal, render_error, tenant_page
from botmesh_admin.timefmt import format_instant

REPLICAS_POLL_S = 2
JOBS_POLL_S = 5


def _when(ms: int | None) -> str:
    """The pages' one time format, in the tenant's zone (``timefmt.format_instant``); ``—`` for none."""
    return format_instant(ms) or "—"


def _relative(ms: int | None, now: int) -> str:
    if ms is None:
        return ""
    delta = (ms - now) / 1000
    amount = abs(delta)
    text = (
        f"{amount:.0f} s" if amount < 120 else f"{amount / 60:.0f} min" if amount < 7200 else f"{amount / 3600:.0f} h"
    )
    return f"in {text}" if delta >= 0 else f"{text} ago"


def _age_class(age_ms: int, lease_ms: int) -> str:
    return "ok" if age_ms <= lease_ms / 2 else "warn" if age_ms <= lease_ms else "bad"


def _bot_context(bot: selectors.BotReplicas, default_lease_ms: int) -> dict[str, Any]:
    leads_by_owner: dict[tuple[str, str], list[str]] = {}
    for leader in bot.leaders:
        leads_by_owner.setdefault((leader.replica_id, leader.incarnation), []).append(leader.name)
    replicas = []
    for r in bot.replicas:
        lease = r.lease_ms or default_lease_ms
        leads = leads_by_owner.get((r.replica_id, r.incarnation), [])
        replicas.append(
            {
                "r": r,
                "age_s": f"{r.age_ms / 1000:.1f}",
                "age_class": _age_class(r.age_ms, lease),
                "lease_ms": lease,
                "leads": leads,
                "responding": bot.responding(r),
            }
        )
    silent = sum(1 for row in replicas if not row["responding"])
    return {
        "b": bot,
        "replicas": replicas,
        "responding_count": len(replicas) - silent,
        "silent_count": silent,
        "events": [{"e": e, "at": _when(e.at_ms)} for e in bot.events[:30]],
    }


def _bot_filter(value: str | None) -> str | None:
    """Return the Replicas page's ``?bot=`` filter, or raise ``BadRequest`` (400) naming it, as the other lists do.

    A bot id is what the replicas API and the metrics page take (``validate_bot_id``: any Unicode text of
    1-63 characters); the deployments registry's slug rule refused ids the page itself listed.
    """
    from botmesh_admin.observability.domain import validate_bot_id

    if value is None:
        return None
    try:
        return validate_bot_id(value)
    except ValidationError as exc:
        raise BadRequest(f"{exc.message} (remove it from the address to see every bot)", field="bot") from None


@tenant_page("agent")
def replicas(request: HttpRequest, tenant: str) -> HttpResponse:
    """Each bot's replicas, leaders, turns and events; below, the admin's own processes.

    ``?bot=<id>`` shows that bot alone (also one that pushes no metrics yet).
    """
    from botmesh_admin.coordination.bots import backend_label, coordination_url
    from botmesh_admin.coordination.runtime import coordination_settings

    only = _bot_filter(request.GET.get("bot") or None)
    _, prefix, lease_ms = coordination_settings()
    try:
        bots = selectors.bot_replicas_list(tenant, bot=only)
    except ValidationError as exc:
        return render_error(request, exc)
    try:
        snapshot = selectors.coordination_snapshot()
        problem = None
    except DomainError as exc:  # Redis unreachable: say so instead of failing the page
        snapshot, problem = None, exc.message
    context: dict[str, Any] = {
        "tenant": tenant,
        "only": only,
        "bots": [_bot_context(b, lease_ms) for b in bots],
        "bot_backend": backend_label(coordination_url()),
        "snapshot": snapshot,
        "problem": problem,
        "poll_s": REPLICAS_POLL_S,
        "backend": backend_label(coordination_url()),  # the admin's own processes use the same service
        "prefix": prefix,
        "lease_ms": lease_ms,
        "replicas": [
            {"r": r, "age_s": f"{r.age_ms / 1000:.1f}", "age_class": _age_class(r.age_ms, lease_ms)}
            for r in (snapshot.replicas if snapshot else [])
        ],
        "events": [{"e": e, "at": _when(e.at_ms)} for e in (snapshot.events[:30] if snapshot else [])],
    }
    template = "dashboard/_replicas.html" if request.headers.get("HX-Request") else "dashboard/replicas.html"
    return render(request, template, context)


class JobForm(forms.Form):
    """The editable part of a job (shape only; the rules live in ``services.job_update``)."""

    kind = forms.ChoiceField(choices=[("interval", "interval"), ("crontab", "crontab")])
    every_s = forms.IntegerField(required=False)
    crontab = forms.CharField(required=False, max_length=200)
    enabled = forms.BooleanField(required=False)
    catch_up = forms.ChoiceField(choices=[(p, p) for p in CATCH_UP_POLICIES])
    catch_up_window_s = forms.IntegerField(min_value=0)
    version = forms.IntegerField(min_value=0, widget=forms.HiddenInput)


def _occurrence(o: selectors.OccurrenceRow) -> dict[str, Any]:
    """An occurrence as the jobs page shows it, with the runs that lost it (superseded)."""
    return {
        "o": o,
        "at": _when(o.scheduled_ms),
        "superseded": [{"run": run, "at": _when(run.at_ms)} for run in o.superseded],
    }


JOB_FIELDS = {
    "schedule.crontab": "crontab",
    "schedule.every_s": "every_s",
    "schedule": "kind",
    "catch_up": "catch_up",
    "job.catch_up": "catch_up",
    "catch_up_window_s": "catch_up_window_s",
}
"""The job form's inputs by the domain field path a refusal names (``botmesh_admin.formerrors``)."""


JOBS_NEED_SUPERUSER = "scheduled jobs run for every tenant of the installation: only a superuser changes them"


def _job_context(tenant: str, refused: FormError | None = None, *, can_edit: bool = False) -> dict[str, Any]:
    now = services.now_ms()
    rows = selectors.job_list(at_ms=now)
    return {
        "tenant": tenant,
        "can_edit": can_edit,
        "read_only_reason": JOBS_NEED_SUPERUSER,
        "poll_s": JOBS_POLL_S,
        "form_error": refused,
        "policies": CATCH_UP_POLICIES,
        "rows": [
            {
                "row": row,
                "next": _when(row.next_ms),
                "next_rel": _relative(row.next_ms, now),
                "last": [_occurrence(o) for o in row.last],
            }
            for row in rows
        ],
        "recent": [_occurrence(o) for o in selectors.occurrence_list(limit=20)],
    }


@tenant_page("admin")
def jobs(request: HttpRequest, tenant: str) -> HttpResponse:
    """Scheduled jobs: schedule, next and last occurrences with their outcomes, and edit forms."""
    template = "dashboard/_jobs.html" if request.headers.get("HX-Request") else "dashboard/jobs.html"
    return render(request, template, _job_context(tenant, can_edit=request.user.is_superuser))


@tenant_page("admin")
def job_edit(request: HttpRequest, tenant: str, job_id: str) -> HttpResponse:
    """Save a job's schedule, enabled flag and catch-up policy (compare-and-set on its version).

    A superuser only: a job runs for every tenant, so a tenant's admin gets the 403 page.

    A GET (the form's address opened as a page) is the 405 page saying the address is a button's, as
    for every form (README), or the 404 page for a job that is not declared.
    """
    if request.method != "POST":
        selectors.job_get(job_id)
        return HttpResponseNotAllowed(["POST"])
    if not request.user.is_superuser:
        # A job runs for every tenant of the installation: a tenant's admin sees it, only an operator changes it.
        selectors.job_get(job_id)
        return render_error(request, PermissionDenied(JOBS_NEED_SUPERUSER))
    form = JobForm(request.POST)
    if not form.is_valid():
        field, problems = next(iter(form.errors.items()))
        refused = form_error(ValidationError(field, problems[0]), form=job_id, fields=JOB_FIELDS, typed=request.POST)
        return render(request, "dashboard/jobs.html", _job_context(tenant, refused, can_edit=True), status=422)
    data = form.cleaned_data
    try:
        services.job_update(
            job_id,
            every_s=data["every_s"] if data["kind"] == "interval" else None,
            crontab=data["crontab"] if data["kind"] == "crontab" else None,
            enabled=data["enabled"],
            catch_up=data["catch_up"],
            catch_up_window_s=data["catch_up_window_s"],
            expected_version=data["version"],
            actor=page_principal(request).actor,
        )
    except ValidationError as exc:
        refused = form_error(exc, form=job_id, fields=JOB_FIELDS, typed=request.POST)
        return render(request, "dashboard/jobs.html", _job_context(tenant, refused, can_edit=True), status=422)
    except DomainError as exc:
        return render_error(request, exc)
    messages.success(request, f"Job {job_id} saved.")
    return redirect("dashboard:jobs", tenant=tenant)
