"""A sender's batch is a bounded number of Kv commits; consent and a killed run inside a batch (issue 21, item 3).

The commits are counted through the real Kv store on every Kv backend (a
counting wrapper around the backend, nothing replaced): reserving a batch
is one commit and recording its answers (accepted, failed, in doubt mixed)
is one more, for a batch of 20 as for one of 200.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from botmesh_admin.channels.providers import DEFAULT_RETRY_AFTER_MS, WhatsAppProvider
from botmesh_admin.kv import DurableKv
from botmesh_admin.observability.shutdown import inflight_count
from campaigns import selectors, services
from campaigns.domain import Delivery, Failure, Recipient, new_delivery, new_token
from campaigns.domain.planning import Planner
from campaigns.services import planning
from campaigns.services.sending import BroadcastFailed, CampaignBot, SendOptions, send_campaign
from campaigns.stores import default_store
from campaigns.stores.kv import KvSlotStore
from crm import services as crm
from tests import backends
from tests.stores import SERVER_BACKENDS

from .conftest import make_contacts
from .test_sending import Clock

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
    # A batch's answers are written while the next batch is out: the third batch left before the second's
    # write died, and its own answers (back by then) were still written on the way out.
    assert fake.count() == 30, "three batches reached the provider before the run died"
    assert len(calls) == 3
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


def test_a_batchs_answers_are_written_while_the_next_batch_is_out_and_count_as_in_flight(world: str, fake) -> None:
    """Batch 1's answers are written after batch 2 left and before it came back; a SIGTERM's drain waits for them.

    The first write waits for the second batch to leave, and the second broadcast
    holds its answers until that write happened (each at most 10 s; a sender that
    writes before sending fails here), so the order is fixed.
    """
    tenant = world
    make_contacts(tenant, 30)
    campaign = start(tenant)
    _, slots = default_store()
    provider = whatsapp(fake)
    events: list[str] = []
    written, second_out = threading.Event(), threading.Event()
    real_record = slots.slots_record

    def record(*args: Any, **kw: Any) -> list[Delivery]:
        n = len([e for e in events if e.startswith("write")]) + 1
        if n == 1:
            assert second_out.wait(10), "batch 1's answers were written before batch 2 left"
        events.append(f"write {n} in flight {inflight_count()}")
        written.set()
        return real_record(*args, **kw)

    class Watched:
        kind = "whatsapp"

        def broadcast(self, messages):
            n = len([e for e in events if e.startswith("out")]) + 1
            events.append(f"out {n}")
            if n == 2:
                second_out.set()
            results = provider.broadcast(messages)
            if n == 2:
                assert written.wait(10), "batch 1's answers were not written while batch 2 was out"
            events.append(f"back {n}")
            return results

    slots.slots_record = record  # type: ignore[method-assign]
    try:
        done = services.campaign_run(tenant, campaign.id, bot=CampaignBot(Watched()), options=FAST)
    finally:
        del slots.slots_record
    assert done.state == "completed" and fake.count() == 30
    assert events[:5] == ["out 1", "back 1", "out 2", "write 1 in flight 2", "back 2"]  # 2: batch 1's and 2's
    # Batch 3 and the second write race; the last write comes once batch 3 is back, before the run returns.
    assert sorted(events[5:7]) == ["out 3", "write 2 in flight 2"] and events[7:] == ["back 3", "write 3 in flight 1"]
    assert selectors.campaign_progress(tenant, campaign.id).counts.states == {"accepted": 30}


def test_a_broadcast_that_raises_after_a_batch_went_out_still_writes_that_batchs_answers(world: str, fake) -> None:
    """Batch 1 is accepted and its answers pending when batch 2's broadcast raises: 1 is written, 2 released."""
    tenant = world
    make_contacts(tenant, 20)
    campaign = start(tenant)
    campaigns, slots = default_store()
    provider = whatsapp(fake)
    calls: list[int] = []

    class SecondExplodes:
        kind = "whatsapp"

        def broadcast(self, messages):
            calls.append(1)
            if len(calls) == 2:
                raise ConnectionError("pool exhausted")
            return provider.broadcast(messages)

    planning._materialize(tenant, campaign, Planner(tenant))
    campaign = selectors.campaign_get(tenant, campaign.id)
    with pytest.raises(BroadcastFailed):
        send_campaign(
            CampaignBot(SecondExplodes()), Planner(tenant), tenant=tenant, campaign=campaign, slots=slots, options=FAST
        )
    after = slots.slot_scan(tenant, campaign.id)
    assert sorted((d.state, d.token is None) for d in after) == [("accepted", False)] * 10 + [("pending", True)] * 10
    assert fake.count() == 10


def test_answers_that_ask_to_slow_down_are_written_before_the_next_batch_leaves(world: str, fake) -> None:
    """A 429 with a delay books the throttle at once: the next batch waits for it (no overlap for that batch)."""
    tenant = world
    make_contacts(tenant, 20)
    fake.script("+573000000003", "rate_limited", times=1)
    campaign = start(tenant)
    clock = Clock()
    provider = whatsapp(fake)
    left_at: list[int] = []

    class Timed:
        kind = "whatsapp"

        def broadcast(self, messages):
            left_at.append(clock.now)
            return provider.broadcast(messages)

    throttled = SendOptions(batch_size=10, ttl_ms=5_000, rate_per_s=1000.0, max_attempts=3)
    done = services.campaign_run(
        tenant, campaign.id, bot=CampaignBot(Timed()), options=throttled, clock=clock, sleep=clock.sleep
    )
    assert done.state == "completed" and fake.count("+573000000003") == 2
    assert left_at[1] - left_at[0] >= DEFAULT_RETRY_AFTER_MS, "the second batch left before the provider's delay"


def test_a_batchs_answers_are_written_before_the_throttles_wait_not_after_it(world: str, fake) -> None:
    """At a slow rate the next batch waits for the throttle: the batch before is written first, so its
    slots are never left "sending" past their lease (a concurrent sender would call them in doubt)."""
    tenant = world
    make_contacts(tenant, 20)
    campaign = start(tenant)
    _, slots = default_store()
    clock = Clock()
    provider = whatsapp(fake)
    events: list[str] = []
    real_record = slots.slots_record

    def record(*args: Any, **kw: Any) -> list[Delivery]:
        events.append(f"write at {clock.now}")
        return real_record(*args, **kw)

    class Timed:
        kind = "whatsapp"

        def broadcast(self, messages):
            events.append(f"out at {clock.now}")
            return provider.broadcast(messages)

    slow = SendOptions(batch_size=10, ttl_ms=5_000, rate_per_s=1.0, max_attempts=3)  # 10 s per batch of 10
    slots.slots_record = record  # type: ignore[method-assign]
    try:
        done = services.campaign_run(
            tenant, campaign.id, bot=CampaignBot(Timed()), options=slow, clock=clock, sleep=clock.sleep
        )
    finally:
        del slots.slots_record
    assert done.state == "completed" and fake.count() == 20
    first_out, first_write, second_out = (int(e.split(" at ")[1]) for e in events[:3])
    assert events[1].startswith("write") and first_write - first_out < slow.ttl_ms, "written before the wait"
    assert second_out - first_out >= 10_000
