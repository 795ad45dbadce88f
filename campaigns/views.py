"""Campaign admin pages: the list, the editor with its preview, and a campaign's progress and deliveries.

Pages read without JavaScript; htmx adds the live preview in the editor, the
progress bar that polls while a campaign runs, and the deliveries filter.
Views call services and selectors only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from botmesh_admin import confirmation
from botmesh_admin.errors import DomainError, NotFound, ValidationError
from botmesh_admin.formerrors import check_all, error_text, form_error
from botmesh_admin.tenancy.decorators import (
    list_query_checked,
    page_principal,
    render_error,
    tenant_page,
)

from . import selectors, services
from .domain import (
    CHANNELS,
    DELIVERY_STATES,
    OUTCOMES,
    Campaign,
    message_from_input,
    validate_channel,
    validate_channel_name,
    validate_name,
    validate_rate,
)

LIVE_STATES = ("scheduled", "running")
# Actions that cannot be undone ask first (botmesh_admin.confirmation): question, what happens, the button.
ASKED_ACTIONS = {
    "cancel": (
        "Cancel the campaign {name!r}?",
        "Nobody else gets it: every recipient not sent to yet is cancelled. Messages already sent stay sent.",
        "Cancel the campaign",
    ),
    "delete": (
        "Delete the campaign {name!r}?",
        "The campaign and its delivery records go for good; messages already sent stay sent.",
        "Delete the campaign",
    ),
}
# States whose deliveries are counted on the list page (one O(1) read of the count index each).
COUNTED_STATES = ("running", "paused", "completed", "failed", "cancelled")
POLL_S = 2  # how often a live campaign's page asks for its progress


def _is_htmx(request: HttpRequest) -> bool:
    return bool(request.headers.get("HX-Request"))


def _segments(tenant: str) -> list[Any]:
    from crm.selectors import segment_list

    return segment_list(tenant)


def _segment_or_none(tenant: str, segment_id: str) -> Any:
    """Return the campaign's segment, or ``None`` if it was deleted (the page says so, not the bare id)."""
    from crm.selectors import segment_get

    try:
        return segment_get(tenant, segment_id)
    except NotFound:
        return None


def _channel_configs(tenant: str) -> list[Any]:
    from botmesh_admin.channels.selectors import channel_config_list

    return channel_config_list(tenant)


def message_from_form(data: Any) -> dict[str, Any]:
    """Return the message fields of the editor: a template with one parameter per line, or a text."""
    channel = data.get("channel", "")
    if channel == "whatsapp":
        params = [line.strip() for line in data.get("parameters", "").splitlines() if line.strip()]
        return {
            "template": data.get("template", "").strip(),
            "language": data.get("language", "").strip() or "en_US",
            "parameters": params,
        }
    return {"text": data.get("text", "")}


def _form_of(c: Campaign) -> dict[str, Any]:
    return {
        "name": c.name,
        "segment_id": c.segment_id,
        "channel": c.channel,
        "channel_name": c.channel_name or "",
        "template": c.message.template or "",
        "language": c.message.language,
        "parameters": "\n".join(c.message.parameters),
        "text": c.message.text or "",
        "rate_per_s": "" if c.rate_per_s is None else f"{c.rate_per_s:g}",
    }


def _rate(data: Any) -> float | None:
    raw = data.get("rate_per_s", "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValidationError("campaign.rate_per_s", "must be a number of messages per second") from None


def _check_form(tenant: str, data: Any) -> None:
    """Refuse every bad input of the editor at once (``formerrors.FieldErrors``), before a preview or a save.

    The same checks the service makes, one per input, so a person sees each mistake under its input
    (the name, the segment, the channel, the message, the sending channel, the rate) in one answer.
    """
    channel = data.get("channel", "")
    check_all(
        lambda: validate_name(data.get("name", "")),
        lambda: services.validate_segment(tenant, data.get("segment_id", "")),
        lambda: validate_channel(channel),
        # The message's rules depend on the channel: checked only once the channel is one.
        lambda: channel in CHANNELS and message_from_input(message_from_form(data), channel),
        lambda: validate_channel_name(data.get("channel_name") or None),
        lambda: validate_rate(_rate(data)),
    )


def _preview_of(tenant: str, data: Any) -> Any:
    """Return the plan of the editor's segment, channel and sending channel (``Send with``), if chosen."""
    channel = data.get("channel", "")
    return selectors.campaign_plan(
        tenant, segment_id=data.get("segment_id", ""), channel=channel, channel_name=data.get("channel_name") or None
    )


@tenant_page("agent")
def campaign_list(request: HttpRequest, tenant: str) -> HttpResponse:
    """Every campaign with its state; running ones with their progress, finished ones with their final counts.

    Counts are the deliveries' count index (``selectors.campaign_progress``): one O(1) read per row.
    """
    after = request.GET.get("after") or None
    state = request.GET.get("state") or None
    with list_query_checked():  # ?state=bogus or a bad cursor: a 400 page naming it
        page = selectors.campaign_list(tenant, limit=50, after=after, state=state)
    rows = [
        (c, selectors.campaign_progress(tenant, c.id).counts if c.state in COUNTED_STATES else None) for c in page.items
    ]
    return render(
        request,
        "campaigns/list.html",
        {
            "tenant": tenant,
            "rows": rows,
            "next": page.next,
            "is_admin": page_principal(request).can("admin"),
            "state": state or "",
        },
    )


CAMPAIGN_FIELDS = {
    "campaign.name": "name",
    "campaign.segment_id": "segment_id",
    "campaign.channel": "channel",
    "campaign.channel_name": "channel_name",
    "campaign.rate_per_s": "rate_per_s",
    "campaign.message.template": "template",
    "campaign.message.language": "language",
    "campaign.message.parameters": "parameters",
    "campaign.message.text": "text",
}
"""The editor's inputs by the domain field path a refusal names (``botmesh_admin.formerrors``)."""


@tenant_page("admin")
def campaign_editor(request: HttpRequest, tenant: str, campaign_id: str | None = None) -> HttpResponse:
    """Create a campaign, or edit a draft: segment, channel, message; ``Preview`` shows the drop counts."""
    current = selectors.campaign_get(tenant, campaign_id) if campaign_id else None
    if current is not None and current.state != "draft":
        messages.error(request, f"A {current.state} campaign cannot be edited.")
        return redirect("campaigns:detail", tenant=tenant, campaign_id=current.id)
    form: Any = request.POST if request.method == "POST" else (_form_of(current) if current else {})
    preview = error = None
    configs = _channel_configs(tenant)
    if request.method == "POST":
        try:
            _check_form(tenant, request.POST)
            if request.POST.get("action") == "preview":
                preview = _preview_of(tenant, request.POST)
            else:
                campaign = _save(request, tenant, current)
                messages.success(request, f"Campaign {campaign.name!r} saved as a draft.")
                return redirect("campaigns:detail", tenant=tenant, campaign_id=campaign.id)
        except DomainError as exc:
            error = form_error(exc, form="campaign", fields=CAMPAIGN_FIELDS, typed=request.POST)
    return render(
        request,
        "campaigns/editor.html",
        {
            "tenant": tenant,
            "campaign": current,
            "form": form,
            "preview": preview,
            "form_error": error,
            "segments": _segments(tenant),
            "channels": CHANNELS,
            "configs": configs,
            "kinds": {c.kind for c in configs},
        },
        status=error.status if error else 200,
    )


def _save(request: HttpRequest, tenant: str, current: Campaign | None) -> Campaign:
    data = request.POST
    fields = {
        "name": data.get("name", ""),
        "segment_id": data.get("segment_id", ""),
        "channel": data.get("channel", ""),
        "message": message_from_form(data),
        "channel_name": data.get("channel_name") or None,
        "rate_per_s": _rate(data),
    }
    if current is None:
        return services.campaign_create(tenant, **fields, actor=page_principal(request).actor)
    return services.campaign_update(tenant, current.id, expected_version=int(data.get("version", "0") or 0), **fields)


@require_POST
@tenant_page("admin")
def campaign_preview(request: HttpRequest, tenant: str) -> HttpResponse:
    """The editor's live preview (htmx, on a change of the form): recipients now, and the contacts left out by reason.

    Nothing to show until a segment is chosen; a refusal in plain words (``formerrors.error_text``), never
    the API's path. The Preview button submits the whole form instead (``campaign_editor``: every field checked).
    """
    if not request.POST.get("segment_id"):
        return render(request, "campaigns/_preview.html", {})
    try:
        plan = _preview_of(tenant, request.POST)
    except DomainError as exc:
        return render(request, "campaigns/_preview.html", {"error": exc})
    return render(request, "campaigns/_preview.html", {"preview": plan})


@tenant_page("agent")
def campaign_detail(request: HttpRequest, tenant: str, campaign_id: str) -> HttpResponse:
    """A campaign: its message, actions, progress (polled while live), counts by reason and deliveries."""
    progress = selectors.campaign_progress(tenant, campaign_id)
    campaign = progress.campaign
    context = {
        "tenant": tenant,
        "campaign": campaign,
        "counts": progress.counts,
        "live": campaign.state in LIVE_STATES,
        "poll_s": POLL_S,
        "outcomes": OUTCOMES,
        "is_admin": page_principal(request).can("admin"),
    }
    if _is_htmx(request) and request.GET.get("part") == "progress":
        response = render(request, "campaigns/_progress.html", context)
        if request.GET.get("was") and request.GET["was"] != campaign.state:
            # The state changed under the page (running → completed, paused, failed…): reload it once, so the
            # actions, the header and the deliveries table match; a page that is no longer live stops polling.
            response["HX-Refresh"] = "true"
        return response
    context["segment"] = _segment_or_none(tenant, campaign.segment_id)
    if campaign.plan is None and campaign.state == "draft":
        try:
            context["preview"] = selectors.campaign_plan_of(tenant, campaign_id)
        except DomainError as exc:
            context["preview_error"] = exc
    context.update(_deliveries_context(request, tenant, campaign_id))
    refused = getattr(request, "form_error", None)  # a refused schedule, shown by campaign_action
    context["form_error"] = refused
    return render(request, "campaigns/detail.html", context, status=refused.status if refused else 200)


def _deliveries_context(request: HttpRequest, tenant: str, campaign_id: str) -> dict[str, Any]:
    state = request.GET.get("state") or None
    reason = request.GET.get("reason") or None
    with list_query_checked():  # ?state=bogus or a bad cursor: a 400 page naming it
        page = selectors.delivery_list(
            tenant, campaign_id, limit=50, after=request.GET.get("after") or None, state=state, reason=reason
        )
    return {
        "deliveries": page,
        "contacts": _contacts_of(tenant, page.items),
        "filter_state": state or "",
        "filter_reason": reason or "",
        "delivery_states": DELIVERY_STATES,
    }


@tenant_page("agent")
def delivery_table(request: HttpRequest, tenant: str, campaign_id: str) -> HttpResponse:
    """The deliveries table, filtered by state and reason (the htmx fragment, or the whole page)."""
    if not _is_htmx(request):
        return campaign_detail(request, tenant, campaign_id)
    campaign = selectors.campaign_get(tenant, campaign_id)
    context = {
        "tenant": tenant,
        "campaign": campaign,
        "is_admin": page_principal(request).can("admin"),
        **_deliveries_context(request, tenant, campaign_id),
    }
    return render(request, "campaigns/_deliveries.html", context)


def _contacts_of(tenant: str, deliveries: list[Any]) -> dict[str, Any]:
    """Return the page's contacts by id (one ``get_many``, O(page)); an erased contact is absent."""
    from crm.selectors import contact_get_many

    return contact_get_many(tenant, [d.contact_id for d in deliveries])


def _scheduled_at(value: str) -> int:
    """Return epoch ms of a ``datetime-local`` value read in the tenant's zone (the page's active zone)."""
    try:
        when = timezone.make_aware(datetime.fromisoformat(value))
    except ValueError:
        raise ValidationError("scheduled_at", "pick a date and time") from None
    return int(when.timestamp() * 1000)


@require_POST
@tenant_page("admin")
def campaign_action(request: HttpRequest, tenant: str, campaign_id: str, action: str) -> HttpResponse:
    """Start (now or at a time), pause, resume, cancel, delete, or resend deliveries in doubt."""
    actor = page_principal(request).actor
    detail = reverse("campaigns:detail", kwargs={"tenant": tenant, "campaign_id": campaign_id})
    if action in ASKED_ACTIONS and not confirmation.confirmed(request):
        try:
            campaign = selectors.campaign_get(tenant, campaign_id)
        except DomainError as exc:
            return render_error(request, exc)
        question, consequence, button = ASKED_ACTIONS[action]
        return confirmation.confirm_page(
            request,
            question=question.format(name=campaign.name),
            consequences=[consequence],
            button=button,
            cancel_url=detail,
        )
    try:
        if action == "start":
            raw = request.POST.get("scheduled_at", "").strip()
            try:
                campaign = services.campaign_start(
                    tenant, campaign_id, scheduled_at=_scheduled_at(raw) if raw else None, actor=actor
                )
            except ValidationError as exc:
                if exc.field != "scheduled_at":
                    raise
                # The campaign's page again (422), the time picked still in the box, the problem under it.
                request.form_error = form_error(  # type: ignore[attr-defined]
                    exc, form="schedule", fields=["scheduled_at"], typed=request.POST
                )
                return campaign_detail(request, tenant, campaign_id)
            messages.success(request, "Campaign scheduled." if campaign.state == "scheduled" else "Campaign started.")
        elif action == "pause":
            services.campaign_pause(tenant, campaign_id, actor=actor)
            messages.success(request, "Campaign paused: the batch in flight finishes, nothing more leaves.")
        elif action == "resume":
            services.campaign_resume(tenant, campaign_id, actor=actor)
            messages.success(request, "Campaign resumed.")
        elif action == "cancel":
            services.campaign_cancel(tenant, campaign_id, actor=actor)
            messages.success(request, "Campaign cancelled.")
        elif action == "delete":
            services.campaign_delete(tenant, campaign_id)
            messages.success(request, "Campaign deleted.")
            return confirmation.done(request, reverse("campaigns:list", kwargs={"tenant": tenant}))
        elif action == "resend":
            recipients = request.POST.getlist("recipient")
            services.delivery_resend(tenant, campaign_id, recipients=recipients, actor=actor)
            messages.success(request, f"Resending {len(recipients)} deliver{'y' if len(recipients) == 1 else 'ies'}.")
        else:
            raise ValidationError("action", "unknown action")
    except ValidationError as exc:
        messages.error(request, error_text(exc))
    except DomainError as exc:
        if exc.status == 404:
            return render_error(request, exc)
        messages.error(request, error_text(exc))
    return confirmation.done(request, detail)
