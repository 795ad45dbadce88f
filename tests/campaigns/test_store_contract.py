"""The CampaignStore and SlotStore contracts, over the memory stores and the Kv stores on every backend.

Times are given explicitly (epoch ms): reservations expire by the clock the
caller passes, so nothing here sleeps.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from botmesh_admin.errors import Conflict, NotFound
from campaigns.domain import (
    Campaign,
    Delivery,
    Failure,
    Message,
    StateConflict,
    new_campaign_id,
    new_token,
)
from campaigns.stores.base import CampaignStore, SlotStore

CID = "cmp_00000000000000000000aa"
T0 = 1_700_000_000_000
TTL = 30_000
WINDOW = Failure(131047, "Re-engagement message", retryable=False)
RATE = Failure(130429, "Rate limit hit", retryable=True, retry_after_ms=2000)


def slot(recipient: str, contact: str = "c_0000000000000000000001") -> Delivery:
    return Delivery(recipient, contact, f"whatsapp:{recipient.lstrip('+')}", updated_at=T0)


def planned(store: SlotStore, tenant: str, *recipients: str) -> None:
    assert store.slots_add(tenant, CID, [slot(r) for r in recipients]) == len(recipients)


def take(store: SlotStore, tenant: str, *recipients: str, now: int = T0) -> list[Delivery]:
    return store.slots_reserve(tenant, CID, list(recipients), token=new_token(), ttl_ms=TTL, now_ms=now)


def test_stores_implement_the_protocols(campaign_store: CampaignStore, slot_store: SlotStore) -> None:
    assert isinstance(campaign_store, CampaignStore)
    assert isinstance(slot_store, SlotStore)


def test_a_planned_slot_is_pending_and_adding_it_again_keeps_it(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233", "+573001112234")
    (held,) = take(slot_store, tenant_id, "+573001112233")
    assert slot_store.slots_add(tenant_id, CID, [slot("+573001112233"), slot("+573001112235")]) == 1
    assert slot_store.slot_get(tenant_id, CID, "+573001112233").state == "reserved", "a re-plan never resets a slot"
    assert [d.recipient for d in slot_store.slot_scan(tenant_id, CID)] == [
        "+573001112233",
        "+573001112234",
        "+573001112235",
    ]
    assert held.token and held.lease_until == T0 + TTL


def test_a_live_reservation_is_not_taken_twice(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233")
    assert len(take(slot_store, tenant_id, "+573001112233")) == 1
    assert take(slot_store, tenant_id, "+573001112233", now=T0 + TTL - 1) == []


def test_an_expired_reservation_without_provider_id_is_taken_again(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233")
    (first,) = take(slot_store, tenant_id, "+573001112233")
    (second,) = take(slot_store, tenant_id, "+573001112233", now=T0 + TTL)
    assert second.token != first.token
    # The first holder lost it: its marks are ignored.
    assert slot_store.slots_mark_sending(tenant_id, CID, [first], ttl_ms=TTL, now_ms=T0 + TTL + 1) == []
    assert slot_store.slot_get(tenant_id, CID, "+573001112233").token == second.token


def test_mark_sent_records_the_provider_id_and_counts_one_send(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233")
    (held,) = take(slot_store, tenant_id, "+573001112233")
    (sending,) = slot_store.slots_mark_sending(tenant_id, CID, [held], ttl_ms=TTL, now_ms=T0 + 1)
    assert sending.state == "sending"
    (sent,) = slot_store.slots_mark_sent(tenant_id, CID, [(sending, "wamid.A", "573001112233")], now_ms=T0 + 2)
    assert (sent.state, sent.provider_message_id, sent.provider_recipient, sent.sends, sent.attempts) == (
        "accepted",
        "wamid.A",
        "573001112233",
        1,
        1,
    )
    assert slot_store.slots_mark_sent(tenant_id, CID, [(sending, "wamid.B", None)], now_ms=T0 + 3) == []
    assert take(slot_store, tenant_id, "+573001112233", now=T0 + 10 * TTL) == [], "a sent slot is never taken again"
    got = slot_store.slot_get(tenant_id, CID, "+573001112233")
    assert (got.provider_message_id, got.sends) == ("wamid.A", 1)


def test_a_sending_slot_is_never_taken_again_and_becomes_in_doubt(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233")
    (held,) = take(slot_store, tenant_id, "+573001112233")
    (sending,) = slot_store.slots_mark_sending(tenant_id, CID, [held], ttl_ms=TTL, now_ms=T0)
    assert take(slot_store, tenant_id, "+573001112233", now=T0 + 10 * TTL) == []
    assert (
        slot_store.slots_mark_in_doubt(
            tenant_id, CID, [(sending, "sender_lost")], now_ms=T0 + TTL - 1, expired_only=True
        )
        == []
    ), "still live"
    (doubt,) = slot_store.slots_mark_in_doubt(
        tenant_id, CID, [(sending, "sender_lost")], now_ms=T0 + TTL, expired_only=True
    )
    assert (doubt.state, doubt.reason) == ("in_doubt", "sender_lost")
    assert take(slot_store, tenant_id, "+573001112233", now=T0 + 10 * TTL) == []
    # The sender's answer arrives late after all: the truth wins.
    (late,) = slot_store.slots_mark_sent(tenant_id, CID, [(sending, "wamid.late", None)], now_ms=T0 + TTL + 5)
    assert (late.state, late.sends) == ("accepted", 1)


def test_reserve_for_sending_takes_the_slot_straight_into_sending(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233", "+573001112234")
    (held,) = take(slot_store, tenant_id, "+573001112234")
    got = slot_store.slots_reserve(
        tenant_id, CID, ["+573001112233", "+573001112234"], token=new_token(), ttl_ms=TTL, now_ms=T0, sending=True
    )
    assert [(d.recipient, d.state, d.lease_until) for d in got] == [("+573001112233", "sending", T0 + TTL)]
    assert take(slot_store, tenant_id, "+573001112233", now=T0 + 10 * TTL) == [], "never taken again"


def test_a_retryable_failure_releases_the_slot_until_max_attempts(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233")
    now = T0
    for attempt in (1, 2):
        (held,) = take(slot_store, tenant_id, "+573001112233", now=now)
        (sending,) = slot_store.slots_mark_sending(tenant_id, CID, [held], ttl_ms=TTL, now_ms=now)
        (released,) = slot_store.slots_mark_failed(tenant_id, CID, [(sending, RATE)], max_attempts=3, now_ms=now)
        assert (released.state, released.attempts, released.error_code, released.reason) == (
            "pending",
            attempt,
            130429,
            "retrying",
        )
        assert released.not_before == now + 2000
        assert take(slot_store, tenant_id, "+573001112233", now=now + 1999) == [], "not before the delay"
        now += 2000
    (held,) = take(slot_store, tenant_id, "+573001112233", now=now)
    (sending,) = slot_store.slots_mark_sending(tenant_id, CID, [held], ttl_ms=TTL, now_ms=now)
    (final,) = slot_store.slots_mark_failed(tenant_id, CID, [(sending, RATE)], max_attempts=3, now_ms=now)
    assert (final.state, final.attempts, final.reason, final.retryable) == ("failed", 3, "gave_up", True)


def test_a_permanent_failure_is_final_with_its_code(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233")
    (held,) = take(slot_store, tenant_id, "+573001112233")
    (sending,) = slot_store.slots_mark_sending(tenant_id, CID, [held], ttl_ms=TTL, now_ms=T0)
    (failed,) = slot_store.slots_mark_failed(tenant_id, CID, [(sending, WINDOW)], max_attempts=3, now_ms=T0)
    assert (failed.state, failed.error_code, failed.retryable, failed.reason) == (
        "failed",
        131047,
        False,
        "code:131047",
    )
    assert take(slot_store, tenant_id, "+573001112233", now=T0 + 10 * TTL) == []


def test_release_gives_held_slots_back_without_an_attempt(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233", "+573001112234")
    held = take(slot_store, tenant_id, "+573001112233", "+573001112234")
    sending = slot_store.slots_mark_sending(tenant_id, CID, held[:1], ttl_ms=TTL, now_ms=T0)
    released = slot_store.slots_release(tenant_id, CID, [*sending, held[1]], now_ms=T0 + 1)
    assert [(d.state, d.attempts, d.token) for d in released] == [("pending", 0, None)] * 2
    assert len(take(slot_store, tenant_id, "+573001112233", "+573001112234", now=T0 + 2)) == 2


def test_drop_needs_the_reservation_and_keeps_the_reason(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233")
    (lost,) = take(slot_store, tenant_id, "+573001112233")
    (held,) = take(slot_store, tenant_id, "+573001112233", now=T0 + TTL)
    assert slot_store.slots_mark_dropped(tenant_id, CID, [(lost, "opted_out")], now_ms=T0 + TTL) == []
    (dropped,) = slot_store.slots_mark_dropped(tenant_id, CID, [(held, "opted_out")], now_ms=T0 + TTL)
    assert (dropped.state, dropped.reason) == ("dropped", "opted_out")


def test_cancel_takes_only_slots_nobody_holds(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+1", "+2", "+3", "+4")
    held = take(slot_store, tenant_id, "+2", "+3")
    slot_store.slots_mark_sending(tenant_id, CID, held[1:], ttl_ms=TTL, now_ms=T0)
    assert slot_store.slots_cancel(tenant_id, CID, now_ms=T0 + 1) == 2  # +1 and +4
    assert [d.state for d in slot_store.slot_scan(tenant_id, CID)] == ["cancelled", "reserved", "sending", "cancelled"]
    assert slot_store.slots_cancel(tenant_id, CID, now_ms=T0 + TTL) == 1, "an expired reservation is cancelled too"
    counts = slot_store.slot_counts(tenant_id, CID)
    assert counts.states == {"cancelled": 3, "sending": 1}
    assert counts.reasons == {"cancelled:campaign_cancelled": 3}


def test_resend_puts_only_an_in_doubt_slot_back(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233", "+573001112234")
    held = take(slot_store, tenant_id, "+573001112233")
    sending = slot_store.slots_mark_sending(tenant_id, CID, held, ttl_ms=TTL, now_ms=T0)
    slot_store.slots_mark_in_doubt(tenant_id, CID, [(sending[0], "no_answer")], now_ms=T0)
    with pytest.raises(StateConflict):
        slot_store.slot_resend(tenant_id, CID, "+573001112234", now_ms=T0)
    with pytest.raises(NotFound):
        slot_store.slot_resend(tenant_id, CID, "+999", now_ms=T0)
    again = slot_store.slot_resend(tenant_id, CID, "+573001112233", now_ms=T0 + 1)
    assert (again.state, again.reason) == ("pending", "resend")
    assert len(take(slot_store, tenant_id, "+573001112233", now=T0 + 2)) == 1


def test_another_tenant_and_campaign_see_nothing(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+573001112233")
    assert slot_store.slot_get(tenant_id + "-b", CID, "+573001112233") is None
    assert slot_store.slot_scan(tenant_id, "cmp_00000000000000000000bb") == []
    assert (
        slot_store.slots_reserve(tenant_id + "-b", CID, ["+573001112233"], token=new_token(), ttl_ms=TTL, now_ms=T0)
        == []
    )


def test_scan_pages_in_recipient_order(slot_store: SlotStore, tenant_id: str) -> None:
    recipients = [f"+5730011{n:05d}" for n in range(25)]
    planned(slot_store, tenant_id, *reversed(recipients))
    seen, after = [], None
    while page := slot_store.slot_scan(tenant_id, CID, after=after, limit=10):
        seen += [d.recipient for d in page]
        after = page[-1].recipient
    assert seen == recipients


def test_concurrent_senders_reserve_each_slot_once(slot_store: SlotStore, tenant_id: str) -> None:
    """Four threads race for the same 60 slots: every slot ends up with exactly one holder."""
    recipients = [f"+5730022{n:05d}" for n in range(60)]
    planned(slot_store, tenant_id, *recipients)
    won: dict[str, list[str]] = {}
    barrier = threading.Barrier(4)

    def sender() -> None:
        token = new_token()
        barrier.wait(timeout=10)
        for start in range(0, 60, 15):
            got = slot_store.slots_reserve(
                tenant_id, CID, recipients[start : start + 15], token=token, ttl_ms=TTL, now_ms=T0
            )
            won[token] = won.get(token, []) + [d.recipient for d in got]

    threads = [threading.Thread(target=sender) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    taken = [r for rs in won.values() for r in rs]
    assert sorted(taken) == recipients, "every slot reserved exactly once"
    for d in slot_store.slot_scan(tenant_id, CID, limit=100):
        assert d.recipient in won[d.token]


def test_drop_all_deletes_the_campaigns_slots(slot_store: SlotStore, tenant_id: str) -> None:
    planned(slot_store, tenant_id, "+1", "+2")
    slot_store.slots_drop_all(tenant_id, CID)
    assert slot_store.slot_scan(tenant_id, CID) == []


# --------------------------------------------------------------------------- campaigns


def _campaign(**kw) -> Campaign:
    return Campaign(
        id=new_campaign_id(),
        name=kw.pop("name", "Black Friday"),
        segment_id=kw.pop("segment_id", "s_0000000000000000000001"),
        channel="whatsapp",
        message=Message(template="promo", parameters=("{name}",)),
        created_at=T0,
        updated_at=T0,
        **kw,
    )


def test_campaign_insert_get_replace_is_compare_and_set(campaign_store: CampaignStore, tenant_id: str) -> None:
    c = campaign_store.campaign_insert(tenant_id, _campaign(contact_ids=("c_0000000000000000000001",)))
    assert c.version == 1 and campaign_store.campaign_get(tenant_id, c.id) == c
    with pytest.raises(Conflict):
        campaign_store.campaign_insert(tenant_id, c)
    c2 = campaign_store.campaign_replace(tenant_id, replace(c, state="running"), expected_version=1)
    assert c2.version == 2 and campaign_store.campaign_get(tenant_id, c.id).state == "running"
    with pytest.raises(Conflict) as info:
        campaign_store.campaign_replace(tenant_id, replace(c, state="paused"), expected_version=1)
    assert info.value.current_version == 2
    with pytest.raises(NotFound):
        campaign_store.campaign_replace(tenant_id, _campaign(), expected_version=1)
    assert campaign_store.campaign_get(tenant_id + "-b", c.id) is None
    campaign_store.campaign_delete(tenant_id, c.id, expected_version=2)
    assert campaign_store.campaign_get(tenant_id, c.id) is None


def test_campaign_scan_orders_by_id(campaign_store: CampaignStore, tenant_id: str) -> None:
    made = [campaign_store.campaign_insert(tenant_id, _campaign(name=f"n{i}")).id for i in range(5)]
    assert [c.id for c in campaign_store.campaign_scan(tenant_id, limit=3)] == made[:3]
    assert [c.id for c in campaign_store.campaign_scan(tenant_id, after=made[2])] == made[3:]


def test_campaign_scan_by_segment_follows_state_changes(campaign_store: CampaignStore, tenant_id: str) -> None:
    """What deleting a segment asks (issue 20 item 5): its campaigns by state, kept in step with each write."""
    a = campaign_store.campaign_insert(tenant_id, _campaign(name="a", segment_id="s_0000000000000000000011"))
    b = campaign_store.campaign_insert(tenant_id, _campaign(name="b", segment_id="s_0000000000000000000011"))
    campaign_store.campaign_insert(tenant_id, _campaign(name="c", segment_id="s_0000000000000000000012"))
    assert [
        c.id for c in campaign_store.campaign_scan_by_segment(tenant_id, "s_0000000000000000000011", states=["draft"])
    ] == [a.id, b.id]
    campaign_store.campaign_replace(tenant_id, replace(b, state="completed"), expected_version=1)
    assert [
        c.name for c in campaign_store.campaign_scan_by_segment(tenant_id, "s_0000000000000000000011", states=["draft"])
    ] == ["a"]
    done = campaign_store.campaign_scan_by_segment(
        tenant_id, "s_0000000000000000000011", states=["completed", "failed"]
    )
    assert [c.name for c in done] == ["b"]
    assert (
        campaign_store.campaign_scan_by_segment(
            tenant_id, "s_0000000000000000000011", states=["draft", "completed"], limit=1
        )[0]
        == a
    )
    campaign_store.campaign_delete(tenant_id, a.id, expected_version=1)
    assert campaign_store.campaign_scan_by_segment(tenant_id, "s_0000000000000000000011", states=["draft"]) == []
    assert (
        campaign_store.campaign_scan_by_segment(tenant_id + "-b", "s_0000000000000000000011", states=["completed"])
        == []
    )


def test_index_lists_active_campaigns_of_every_tenant(campaign_store: CampaignStore, tenant_id: str) -> None:
    other = tenant_id + "-b"
    campaign_store.index_put(tenant_id, CID, state="scheduled", at=T0)
    campaign_store.index_put(other, CID, state="running", at=None)
    mine = [e for e in campaign_store.index_scan() if e.tenant in (tenant_id, other)]
    assert [(e.tenant, e.state, e.at) for e in mine] == [(tenant_id, "scheduled", T0), (other, "running", None)]
    campaign_store.index_delete(tenant_id, CID)
    campaign_store.index_delete(other, CID)
    assert not [e for e in campaign_store.index_scan() if e.tenant in (tenant_id, other)]


def test_throttle_books_consecutive_windows(campaign_store: CampaignStore, tenant_id: str) -> None:
    assert campaign_store.throttle_take(tenant_id, "whatsapp", count=10, interval_ms=100, now_ms=T0) == T0
    assert campaign_store.throttle_take(tenant_id, "whatsapp", count=5, interval_ms=100, now_ms=T0 + 10) == T0 + 1000
    assert campaign_store.throttle_take(tenant_id, "telegram", count=1, interval_ms=100, now_ms=T0) == T0
    pushed = campaign_store.throttle_take(
        tenant_id, "whatsapp", count=0, interval_ms=100, now_ms=T0, not_before_ms=T0 + 9000
    )
    assert pushed == T0 + 9000
    assert campaign_store.throttle_take(tenant_id, "whatsapp", count=1, interval_ms=100, now_ms=T0) == T0 + 9000
