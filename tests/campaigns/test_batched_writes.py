"""A sender's batch is a bounded number of Kv commits; consent and a killed run inside a batch (issue 21, item 3).

The commits are counted through the real Kv store on every Kv backend (a
counting wrapper around the backend, nothing replaced): reserving a batch
is one commit and recording its answers (accepted, failed, in doubt mixed)
is one more, for a batch of 20 as for one of 200.
"""

from __future__ import annotations

from typing import Any

import pytest

from botmesh_admin.channels.providers import WhatsAppProvider
from botmesh_admin.kv import DurableKv
from campaigns import selectors, services
from campaigns.domain import Delivery, Failure, Recipient, new_delivery, new_token
from campaigns.domain.planning import Planner
from campaigns.services.sending import CampaignBot, SendOptions
from campaigns.stores import default_store
from campaigns.stores.kv import KvSlotStore
from crm import services as crm
from tests import backends
from tests.stores import SERVER_BACKENDS

from .conftest import make_contacts

CID = "cmp_0000000000000000000b01"
T0 = 1_700_000_000_000
FAST = SendOptions(batch_size=10, ttl_ms=5_000, rate_per_s=None, max_attempts=3)


class CountingKv:
    """The backend itself, with its commits and reads counted."""

    def __init__(self, kv: DurableKv) -> None:
        self._kv, self.url = kv, kv.url
        self.commits = self.gets = 0

    def commit(self, table: str, ops: Any) -> Any:
        self.commits += 1
        return self._kv.commit(table, ops)

    def get(self, table: str, key: str) -> Any:
        self.gets += 1
        return self._kv.get(table, key)

    def get_many(self, table: str, keys: Any) -> Any:
        self.gets += 1
        return self._kv.get_many(table, keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)


KINDS = [
    pytest.param(name, marks=pytest.mark.services) if name in SERVER_BACKENDS else name for name in backends.KV_BACKENDS
]


@pytest.mark.parametrize("backend", KINDS)
@pytest.mark.parametrize("n", [20, 200])
def test_a_batch_is_one_commit_to_reserve_and_one_to_record_its_answers(
    backend: str, n: int, tenant_id: str, request: pytest.FixtureRequest
) -> None:
    kv = CountingKv(backends.open_kv(backend, request))
    store = KvSlotStore(kv)  # type: ignore[arg-type]
    slots = [
        new_delivery(Recipient(f"c_{i:022x}", f"+5730{i:08d}", f"whatsapp:5730{i:08d}", None), T0) for i in range(n)
    ]
    store.slots_add(tenant_id, CID, slots)
    pending = store.slot_scan(tenant_id, CID, limit=n)
    kv.commits = kv.gets = 0
    held = store.slots_reserve(tenant_id, CID, pending, token=new_token(), ttl_ms=30_000, now_ms=T0, sending=True)
    assert len(held) == n and (kv.commits, kv.gets) == (1, 0), "reserving the batch: one commit, no read"
    third = n // 3
    sent = [(d, f"wamid.{i}", None) for i, d in enumerate(held[:third])]
    failed = [(d, Failure(131047, "Re-engagement message", retryable=False)) for d in held[third : 2 * third]]
    retry = [(d, Failure(130429, "Rate limit hit", retryable=True, retry_after_ms=2000)) for d in held[2 * third : -1]]
    doubt = [(held[-1], "no_answer")]
    kv.commits = 0
    done = store.slots_record(
        tenant_id, CID, sent=sent, failed=failed + retry, in_doubt=doubt, max_attempts=3, now_ms=T0 + 10
    )
    assert kv.commits == 1, "recording every answer of the batch: one commit"
    assert [d.state for d in done] == ["accepted"] * third + ["failed"] * third + ["pending"] * len(retry) + [
        "in_doubt"
    ]
    counts = store.slot_counts(tenant_id, CID)
    assert counts.states == {"accepted": third, "failed": third, "pending": len(retry), "in_doubt": 1}
    assert counts.reasons == {
        "failed:code:131047": third,
        "in_doubt:no_answer": 1,
    }


def whatsapp(fake) -> WhatsAppProvider:
    return WhatsAppProvider(fake.base_url, "106540352242922", "test-token", timeout_s=2, max_workers=4)


def start(tenant: str):
    segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
    message = {"template": "promo_nov", "language": "es", "parameters": ["{name}"]}
    campaign = services.campaign_create(
        tenant, name="Noviembre", segment_id=segment.id, channel="whatsapp", message=message
    )
    return services.campaign_start(tenant, campaign.id)


def test_a_consent_denied_between_planning_and_sending_drops_exactly_that_delivery(world: str, fake) -> None:
    tenant = world
    contacts = make_contacts(tenant, 25)
    campaign = start(tenant)
    revoked = contacts[13]

    class DeniedAfterPlanning(Planner):
        def plan(self, **kw: Any):  # the plan is fixed, then the contact says no before the batch leaves
            plan = super().plan(**kw)
            crm.consent_set(tenant, revoked.id, channel="whatsapp", status="denied", source="test")
            return plan

    done = services.campaign_run(
        tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), planner=DeniedAfterPlanning(tenant), options=FAST
    )
    assert done.state == "completed"
    counts = selectors.campaign_progress(tenant, campaign.id).counts
    assert counts.states == {"accepted": 24, "dropped": 1} and counts.reasons == {"dropped:opted_out": 1}
    assert fake.count("+573000000013") == 0 and fake.count() == 24


def test_a_run_killed_between_reserving_and_recording_resends_nothing_the_provider_accepted(world: str, fake) -> None:
    """The process dies after the provider answered a batch and before its answers were written."""
    tenant = world
    make_contacts(tenant, 30)
    campaign = start(tenant)
    _, slots = default_store()
    real_record = slots.slots_record
    calls: list[int] = []

    class Killed(BaseException):
        """Stands for the process dying: nothing after it runs (not an Exception, so nobody catches it)."""

    def record_then_die(*args: Any, **kw: Any) -> list[Delivery]:
        calls.append(1)
        if len(calls) == 2:  # the second batch's answers are never written
            raise Killed()
        return real_record(*args, **kw)

    slots.slots_record = record_then_die  # type: ignore[method-assign]
    try:
        with pytest.raises(Killed):
            services.campaign_run(tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), options=FAST)
    finally:
        del slots.slots_record
    assert fake.count() == 20, "two batches reached the provider before the run died"
    # The next run, once the dead run's slot leases lapsed (its 5 s ttl), finds the second batch still sending.
    from campaigns.domain import now_ms

    later = now_ms() + FAST.ttl_ms + 1
    done = services.campaign_run(
        tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), options=FAST, clock=lambda: later, sleep=lambda s: None
    )
    assert done.state == "completed"
    assert fake.count() == 30 and all(fake.count(f"+5730{i:08d}") == 1 for i in range(30)), "nobody twice"
    counts = selectors.campaign_progress(tenant, campaign.id).counts
    assert counts.states == {"accepted": 20, "in_doubt": 10}
    assert counts.reasons == {"in_doubt:sender_lost": 10}
