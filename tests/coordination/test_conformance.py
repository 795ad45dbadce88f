"""The Coordinator contract, run on every backend (memory hub, Redis, Redis Cluster, the Kv coordinator).

Lease time is ordered on a fake clock (``Deployment.clock``, ``elapse``) on every
backend but Redis, whose leases expire on the server's real clock; threads are
ordered by what the shared state shows (``wait_until`` a ticket is queued), never by sleeping.
"""

from __future__ import annotations

import threading
import time

import pytest

from botmesh_admin.coordination import CoordinationEvent
from botmesh_admin.coordination import Coordinator as CoordinatorProtocol
from botmesh_admin.coordination.base import LOCAL_VALIDITY
from botmesh_admin.errors import ValidationError
from tests.polling import wait_until

from .conftest import LEASE_MS, Deployment

L = LEASE_MS / 1000


def _in_thread(fn):  # type: ignore[no-untyped-def]
    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", fn()), daemon=True)
    thread.start()
    return thread, box


def test_every_coordinator_implements_the_protocol(deployment: Deployment) -> None:
    """Both coordinator classes satisfy the runtime-checkable contract."""
    assert isinstance(deployment.make("a"), CoordinatorProtocol)


def test_free_turn_is_granted_at_once_and_held_turn_is_not(deployment: Deployment) -> None:
    """One holder at a time: a second replica waiting 0 ms gets nothing."""
    a, b = deployment.make("a"), deployment.make("b")
    turn = a.acquire_turn("chat:1", 0)
    assert turn is not None and turn.valid() and turn.previous_holder is None
    assert b.acquire_turn("chat:1", 0) is None
    assert b.acquire_turn("chat:1", 150) is None
    assert b.acquire_turn("chat:2", 0) is not None  # other keys are independent
    assert a.release(turn) is True
    assert not turn.valid()
    again = b.acquire_turn("chat:1", 0)
    assert again is not None and again.previous_holder == a.owner


def test_turns_are_granted_in_ticket_order(deployment: Deployment) -> None:
    """Waiters on one key are served first come, first served, across replicas."""
    holder = deployment.make("holder")
    first = holder.acquire_turn("chat:fifo", 0)
    assert first is not None
    order: list[str] = []
    threads = []
    for n, name in enumerate(("w1", "w2", "w3", "w4"), start=1):
        coordinator = deployment.make(name)

        def wait(c=coordinator, n=name) -> None:  # type: ignore[no-untyped-def]
            turn = c.acquire_turn("chat:fifo", 10_000)
            assert turn is not None
            order.append(n)
            time.sleep(0.02)
            turn.release()

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        threads.append(thread)
        # the ticket is taken before the next waiter starts
        wait_until(lambda n=n: deployment.queued(holder, "chat:fifo") == n, f"{name}'s ticket", timeout_s=15)
    first.release()
    for thread in threads:
        thread.join(timeout=15)
    assert order == ["w1", "w2", "w3", "w4"]


def test_one_holder_at_a_time_under_contention(deployment: Deployment) -> None:
    """Threads of three replicas never hold the same key at once; every acquisition succeeds."""
    coordinators = [deployment.make(f"r{i}") for i in range(3)]
    inside = threading.Semaphore(1)
    overlaps: list[int] = []
    fences: list[int] = []
    done = []

    def work(c) -> None:  # type: ignore[no-untyped-def]
        for _ in range(8):
            turn = c.acquire_turn("chat:hot", 15_000)
            assert turn is not None
            if not inside.acquire(blocking=False):
                overlaps.append(turn.fence)
            else:
                fences.append(turn.fence)
                time.sleep(0.002)
                inside.release()
            turn.release()
        done.append(1)

    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in coordinators for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert overlaps == []
    assert len(done) == 6 and len(fences) == 48
    assert fences == sorted(fences) and len(set(fences)) == 48  # granted one after another


def test_fences_grow_with_every_acquisition(deployment: Deployment) -> None:
    """Turns, leaderships and locks all carry strictly increasing fences."""
    a, b = deployment.make("a"), deployment.make("b")
    seen = []
    for i in range(3):
        turn = (a if i % 2 else b).acquire_turn("chat:f", 0)
        assert turn is not None
        seen.append(turn.fence)
        turn.release()
    lead = a.try_lead("scheduler")
    assert lead is not None
    seen.append(lead.fence)
    lock = b.acquire_lock_fenced("lock:f", 1000)
    assert lock is not None
    seen.append(lock[1])
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_a_held_turn_is_renewed_past_its_lease(deployment: Deployment) -> None:
    """The background renewal keeps a turn held for several lease lengths."""
    a, b = deployment.make("a"), deployment.make("b")
    turn = a.acquire_turn("chat:long", 0)
    assert turn is not None
    if deployment.clock is None:  # Redis: the lease runs on the server's real clock
        time.sleep(2.5 * L)
    else:  # 2.5 leases in five steps, each renewed by the background thread before the next
        full = int(LEASE_MS * LOCAL_VALIDITY)
        for step in range(5):
            deployment.clock.advance(LEASE_MS // 2)
            wait_until(lambda: turn.remaining_ms() == full, f"renewal {step + 1}", timeout_s=10 * L)
    assert turn.valid()
    assert b.acquire_turn("chat:long", 0) is None
    assert a.held_turns() == 1


def test_a_dead_holders_turn_passes_on_after_the_lease(deployment: Deployment) -> None:
    """A holder that stops renewing (crashed) loses its turn after lease_ms, not before."""
    a, b = deployment.make("a"), deployment.make("b")
    turn = a.acquire_turn("chat:dead", 0)
    assert turn is not None
    a.close(release=False)  # crash: no release, no more renewals
    if deployment.clock is None:  # Redis: wait in the server's real time
        started = time.monotonic()
        taken = b.acquire_turn("chat:dead", int(4 * LEASE_MS))
        waited = time.monotonic() - started
    else:  # still held half a lease later; free once the lease has run out (waited on the fake clock)
        started_ms = deployment.clock()
        deployment.clock.advance(LEASE_MS // 2)
        assert b.acquire_turn("chat:dead", 0) is None
        deployment.clock.advance(LEASE_MS - LEASE_MS // 2)
        taken = b.acquire_turn("chat:dead", 0)
        waited = (deployment.clock() - started_ms) / 1000
    assert taken is not None and taken.fence > turn.fence
    assert taken.previous_holder == a.owner
    assert 0.5 * L <= waited <= 2.5 * L


def test_queued_tickets_of_a_dead_replica_are_skipped(deployment: Deployment) -> None:
    """A ticket nobody waits on any more does not block the queue for long."""
    a, c = deployment.make("a"), deployment.make("c")
    turn = a.acquire_turn("chat:ghost", 0)
    assert turn is not None
    # A replica that took a ticket and died: its ticket sits in the queue, untouched.
    a._backend.turn_acquire("chat:ghost", "ghost/dead", None, LEASE_MS)
    thread, box = _in_thread(lambda: c.acquire_turn("chat:ghost", int(5 * LEASE_MS)))
    wait_until(lambda: deployment.queued(a, "chat:ghost") == 2, "c's ticket behind the ghost's", timeout_s=10)
    turn.release()
    if deployment.clock is not None:  # the ghost's ticket dies a lease after it was taken (Redis: in real time)
        deployment.clock.advance(LEASE_MS + 1)
    thread.join(timeout=10)
    granted = box.get("result")
    assert granted is not None and granted.previous_holder == a.owner  # type: ignore[attr-defined]


def test_a_restarted_replica_never_inherits_its_old_turns(deployment: Deployment) -> None:
    """Same replica_id, new incarnation: the old turn is someone else's until it expires."""
    old = deployment.make("replica-1", lease_ms=3000)
    turn = old.acquire_turn("chat:inc", 0)
    assert turn is not None
    old.close(release=False)
    new = deployment.make("replica-1", lease_ms=3000)
    assert new.replica_id == old.replica_id and new.incarnation != old.incarnation
    assert new.acquire_turn("chat:inc", 0) is None
    if deployment.clock is not None:  # the old turn's lease (3000 ms) runs out; Redis waits for it below
        deployment.clock.advance(3000)
    taken = new.acquire_turn("chat:inc", 12_000)
    assert taken is not None and taken.previous_holder == old.owner and taken.fence > turn.fence


def test_waiting_gives_up_after_wait_ms_and_withdraws_the_ticket(deployment: Deployment) -> None:
    """A timed-out waiter leaves the queue, so the next waiter is not held up by it."""
    a, b, c = deployment.make("a"), deployment.make("b"), deployment.make("c")
    turn = a.acquire_turn("chat:w", 0)
    assert turn is not None
    started = time.monotonic()
    assert b.acquire_turn("chat:w", 200) is None
    assert 0.15 <= time.monotonic() - started <= 0.3 + L / 3
    thread, box = _in_thread(lambda: c.acquire_turn("chat:w", 5000))
    wait_until(lambda: deployment.queued(a, "chat:w") == 1, "c's ticket (b's withdrawn)", timeout_s=10)
    released_at = time.monotonic()
    turn.release()
    thread.join(timeout=6)
    assert box.get("result") is not None
    assert time.monotonic() - released_at < L  # woken on release, not after b's ticket expired


def test_only_one_replica_leads_and_followers_are_told(deployment: Deployment) -> None:
    """try_lead: one leader; the others get None and a follower event once."""
    coordinators = [deployment.make(f"r{i}") for i in range(3)]
    events: list[CoordinationEvent] = []
    for c in coordinators:
        c.subscribe(events.append)
    handles = [c.try_lead("provider:wa-1") for c in coordinators]
    assert sum(h is not None for h in handles) == 1
    assert handles[0] is not None and coordinators[0].try_lead("provider:wa-1") is handles[0]
    for c in coordinators[1:]:
        assert c.try_lead("provider:wa-1") is None
    kinds = [(e.kind, e.replica_id) for e in events]
    assert kinds.count(("leader", "r0")) == 1
    assert kinds.count(("follower", "r1")) == 1 and kinds.count(("follower", "r2")) == 1
    assert coordinators[0].lead_provider("wa-1") is handles[0]


def test_leadership_hands_over_with_a_higher_fence(deployment: Deployment) -> None:
    """A resigned or crashed leader is succeeded; the successor reports a handover."""
    a, b = deployment.make("a"), deployment.make("b")
    events: list[CoordinationEvent] = []
    b.subscribe(events.append)
    lead_a = a.try_lead("scheduler")
    assert lead_a is not None and b.try_lead("scheduler") is None
    lead_a.release()
    lead_b = b.try_lead("scheduler")
    assert lead_b is not None and lead_b.fence > lead_a.fence and lead_b.previous_holder == a.owner
    assert [e.kind for e in events] == ["follower", "leader", "handover"]
    assert events[-1].previous == a.owner
    b.close(release=False)
    assert a.try_lead("scheduler") is None
    deployment.elapse(int(1.2 * LEASE_MS))
    lead_a2 = a.try_lead("scheduler")
    assert lead_a2 is not None and lead_a2.fence > lead_b.fence


def test_a_handover_says_why_the_previous_holder_let_go(deployment: Deployment) -> None:
    """The handover event's reason (the Replicas page's column): a kill reads as an expired lease, a release as one."""
    a, b, c = deployment.make("a"), deployment.make("b"), deployment.make("c")
    lead_a = a.try_lead("provider:main")
    assert lead_a is not None
    a.close(release=False)  # kill -9: no release, no more renewals
    deployment.elapse(int(1.3 * LEASE_MS))
    assert b.try_lead("provider:main") is not None
    handover = [e for e in b.snapshot().events if e.kind == "handover"][0]
    assert handover.previous == a.owner and handover.replica_id == "b"
    assert handover.detail.startswith("previous holder's lease expired (no renewal for ")
    silent_ms = int(handover.detail.split("for ")[1].split(" ms")[0])
    assert LEASE_MS <= silent_ms < LEASE_MS + 10_000  # at least its lease went by without a renewal
    assert b.step_down("provider:main", reason="transport closed for 5000 ms") is True
    assert c.try_lead("provider:main") is not None
    events = c.snapshot().events
    assert (events[0].kind, events[0].previous) == ("handover", b.owner)
    assert events[0].detail == "previous holder released the lease (stepped down or stopped)"
    assert events[0].to_json()["detail"] == events[0].detail


def test_a_stalled_replica_gives_up_before_the_service_expires_its_lease(deployment: Deployment) -> None:
    """Renewals stalled for most of lease_ms: the handle is invalid while the service still holds it."""
    lease_s = 3.0
    a, b = deployment.make("a", lease_ms=3000), deployment.make("b", lease_ms=3000)
    lost: list[CoordinationEvent] = []
    a.subscribe(lambda e: lost.append(e) if e.kind == "lease-lost" else None)
    sent = time.monotonic()
    lead = a.try_lead("scheduler")
    assert lead is not None
    a._stop.set()  # the renewal thread stops: a stall
    a._thread.join(timeout=5)
    if deployment.clock is not None:  # exactly 0.82 of the lease later: the service's lease has 0.18 left
        deployment.clock.advance(int(0.82 * 3000))
    else:
        time.sleep(max(0.0, sent + 0.82 * lease_s - time.monotonic()))
    assert not lead.valid() and lead.state == "lost"  # given up locally at 0.8 of the lease
    # On the fake clock this always holds; Redis' lease runs in real time (a loaded machine may overshoot).
    if deployment.clock is not None or time.monotonic() - sent < 0.97 * lease_s:
        assert b.try_lead("scheduler") is None  # ... while the service still holds it
    a._renew_once()  # the stalled thread wakes up: it reports the loss instead of renewing
    assert [e.name for e in lost] == ["scheduler"]
    lead_b = b.try_lead("scheduler")  # given up in the service as well
    assert lead_b is not None and lead_b.fence > lead.fence


def test_lease_lost_when_the_service_no_longer_holds_it(deployment: Deployment) -> None:
    """A lease taken over behind the holder's back is reported lost at the next renewal."""
    a, b = deployment.make("a"), deployment.make("b")
    lost: list[str] = []
    a.subscribe(lambda e: lost.append(e.kind))
    turn = a.acquire_turn("chat:stolen", 0)
    assert turn is not None
    a._backend.turn_release("chat:stolen", turn.ticket)  # e.g. an operator cleared it
    assert b.acquire_turn("chat:stolen", 0) is not None
    wait_until(lambda: not turn.valid() and "lease-lost" in lost, "the next renewal's lease-lost", timeout_s=2 * L)
    assert not turn.valid() and "lease-lost" in lost


def test_fenced_lock_is_exclusive_and_releases_only_with_its_token(deployment: Deployment) -> None:
    """acquire_lock_fenced gives a token and fence; a stale token releases nothing."""
    a, b = deployment.make("a"), deployment.make("b")
    got = a.acquire_lock_fenced("lock:x", 2000)
    assert got is not None
    token, fence = got
    assert b.acquire_lock_fenced("lock:x", 2000) is None
    assert b.release_lock("lock:x", "not-the-token") is False
    assert b.acquire_lock_fenced("lock:x", 2000) is None
    assert a.release_lock("lock:x", token) is True
    assert a.release_lock("lock:x", token) is False
    again = b.acquire_lock_fenced("lock:x", 2000)
    assert again is not None and again[1] > fence
    assert a.release_lock("lock:x", token) is False  # the old token cannot release the new holder
    assert b.acquire_lock_fenced("lock:x", 2000) is None


def test_renewing_a_lock_replaces_its_ttl_and_never_adds(deployment: Deployment) -> None:
    """Renewing N times keeps the remaining time at or below ttl (a known lock bug)."""
    a = deployment.make("a")
    got = a.acquire_lock_fenced("lock:ttl", 1000)
    assert got is not None
    for _ in range(10):
        assert a.renew_lock("lock:ttl", got[0], 1000) is True
        ttl = deployment.lock_ttl_ms(a, "lock:ttl")
        assert ttl is not None and 0 < ttl <= 1000
    assert a.renew_lock("lock:ttl", got[0], 300) is True
    ttl = deployment.lock_ttl_ms(a, "lock:ttl")
    assert ttl is not None and ttl <= 300
    assert a.renew_lock("lock:ttl", "stale", 1000) is False


def test_an_expired_lock_cannot_be_renewed_and_is_taken_over(deployment: Deployment) -> None:
    """After its TTL the lock belongs to whoever takes it next, with a higher fence."""
    a, b = deployment.make("a"), deployment.make("b")
    got = a.acquire_lock_fenced("lock:exp", 150)
    assert got is not None
    deployment.elapse(250)
    taken = b.acquire_lock_fenced("lock:exp", 1000)
    assert taken is not None and taken[1] > got[1]
    assert a.renew_lock("lock:exp", got[0], 1000) is False
    assert a.release_lock("lock:exp", got[0]) is False
    assert deployment.lock_ttl_ms(b, "lock:exp") is not None


def test_snapshot_lists_replicas_leaders_turns_and_events(deployment: Deployment) -> None:
    """What the replicas dashboard shows, read from the shared state."""
    web = deployment.make("web-1", role="web")
    worker = deployment.make("worker-1", role="worker")
    worker.acquire_turn("chat:s1", 0)
    worker.acquire_turn("chat:s2", 0)
    lead = web.try_lead("scheduler")
    assert lead is not None
    lead.release()
    assert worker.try_lead("scheduler") is not None
    worker._beat()
    snap = web.snapshot()
    by_id = {r.replica_id: r for r in snap.replicas}
    assert set(by_id) >= {"web-1", "worker-1"}
    assert by_id["worker-1"].role == "worker" and by_id["worker-1"].turns == 2
    assert by_id["worker-1"].incarnation == worker.incarnation
    assert by_id["worker-1"].leads == {"scheduler": snap.leaders[0].fence}
    assert 0 <= by_id["web-1"].age_ms < 3 * LEASE_MS
    assert [(x.name, x.replica_id) for x in snap.leaders] == [("scheduler", "worker-1")]
    assert [(e.kind, e.name, e.previous) for e in snap.events][:1] == [("handover", "scheduler", web.owner)]
    web.close()
    assert "web-1" not in {r.replica_id for r in worker.snapshot().replicas}


def test_snapshot_shows_held_chat_keys_hashed_and_the_replicas_lease(deployment: Deployment) -> None:
    """Issue 19 item 3: the Replicas page shows which chats a replica holds, as hashes, never raw."""
    from botmesh_admin.coordination.core import key_digest

    bot = deployment.make("bot-1", role="bot")
    turns = [bot.acquire_turn(key, 0) for key in ("whatsapp:573001112233", "telegram:700000109")]
    bot._beat()
    row = {r.replica_id: r for r in bot.snapshot().replicas}["bot-1"]
    assert row.turns == 2 and row.lease_ms == LEASE_MS
    assert sorted(row.turn_keys) == sorted([key_digest("whatsapp:573001112233"), key_digest("telegram:700000109")])
    assert "573001112233" not in repr(row)
    for turn in turns:
        assert turn is not None
        turn.release()
    bot._beat()
    assert {r.replica_id: r for r in bot.snapshot().replicas}["bot-1"].turn_keys == ()


def test_a_step_down_releases_the_leadership_and_says_why(deployment: Deployment) -> None:
    """``step_down`` frees the leadership at once (the next replica leads) and publishes its reason."""
    a, b = deployment.make("a"), deployment.make("b")
    lead = a.try_lead("provider:wa-1")
    assert lead is not None
    assert a.step_down("provider:wa-1", reason="transport closed for 30000 ms") is True
    assert not lead.valid() and a.step_down("provider:wa-1", reason="again") is False
    assert b.try_lead("provider:wa-1") is not None
    events = b.snapshot().events
    assert events[0].kind == "handover" and events[0].previous == a.owner
    down = [e for e in events if e.kind == "step-down"]
    assert [(e.name, e.replica_id, e.fence, e.detail) for e in down] == [
        ("provider:wa-1", "a", lead.fence, "transport closed for 30000 ms")
    ]
    with pytest.raises(ValidationError) as caught:
        a.step_down("provider:wa-1", reason=" ")
    assert caught.value.field == "reason"


def test_chat_keys_never_appear_raw_in_events(deployment: Deployment) -> None:
    """A lost turn is reported under a hash of its key."""
    a = deployment.make("a")
    events: list[CoordinationEvent] = []
    a.subscribe(events.append)
    turn = a.acquire_turn("whatsapp:+573001112233", 0)
    assert turn is not None
    a._backend.turn_release("whatsapp:+573001112233", turn.ticket)
    a._renew_once()
    assert [e.kind for e in events] == ["lease-lost"]
    assert "573001112233" not in events[0].name and events[0].name.startswith("turn:")


def test_keys_with_braces_and_unicode_work(deployment: Deployment) -> None:
    """Any chat key works, including braces (hash tags) and non-ASCII text."""
    a, b = deployment.make("a"), deployment.make("b")
    for key in ("tg:{12}x}", "wa:ñandú", "{", "}{"):
        turn = a.acquire_turn(key, 0)
        assert turn is not None, key
        assert b.acquire_turn(key, 0) is None
        turn.release()
        assert b.acquire_turn(key, 0) is not None


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.acquire_turn("", 0), "key"),
        (lambda c: c.acquire_turn("a\nb", 0), "key"),
        (lambda c: c.acquire_turn("x" * 513, 0), "key"),
        (lambda c: c.acquire_turn("k", -1), "wait_ms"),
        (lambda c: c.try_lead("bad name"), "name"),
        (lambda c: c.acquire_lock_fenced("k", 10), "ttl_ms"),
    ],
)
def test_bad_arguments_name_the_field(deployment: Deployment, call, field: str) -> None:  # type: ignore[no-untyped-def]
    """Validation errors name the offending argument."""
    with pytest.raises(ValidationError) as info:
        call(deployment.make("a"))
    assert info.value.field == field
