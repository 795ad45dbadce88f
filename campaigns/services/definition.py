"""Campaign definition and state changes: create, edit, delete, start / schedule, pause, resume, cancel, resend.

Tenant first, the rest keyword-only. Every input is validated before it is
written (``ValidationError`` names the field); a state change is a
compare-and-set on the campaign's version, retried after a concurrent write,
and refused with ``StateConflict`` (409) when the campaign is not in a state
that allows it. A run is published (``campaign_run_dispatch``: a ``campaigns.run``
journal event) and a Celery task queued only after the write returned. The run
itself is ``running.campaign_run``.

Logs carry tenant and campaign ids and counts, never an address.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from botmesh_admin.errors import Conflict, NotFound, ValidationError
from botmesh_admin.events.base import EventRecord
from botmesh_admin.events.runtime import default_journal
from botmesh_admin.events.services import event_publish
from botmesh_admin.kv.cas import cas_retry

from ..domain import (
    ACTIVE_STATES,
    EDITABLE_STATES,
    RUN_CHANNEL,
    RUN_EVENT,
    Campaign,
    StateConflict,
    message_from_input,
    new_campaign_id,
    now_ms,
    validate_campaign,
    validate_channel,
    validate_channel_name,
    validate_contact_ids,
    validate_name,
    validate_rate,
    validate_scheduled_at,
)
from ..stores import default_store
from ..stores.base import VersionConflict
from ..tasks import campaign_start_due as campaign_start_due_task

log = logging.getLogger("botmesh.campaigns")

UNSET: Any = object()


# --------------------------------------------------------------------------- definition


def validate_segment(tenant: str, segment_id: object, field: str = "campaign.segment_id") -> str:
    """Return ``segment_id`` if it is one of the tenant's segments.

    Raise ``ValidationError`` on ``field``: none chosen, or no such segment.
    """
    from crm.selectors import segment_get

    if not isinstance(segment_id, str) or not segment_id:
        raise ValidationError(field, "choose a segment")
    try:
        segment_get(tenant, segment_id)
    except NotFound:
        raise ValidationError(field, "no such segment") from None
    return segment_id


def _validate_sending_channel(tenant: str, channel: str, name: str | None) -> str | None:
    """Return ``name`` if it is one of the tenant's ``channel`` channels: the one that sends.

    Required as soon as the tenant has a channel of that kind: a campaign names
    its sending number or bot explicitly, and a recipient is only sent to
    through a channel they are on (``bot_for``). ``None`` is accepted only while
    the tenant has no channel of the kind (development's console provider sends;
    in production every send fails, naming the missing credentials).
    """
    from botmesh_admin.channels.selectors import channel_config_list

    configured = [c.name for c in channel_config_list(tenant, kind=channel)]
    if name is None:
        if not configured:
            return None
        raise ValidationError(
            "campaign.channel_name", f"name the {channel} channel that sends: one of {', '.join(configured)}"
        )
    if name not in configured:
        from botmesh_admin.channels.selectors import channel_config_get

        try:
            config = channel_config_get(tenant, name=name)
        except NotFound:
            raise ValidationError("campaign.channel_name", f"no channel called {name!r}") from None
        raise ValidationError("campaign.channel_name", f"{name!r} is a {config.kind} channel, not {channel}")
    return name


def campaign_create(
    tenant: str,
    *,
    name: str,
    segment_id: str,
    channel: str,
    message: Mapping[str, Any],
    channel_name: str | None = None,
    contact_ids: Sequence[str] | None = None,
    rate_per_s: float | None = None,
    actor: str = "",
) -> Campaign:
    """Save a ``draft`` campaign; raise ``ValidationError`` naming the field (``campaign.message.template``)."""
    channel = validate_channel(channel)
    at = now_ms()
    campaign = Campaign(
        id=new_campaign_id(),
        name=validate_name(name),
        segment_id=validate_segment(tenant, segment_id),
        channel=channel,
        message=message_from_input(message, channel),
        channel_name=_validate_sending_channel(tenant, channel, validate_channel_name(channel_name)),
        contact_ids=validate_contact_ids(contact_ids, given=True),
        rate_per_s=validate_rate(rate_per_s),
        created_by=str(actor)[:150],
        created_at=at,
        updated_at=at,
    )
    campaigns, _ = default_store()
    created = campaigns.campaign_insert(tenant, validate_campaign(campaign))
    log.info("campaign created tenant=%s campaign=%s channel=%s", tenant, created.id, channel)
    return created


def campaign_update(
    tenant: str,
    campaign_id: str,
    *,
    expected_version: int,
    name: str = UNSET,
    segment_id: str = UNSET,
    channel: str = UNSET,
    message: Mapping[str, Any] = UNSET,
    channel_name: str | None = UNSET,
    contact_ids: Sequence[str] | None = UNSET,
    rate_per_s: float | None = UNSET,
) -> Campaign:
    """Change a draft campaign at ``expected_version`` (compare-and-set); raise ``Conflict`` / ``StateConflict``."""
    campaigns, _ = default_store()
    current = _get(tenant, campaign_id)
    if current.state != "draft":
        raise StateConflict(f"a {current.state} campaign cannot be edited", current_version=current.version)
    new_channel = validate_channel(channel) if channel is not UNSET else current.channel
    changes: dict[str, Any] = {"channel": new_channel}
    if name is not UNSET:
        changes["name"] = validate_name(name)
    if segment_id is not UNSET:
        changes["segment_id"] = validate_segment(tenant, segment_id)
    raw_message = message if message is not UNSET else current.message
    changes["message"] = message_from_input(raw_message, new_channel)
    wanted_name = validate_channel_name(channel_name) if channel_name is not UNSET else current.channel_name
    changes["channel_name"] = _validate_sending_channel(tenant, new_channel, wanted_name)
    if contact_ids is not UNSET:
        changes["contact_ids"] = validate_contact_ids(contact_ids, given=True)
    if rate_per_s is not UNSET:
        changes["rate_per_s"] = validate_rate(rate_per_s)
    if current.version != expected_version:
        raise Conflict(
            f"campaign changed: expected version {expected_version}, found {current.version}",
            current_version=current.version,
        )
    updated = validate_campaign(replace(current, **changes, updated_at=now_ms()))
    return campaigns.campaign_replace(tenant, updated, expected_version=expected_version)


def campaign_delete(tenant: str, campaign_id: str) -> None:
    """Delete a campaign and its deliveries; a scheduled, running or paused one must be cancelled first."""
    campaigns, slots = default_store()

    def attempt() -> None:
        current = _get(tenant, campaign_id)
        if current.state in ACTIVE_STATES:
            raise StateConflict(
                f"cancel the {current.state} campaign before deleting it", current_version=current.version
            )
        campaigns.campaign_delete(tenant, campaign_id, expected_version=current.version)

    cas_retry(attempt, what="the campaign", retry_on=VersionConflict)
    slots.slots_drop_all(tenant, campaign_id)
    campaigns.index_delete(tenant, campaign_id)
    log.info("campaign deleted tenant=%s campaign=%s", tenant, campaign_id)


# --------------------------------------------------------------------------- state changes


def campaign_run_dispatch(tenant: str, campaign: Campaign, *, after: str = "") -> EventRecord:
    """Publish the run of ``campaign``: a ``campaigns.run`` journal event on the ``campaigns-run`` channel.

    Call it after the state change was written. The journal's worker runs it
    (``running.campaign_run_event``) under a fenced lease with a heartbeat,
    retried with backoff after a failure and dead-lettered after its last
    attempt. Idempotent per campaign version and ``after`` (the event a
    successor follows, or the tick's mark): pressing resume twice publishes one
    run. Return the journal record (the existing one for a repeated key).
    """
    key = f"run:{campaign.id}:v{campaign.version}" + (f":{after}" if after else "")
    return event_publish(
        tenant, type=RUN_EVENT, channel=RUN_CHANNEL, payload={"campaign_id": campaign.id}, idempotency_key=key
    )


def _get(tenant: str, campaign_id: str) -> Campaign:
    campaigns, _ = default_store()
    campaign = campaigns.campaign_get(tenant, campaign_id) if isinstance(campaign_id, str) else None
    if campaign is None:
        raise NotFound(f"campaign {campaign_id} not found")
    return campaign


def _transition(
    tenant: str,
    campaign_id: str,
    change: Callable[[Campaign], Campaign | None],
    *,
    index: Callable[[Campaign], None] | None = None,
) -> Campaign:
    """Apply ``change`` by compare-and-set, re-reading after a concurrent write; ``None`` = nothing to do."""
    campaigns, _ = default_store()

    def attempt() -> Campaign:
        current = _get(tenant, campaign_id)
        changed = change(current)
        if changed is None:
            return current
        changed = replace(changed, updated_at=now_ms())
        if index is not None:
            index(changed)  # before the campaign: an active campaign is never missing from the index
        return campaigns.campaign_replace(tenant, changed, expected_version=current.version)

    return cas_retry(attempt, what="the campaign", retry_on=VersionConflict)


def _index_active(tenant: str) -> Callable[[Campaign], None]:
    def put(c: Campaign) -> None:
        campaigns, _ = default_store()
        campaigns.index_put(tenant, c.id, state=c.state, at=c.scheduled_at if c.state == "scheduled" else None)

    return put


def _refuse(c: Campaign, action: str) -> StateConflict:
    return StateConflict(f"a {c.state} campaign cannot be {action}", current_version=c.version)


def campaign_start(tenant: str, campaign_id: str, *, scheduled_at: int | None = None, actor: str = "") -> Campaign:
    """Start a draft (or scheduled) campaign now, or schedule it for ``scheduled_at`` (epoch ms, in the future).

    A scheduled campaign starts at its time as a durable scheduled job (the
    ``campaigns.tick`` job, plus a Celery countdown for punctuality). Raise
    ``ValidationError`` (``scheduled_at``) for a time in the past, ``StateConflict``
    for a campaign that already ran.
    """
    at = validate_scheduled_at(scheduled_at, now_ms())

    def change(c: Campaign) -> Campaign:
        if c.state not in EDITABLE_STATES:
            raise _refuse(c, "started")
        if at is not None:
            return replace(c, state="scheduled", scheduled_at=at, error=None)
        return replace(c, state="running", started_at=c.started_at or now_ms(), error=None)

    campaign = _transition(tenant, campaign_id, change, index=_index_active(tenant))
    log.info("campaign %s tenant=%s campaign=%s by=%s", campaign.state, tenant, campaign_id, actor or "-")
    if campaign.state == "scheduled" and at is not None:
        # Punctuality only: the ``campaigns.tick`` job is the guarantee.
        campaign_start_due_task.apply_async((tenant, campaign_id), countdown=max(0.0, (at - now_ms()) / 1000))
    else:
        campaign_run_dispatch(tenant, campaign)
    return campaign


def campaign_pause(tenant: str, campaign_id: str, *, actor: str = "") -> Campaign:
    """Pause a running campaign: its sender stops after the batch in flight; nothing already sent is undone."""

    def change(c: Campaign) -> Campaign | None:
        if c.state == "paused":
            return None
        if c.state != "running":
            raise _refuse(c, "paused")
        return replace(c, state="paused")

    campaign = _transition(tenant, campaign_id, change, index=_index_active(tenant))
    log.info("campaign paused tenant=%s campaign=%s by=%s", tenant, campaign_id, actor or "-")
    return campaign


def campaign_resume(tenant: str, campaign_id: str, *, actor: str = "") -> Campaign:
    """Resume a paused (or failed) campaign: only recipients without an outcome are sent to."""

    def change(c: Campaign) -> Campaign | None:
        if c.state == "running":
            return None
        if c.state not in ("paused", "failed"):
            raise _refuse(c, "resumed")
        return replace(c, state="running", error=None, finished_at=None)

    campaign = _transition(tenant, campaign_id, change, index=_index_active(tenant))
    log.info("campaign resumed tenant=%s campaign=%s by=%s", tenant, campaign_id, actor or "-")
    campaign_run_dispatch(tenant, campaign)
    return campaign


def campaign_cancel(tenant: str, campaign_id: str, *, actor: str = "") -> Campaign:
    """Cancel a campaign: every recipient not yet sent to is ``cancelled``; sends in flight finish and count."""

    def change(c: Campaign) -> Campaign | None:
        if c.state == "cancelled":
            return None
        if c.state == "completed":
            raise _refuse(c, "cancelled")
        return replace(c, state="cancelled", finished_at=now_ms())

    campaign = _transition(tenant, campaign_id, change)
    campaigns, slots = default_store()
    cancelled = slots.slots_cancel(tenant, campaign_id, now_ms=now_ms())
    campaigns.index_delete(tenant, campaign_id)
    log.info(
        "campaign cancelled tenant=%s campaign=%s deliveries=%d by=%s", tenant, campaign_id, cancelled, actor or "-"
    )
    return campaign


def delivery_resend(tenant: str, campaign_id: str, *, recipients: Sequence[str], actor: str = "") -> Campaign:
    """Resend deliveries that are ``in_doubt`` (a person checked they did not arrive); run the campaign again.

    Raise ``NotFound`` for an unknown recipient and ``StateConflict`` for a
    delivery that is not in doubt (nothing is changed then) or a campaign
    that was cancelled.
    """
    if isinstance(recipients, str) or not recipients:
        raise ValidationError("recipients", "name at least one recipient")
    campaigns, slots = default_store()
    current = _get(tenant, campaign_id)
    if current.state in ("draft", "scheduled", "cancelled"):
        raise _refuse(current, "resent")
    for i, recipient in enumerate(recipients):
        slot = slots.slot_get(tenant, campaign_id, recipient) if isinstance(recipient, str) else None
        if slot is None:
            raise NotFound(f"recipients[{i}]: no such delivery")
        if slot.state != "in_doubt":
            raise StateConflict(f"recipients[{i}]: only a delivery in doubt can be resent (it is {slot.state})")
    at = now_ms()
    for recipient in recipients:
        slots.slot_resend(tenant, campaign_id, recipient, now_ms=at)
    log.info(
        "campaign resend tenant=%s campaign=%s deliveries=%d by=%s", tenant, campaign_id, len(recipients), actor or "-"
    )

    def change(c: Campaign) -> Campaign | None:
        if c.state in ("running", "paused"):
            return None
        return replace(c, state="running", finished_at=None, error=None)

    campaign = _transition(tenant, campaign_id, change, index=_index_active(tenant))
    if campaign.state == "running":
        campaign_run_dispatch(tenant, campaign)
    return campaign


def campaign_run_dead_lettered(tenant: str, campaign_id: str, *, event_id: str, error: str | None) -> Campaign | None:
    """Mark a running (or paused) campaign ``failed`` because its ``campaigns.run`` event was dead-lettered.

    The journal's dead-letter hook of ``campaigns.run`` (``campaigns.handlers``):
    the run's last attempt failed, or its worker died on it (its last lease
    expired). Without this the campaign would show ``running`` forever with
    nobody sending. ``error`` says why, shown as the campaign's error on its
    page and in the API; Resume sends to the recipients without an outcome.
    A finished campaign, or one another run event (not ``event_id``) is
    pending or leased for, is left as it is; an unknown one is ``None``.
    """
    if _run_alive_elsewhere(tenant, campaign_id, event_id):
        return _get(tenant, campaign_id)  # a newer run (a resume meanwhile) is sending it
    reason = error or "its journal event was dead-lettered"
    try:
        return _fail(tenant, campaign_id, f"the run stopped for good: {reason[:400]} (resume the campaign to go on)")
    except NotFound:
        return None


def _run_alive_elsewhere(tenant: str, campaign_id: str, event_id: str) -> bool:
    """Return True if a run event of the campaign other than ``event_id`` is pending or leased (O(tenant's runs))."""
    journal = default_journal()
    for state in ("pending", "leased"):
        after: str | None = None
        while True:
            page = journal.list(tenant=tenant, state=state, channel=RUN_CHANNEL, limit=200, after=after)
            if any(r.id != event_id and r.payload.get("campaign_id") == campaign_id for r in page):
                return True
            if len(page) < 200:
                break
            after = page[-1].id
    return False


def _fail(tenant: str, campaign_id: str, error: str) -> Campaign:
    campaigns, _ = default_store()

    def change(c: Campaign) -> Campaign | None:
        if c.state not in ("running", "paused"):
            return None
        return replace(c, state="failed", error=error[:500], finished_at=now_ms())

    failed = _transition(tenant, campaign_id, change)
    if failed.state == "failed":
        campaigns.index_delete(tenant, campaign_id)
        log.warning("campaign failed tenant=%s campaign=%s: %s", tenant, campaign_id, error)
    return failed


def _complete(tenant: str, campaign_id: str) -> Campaign:
    campaigns, slots = default_store()

    def change(c: Campaign) -> Campaign | None:
        if c.state not in ("running", "paused") or slots.slot_counts(tenant, campaign_id).open:
            return None
        return replace(c, state="completed", finished_at=now_ms())

    done = _transition(tenant, campaign_id, change)
    if done.state == "completed":
        campaigns.index_delete(tenant, campaign_id)
        log.info("campaign completed tenant=%s campaign=%s", tenant, campaign_id)
    return done
