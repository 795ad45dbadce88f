"""``/api/v1/tenants/{tenant}/campaigns`` (ARCHITECTURE §11).

Reads need the agent role; every write (create, edit, delete, start, pause,
resume, cancel, resend) needs admin. Times are epoch milliseconds. Bad input
is 422 with the field path (``scheduled_at`` for a time in the past) and
writes nothing; a stale ``expected_version`` is 409 with ``current_version``;
an action the campaign's state does not allow is 409 ``campaign_state``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from botmesh_admin.api import BodyIn, CursorParams, ErrorOut, Page, one_of, principal, requires

from . import selectors, services
from .domain import CAMPAIGN_STATES, CHANNELS, DELIVERY_STATES, Campaign, Delivery, DeliveryCounts
from .domain.planning import Plan

router = Router(tags=["campaigns"])

ERRORS: dict[int, type[Schema]] = {403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


class MessageIO(Schema):
    text: str | None = Field(None, description="the text (Telegram)")
    template: str | None = Field(None, description="an approved WhatsApp template name")
    language: str = Field("en_US", description="the template's language code")
    parameters: list[str] = Field([], description="the template's body parameters; {name} = the contact's name")


class PlanCountsOut(Schema):
    considered: int
    recipients: int
    dropped: dict[str, int] = Field(..., description="left-out contacts per reason")


class ProgressOut(Schema):
    total: int
    done: int
    percent: int
    states: dict[str, int]
    reasons: dict[str, int] = Field(..., description="per state:reason, e.g. dropped:opted_out, failed:code:131047")


class CampaignOut(Schema):
    id: str
    name: str
    segment_id: str
    channel: str
    channel_name: str | None
    message: MessageIO
    contact_ids: list[str] | None
    rate_per_s: float | None
    state: str
    scheduled_at: int | None
    plan: PlanCountsOut | None
    error: str | None
    created_by: str
    created_at: int
    updated_at: int
    started_at: int | None
    finished_at: int | None
    version: int
    progress: ProgressOut | None = None


class CampaignIn(BodyIn):
    name: str
    segment_id: str
    channel: str = one_of(CHANNELS, description="whatsapp or telegram")
    message: dict[str, Any]
    channel_name: str | None = Field(
        None,
        description="the tenant's channel (WhatsApp number or Telegram bot) that sends; required. A "
        "recipient without a conversation on it is dropped with reason no_conversation_on_channel (a WhatsApp "
        "template may open one)",
    )
    contact_ids: list[str] | None = Field(None, description="only these contacts (each must match the segment)")
    rate_per_s: float | None = Field(None, description="messages per second (default: the channel's)")


class CampaignPatch(BodyIn):
    expected_version: int
    name: str | None = None
    segment_id: str | None = None
    channel: str | None = None
    message: dict[str, Any] | None = None
    channel_name: str | None = None
    contact_ids: list[str] | None = None
    rate_per_s: float | None = None


class PlanIn(BodyIn):
    segment_id: str
    channel: str = one_of(CHANNELS)
    contact_ids: list[str] | None = None
    channel_name: str | None = Field(
        None,
        max_length=63,
        description="the channel (WhatsApp number or Telegram bot) that would send: the "
        "plan then looks up who has no conversation on it (no_conversation)",
    )


class NoConversationOut(Schema):
    channel_name: str = Field(..., description="the sending channel looked at")
    checked: int = Field(..., description="recipients looked up in the inbox now: the first ones, at most 50")
    without_conversation: int = Field(
        ...,
        description="of those checked, how many have no conversation on channel_name: the run drops them "
        "with reason no_conversation_on_channel",
    )
    examples: list[str] = Field(..., description="up to 10 names of recipients checked without a conversation")
    exact: bool = Field(
        ...,
        description="true when every recipient was checked (checked == recipients): without_conversation "
        "is then the run's count; false: only the first were, the others are checked at send time",
    )


class PlanOut(PlanCountsOut):
    examples: dict[str, list[str]] = Field(..., description="up to 10 names per reason (and of recipients)")
    no_conversation: NoConversationOut | None = Field(
        None,
        description="recipients without a conversation on the sending channel (channel_name), who are "
        "counted in recipients but dropped at send time; null when no channel is named or the message needs "
        "none (a WhatsApp template)",
    )


class StartIn(BodyIn):
    scheduled_at: int | None = Field(None, description="epoch ms in the future; omit to start now")


class CampaignFilters(CursorParams):
    state: str | None = one_of(CAMPAIGN_STATES, None, max_length=20)


class DeliveryFilters(CursorParams):
    state: str | None = one_of(DELIVERY_STATES, None, max_length=20)
    reason: str | None = Field(None, max_length=64)
    contact_id: str | None = Field(None, max_length=40)


class DeliveryOut(Schema):
    recipient: str
    contact_id: str
    chat_key: str
    state: str
    attempts: int
    sends: int
    provider_message_id: str | None
    provider_recipient: str | None
    error_code: int | None
    error_title: str | None
    retryable: bool | None
    reason: str | None
    not_before: int | None
    updated_at: int


class ResendIn(BodyIn):
    recipients: list[str] = Field(..., description="recipients of deliveries in doubt")


def progress_out(counts: DeliveryCounts) -> dict[str, Any]:
    """Return the API shape of delivery counts."""
    return {
        "total": counts.total,
        "done": counts.done,
        "percent": counts.percent,
        "states": dict(counts.states),
        "reasons": dict(counts.reasons),
    }


def campaign_out(c: Campaign, counts: DeliveryCounts | None = None) -> dict[str, Any]:
    """Return the API shape of a campaign (with its progress when ``counts`` is given).

    The stored JSON (``Campaign.to_json``) plus ``version`` and ``progress``.
    """
    return c.to_json() | {
        "version": c.version,
        "progress": progress_out(counts) if counts is not None else None,
    }


def plan_out(plan: Plan) -> dict[str, Any]:
    """Return the API shape of a plan preview."""
    check = plan.no_conversation
    return {
        **plan.counts.to_json(),
        "examples": plan.examples,
        "no_conversation": check.to_json() if check is not None else None,
    }


def delivery_out(d: Delivery) -> dict[str, Any]:
    return {
        "recipient": d.recipient,
        "contact_id": d.contact_id,
        "chat_key": d.chat_key,
        "state": d.state,
        "attempts": d.attempts,
        "sends": d.sends,
        "provider_message_id": d.provider_message_id,
        "provider_recipient": d.provider_recipient,
        "error_code": d.error_code,
        "error_title": d.error_title,
        "retryable": d.retryable,
        "reason": d.reason,
        "not_before": d.not_before,
        "updated_at": d.updated_at,
    }


def _detail(tenant: str, campaign_id: str) -> dict[str, Any]:
    progress = selectors.campaign_progress(tenant, campaign_id)
    return campaign_out(progress.campaign, progress.counts)


@router.get("campaigns", response={200: Page[CampaignOut], **ERRORS})
@requires("agent")
def campaign_list(request: HttpRequest, tenant: str, filters: Query[CampaignFilters]) -> dict[str, Any]:
    """List campaigns by id (creation time), optionally only those in ``state``. No progress here: see one."""
    page = selectors.campaign_list(tenant, limit=filters.limit, after=filters.after, state=filters.state)
    return {"items": [campaign_out(c) for c in page.items], "next": page.next}


@router.post("campaigns", response={201: CampaignOut, **ERRORS})
@requires("admin")
def campaign_create(request: HttpRequest, tenant: str, body: CampaignIn) -> Status:
    """Create a draft campaign (admins)."""
    p = principal(request)
    campaign = services.campaign_create(
        tenant,
        name=body.name,
        segment_id=body.segment_id,
        channel=body.channel,
        message=body.message,
        channel_name=body.channel_name,
        contact_ids=body.contact_ids,
        rate_per_s=body.rate_per_s,
        actor=p.actor,
    )
    return Status(201, campaign_out(campaign))


@router.post("campaigns/plan", response={200: PlanOut, **ERRORS})
@requires("agent")
def campaign_plan(request: HttpRequest, tenant: str, body: PlanIn) -> dict[str, Any]:
    """Preview an unsaved campaign: how many contacts it would reach now, and how many are left out, by reason.

    With ``channel_name``, ``no_conversation`` tells who among the first recipients has no conversation on it.
    """
    return plan_out(
        selectors.campaign_plan(
            tenant,
            segment_id=body.segment_id,
            channel=body.channel,
            contact_ids=body.contact_ids,
            channel_name=body.channel_name,
        )
    )


@router.get("campaigns/{campaign_id}", response={200: CampaignOut, **ERRORS})
@requires("agent")
def campaign_get(request: HttpRequest, tenant: str, campaign_id: str) -> dict[str, Any]:
    """One campaign with its progress: deliveries per state and per reason."""
    return _detail(tenant, campaign_id)


@router.patch("campaigns/{campaign_id}", response={200: CampaignOut, **ERRORS})
@requires("admin")
def campaign_update(request: HttpRequest, tenant: str, campaign_id: str, body: CampaignPatch) -> dict[str, Any]:
    """Edit a draft at ``expected_version`` (admins); 409 with ``current_version`` when stale."""
    fields = body.model_fields_set - {"expected_version"}
    kwargs = {name: getattr(body, name) for name in fields}
    services.campaign_update(tenant, campaign_id, expected_version=body.expected_version, **kwargs)
    return _detail(tenant, campaign_id)


@router.delete("campaigns/{campaign_id}", response={204: None, **ERRORS})
@requires("admin")
def campaign_delete(request: HttpRequest, tenant: str, campaign_id: str) -> Status:
    """Delete a campaign that is not scheduled, running or paused, with its deliveries (admins)."""
    services.campaign_delete(tenant, campaign_id)
    return Status(204, None)


@router.get("campaigns/{campaign_id}/plan", response={200: PlanOut, **ERRORS})
@requires("agent")
def campaign_plan_of(request: HttpRequest, tenant: str, campaign_id: str) -> dict[str, Any]:
    """Preview a saved campaign as of now (before it starts, the recipients are not fixed yet)."""
    return plan_out(selectors.campaign_plan_of(tenant, campaign_id))


@router.post("campaigns/{campaign_id}/start", response={200: CampaignOut, **ERRORS})
@requires("admin")
def campaign_start(request: HttpRequest, tenant: str, campaign_id: str, body: StartIn | None = None) -> dict[str, Any]:
    """Start now, or schedule for ``scheduled_at`` (admins); a time in the past is 422 on ``scheduled_at``."""
    p = principal(request)
    services.campaign_start(tenant, campaign_id, scheduled_at=body.scheduled_at if body else None, actor=p.actor)
    return _detail(tenant, campaign_id)


@router.post("campaigns/{campaign_id}/pause", response={200: CampaignOut, **ERRORS})
@requires("admin")
def campaign_pause(request: HttpRequest, tenant: str, campaign_id: str) -> dict[str, Any]:
    """Pause a running campaign (admins): the batch in flight finishes, nothing more leaves."""
    p = principal(request)
    services.campaign_pause(tenant, campaign_id, actor=p.actor)
    return _detail(tenant, campaign_id)


@router.post("campaigns/{campaign_id}/resume", response={200: CampaignOut, **ERRORS})
@requires("admin")
def campaign_resume(request: HttpRequest, tenant: str, campaign_id: str) -> dict[str, Any]:
    """Resume a paused or failed campaign (admins): only recipients without an outcome get it."""
    p = principal(request)
    services.campaign_resume(tenant, campaign_id, actor=p.actor)
    return _detail(tenant, campaign_id)


@router.post("campaigns/{campaign_id}/cancel", response={200: CampaignOut, **ERRORS})
@requires("admin")
def campaign_cancel(request: HttpRequest, tenant: str, campaign_id: str) -> dict[str, Any]:
    """Cancel (admins): every recipient not yet sent to is ``cancelled``."""
    p = principal(request)
    services.campaign_cancel(tenant, campaign_id, actor=p.actor)
    return _detail(tenant, campaign_id)


@router.get("campaigns/{campaign_id}/deliveries", response={200: Page[DeliveryOut], **ERRORS})
@requires("agent")
def delivery_list(
    request: HttpRequest, tenant: str, campaign_id: str, filters: Query[DeliveryFilters]
) -> dict[str, Any]:
    """The per-recipient outcomes, by recipient; filter by ``state``, ``reason`` or ``contact_id``."""
    page = selectors.delivery_list(
        tenant,
        campaign_id,
        limit=filters.limit,
        after=filters.after,
        state=filters.state,
        reason=filters.reason,
        contact_id=filters.contact_id,
    )
    return {"items": [delivery_out(d) for d in page.items], "next": page.next}


@router.post("campaigns/{campaign_id}/deliveries/resend", response={200: CampaignOut, **ERRORS})
@requires("admin")
def delivery_resend(request: HttpRequest, tenant: str, campaign_id: str, body: ResendIn) -> dict[str, Any]:
    """Resend deliveries that are in doubt (admins), after checking they did not arrive."""
    p = principal(request)
    services.delivery_resend(tenant, campaign_id, recipients=body.recipients, actor=p.actor)
    return _detail(tenant, campaign_id)
