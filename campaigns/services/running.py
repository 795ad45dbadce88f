"""The campaign run and the scheduler's tick.

A run is a journal event (``campaigns.run`` on the ``campaigns-run`` channel,
published by ``definition.campaign_run_dispatch``), so it has the journal's
fenced lease, heartbeat, retries and dead-letter queue: a worker killed
mid-run lets the lease lapse and the next worker's drain claims the event
(a higher fencing token) and resumes from the slots. ``campaign_run_event``
is the handler's body; ``campaign_run`` the send itself: it fixes the
recipients on first run (one slot per recipient) and calls
``sending.send_campaign`` until no slot is open, or the campaign is paused or
cancelled, or (in a handler) the run's lease was lost. Runs of one campaign
may overlap (a redelivered event, the tick, a person pressing resume): the
slots make sure nobody gets the message twice.

Logs carry tenant and campaign ids and counts, never an address.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from botmesh_admin.errors import NotFound
from botmesh_admin.events.base import EventRecord, StaleLeaseError
from botmesh_admin.events.runtime import default_journal
from botmesh_admin.events.tasks import drain as drain_task
from botmesh_admin.events.worker import Claim, current_claim
from botmesh_admin.observability import shutdown

from ..domain import ACTIVE_STATES, RUN_CHANNEL, Campaign, Recipient, now_ms
from ..domain.planning import Planner
from ..stores import default_store
from .definition import _complete, _fail, _get, _index_active, _transition, campaign_run_dispatch
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
    """Goes on while the campaign is ``running`` and (in a journal handler) this run still holds the event's lease."""

    def __init__(self, tenant: str, campaign_id: str, claim: Claim | None, clock: Callable[[], int]) -> None:
        self.tenant, self.campaign_id, self.claim, self.clock = tenant, campaign_id, claim, clock
        self.checked = clock()
        self.stopped_by: str | None = None

    def keep_going(self) -> bool:
        campaigns, _ = default_store()
        current = campaigns.campaign_get(self.tenant, self.campaign_id)
        if current is None or current.state != "running":
            self.stopped_by = current.state if current else "deleted"
            return False
        now = self.clock()
        if self.claim is not None and now - self.checked >= self.claim.lease_ms // 3:
            try:
                self.claim.check()  # the fence: another worker holds the event once our lease lapsed
            except StaleLeaseError:
                self.stopped_by = "lease_lost"
                return False
            self.checked = now
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


def campaign_run_event(record: EventRecord, **run: Any) -> str:
    """Run the campaign of a ``campaigns.run`` journal event (``campaign_run(**run)``); return its state.

    A run the worker's shutdown (SIGTERM) stopped with the campaign still
    ``running`` publishes its successor (the batch in flight was finished and
    recorded), which the next worker's drain takes; this event is then done.
    Raise what ``campaign_run`` raises (the journal retries, then dead-letters).
    """
    campaign_id = record.payload.get("campaign_id")
    if not isinstance(campaign_id, str):
        raise ValueError(f"event {record.id}: payload.campaign_id must be a campaign id")
    campaign = campaign_run(record.tenant, campaign_id, **run)
    if campaign.state == "running" and shutdown.stopping():
        campaign_run_dispatch(record.tenant, campaign, after=record.id)
        log.info(
            "campaign %s tenant=%s: stopped by the worker's shutdown; requeued for the next worker",
            campaign_id,
            record.tenant,
        )
    return campaign.state


def campaign_run(
    tenant: str,
    campaign_id: str,
    *,
    bot: CampaignBot | None = None,
    planner: Planner | None = None,
    options: SendOptions | None = None,
    clock: Callable[[], int] = now_ms,
    sleep: Callable[[float], None] = time.sleep,
) -> Campaign:
    """Send a ``running`` campaign until every recipient has an outcome, or it is paused or cancelled.

    Return the campaign as the run left it. A campaign in another state is
    returned untouched. In a journal handler the run stops once its event's
    lease is lost (another worker took the event over). ``bot``, ``planner``
    and ``options`` default to the campaign's channel provider, the CRM and
    the settings. Raise ``NotFound``.
    """
    control = _Control(tenant, campaign_id, current_claim(), clock)
    campaign = _get(tenant, campaign_id)
    for _ in range(5):  # after a stop, look again: a pause may have been resumed meanwhile
        if campaign.state != "running":
            return campaign
        campaign = _run_once(
            tenant, campaign, bot=bot, planner=planner, options=options, control=control, clock=clock, sleep=sleep
        )
        if control.stopped_by == "lease_lost":
            log.info("campaign %s tenant=%s: another worker took the run over", campaign_id, tenant)
            return campaign
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
    control: _Control,
    clock: Callable[[], int],
    sleep: Callable[[float], None],
) -> Campaign:
    campaigns, slots = default_store()
    planner = planner or Planner(tenant)
    if campaign.plan is None:
        campaign = _materialize(tenant, campaign, planner)
        if campaign.state != "running":
            return campaign
    try:
        bot = bot or bot_for(tenant, campaign)
    except (NotFound, ValueError) as exc:
        return _fail(tenant, campaign.id, f"the campaign's channel cannot send: {exc}")
    control.stopped_by = None
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
    Nobody sends a running campaign when it has no run event pending or leased
    in the journal; when it has one (a retry waiting, a lease whose worker
    died), the tick queues a drain of the ``campaigns-run`` channel, whose
    worker claims it once it is due. One whose run was dead-lettered waits
    for a person (Replay on the journal page). ``dispatch(tenant,
    campaign_id)`` replaces the publish (tests). Return ``{"started",
    "redispatched", "cleaned"}``.
    """
    now = at_ms if at_ms is not None else now_ms()
    campaigns, _ = default_store()
    counts = {"started": 0, "redispatched": 0, "cleaned": 0}
    runs: dict[tuple[str, str], str] | None = None  # read once, when a running campaign looks stalled
    wake = False  # a stalled campaign's run event waits in the journal: queue a drain of the channel
    after: tuple[str, str] | None = None
    while True:
        entries = campaigns.index_scan(after=after, limit=500)
        for entry in entries:
            tenant, campaign_id = entry.tenant, entry.campaign_id
            campaign = campaigns.campaign_get(tenant, campaign_id)
            if campaign is None or campaign.state not in ACTIVE_STATES:
                campaigns.index_delete(tenant, campaign_id)
                counts["cleaned"] += 1
            elif campaign.state == "scheduled" and (campaign.scheduled_at or 0) <= now:
                started = campaign_start_due(tenant, campaign_id, at_ms=now)
                if started.state == "running":
                    # The key of the version started: the start_due task's publish is the same event.
                    if dispatch:
                        dispatch(tenant, campaign_id)
                    else:
                        campaign_run_dispatch(tenant, started)
                    counts["started"] += 1
            elif campaign.state == "running" and now - campaign.updated_at >= STALLED_AFTER_MS:
                runs = _run_events() if runs is None else runs
                state = runs.get((tenant, campaign_id))
                if state is None:
                    if dispatch:
                        dispatch(tenant, campaign_id)
                    else:
                        campaign_run_dispatch(tenant, campaign, after=f"tick-{now}")
                    counts["redispatched"] += 1
                elif state != "dead":
                    wake = True
        if len(entries) < 500:
            break
        after = (entries[-1].tenant, entries[-1].campaign_id)
    if wake and dispatch is None:
        _wake_runs()
    return counts


def _run_events() -> dict[tuple[str, str], str]:
    """Return ``{(tenant, campaign id): state}`` of the run events pending, leased or dead (O(those events)).

    A campaign with several keeps the first found: pending, then leased, then dead.
    """
    journal = default_journal()
    found: dict[tuple[str, str], str] = {}
    for state in ("pending", "leased", "dead"):
        last: str | None = None
        while True:
            page = journal.list(state=state, channel=RUN_CHANNEL, limit=200, after=last)
            for r in page:
                found.setdefault((r.tenant, str(r.payload.get("campaign_id"))), state)
            if len(page) < 200:
                break
            last = page[-1].id
    return found


def _wake_runs() -> None:
    """Queue an ``events.drain`` of the runs' channel (the broker may be down: the next tick tries again)."""
    try:
        drain_task.delay(channel=RUN_CHANNEL)
    except Exception as exc:  # noqa: BLE001 - a broker outage is not the tick's failure
        log.warning("could not queue the drain of %s: %s", RUN_CHANNEL, type(exc).__name__)
