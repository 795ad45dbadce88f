"""Campaign reads: campaigns, plan previews, progress and the per-delivery table.

Lookups answer ``NotFound`` for missing and foreign campaigns alike (every read
is scoped to the caller's tenant by the store). Times are epoch milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

from botmesh_admin.errors import NotFound, ValidationError
from botmesh_admin.pagination import Page, cursor_check, page_of, validate_limit

from .domain import (
    CAMPAIGN_STATES,
    DELIVERY_STATES,
    ID_RE,
    Campaign,
    ConversationCheck,
    Delivery,
    DeliveryCounts,
    PlanCounts,
    Recipient,
    chat_key_of,
    validate_channel,
    validate_channel_name,
    validate_contact_ids,
)
from .domain.planning import SAMPLE, Plan, Planner
from .stores import default_store

PREVIEW_RECIPIENTS = 1000
CONVERSATION_CHECK_PAGE = 50  # recipients a preview looks up on the sending channel (one O(1) inbox read each)
MAX_FILTER = 200  # longer than any reason or contact id a delivery holds
# A delivery list's cursor is the last recipient: an E.164 number (WhatsApp) or a Telegram user id.
RECIPIENT_CURSOR = re.compile(r"\+?[0-9]{1,20}")


def campaign_get(tenant: str, campaign_id: str) -> Campaign:
    """Return the campaign; raise ``NotFound`` if it is missing (or another tenant's)."""
    campaigns, _ = default_store()
    campaign = campaigns.campaign_get(tenant, campaign_id) if isinstance(campaign_id, str) else None
    if campaign is None:
        raise NotFound(f"campaign {campaign_id} not found")
    return campaign


CampaignPage = Page
"""One page of campaigns (``items``, ``next``: the last campaign's id, passed back as ``after``)."""


def campaign_list(
    tenant: str, *, limit: int = 50, after: str | None = None, state: str | None = None
) -> Page[Campaign]:
    """Return campaigns ordered by id (creation time), optionally only those in ``state``; ``limit`` 1..200."""
    limit = validate_limit(limit)
    if state is not None and state not in CAMPAIGN_STATES:
        raise ValidationError("state", f"must be one of {', '.join(CAMPAIGN_STATES)}")
    after = cursor_check(after, ID_RE)  # the id of the page's last campaign
    campaigns, _ = default_store()
    items = campaigns.campaign_scan(tenant, after=after, limit=limit + 1, state=state)  # by state: an index
    return page_of(items, limit, lambda c: c.id)


def conversation_required(channel: str, *, template: bool) -> bool:
    """Return whether a send on ``channel`` needs a conversation with the recipient on the sending channel.

    A Telegram bot can only write to a user who started it, and a WhatsApp text
    only inside a conversation with that number (the 24-hour window). A
    WhatsApp template is a business-initiated message Meta lets a number send
    to any opted-in customer (Cloud API, "Conversations"): it needs none.
    """
    return not (template and channel == "whatsapp")


def recipient_has_conversation(tenant: str, recipient: Recipient, *, channel_name: str) -> bool:
    """Return whether the inbox has a conversation with ``recipient`` on ``channel_name`` (one O(1) read)."""
    from inbox.selectors import conversations_of_chat

    return bool(conversations_of_chat(tenant, recipient.chat_key, channel_name=channel_name))


def campaign_plan(
    tenant: str,
    *,
    segment_id: str,
    channel: str,
    contact_ids: Sequence[str] | None = None,
    planner: Planner | None = None,
    channel_name: str | None = None,
    template: bool | None = None,
) -> Plan:
    """Return who a campaign to ``segment_id`` on ``channel`` would reach now, with the drop counts.

    Nothing is written. To a whole segment whose membership is built (the
    usual case: ``crm.selectors.segment_reach``), the counts are the
    membership's counters and the examples one page of each: O(page), with at
    most ``SAMPLE`` recipients held. Otherwise (listed contacts, a planner of
    the caller's, a segment just created or changed) the plan walks the whole
    audience (its counts are exact) with bounded memory: it holds the first
    ``PREVIEW_RECIPIENTS`` recipients only.

    With ``channel_name`` (the sending number or bot) the plan's
    ``no_conversation`` tells how many recipients the run would drop for
    having no conversation there (the send hook's rule,
    ``conversation_required``; ``template`` None: a WhatsApp campaign sends a
    template, a Telegram one a text). Only the first
    ``CONVERSATION_CHECK_PAGE`` recipients are looked up, so it is exact when
    they are all the recipients (``exact``); otherwise the rest are checked at
    send time. Raise ``ValidationError`` for an unknown segment, channel or
    ``channel_name`` (``campaign.channel_name``: not a channel of that kind).
    """
    from crm.selectors import segment_get

    channel = validate_channel(channel)
    try:
        segment = segment_get(tenant, segment_id)
    except NotFound:
        raise ValidationError("campaign.segment_id", "no such segment") from None
    listed = validate_contact_ids(contact_ids)
    sender = _sending_channel(tenant, channel, channel_name)
    plan = None
    if listed is None and planner is None:
        plan = _plan_from_membership(tenant, segment_id, channel)
    if plan is None:
        plan = (planner or Planner(tenant)).plan(
            rules=segment.rules, channel=channel, contact_ids=listed, keep=PREVIEW_RECIPIENTS
        )
    if sender is not None and conversation_required(
        channel, template=channel == "whatsapp" if template is None else template
    ):
        plan = replace(plan, no_conversation=_conversation_check(tenant, plan, sender))
    return plan


def _sending_channel(tenant: str, channel: str, name: object) -> str | None:
    """Return ``name`` if it is one of the tenant's ``channel`` channels (None stays None)."""
    from botmesh_admin.channels.selectors import channel_config_get

    checked = validate_channel_name(name)
    if checked is None:
        return None
    try:
        config = channel_config_get(tenant, name=checked)
    except NotFound:
        raise ValidationError("campaign.channel_name", f"no channel called {checked!r}") from None
    if config.kind != channel:
        raise ValidationError("campaign.channel_name", f"{checked!r} is a {config.kind} channel, not {channel}")
    return checked


def _conversation_check(tenant: str, plan: Plan, channel_name: str) -> ConversationCheck:
    """Look up the plan's first ``CONVERSATION_CHECK_PAGE`` recipients on ``channel_name`` (O(page))."""
    page = plan.recipients[:CONVERSATION_CHECK_PAGE]
    without = [r for r in page if not recipient_has_conversation(tenant, r, channel_name=channel_name)]
    return ConversationCheck(
        channel_name,
        len(page),
        len(without),
        tuple(r.name or r.contact_id for r in without[:SAMPLE]),
        exact=len(page) == plan.counts.recipients,
    )


def _plan_from_membership(tenant: str, segment_id: str, channel: str) -> Plan | None:
    """Return the plan of a whole segment from its materialized membership, or ``None`` if not built.

    The same counts and examples as ``Planner.plan`` over every contact: the
    membership keeps the planner's verdict per campaign channel
    (``crm.domain.membership_groups``). No recipient is a duplicate there:
    identities are unique per tenant, so two contacts never share an address.
    """
    from crm.selectors import segment_reach

    # Recipients: as many as the examples' page holds (the sending channel's check looks them up).
    reach = segment_reach(tenant, segment_id, channel=channel, examples=CONVERSATION_CHECK_PAGE)
    if reach is None:
        return None
    audience = sum(reach.verdicts.values())
    dropped = {
        "not_in_segment": reach.contacts - audience,
        "no_identity": reach.verdicts["no_identity"],
        "opted_out": reach.verdicts["opted_out"],
    }
    examples = {
        "recipients" if reason == "ok" else reason: [c.name or c.id for c in contacts[:SAMPLE]]
        for reason, contacts in reach.examples.items()
        if contacts
    }
    recipients = tuple(
        Recipient(c.id, c.addresses(channel)[0], chat_key_of(channel, c.addresses(channel)[0]), c.name)
        for c in reach.examples.get("ok", [])[:PREVIEW_RECIPIENTS]
    )
    counts = PlanCounts(reach.contacts, reach.verdicts["ok"], {k: v for k, v in sorted(dropped.items()) if v})
    return Plan(recipients, counts, examples)


def campaign_plan_of(tenant: str, campaign_id: str) -> Plan:
    """Return the preview of a saved campaign (its segment, channel and listed contacts, as of now).

    O(page) for a campaign to a whole segment whose membership is built (see ``campaign_plan``), with
    the look at its sending channel (``no_conversation``) when it names one.
    """
    c = campaign_get(tenant, campaign_id)
    return campaign_plan(
        tenant,
        segment_id=c.segment_id,
        channel=c.channel,
        contact_ids=c.contact_ids,
        channel_name=c.channel_name,
        template=c.message.template is not None,
    )


# A campaign in one of these states still reads its segment (to plan, start or resume); a finished one does not.
SEGMENT_NEEDED_STATES = ("draft", "scheduled", "running", "paused")
SEGMENT_FINISHED_STATES = ("completed", "failed", "cancelled")


class SegmentUse(NamedTuple):
    """The campaigns to one segment: those that still need it, and finished ones (at most ``limit`` each)."""

    needed: list[Campaign]
    finished: list[Campaign]


def campaigns_of_segment(tenant: str, segment_id: str, *, limit: int = 5) -> SegmentUse:
    """Return the campaigns to ``segment_id``, split by whether they still need it (O(limit): an index)."""
    campaigns, _ = default_store()
    return SegmentUse(
        campaigns.campaign_scan_by_segment(tenant, segment_id, states=SEGMENT_NEEDED_STATES, limit=limit),
        campaigns.campaign_scan_by_segment(tenant, segment_id, states=SEGMENT_FINISHED_STATES, limit=limit),
    )


class Progress(NamedTuple):
    """A campaign with its deliveries counted per state and reason."""

    campaign: Campaign
    counts: DeliveryCounts


def campaign_progress(tenant: str, campaign_id: str) -> Progress:
    """Return the campaign and its delivery counts (``counts.percent`` = deliveries with an outcome)."""
    campaign = campaign_get(tenant, campaign_id)
    _, slots = default_store()
    return Progress(campaign, slots.slot_counts(tenant, campaign_id))


DeliveryPage = Page
"""One page of deliveries by recipient (``items``, ``next``: passed back as ``after``)."""


def delivery_list(
    tenant: str,
    campaign_id: str,
    *,
    limit: int = 50,
    after: str | None = None,
    state: str | None = None,
    reason: str | None = None,
    contact_id: str | None = None,
) -> Page[Delivery]:
    """Return the campaign's deliveries ordered by recipient, filtered by state, reason and contact.

    One page is O(page) reads: a filter is read through the slots' value index.
    """
    limit = validate_limit(limit)
    if state is not None and state not in DELIVERY_STATES:
        raise ValidationError("state", f"must be one of {', '.join(DELIVERY_STATES)}")
    after = cursor_check(after, RECIPIENT_CURSOR)
    campaign_get(tenant, campaign_id)
    if any(isinstance(v, str) and len(v) > MAX_FILTER for v in (reason, contact_id)):
        return Page([], None)  # no delivery has it (and it could not be an index key)
    _, slots = default_store()
    items = slots.slot_scan(
        tenant, campaign_id, after=after, limit=limit + 1, state=state, reason=reason, contact_id=contact_id
    )
    return page_of(items, limit, lambda d: d.recipient)
