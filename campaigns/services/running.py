"""The campaign run and the scheduler's tick.

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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from botmesh_admin.errors import NotFound

from ..domain import ACTIVE_STATES, Campaign, Recipient, new_token, now_ms
from ..domain.planning import Planner
from ..stores import default_stores
from .definition import _complete, _fail, _get, _index_active, _transition
from .planning import _materialize
from .sending import BroadcastFailed, CampaignBot, SendOptions, send_campaign

log = logging.getLogger("botmesh.campaigns")

DEFAULT_RATES = {"whatsapp": 60.0, "telegram": 25.0}
BROADCAST_FAILURES_BEFORE_FAILED = 3
STALLED_AFTER_MS = 5_000


def setting(name: str, default: Any) -> Any:
    """Return ``settings.<name>`` or ``default`` (read when needed, never at import)."""
    from django.conf import settings

    return getattr(settings, name, default)


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
    from ..selectors import conversation_required, recipient_has_conversation

    def hook(recipient: Recipient, message: Any) -> str | None:
        kind = recipient.chat_key.partition(":")[0]
        if not conversation_required(kind, template=message.template is not None):
            return None
        if not recipient_has_conversation(tenant, recipient, channel_name=channel_name):
            return NO_CONVERSATION
        return None

    return hook


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
    from .. import tasks

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
