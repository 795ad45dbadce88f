"""Campaign writes: create, edit, start / schedule, pause, resume, cancel, resend, run, and the scheduler's tick.

Tenant first, the rest keyword-only. Every input is validated before it is
written (``ValidationError`` names the field); a state change is a
compare-and-set on the campaign's version, retried after a concurrent write,
and refused with ``StateConflict`` (409) when the campaign is not in a state
that allows it. Celery tasks are dispatched only after the write returned.

The send itself is ``campaign_run`` (called by the ``campaigns.run`` task):
it takes the campaign's runner lease, fixes the recipients on first run (one
slot per recipient), and calls ``sending.send_campaign`` until no slot is
open, or the campaign is paused or cancelled. Any number of runs of one
campaign may overlap (a redelivered task, the tick, a person pressing
resume): the slots make sure nobody gets the message twice.

Logs carry tenant and campaign ids and counts, never an address.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from botmesh_admin.errors import Conflict, NotFound, ValidationError

from .domain import (
    ACTIVE_STATES,
    EDITABLE_STATES,
    Campaign,
    Recipient,
    StateConflict,
    message_from_input,
    new_campaign_id,
    new_delivery,
    new_token,
    now_ms,
    validate_campaign,
    validate_channel,
    validate_channel_name,
    validate_contact_ids,
    validate_name,
    validate_rate,
    validate_scheduled_at,
)
from .planner import Planner
from .sending import BroadcastFailed, CampaignBot, SendOptions, send_campaign
from .stores import default_stores
from .stores.base import SlotStore

log = logging.getLogger("botmesh.campaigns")

MAX_ATTEMPTS = 50
UNSET: Any = object()
DEFAULT_RATES = {"whatsapp": 60.0, "telegram": 25.0}
BROADCAST_FAILURES_BEFORE_FAILED = 3
STALLED_AFTER_MS = 5_000


def setting(name: str, default: Any) -> Any:
    """Return ``settings.<name>`` or ``default`` (read when needed, never at import)."""
    from django.conf import settings

    return getattr(settings, name, default)


def _backoff(attempt: int) -> None:
    time.sleep(min(0.05, 0.001 * 2 ** min(attempt, 6)))


# --------------------------------------------------------------------------- definition


def check_segment(tenant: str, segment_id: object) -> str:
    """Return ``segment_id`` if it is one of the tenant's segments.

    Raise ``ValidationError`` on ``campaign.segment_id``: none chosen, or no such segment.
    """
    from crm.selectors import segment_get

    if not isinstance(segment_id, str) or not segment_id:
        raise ValidationError("campaign.segment_id", "choose a segment")
    try:
        segment_get(tenant, segment_id)
    except NotFound:
        raise ValidationError("campaign.segment_id", "no such segment") from None
    return segment_id


def _check_channel_name(tenant: str, channel: str, name: str | None) -> str | None:
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
        segment_id=check_segment(tenant, segment_id),
        channel=channel,
        message=message_from_input(message, channel),
        channel_name=_check_channel_name(tenant, channel, validate_channel_name(channel_name)),
        contact_ids=validate_contact_ids(contact_ids),
        rate_per_s=validate_rate(rate_per_s),
        created_by=str(actor)[:150],
        created_at=at,
        updated_at=at,
    )
    campaigns, _ = default_stores()
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
    campaigns, _ = default_stores()
    current = _get(tenant, campaign_id)
    if current.state != "draft":
        raise StateConflict(f"a {current.state} campaign cannot be edited", current_version=current.version)
    new_channel = validate_channel(channel) if channel is not UNSET else current.channel
    changes: dict[str, Any] = {"channel": new_channel}
    if name is not UNSET:
        changes["name"] = validate_name(name)
    if segment_id is not UNSET:
        changes["segment_id"] = check_segment(tenant, segment_id)
    raw_message = message if message is not UNSET else current.message
    changes["message"] = message_from_input(raw_message, new_channel)
    wanted_name = validate_channel_name(channel_name) if channel_name is not UNSET else current.channel_name
    changes["channel_name"] = _check_channel_name(tenant, new_channel, wanted_name)
    if contact_ids is not UNSET:
        changes["contact_ids"] = validate_contact_ids(contact_ids)
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
    campaigns, slots = default_stores()
    for attempt in range(MAX_ATTEMPTS):
        current = _get(tenant, campaign_id)
        if current.state in ACTIVE_STATES:
            raise StateConflict(
                f"cancel the {current.state} campaign before deleting it", current_version=current.version
            )
        try:
            campaigns.campaign_delete(tenant, campaign_id, expected_version=current.version)
        except Conflict as exc:
            if exc.current_version is None:
                raise NotFound(f"campaign {campaign_id} not found") from None
            _backoff(attempt)
            continue
        slots.slots_drop_all(tenant, campaign_id)
        campaigns.index_delete(tenant, campaign_id)
        log.info("campaign deleted tenant=%s campaign=%s", tenant, campaign_id)
        return
    raise Conflict("the campaign is changing too fast; try again")


# --------------------------------------------------------------------------- state changes


def _get(tenant: str, campaign_id: str) -> Campaign:
    campaigns, _ = default_stores()
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
    campaigns, _ = default_stores()
    for attempt in range(MAX_ATTEMPTS):
        current = _get(tenant, campaign_id)
        changed = change(current)
        if changed is None:
            return current
        changed = replace(changed, updated_at=now_ms())
        if index is not None:
            index(changed)  # before the campaign: an active campaign is never missing from the index
        try:
            return campaigns.campaign_replace(tenant, changed, expected_version=current.version)
        except Conflict as exc:
            if exc.current_version is None:
                raise NotFound(f"campaign {campaign_id} not found") from None
            _backoff(attempt)
    raise Conflict("the campaign is changing too fast; try again")


def _index_active(tenant: str) -> Callable[[Campaign], None]:
    def put(c: Campaign) -> None:
        campaigns, _ = default_stores()
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
    from . import tasks

    if campaign.state == "scheduled" and at is not None:
        tasks.dispatch_start_due(tenant, campaign_id, at)
    else:
        tasks.dispatch_run(tenant, campaign_id)
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
    from . import tasks

    tasks.dispatch_run(tenant, campaign_id)
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
    campaigns, slots = default_stores()
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
    campaigns, slots = default_stores()
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
        from . import tasks

        tasks.dispatch_run(tenant, campaign_id)
    return campaign


# --------------------------------------------------------------------------- the run


class _Control:
    """Goes on while the campaign is ``running`` and (with a lease) this runner still holds it."""

    def __init__(
        self, tenant: str, campaign_id: str, owner: str, lease_ms: int | None, clock: Callable[[], int]
    ) -> None:
        self.tenant, self.campaign_id, self.owner, self.lease_ms, self.clock = (
            tenant,
            campaign_id,
            owner,
            lease_ms,
            clock,
        )
        self.renewed = clock()
        self.stopped_by: str | None = None

    def keep_going(self) -> bool:
        campaigns, slots = default_stores()
        current = campaigns.campaign_get(self.tenant, self.campaign_id)
        if current is None or current.state != "running":
            self.stopped_by = current.state if current else "deleted"
            return False
        now = self.clock()
        if self.lease_ms and now - self.renewed >= self.lease_ms // 3:
            if not slots.lease_acquire(
                self.tenant, self.campaign_id, owner=self.owner, ttl_ms=self.lease_ms, now_ms=now
            ):
                self.stopped_by = "lease_lost"
                return False
            self.renewed = now
        return True


def default_options(campaign: Campaign) -> SendOptions:
    """Return the send options of ``campaign`` from the settings (rate per channel, batch, slot lease)."""
    rates = {**DEFAULT_RATES, **setting("BOTMESH_CAMPAIGN_RATE_PER_S", {})}
    rate = campaign.rate_per_s if campaign.rate_per_s is not None else rates.get(campaign.channel)
    batch = int(setting("BOTMESH_CAMPAIGN_BATCH", 50))
    if rate:
        batch = max(1, min(batch, int(rate)))  # a burst is at most one second of the rate
    return SendOptions(
        batch_size=batch,
        ttl_ms=int(setting("BOTMESH_CAMPAIGN_SLOT_TTL_MS", 60_000)),
        rate_per_s=rate,
        throttle_key=f"{campaign.channel}-{campaign.channel_name or 'default'}",
        max_attempts=int(setting("BOTMESH_CAMPAIGN_MAX_ATTEMPTS", 3)),
    )


NO_CONVERSATION = "no_conversation_on_channel"


def bot_for(tenant: str, campaign: Campaign) -> CampaignBot:
    """Return the bot that sends ``campaign``: its named channel's provider (the console without
    credentials in dev) and the hook that keeps each send on that channel.

    A campaign saved before the channel was required (``channel_name`` None)
    sends through the tenant's only channel of its kind. Raise ``NotFound``
    when the named channel is gone, ``ValueError`` when none is named and the
    tenant has several (the run fails with that reason: never another number).
    """
    from botmesh_admin.channels.domain import Channel
    from botmesh_admin.channels.providers import provider_for
    from botmesh_admin.channels.selectors import channel_config_get, channel_config_list

    channel: Channel | None
    if campaign.channel_name:
        channel = channel_config_get(tenant, name=campaign.channel_name)
    else:
        configured = channel_config_list(tenant, kind=campaign.channel)
        if len(configured) > 1:
            raise ValueError(
                f"the campaign names no sending channel and the tenant has {len(configured)} "
                f"{campaign.channel} channels; edit it to name one"
            )
        channel = configured[0] if configured else None
    provider = provider_for(tenant, channel)
    if hasattr(provider, "max_workers"):
        provider.max_workers = int(setting("BOTMESH_CAMPAIGN_CONCURRENCY", 8))
    hooks = (_on_channel(tenant, channel.name),) if channel is not None else ()
    return CampaignBot(provider, hooks=hooks)


def _on_channel(tenant: str, channel_name: str) -> Callable[[Recipient, Any], str | None]:
    """Return the send hook that drops a recipient without a conversation on ``channel_name``.

    A Telegram bot can only write to a user who started it, and a WhatsApp text
    only inside a conversation with that number (the 24-hour window), so such a
    recipient is ``dropped`` with ``no_conversation_on_channel`` — never sent from
    another number or bot. A WhatsApp template is a business-initiated message
    Meta lets a number send to any opted-in customer (Cloud API, "Conversations"):
    it goes out from the named number and opens the conversation there.
    One inbox read per recipient (``conversations_of_chat`` on one channel: O(1)).
    The preview applies the same rule to its first recipients
    (``selectors.campaign_plan``'s ``no_conversation``).
    """
    from .selectors import conversation_required, recipient_has_conversation

    def hook(recipient: Recipient, message: Any) -> str | None:
        kind = recipient.chat_key.partition(":")[0]
        if not conversation_required(kind, template=message.template is not None):
            return None
        if not recipient_has_conversation(tenant, recipient, channel_name=channel_name):
            return NO_CONVERSATION
        return None

    return hook


class SlotClaims:
    """The planner's ``Claims`` of a run: each recipient key claimed in the slot store, its slot added with it.

    Kept in the Kv (``SlotStore.slots_claim``), so planning streams with
    bounded memory, a plan run again after a crash finds its own recipients,
    and two contacts never get one recipient's slot.
    """

    def __init__(self, slots: SlotStore, tenant: str, campaign_id: str, at: int) -> None:
        self.slots, self.tenant, self.campaign_id, self.at = slots, tenant, campaign_id, at

    def claim(self, items: Sequence[tuple[str, Recipient]]) -> list[bool]:
        return self.slots.slots_claim(
            self.tenant, self.campaign_id, [(key, new_delivery(r, self.at)) for key, r in items]
        )


def _materialize(tenant: str, campaign: Campaign, planner: Planner) -> Campaign:
    """Fix the recipients: one pending slot each (idempotent, streamed), then record the plan's counts."""
    from crm.selectors import segment_get

    campaigns, slots = default_stores()
    try:
        segment = segment_get(tenant, campaign.segment_id)
    except NotFound:
        return _fail(tenant, campaign.id, "the campaign's segment was deleted")
    claims = SlotClaims(slots, tenant, campaign.id, now_ms())
    plan = planner.plan(
        rules=segment.rules, channel=campaign.channel, contact_ids=campaign.contact_ids, claims=claims, keep=0
    )
    log.info("campaign planned tenant=%s campaign=%s recipients=%d", tenant, campaign.id, plan.counts.recipients)
    return _transition(tenant, campaign.id, lambda c: None if c.plan is not None else replace(c, plan=plan.counts))


def _fail(tenant: str, campaign_id: str, error: str) -> Campaign:
    campaigns, _ = default_stores()

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
    campaigns, slots = default_stores()

    def change(c: Campaign) -> Campaign | None:
        if c.state not in ("running", "paused") or slots.slot_counts(tenant, campaign_id).open:
            return None
        return replace(c, state="completed", finished_at=now_ms())

    done = _transition(tenant, campaign_id, change)
    if done.state == "completed":
        campaigns.index_delete(tenant, campaign_id)
        log.info("campaign completed tenant=%s campaign=%s", tenant, campaign_id)
    return done


def campaign_run(
    tenant: str,
    campaign_id: str,
    *,
    bot: CampaignBot | None = None,
    planner: Planner | None = None,
    options: SendOptions | None = None,
    use_lease: bool = True,
    clock: Callable[[], int] = now_ms,
    sleep: Callable[[float], None] = time.sleep,
) -> Campaign:
    """Send a ``running`` campaign until every recipient has an outcome, or it is paused or cancelled.

    Return the campaign as the run left it. A campaign in another state, or
    whose runner lease another live process holds, is returned untouched.
    ``bot``, ``planner`` and ``options`` default to the campaign's channel
    provider, the CRM and the settings. Raise ``NotFound``.
    """
    campaigns, slots = default_stores()
    owner = f"{socket.gethostname()}:{os.getpid()}:{new_token()[:8]}"
    lease_ms = int(setting("BOTMESH_CAMPAIGN_LEASE_MS", 30_000)) if use_lease else None
    campaign = _get(tenant, campaign_id)
    for _ in range(5):  # after a stop, look again: a pause may have been resumed meanwhile
        if campaign.state != "running":
            return campaign
        if lease_ms and not slots.lease_acquire(tenant, campaign_id, owner=owner, ttl_ms=lease_ms, now_ms=clock()):
            log.info("campaign %s tenant=%s: another runner holds it", campaign_id, tenant)
            return campaign
        try:
            campaign = _run_once(
                tenant,
                campaign,
                bot=bot,
                planner=planner,
                options=options,
                owner=owner,
                lease_ms=lease_ms,
                clock=clock,
                sleep=sleep,
            )
        finally:
            if lease_ms:
                slots.lease_release(tenant, campaign_id, owner=owner)
        if campaign.state != "running":
            campaign = _get(tenant, campaign_id)
    return campaign


def _run_once(
    tenant: str,
    campaign: Campaign,
    *,
    bot: CampaignBot | None,
    planner: Planner | None,
    options: SendOptions | None,
    owner: str,
    lease_ms: int | None,
    clock: Callable[[], int],
    sleep: Callable[[float], None],
) -> Campaign:
    campaigns, slots = default_stores()
    planner = planner or Planner(tenant)
    if campaign.plan is None:
        campaign = _materialize(tenant, campaign, planner)
        if campaign.state != "running":
            return campaign
    try:
        bot = bot or bot_for(tenant, campaign)
    except (NotFound, ValueError) as exc:
        return _fail(tenant, campaign.id, f"the campaign's channel cannot send: {exc}")
    control = _Control(tenant, campaign.id, owner, lease_ms, clock)
    failures = 0
    while True:
        try:
            report = send_campaign(
                bot,
                planner,
                tenant=tenant,
                campaign=campaign,
                slots=slots,
                campaigns=campaigns,
                options=options or default_options(campaign),
                control=control,
                clock=clock,
                sleep=sleep,
            )
            break
        except BroadcastFailed as exc:
            failures += 1
            if failures >= BROADCAST_FAILURES_BEFORE_FAILED:
                return _fail(tenant, campaign.id, str(exc))
            sleep(min(8.0, 2.0**failures))
    log.info(
        "campaign run tenant=%s campaign=%s accepted=%d failed=%d retrying=%d dropped=%d in_doubt=%d%s",
        tenant,
        campaign.id,
        report.accepted,
        report.failed,
        report.retrying,
        report.dropped,
        report.in_doubt,
        f" stopped_by={control.stopped_by}" if report.stopped else "",
    )
    if report.fatal:
        return _fail(tenant, campaign.id, report.fatal)
    if report.finished:
        return _complete(tenant, campaign.id)
    current = _get(tenant, campaign.id)
    if current.state == "cancelled":
        slots.slots_cancel(tenant, campaign.id, now_ms=clock())
    return current


# --------------------------------------------------------------------------- the scheduler's tick


def campaign_start_due(tenant: str, campaign_id: str, *, at_ms: int | None = None) -> Campaign:
    """Start a scheduled campaign whose time has come (idempotent: only ``scheduled`` → ``running``)."""
    now = at_ms if at_ms is not None else now_ms()

    def change(c: Campaign) -> Campaign | None:
        if c.state != "scheduled" or (c.scheduled_at or 0) > now:
            return None
        return replace(c, state="running", started_at=c.started_at or now)

    return _transition(tenant, campaign_id, change, index=_index_active(tenant))


def campaigns_tick(*, at_ms: int | None = None, dispatch: Callable[[str, str], None] | None = None) -> dict[str, int]:
    """Start the scheduled campaigns that are due and re-dispatch running campaigns nobody is sending.

    Called by the durable scheduled job ``campaigns.tick``; every step is
    idempotent, so an occurrence retried after a crash changes nothing twice.
    Return ``{"started", "redispatched", "cleaned"}``.
    """
    from . import tasks

    dispatch = dispatch or tasks.dispatch_run
    now = at_ms if at_ms is not None else now_ms()
    campaigns, slots = default_stores()
    counts = {"started": 0, "redispatched": 0, "cleaned": 0}
    after: tuple[str, str] | None = None
    while True:
        entries = campaigns.index_scan(after=after, limit=500)
        for entry in entries:
            campaign = campaigns.campaign_get(entry.tenant, entry.campaign_id)
            if campaign is None or campaign.state not in ACTIVE_STATES:
                campaigns.index_delete(entry.tenant, entry.campaign_id)
                counts["cleaned"] += 1
            elif campaign.state == "scheduled" and (campaign.scheduled_at or 0) <= now:
                if campaign_start_due(entry.tenant, entry.campaign_id, at_ms=now).state == "running":
                    dispatch(entry.tenant, entry.campaign_id)
                    counts["started"] += 1
            elif (
                campaign.state == "running"
                and now - campaign.updated_at >= STALLED_AFTER_MS
                and slots.lease_holder(entry.tenant, entry.campaign_id, now_ms=now) is None
            ):
                dispatch(entry.tenant, entry.campaign_id)
                counts["redispatched"] += 1
        if len(entries) < 500:
            return counts
        after = (entries[-1].tenant, entries[-1].campaign_id)
