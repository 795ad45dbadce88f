"""Campaign progress and delivery filters read through the slots' indexes; the planner streams.

The counters and value entries are always compared with what the slot records
themselves define: ``count_deliveries`` over a scan of every slot, the filters
applied to that scan, and ``IndexedTable.check`` recomputing each index.
"""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from botmesh_admin.kv.memory import MemoryKv
from campaigns import selectors, services
from campaigns.domain import (
    DELIVERY_STATES,
    Campaign,
    Delivery,
    Failure,
    Message,
    Recipient,
    count_deliveries,
    new_token,
)
from campaigns.domain import planning as planner_module
from campaigns.domain.planning import Planner, SeenKeys
from campaigns.services import planning
from campaigns.stores import CampaignStores, use_store
from campaigns.stores.base import SlotStore
from campaigns.stores.kv import DELIVERY, KvCampaignStore, KvSlotStore
from campaigns.stores.memory import MemoryCampaignStore, MemorySlotStore
from crm.domain import Consent, Contact, Identity, SegmentRules
from tests import backends

from .conftest import make_contacts

CID = "cmp_00000000000000000000aa"
T0 = 1_700_000_000_000
TTL = 30_000
RECIPIENTS = [f"+5730011{n:05d}" for n in range(40)]
FAILURES = [
    Failure(131047, "Re-engagement message", retryable=False),
    Failure(130429, "Rate limit hit", retryable=True, retry_after_ms=2000),
    Failure(None, "timeout", retryable=True),
    Failure(403, "blocked", retryable=False),
]
REASONS = ["opted_out", "handoff", "no_identity"]
NO_DRIFT = {"missing": 0, "extra": 0, "wrong": 0}


def contact_of(recipient: str, other: bool = False) -> str:
    """The contact planned for ``recipient`` (``other``: a second contact with the same number)."""
    return f"c_{int(recipient[1:]) + (10**12 if other else 0):022x}"


def key_of(recipient: str) -> str:
    return recipient.lstrip("+")


def slot(recipient: str, other: bool = False) -> Delivery:
    return Delivery(recipient, contact_of(recipient, other), f"whatsapp:{key_of(recipient)}", updated_at=T0)


def every_slot(store: SlotStore, tenant: str, campaign_id: str = CID, **filters: Any) -> list[Delivery]:
    """Page through ``slot_scan`` (7 at a time, so cursors are crossed) and return every slot."""
    out: list[Delivery] = []
    after = None
    while True:
        page = store.slot_scan(tenant, campaign_id, after=after, limit=7, **filters)
        out += page
        if len(page) < 7:
            return out
        after = page[-1].recipient


def assert_indexes_agree(store: SlotStore, tenant: str, campaign_id: str = CID) -> None:
    """Counters = ``count_deliveries`` of the records; each filter = the records filtered; no index drift."""
    slots = every_slot(store, tenant, campaign_id)
    assert store.slot_counts(tenant, campaign_id) == count_deliveries(slots)
    states = sorted({d.state for d in slots}) + ["accepted"]
    reasons = sorted({d.reason for d in slots if d.reason}) + ["code:1"]
    for state in states:
        assert every_slot(store, tenant, campaign_id, state=state) == [d for d in slots if d.state == state]
        for reason in reasons:
            assert every_slot(store, tenant, campaign_id, state=state, reason=reason) == [
                d for d in slots if d.state == state and d.reason == reason
            ]
    for reason in reasons:
        assert every_slot(store, tenant, campaign_id, reason=reason) == [d for d in slots if d.reason == reason]
    for d in slots[:3]:
        assert every_slot(store, tenant, campaign_id, contact_id=d.contact_id) == [
            s for s in slots if s.contact_id == d.contact_id
        ]
        assert every_slot(store, tenant, campaign_id, contact_id=d.contact_id, state=d.state) == [
            s for s in slots if s.contact_id == d.contact_id and s.state == d.state
        ]
    if isinstance(store, KvSlotStore):
        table = store._table(tenant, campaign_id)
        for index in DELIVERY.indexes:
            assert store.layout.check(table, index.name) == NO_DRIFT, index.name


class History:
    """Random slot histories: plans (and re-runs), sends, answers, failures, releases, cancels, resends, time."""

    OPS = (
        "plan",
        "reserve",
        "send",
        "sent",
        "failed",
        "dropped",
        "doubt",
        "expired",
        "release",
        "cancel",
        "resend",
        "tick",
    )
    WEIGHTS = (3, 6, 4, 4, 4, 3, 2, 2, 2, 1, 2, 3)  # a cancel ends most of a history: now and then only

    def __init__(self, store: SlotStore, tenant: str) -> None:
        self.store, self.tenant, self.now = store, tenant, T0

    def step(self, op: str, rng: random.Random) -> None:
        store, tenant, now = self.store, self.tenant, self.now
        some = self._some(op, rng)
        if op == "plan":  # a plan (or its re-run): some numbers also claimed by a second contact
            picks = rng.sample(RECIPIENTS, rng.randint(1, 8))
            claims = [(key_of(r), slot(r, other=rng.random() < 0.25)) for r in picks]
            store.slots_claim(tenant, CID, claims)
        elif op == "reserve":
            store.slots_reserve(
                tenant,
                CID,
                [d.recipient for d in some],
                token=new_token(),
                ttl_ms=TTL,
                now_ms=now,
                sending=rng.random() < 0.5,
            )
        elif op == "send":
            store.slots_mark_sending(tenant, CID, some, ttl_ms=TTL, now_ms=now)
        elif op == "sent":
            store.slots_mark_sent(tenant, CID, [(d, f"wamid.{rng.randrange(10**6)}", None) for d in some], now_ms=now)
        elif op == "failed":
            store.slots_mark_failed(tenant, CID, [(d, rng.choice(FAILURES)) for d in some], max_attempts=3, now_ms=now)
        elif op == "dropped":
            store.slots_mark_dropped(tenant, CID, [(d, rng.choice(REASONS)) for d in some], now_ms=now)
        elif op == "doubt":
            store.slots_mark_in_doubt(tenant, CID, [(d, "no_answer") for d in some], now_ms=now)
        elif op == "expired":
            store.slots_mark_in_doubt(tenant, CID, [(d, "sender_lost") for d in some], now_ms=now, expired_only=True)
        elif op == "release":
            store.slots_release(tenant, CID, some, now_ms=now)
        elif op == "cancel":
            store.slots_cancel(tenant, CID, now_ms=now)
        elif op == "resend":
            for d in some:
                if d.state == "in_doubt" and d.provider_message_id is None:
                    store.slot_resend(tenant, CID, d.recipient, now_ms=now)
        else:
            self.now += rng.choice((1, 2000, TTL))

    # The states an op acts on (it is given other slots now and then too: the rules must leave those alone).
    TARGETS = {
        "reserve": ("pending", "reserved"),
        "send": ("reserved",),
        "sent": ("sending", "in_doubt"),
        "failed": ("sending", "in_doubt"),
        "dropped": ("reserved",),
        "doubt": ("sending",),
        "expired": ("sending",),
        "release": ("reserved", "sending"),
        "resend": ("in_doubt",),
    }

    def _some(self, op: str, rng: random.Random) -> list[Delivery]:
        slots = every_slot(self.store, self.tenant)
        if rng.random() < 0.8:
            slots = [d for d in slots if d.state in self.TARGETS.get(op, ())] or slots
        return rng.sample(slots, min(len(slots), rng.randint(1, 6)))


def test_random_histories_keep_counters_and_filters_equal_to_the_records(
    slot_store: SlotStore,
    tenant_id: str,
) -> None:
    """Over every store and backend: after random sends, failures, releases and re-runs, nothing drifts."""
    history = History(slot_store, tenant_id)
    rng = random.Random(16)
    history.step("plan", rng)
    for n in range(120):
        history.step(rng.choices(History.OPS, History.WEIGHTS)[0], rng)
        if n % 40 == 39:
            assert_indexes_agree(slot_store, tenant_id)
    assert_indexes_agree(slot_store, tenant_id)
    assert sum(slot_store.slot_counts(tenant_id, CID).states.values()) == len(every_slot(slot_store, tenant_id))


class SlotIndexMachine(RuleBasedStateMachine):
    """Hypothesis drives the histories over the Kv store (memory Kv): the invariant holds after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.history = History(KvSlotStore(MemoryKv()), "t-machine")
        self.history.step("plan", random.Random(0))

    @rule(op=st.sampled_from(History.OPS), seed=st.integers(0, 2**16))
    def step(self, op: str, seed: int) -> None:
        self.history.step(op, random.Random(seed))

    @invariant()
    def counters_and_filters_equal_the_records(self) -> None:
        assert_indexes_agree(self.history.store, self.history.tenant)


TestSlotIndexMachine = SlotIndexMachine.TestCase
TestSlotIndexMachine.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)


def test_a_claimed_key_belongs_to_its_first_contact_and_a_rerun_finds_its_own(
    slot_store: SlotStore, tenant_id: str
) -> None:
    """The plan's dedupe lives in the store: a second contact is a duplicate, the same contact again is not."""
    a, b = RECIPIENTS[:2]
    assert slot_store.slots_claim(
        tenant_id, CID, [(key_of(a), slot(a)), (key_of(a), slot(a, other=True)), (key_of(b), slot(b))]
    ) == [True, False, True]
    (held,) = slot_store.slots_reserve(tenant_id, CID, [a], token=new_token(), ttl_ms=TTL, now_ms=T0)
    # The plan runs again (a crash before the plan was recorded): same answers, and the slot is left as it is.
    assert slot_store.slots_claim(
        tenant_id, CID, [(key_of(a), slot(a)), (key_of(a), slot(a, other=True)), (key_of(b), slot(b))]
    ) == [True, False, True]
    assert slot_store.slot_get(tenant_id, CID, a).token == held.token
    assert [d.recipient for d in every_slot(slot_store, tenant_id)] == [a, b]
    # A slot added without a claim (an older plan) gives the key to its contact.
    c = RECIPIENTS[2]
    assert slot_store.slots_add(tenant_id, CID, [slot(c)]) == 1
    assert slot_store.slots_claim(tenant_id, CID, [(key_of(c), slot(c, other=True)), (key_of(c), slot(c))]) == [
        False,
        True,
    ]
    assert_indexes_agree(slot_store, tenant_id)


# --------------------------------------------------------------------------- what a read costs


class CountingKv:
    """The real Kv, counting the entries each read returns or asks for (what a page costs)."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.url, self.entries = kv, kv.url, 0

    def get(self, table: str, key: str) -> Any:
        self.entries += 1
        return self.kv.get(table, key)

    def get_many(self, table: str, keys: Any) -> Any:
        self.entries += len(keys)
        return self.kv.get_many(table, keys)

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> Any:
        found = self.kv.scan(table, prefix, after, limit)
        self.entries += max(1, len(found))
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


def _campaign(store: KvCampaignStore, tenant: str) -> str:
    c = Campaign(
        id=f"cmp_{random.getrandbits(88):022x}",
        name="Big",
        segment_id="s_" + "1" * 22,
        channel="whatsapp",
        message=Message(template="promo"),
        state="running",
        created_at=T0,
        updated_at=T0,
    )
    return store.campaign_insert(tenant, c).id


def _fill(slots: KvSlotStore, tenant: str, campaign_id: str, n: int) -> None:
    """``n`` planned slots; 5 failed for good, 3 dropped (opted out), 2 in doubt, the rest pending."""
    recipients = [f"+5731{i:08d}" for i in range(n)]
    slots.slots_add(tenant, campaign_id, [slot(r) for r in recipients])
    spread = recipients[:: max(1, n // 10)][:10]
    held = slots.slots_reserve(tenant, campaign_id, spread, token=new_token(), ttl_ms=TTL, now_ms=T0, sending=True)
    slots.slots_mark_failed(tenant, campaign_id, [(d, FAILURES[0]) for d in held[:5]], max_attempts=3, now_ms=T0)
    slots.slots_mark_in_doubt(tenant, campaign_id, [(d, "no_answer") for d in held[8:]], now_ms=T0)
    slots.slots_release(tenant, campaign_id, held[5:8], now_ms=T0)
    again = slots.slots_reserve(
        tenant, campaign_id, [d.recipient for d in held[5:8]], token=new_token(), ttl_ms=TTL, now_ms=T0
    )
    slots.slots_mark_dropped(tenant, campaign_id, [(d, "opted_out") for d in again], now_ms=T0)


def test_progress_and_filtered_pages_cost_the_same_at_300_and_3000_deliveries(tenant_id: str) -> None:
    """Progress is O(1) (counters) and a filtered page O(page) (value index): the reads do not grow."""
    kv = CountingKv(MemoryKv())
    campaigns, slots = KvCampaignStore(kv), KvSlotStore(kv)  # type: ignore[arg-type]
    small, big = _campaign(campaigns, tenant_id), _campaign(campaigns, tenant_id)
    _fill(slots, tenant_id, small, 300)
    _fill(slots, tenant_id, big, 3000)
    cost: dict[str, list[int]] = {}
    with use_store(CampaignStores(campaigns, slots)):
        for campaign_id in (small, big):
            for name, read in [
                ("progress", lambda cid=campaign_id: selectors.campaign_progress(tenant_id, cid)),
                ("failed", lambda cid=campaign_id: selectors.delivery_list(tenant_id, cid, state="failed", limit=2)),
                ("reason", lambda cid=campaign_id: selectors.delivery_list(tenant_id, cid, reason="opted_out")),
                (
                    "both",
                    lambda cid=campaign_id: selectors.delivery_list(
                        tenant_id, cid, state="in_doubt", reason="no_answer"
                    ),
                ),
            ]:
                read()  # index states are cached after the first read
                kv.entries = 0
                result = read()
                cost.setdefault(name, []).append(kv.entries)
                assert result
        progress = selectors.campaign_progress(tenant_id, big).counts
        assert progress.states == {"dropped": 3, "failed": 5, "in_doubt": 2, "pending": 2990}
        assert progress.reasons == {"dropped:opted_out": 3, "failed:code:131047": 5, "in_doubt:no_answer": 2}
        first = selectors.delivery_list(tenant_id, big, state="failed", limit=2)
        rest = selectors.delivery_list(tenant_id, big, state="failed", limit=2, after=first.next)
        last = selectors.delivery_list(tenant_id, big, state="failed", limit=2, after=rest.next)
        assert [len(p.items) for p in (first, rest, last)] == [2, 2, 1] and last.next is None
    for name, (at_300, at_3000) in cost.items():
        assert at_300 == at_3000 and at_3000 <= 12, (name, cost)


def test_a_filter_longer_than_any_reason_finds_nothing(world: str) -> None:
    campaigns = MemoryCampaignStore()
    with use_store(CampaignStores(campaigns, MemorySlotStore())):
        c = campaigns.campaign_insert(
            world,
            Campaign(
                id=CID, name="x", segment_id="s_" + "1" * 22, channel="whatsapp", message=Message(template="promo")
            ),
        )
        assert selectors.delivery_list(world, c.id, reason="x" * 5000) == selectors.DeliveryPage([], None)


# --------------------------------------------------------------------------- the planner streams


def test_seen_keys_stay_exact_when_they_move_to_disk() -> None:
    r = Recipient("c_" + "0" * 22, "+1", "whatsapp:1")
    with SeenKeys(spill=3) as seen:
        assert seen.claim([("a", r), ("b", r), ("a", r)]) == [True, True, False]
        assert seen.claim([("c", r), ("d", r), ("b", r)]) == [True, True, False]  # past 3 keys: on disk
        assert seen._db is not None
        assert seen.claim([("d", r), ("e", r), ("a", r), ("e", r)]) == [False, True, False, False]


class Synthetic:
    """``n`` contacts made as they are read (ascending ids); every 10th shares the previous one's number."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.granted = {"whatsapp": Consent("whatsapp", "granted", 1, "test")}

    def every(self) -> Iterator[Contact]:
        for i in range(self.n):
            number = i - 1 if i % 10 == 9 else i
            address = f"+5730{number:08d}" if i % 10 != 9 else f"5730{number:08d}"  # written another way
            yield Contact(
                id=f"c_{i:022x}", identities=(Identity("whatsapp", address),), consent=self.granted, name=f"Cliente {i}"
            )

    def get(self, contact_id: str) -> Contact | None:
        return None


def _peak_planning(n: int) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        with SeenKeys(spill=2000) as seen:
            plan = Planner("t-memory", Synthetic(n)).plan(rules=SegmentRules(), channel="whatsapp", claims=seen, keep=0)
        return tracemalloc.get_traced_memory()[1], plan
    finally:
        tracemalloc.stop()


def test_planning_memory_does_not_grow_with_the_audience() -> None:
    """8x the contacts, about the same peak: the planner holds a batch, not the audience (dedupe still exact)."""
    small_peak, small = _peak_planning(3_000)
    big_peak, big = _peak_planning(24_000)
    assert (small.counts.recipients, small.counts.dropped) == (2_700, {"duplicate": 300})
    assert (big.counts.recipients, big.counts.dropped) == (21_600, {"duplicate": 2_400})
    assert big.recipients == () and len(big.examples["duplicate"]) == 10
    assert big_peak < 1.5 * small_peak, (small_peak, big_peak)


def test_a_source_out_of_id_order_is_refused() -> None:
    class Backwards(Synthetic):
        def every(self) -> Iterator[Contact]:
            return reversed(list(super().every()))

    with pytest.raises(ValueError, match="after"):
        Planner("t-order", Backwards(3)).plan(rules=SegmentRules(), channel="whatsapp")


@pytest.fixture
def kv_world(world: str, request: pytest.FixtureRequest):
    """``world`` (memory CRM) with the campaign Kv stores over each backend in turn; yields (tenant, slots)."""
    kv = backends.open_kv(request.param, request)
    slots = KvSlotStore(kv)
    with use_store(CampaignStores(KvCampaignStore(kv), slots)):
        yield world, slots


@pytest.mark.parametrize("kv_world", backends.KV_BACKENDS, indirect=True)
def test_a_plan_interrupted_midway_and_run_again_gives_each_recipient_one_slot(kv_world, monkeypatch) -> None:
    """A crash between two claim batches, then the run again: every recipient once, the counts a clean plan's."""
    tenant, slots = kv_world
    from crm import services as crm

    make_contacts(tenant, 9)

    crm.contact_create(
        tenant,
        identities=[{"channel": "whatsapp", "address": "+573100000000"}],
        tags=["promo"],
        consent={"whatsapp": "denied"},
    )
    segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
    campaign = services.campaign_create(
        tenant, name="Crash", segment_id=segment.id, channel="whatsapp", message={"template": "promo"}
    )
    monkeypatch.setattr(planner_module, "BATCH", 4)

    class Crashing(planning.SlotClaims):
        calls = 0

        def claim(self, items):
            Crashing.calls += 1
            if Crashing.calls == 2:
                raise ConnectionError("killed mid-plan")
            return super().claim(items)

    claims = Crashing(slots, tenant, campaign.id, T0)
    rules = SegmentRules(tags_all=("promo",))
    with pytest.raises(ConnectionError):
        Planner(tenant).plan(rules=rules, channel="whatsapp", claims=claims, keep=0)
    assert 0 < len(every_slot(slots, tenant, campaign.id)) < 9
    rerun = Planner(tenant).plan(rules=rules, channel="whatsapp", claims=claims, keep=0)
    clean = Planner(tenant).plan(rules=rules, channel="whatsapp")
    assert rerun.counts == clean.counts
    assert (clean.counts.recipients, clean.counts.dropped) == (9, {"opted_out": 1})
    assert sorted(d.recipient for d in every_slot(slots, tenant, campaign.id)) == [f"+5730{i:08d}" for i in range(9)]
    assert_indexes_agree(slots, tenant, campaign.id)


@pytest.mark.parametrize("kv_world", ["memory"], indirect=True)
def test_two_contacts_with_one_number_in_different_batches_get_one_slot(kv_world, monkeypatch) -> None:
    """The dedupe is exact across batches (and across runs): it is the slot store's claim, not a batch's set."""
    tenant, slots = kv_world
    monkeypatch.setattr(planner_module, "BATCH", 1)
    source = Synthetic(12)  # contact 9 has contact 8's number written without the +
    claims = planning.SlotClaims(slots, tenant, CID, T0)
    for _ in range(2):
        plan = Planner(tenant, source).plan(rules=SegmentRules(), channel="whatsapp", claims=claims, keep=0)
        assert (plan.counts.recipients, plan.counts.dropped) == (11, {"duplicate": 1})
        assert plan.examples["duplicate"] == ["Cliente 9"]
    assert len(every_slot(slots, tenant)) == 11
    assert slots.slot_get(tenant, CID, "+573000000008").contact_id == f"c_{8:022x}"
    assert slots.slot_get(tenant, CID, "573000000008") is None


def test_the_preview_holds_the_first_recipients_and_counts_them_all(world: str, monkeypatch) -> None:
    from crm import services as crm

    monkeypatch.setattr(selectors, "PREVIEW_RECIPIENTS", 3)
    make_contacts(world, 5)
    segment = crm.segment_create(world, name="Promo", rules={"tags_all": ["promo"]})
    plan = selectors.campaign_plan(world, segment_id=segment.id, channel="whatsapp")
    assert plan.counts.recipients == 5
    assert [r.address for r in plan.recipients] == [f"+5730{i:08d}" for i in range(3)]


@pytest.mark.parametrize("kv_world", backends.KV_BACKENDS, indirect=True)
def test_a_run_on_the_kv_stores_shows_exact_progress_and_filters(kv_world, fake) -> None:
    """The whole run (plan, send, answers) on each backend: progress and filters agree with the deliveries."""
    from campaigns.services.sending import CampaignBot
    from crm import services as crm

    from .test_sending import FAST, Clock, whatsapp

    tenant, slots = kv_world
    make_contacts(tenant, 12)
    fake.script("+573000000001", "window_closed")
    fake.script("+573000000002", "rate_limited", times=1)
    fake.script("+573000000003", "drop")
    segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
    campaign = services.campaign_create(
        tenant,
        name="Kv",
        segment_id=segment.id,
        channel="whatsapp",
        message={"template": "promo_nov", "language": "es"},
    )
    services.campaign_start(tenant, campaign.id)

    def handoff(recipient, message):
        return "handoff" if recipient.address.endswith("11") else None

    clock = Clock()
    done = services.campaign_run(
        tenant, campaign.id, bot=CampaignBot(whatsapp(fake), (handoff,)), options=FAST, clock=clock, sleep=clock.sleep
    )
    assert done.state == "completed" and done.plan.recipients == 12
    counts = selectors.campaign_progress(tenant, campaign.id).counts
    assert counts.states == {"accepted": 9, "dropped": 1, "failed": 1, "in_doubt": 1}
    assert counts.reasons == {"dropped:handoff": 1, "failed:code:131047": 1, "in_doubt:no_answer": 1}
    page = selectors.delivery_list(tenant, campaign.id, state="accepted", limit=5)
    assert len(page.items) == 5 and all(d.state == "accepted" for d in page.items)
    rest = selectors.delivery_list(tenant, campaign.id, state="accepted", limit=5, after=page.next)
    assert len(rest.items) == 4 and rest.next is None
    assert [d.recipient for d in selectors.delivery_list(tenant, campaign.id, reason="handoff").items] == [
        "+573000000011"
    ]
    assert_indexes_agree(slots, tenant, campaign.id)
    assert set(DELIVERY_STATES) >= set(counts.states)


# --------------------------------------------------------------------------- an installation from before the indexes


@pytest.mark.django_db
def test_a_campaign_planned_before_the_indexes_is_built_by_botmesh_reindex(tenant_id: str) -> None:
    """Its slots were written without index upkeep: reads say to reindex; the command finds its table and builds."""
    import io

    from django.core.management import call_command

    from botmesh_admin.kv import Put
    from botmesh_admin.kv.indexes import IndexNotBuilt
    from botmesh_admin.kv.runtime import default_kv
    from botmesh_admin.tenancy.models import Tenant

    Tenant.objects.create(id=tenant_id, name="Upgraded")
    kv = default_kv()
    campaigns, slots = KvCampaignStore(kv), KvSlotStore(kv)
    campaign_id = _campaign(campaigns, tenant_id)
    table = slots._table(tenant_id, campaign_id)
    for n, r in enumerate(RECIPIENTS[:12]):  # as the store wrote them before this change
        state = {0: "accepted", 1: "failed"}.get(n % 4, "pending")
        kv.commit(
            table,
            [
                Put(
                    f"d/{r}",
                    Delivery.to_json(
                        Delivery(
                            r,
                            contact_of(r),
                            f"whatsapp:{key_of(r)}",
                            state=state,
                            reason="code:131047" if state == "failed" else None,
                        )
                    ),
                )
            ],
        )
    with use_store(CampaignStores(campaigns, slots)):
        with pytest.raises(IndexNotBuilt, match="botmesh_reindex"):
            selectors.campaign_progress(tenant_id, campaign_id)
        out = io.StringIO()
        call_command("botmesh_reindex", "--tenant", tenant_id, stdout=out)
        assert (
            f"{tenant_id} campaigns/d-{campaign_id} delivery_count_state: 12 records indexed, built" in out.getvalue()
        )
        counts = selectors.campaign_progress(tenant_id, campaign_id).counts
        assert counts.states == {"accepted": 3, "failed": 3, "pending": 6}
        assert counts.reasons == {"failed:code:131047": 3}
        assert len(selectors.delivery_list(tenant_id, campaign_id, state="failed").items) == 3
        checked = io.StringIO()
        call_command("botmesh_check_indexes", "--tenant", tenant_id, stdout=checked)
        assert "0 drifting" in checked.getvalue()
    assert_indexes_agree(slots, tenant_id, campaign_id)


def test_campaigns_listed_by_state_page_through_the_index(campaign_store, tenant_id: str) -> None:
    """Over every store and backend: a state's campaigns by id, page by page, as the records say; no drift."""
    from dataclasses import replace

    from campaigns.stores.kv import CAMPAIGN

    made = []
    for n in range(9):
        c = campaign_store.campaign_insert(
            tenant_id,
            Campaign(
                id=f"cmp_{n:022x}",
                name=f"c{n}",
                segment_id="s_" + "1" * 22,
                channel="whatsapp",
                message=Message(template="promo"),
                created_at=T0,
                updated_at=T0,
            ),
        )
        made.append(c)
    for c in made[::2]:
        campaign_store.campaign_replace(tenant_id, replace(c, state="running"), expected_version=c.version)
    campaign_store.campaign_delete(tenant_id, made[4].id, expected_version=2)

    def listed(state: str | None) -> list[str]:
        out, after = [], None
        while page := campaign_store.campaign_scan(tenant_id, after=after, limit=2, state=state):
            out += [c.id for c in page]
            after = page[-1].id
        return out

    assert listed("running") == [made[n].id for n in (0, 2, 6, 8)]
    assert listed("draft") == [made[n].id for n in (1, 3, 5, 7)]
    assert listed(None) == [c.id for n, c in enumerate(made) if n != 4]
    assert listed("paused") == []
    if isinstance(campaign_store, KvCampaignStore):
        assert campaign_store.layout.check(campaign_store._campaigns(tenant_id), CAMPAIGN.indexes[0].name) == NO_DRIFT
    with use_store(CampaignStores(campaign_store, MemorySlotStore())):
        page = selectors.campaign_list(tenant_id, state="running", limit=3)
        assert [c.id for c in page.items] == [made[n].id for n in (0, 2, 6)] and page.next == made[6].id
        assert [c.id for c in selectors.campaign_list(tenant_id, state="running", after=page.next).items] == [
            made[8].id
        ]
