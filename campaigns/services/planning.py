"""A run's plan: its recipients fixed in the slot store, one pending slot each.

``_materialize`` runs the planner (``campaigns.domain.planning.Planner``) with
``SlotClaims``, so the dedupe of recipients is the slot store's: planning streams
with bounded memory, a plan run again after a crash finds its own recipients,
and two contacts never get one recipient's slot. Then the plan's counts are
recorded on the campaign.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from botmesh_admin.errors import NotFound

from ..domain import Campaign, Recipient, new_delivery, now_ms
from ..domain.planning import Planner
from ..stores import default_store
from ..stores.base import SlotStore
from .definition import _fail, _transition

log = logging.getLogger("botmesh.campaigns")


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

    campaigns, slots = default_store()
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
