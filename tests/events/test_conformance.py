"""The EventJournal contract, case by case, on every backend (memory, file, SQLite, PostgreSQL, Redis)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from botmesh_admin.errors import Conflict, NotFound, ValidationError
from botmesh_admin.events import Envelope, EventJournal, EventRecord, RetryPolicy, StaleLeaseError
from botmesh_admin.events.base import MAX_BATCH, MAX_PAYLOAD_BYTES

from . import journals
from .conftest import FakeClock, backend_params

REPO = Path(__file__).resolve().parents[2]

LEASE = 10_000


def env(key: str = "k1", tenant: str = "acme", channel: str | None = None, **kw: object) -> Envelope:
    payload = kw.pop("payload", {"text": "hola", "n": 1})
    return Envelope(
        type=kw.pop("type", "inbox.message"),  # type: ignore[arg-type]
        tenant=tenant,
        payload=payload,  # type: ignore[arg-type]
        idempotency_key=key,
        channel=channel,
        **kw,  # type: ignore[arg-type]
    )


# -- append ------------------------------------------------------------------------------


def test_append_returns_a_pending_record_stamped_by_the_journal_clock(journal: EventJournal, clock: FakeClock) -> None:
    record = journal.append(env(payload={"text": "¿hola?", "nested": [1, {"a": None}]}))
    assert record.id.startswith("ev_")
    assert (record.state, record.attempts, record.fencing_token) == ("pending", 0, 0)
    assert record.created_at == clock.now == record.available_at
    assert record.leased_until is None and record.last_error is None
    assert journal.get(record.id) == record
    assert record.payload == {"text": "¿hola?", "nested": [1, {"a": None}]}


def test_append_is_idempotent_by_key_and_returns_the_first_record(journal: EventJournal, clock: FakeClock) -> None:
    first = journal.append(env("dup", payload={"v": 1}))
    clock.advance(5)
    second = journal.append(env("dup", payload={"v": 2}))
    assert second == first
    assert second.payload == {"v": 1}
    assert len(journal.list(tenant="acme")) == 1


def test_append_idempotency_is_per_tenant(journal: EventJournal) -> None:
    a = journal.append(env("same", tenant="acme"))
    b = journal.append(env("same", tenant="other"))
    assert a.id != b.id
    assert journal.get(a.id).tenant == "acme" and journal.get(b.id).tenant == "other"


def test_append_keeps_an_explicit_id_and_created_at(journal: EventJournal) -> None:
    record = journal.append(env(id="wamid.HBgM-1", created_at=1234))
    assert (record.id, record.created_at) == ("wamid.HBgM-1", 1234)


def test_append_with_an_id_taken_by_another_key_conflicts(journal: EventJournal) -> None:
    journal.append(env("k1", id="ev-fixed"))
    with pytest.raises(Conflict):
        journal.append(env("k2", id="ev-fixed"))
    assert [r.idempotency_key for r in journal.list()] == ["k1"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"type": "Bad Type"}, "envelope.type"),
        ({"tenant": "ACME!"}, "envelope.tenant"),
        ({"channel": "In Bound"}, "envelope.channel"),
        ({"key": ""}, "envelope.idempotency_key"),
        ({"payload": ["not", "a", "dict"]}, "envelope.payload"),
        ({"payload": {"x": float("nan")}}, "envelope.payload"),
        ({"payload": {"t": (1, 2)}}, "envelope.payload"),
        ({"payload": {1: "int key"}}, "envelope.payload"),
        ({"payload": {"big": "x" * MAX_PAYLOAD_BYTES}}, "envelope.payload"),
        ({"id": "has space"}, "envelope.id"),
        ({"created_at": -1}, "envelope.created_at"),
    ],
)
def test_append_refuses_a_bad_envelope_naming_the_field(
    journal: EventJournal, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        journal.append(env(**kwargs))  # type: ignore[arg-type]
    assert info.value.field == field
    assert journal.list() == []


# -- append_many -------------------------------------------------------------------------


def test_append_many_stores_a_batch_in_order_and_claims_it_in_that_order(
    journal: EventJournal, clock: FakeClock
) -> None:
    ids = [f"ev_batch{i:03d}" for i in range(5)]
    envelopes = [env(f"k{i}", channel="ledger", id=ids[i], payload={"n": i}) for i in range(5)]
    records = journal.append_many(envelopes)
    assert [r.id for r in records] == ids
    assert all((r.state, r.channel, r.created_at) == ("pending", "ledger", clock.now) for r in records)
    assert [journal.get(i) for i in ids] == records
    claimed = [journal.claim(clock.now, LEASE, "ledger") for _ in range(5)]
    assert [r.payload["n"] for r in claimed if r] == [0, 1, 2, 3, 4]
    assert journal.counts("acme") == {("leased", "ledger"): 5}


def test_append_many_answers_known_and_repeated_keys_with_the_first_record(journal: EventJournal) -> None:
    before = journal.append(env("old", payload={"v": "before"}))
    records = journal.append_many(
        [env("new", payload={"v": 1}), env("old", payload={"v": 2}), env("new", payload={"v": 3}), env("x", tenant="b")]
    )
    assert records[1] == before and records[1].payload == {"v": "before"}
    assert records[2] == records[0] and records[0].payload == {"v": 1}
    assert records[3].tenant == "b" and records[3].id not in (records[0].id, before.id)
    assert sorted(r.idempotency_key for r in journal.list(tenant="acme")) == ["new", "old"]
    assert journal.counts("acme") == {("pending", None): 2}
    assert journal.append_many([]) == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"type": "Bad Type"}, "envelopes[1].type"), ({"payload": {"x": float("nan")}}, "envelopes[1].payload")],
)
def test_append_many_writes_nothing_when_one_envelope_is_bad(
    journal: EventJournal, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        journal.append_many([env("good"), env("bad", **kwargs), env("after")])  # type: ignore[arg-type]
    assert info.value.field == field
    with pytest.raises(ValidationError) as info:
        journal.append_many([env("good"), "not an envelope"])  # type: ignore[list-item]
    assert info.value.field == "envelopes[1]"
    assert journal.list() == []


def test_append_many_with_a_taken_id_conflicts_and_writes_nothing(journal: EventJournal) -> None:
    journal.append(env("k1", id="ev-fixed"))
    with pytest.raises(Conflict):
        journal.append_many([env("k2"), env("k3", id="ev-fixed")])
    with pytest.raises(Conflict):
        journal.append_many([env("k4", id="ev-twice"), env("k5", id="ev-twice")])
    assert [r.idempotency_key for r in journal.list()] == ["k1"]
    assert journal.counts("acme") == {("pending", None): 1}


# -- claim -------------------------------------------------------------------------------


def test_claim_leases_the_oldest_ready_record(journal: EventJournal, clock: FakeClock) -> None:
    first = journal.append(env("a"))
    clock.advance(1)
    journal.append(env("b"))
    now = clock.advance(1)
    record = journal.claim(now, LEASE)
    assert record is not None and record.id == first.id
    assert (record.state, record.attempts) == ("leased", 1)
    assert record.leased_until == now + LEASE
    assert record.fencing_token >= 1
    assert journal.get(first.id) == record


def test_claim_returns_none_when_nothing_is_ready(journal: EventJournal, clock: FakeClock) -> None:
    assert journal.claim(clock.now, LEASE) is None
    journal.append(env())
    assert journal.claim(clock.now - 1, LEASE) is None  # not yet available
    assert journal.claim(clock.now, LEASE) is not None
    assert journal.claim(clock.now, LEASE) is None  # leased, lease not expired


def test_claim_without_channel_takes_only_records_without_channel(journal: EventJournal, clock: FakeClock) -> None:
    inbound = journal.append(env("in", channel="inbound"))
    outbox = journal.append(env("out", channel="outbox"))
    default = journal.append(env("def"))
    assert journal.claim(clock.now, LEASE).id == default.id
    assert journal.claim(clock.now, LEASE) is None
    assert journal.claim(clock.now, LEASE, channel="inbound").id == inbound.id
    assert journal.claim(clock.now, LEASE, channel="inbound") is None
    claimed = journal.claim(clock.now, LEASE, channel="outbox")
    assert claimed.id == outbox.id and claimed.channel == "outbox"


def test_claims_never_hand_one_record_to_two_threads(journal: EventJournal, clock: FakeClock) -> None:
    ids = {journal.append(env(f"k{i}")).id for i in range(120)}
    claimed: list[tuple[str, int]] = []
    lock = threading.Lock()

    def drain() -> None:
        while (record := journal.claim(clock.now, LEASE)) is not None:
            with lock:
                claimed.append((record.id, record.fencing_token))

    threads = [threading.Thread(target=drain) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(i for i, _ in claimed) == sorted(ids)
    assert len({tok for _, tok in claimed}) == len(claimed)


# -- fencing tokens ------------------------------------------------------------------------


def test_fencing_token_grows_on_every_claim_of_an_event(journal: EventJournal, clock: FakeClock) -> None:
    record = journal.append(env())
    first = journal.claim(clock.now, LEASE)
    later = journal.claim(clock.advance(LEASE), LEASE)  # the first lease expired
    assert later.id == record.id and later.fencing_token > first.fencing_token
    assert later.attempts == 2


def test_a_superseded_token_is_refused_and_changes_nothing(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    old = journal.claim(clock.now, LEASE)
    new = journal.claim(clock.advance(LEASE + 1), LEASE)
    for settle in (
        lambda: journal.ack(old.id, clock.now, old.fencing_token),
        lambda: journal.fail(old.id, clock.now, old.fencing_token, "late"),
        lambda: journal.release(old.id, clock.now, old.fencing_token),
    ):
        with pytest.raises(StaleLeaseError):
            settle()
        assert journal.get(new.id) == new
    assert journal.ack(new.id, clock.now, new.fencing_token).state == "done"


def test_a_handler_that_outlived_its_lease_cannot_ack(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    leased = journal.claim(clock.now, LEASE)
    clock.advance(LEASE)  # leased_until <= now: expired, though nobody reclaimed it
    with pytest.raises(StaleLeaseError, match="expired"):
        journal.ack(leased.id, clock.now, leased.fencing_token)
    with pytest.raises(StaleLeaseError):
        journal.fail(leased.id, clock.now, leased.fencing_token, "too late")
    assert journal.get(leased.id) == leased


def test_extend_renews_a_live_lease_and_keeps_its_token(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    leased = journal.claim(clock.now, LEASE)
    renewed = journal.extend(leased.id, clock.advance(LEASE - 1), leased.fencing_token, LEASE)
    assert renewed.fencing_token == leased.fencing_token and renewed.leased_until == clock.now + LEASE
    assert journal.get(leased.id) == renewed
    assert journal.claim(clock.advance(LEASE - 1), LEASE) is None  # past the first lease: still held
    assert journal.ack(leased.id, clock.now, leased.fencing_token).state == "done"


def test_extend_refuses_an_expired_or_superseded_lease(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    old = journal.claim(clock.now, LEASE)
    with pytest.raises(StaleLeaseError, match="expired"):
        journal.extend(old.id, clock.advance(LEASE), old.fencing_token, LEASE)
    new = journal.claim(clock.now, LEASE)
    with pytest.raises(StaleLeaseError):
        journal.extend(old.id, clock.now, old.fencing_token, LEASE)
    assert journal.get(new.id) == new
    with pytest.raises(NotFound):
        journal.extend("ev_missing", clock.now, 1, LEASE)
    with pytest.raises(ValidationError):
        journal.extend(new.id, clock.now, new.fencing_token, 0)


def test_settling_an_unknown_event_is_not_found(journal: EventJournal, clock: FakeClock) -> None:
    with pytest.raises(NotFound):
        journal.ack("ev_missing", clock.now, 1)
    assert journal.get("ev_missing") is None


def test_fencing_tokens_keep_growing_after_a_restart(
    backend: str, open_journal: Callable[..., EventJournal], clock: FakeClock
) -> None:
    if backend == "memory":
        pytest.skip("a memory journal does not survive its process")
    first = open_journal()
    record = first.append(env())
    before = first.claim(clock.now, LEASE)
    first.ack(record.id, clock.now, before.fencing_token)
    first.close()
    second = open_journal()
    assert second.get(record.id).state == "done"
    replayed = second.replay(record.id)
    assert replayed.fencing_token > before.fencing_token
    again = second.claim(clock.now, LEASE)
    assert again.fencing_token > replayed.fencing_token


# -- ack / fail / release -----------------------------------------------------------------------


def test_ack_marks_the_record_done_once(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    leased = journal.claim(clock.now, LEASE)
    done = journal.ack(leased.id, clock.advance(5), leased.fencing_token)
    assert (done.state, done.leased_until, done.attempts) == ("done", None, 1)
    with pytest.raises(StaleLeaseError):
        journal.ack(leased.id, clock.now, leased.fencing_token)
    assert journal.claim(clock.advance(LEASE * 10), LEASE) is None


def test_fail_retries_with_exponential_backoff(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    leased = journal.claim(clock.now, LEASE)
    failed = journal.fail(leased.id, clock.now, leased.fencing_token, "timeout")
    assert (failed.state, failed.last_error, failed.attempts) == ("pending", "timeout", 1)
    assert failed.available_at == clock.now + 1000
    assert journal.claim(clock.advance(999), LEASE) is None
    second = journal.claim(clock.advance(1), LEASE)
    assert second.attempts == 2
    failed = journal.fail(second.id, clock.now, second.fencing_token, "timeout again")
    assert failed.available_at == clock.now + 2000


def test_fail_after_max_attempts_moves_the_record_to_the_dlq(journal: EventJournal, clock: FakeClock) -> None:
    record = journal.append(env())
    for attempt in range(1, 4):
        leased = journal.claim(clock.advance(60_000), LEASE)
        assert leased.attempts == attempt
        after = journal.fail(leased.id, clock.now, leased.fencing_token, f"boom {attempt}")
    assert (after.state, after.last_error, after.attempts) == ("dead", "boom 3", 3)
    assert journal.claim(clock.advance(10**9), LEASE) is None
    assert [r.id for r in journal.list(state="dead")] == [record.id]
    assert journal.list(state="dead")[0].last_error == "boom 3"


def test_fail_backoff_has_jitter_within_bounds(open_journal: Callable[..., EventJournal], clock: FakeClock) -> None:
    journal = open_journal(policy=RetryPolicy(max_attempts=9, base_delay_ms=1000, jitter=0.5))
    delays = set()
    for i in range(12):
        journal.append(env(f"j{i}"))
        leased = journal.claim(clock.now, LEASE)
        after = journal.fail(leased.id, clock.now, leased.fencing_token, "x")
        delays.add(after.available_at - clock.now)
    assert all(500 <= d <= 1000 for d in delays)
    assert len(delays) > 1


def test_release_gives_the_record_back_without_spending_an_attempt(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    leased = journal.claim(clock.now, LEASE)
    released = journal.release(leased.id, clock.advance(3), leased.fencing_token)
    assert (released.state, released.attempts, released.available_at) == ("pending", 0, clock.now)
    again = journal.claim(clock.now, LEASE)
    assert again.attempts == 1 and again.fencing_token > leased.fencing_token


def test_release_works_on_an_expired_lease_nobody_reclaimed(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    leased = journal.claim(clock.now, LEASE)
    released = journal.release(leased.id, clock.advance(LEASE * 2), leased.fencing_token)
    assert (released.state, released.attempts) == ("pending", 0)


def test_an_expired_last_attempt_dead_letters_on_the_next_claim(journal: EventJournal, clock: FakeClock) -> None:
    poison = journal.append(env("poison"))
    for _ in range(3):  # a worker claims it and dies, three times
        assert journal.claim(clock.advance(LEASE), LEASE).id == poison.id
    healthy = journal.append(env("healthy"))
    assert journal.claim(clock.advance(LEASE), LEASE).id == healthy.id
    assert journal.claim(clock.now, LEASE) is None  # the poison record went to the DLQ
    dead = journal.get(poison.id)
    assert dead.state == "dead" and "lease expired" in dead.last_error


# -- batched: claim_many / ack_many / fail_many ---------------------------------------------------


def test_claim_many_leases_the_oldest_ready_records_of_a_channel_each_with_its_own_token(
    journal: EventJournal, clock: FakeClock
) -> None:
    made = []
    for i in range(7):
        made.append(journal.append(env(f"k{i}", channel="inbound")))
        clock.advance(1)
    journal.append(env("other", channel="outbox"))
    journal.append(env("later", channel="inbound", created_at=clock.now))
    now = clock.now - 1  # "later" is not ready yet
    claimed = journal.claim_many(now, LEASE, "inbound", 5)
    assert [r.id for r in claimed] == [r.id for r in made[:5]]  # oldest first
    assert all((r.state, r.attempts, r.leased_until) == ("leased", 1, now + LEASE) for r in claimed)
    tokens = [r.fencing_token for r in claimed]
    assert len(set(tokens)) == 5 and min(tokens) >= 1
    assert [journal.get(r.id) for r in claimed] == claimed
    rest = journal.claim_many(now, LEASE, "inbound", 100)
    assert [r.id for r in rest] == [r.id for r in made[5:]]
    assert min(r.fencing_token for r in rest) > max(tokens)
    assert journal.claim_many(now, LEASE, "inbound", 100) == []
    assert journal.claim_many(now, LEASE, None, 10) == []
    assert journal.counts("acme") == {("leased", "inbound"): 7, ("pending", "inbound"): 1, ("pending", "outbox"): 1}
    for bad, field in ((0, "limit"), (MAX_BATCH + 1, "limit"), (True, "limit")):
        with pytest.raises(ValidationError) as info:
            journal.claim_many(now, LEASE, "inbound", bad)
        assert info.value.field == field


def test_claim_many_takes_expired_leases_and_dead_letters_expired_last_attempts(
    journal: EventJournal, clock: FakeClock
) -> None:
    poison = journal.append(env("poison"))
    for _ in range(3):  # claimed and abandoned three times (max_attempts)
        assert [r.id for r in journal.claim_many(clock.advance(LEASE), LEASE)] == [poison.id]
    clock.advance(LEASE)  # the third lease has just expired
    healthy = []
    for i in range(3):
        healthy.append(journal.append(env(f"h{i}")))
        clock.advance(1)
    again = journal.claim_many(clock.now, LEASE, None, 3)  # the poison record is first in line
    assert [r.id for r in again] == [r.id for r in healthy]  # the poison record took no place
    dead = journal.get(poison.id)
    assert dead.state == "dead" and "lease expired" in dead.last_error
    expired = journal.claim_many(clock.advance(LEASE), LEASE, None, 10)  # the healthy leases expired
    assert [(r.id, r.attempts) for r in expired] == [(healthy[0].id, 2)]  # attempted before: claimed alone
    expired += journal.claim_many(clock.now, LEASE, None, 10) + journal.claim_many(clock.now, LEASE, None, 10)
    assert [(r.id, r.attempts) for r in expired] == [(r.id, 2) for r in healthy]
    assert all(b.fencing_token > a.fencing_token for a, b in zip(again, expired, strict=True))


def test_claim_many_reports_the_records_it_dead_lettered(journal: EventJournal, clock: FakeClock) -> None:
    poison = journal.append(env("poison"))
    for _ in range(3):  # claimed and abandoned three times (max_attempts)
        journal.claim_many(clock.advance(LEASE), LEASE)
    healthy = journal.append(env("healthy"))
    dead: list[EventRecord] = []
    claimed = journal.claim_many(clock.advance(LEASE), LEASE, None, 5, dead_lettered=dead)
    assert [r.id for r in claimed] == [healthy.id]
    assert [(r.id, r.state, r.attempts) for r in dead] == [(poison.id, "dead", 3)]
    assert dead[0].last_error == journal.get(poison.id).last_error and "lease expired" in dead[0].last_error
    nothing: list[EventRecord] = []
    journal.claim_many(clock.advance(LEASE), LEASE, None, 5, dead_lettered=nothing)
    assert nothing == []  # the healthy record's expired lease was not its last: leased again, not dead


def test_claim_many_claims_a_record_attempted_before_alone(journal: EventJournal, clock: FakeClock) -> None:
    # A poison record that killed its worker must not take its batch neighbours along on every crash.
    poison = journal.append(env("poison"))
    for i in range(3):
        clock.advance(1)
        journal.append(env(f"n{i}"))
    first = journal.claim_many(clock.now, LEASE, None, 10)
    assert [r.idempotency_key for r in first] == ["poison", "n0", "n1", "n2"]
    now = clock.advance(5)
    journal.ack_many(now, [(r.id, r.fencing_token) for r in first[1:2]])  # n0 finished, then the worker died
    later = clock.advance(LEASE)  # the leases of poison, n1 and n2 lapsed
    journal.append(env("fresh"))
    alone = journal.claim_many(later, LEASE, None, 10)
    assert [(r.id, r.attempts) for r in alone] == [(poison.id, 2)]  # by itself, though more are ready
    rest = journal.claim_many(later, LEASE, None, 10)
    assert [r.idempotency_key for r in rest] == ["n1"]  # attempted before too: alone
    assert [r.idempotency_key for r in journal.claim_many(later, LEASE, None, 10)] == ["n2"]
    assert [r.idempotency_key for r in journal.claim_many(later, LEASE, None, 10)] == ["fresh"]
    # a fresh record first in line: the batch ends before a retried one
    for key in ("a", "b"):
        journal.append(env(key))
        clock.advance(1)
    retried = journal.claim_many(clock.now, LEASE, None, 1)
    assert journal.fail(retried[0].id, clock.now, retried[0].fencing_token, "boom").state == "pending"
    journal.append(env("c"))
    batch = journal.claim_many(clock.advance(60_000), LEASE, None, 10)
    assert [r.idempotency_key for r in batch] == ["b", "c"]  # "a" failed once: it comes next, alone
    assert [r.idempotency_key for r in journal.claim_many(clock.now, LEASE, None, 10)] == ["a"]


def test_claim_many_never_hands_one_record_to_two_threads(journal: EventJournal, clock: FakeClock) -> None:
    journal.append_many([env(f"k{i}") for i in range(150)])
    claimed: list[tuple[str, int]] = []
    lock = threading.Lock()

    def drain() -> None:
        while records := journal.claim_many(clock.now, LEASE, None, 7):
            with lock:
                claimed.extend((r.id, r.fencing_token) for r in records)

    threads = [threading.Thread(target=drain) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(claimed) == 150 and len({i for i, _ in claimed}) == 150
    assert len({tok for _, tok in claimed}) == 150


def test_ack_many_settles_live_claims_and_refuses_each_stale_one_alone(journal: EventJournal, clock: FakeClock) -> None:
    journal.append_many([env(f"k{i}") for i in range(4)])
    a, b, c, d = journal.claim_many(clock.now, LEASE, None, 4)
    superseded = (b.id, b.fencing_token - 1 if b.fencing_token > 1 else b.fencing_token + 100)
    now = clock.advance(5)
    results = journal.ack_many(now, [(a.id, a.fencing_token), superseded, (c.id, c.fencing_token), ("ev_gone", 3)])
    assert [r.state if r else None for r in results] == ["done", None, "done", None]
    assert results[0] == journal.get(a.id) and results[0].available_at == now and results[0].leased_until is None
    assert journal.get(b.id).state == "leased"  # a refused claim changes nothing
    assert journal.ack_many(now, [(a.id, a.fencing_token)]) == [None]  # done already
    late = clock.advance(LEASE)  # d's lease expired: its ack is refused
    assert journal.ack_many(late, [(d.id, d.fencing_token), (b.id, b.fencing_token)]) == [None, None]
    assert journal.counts("acme") == {("done", None): 2, ("leased", None): 2}
    assert journal.ack_many(late, []) == []


def test_fail_many_retries_with_backoff_or_dead_letters_each_record(journal: EventJournal, clock: FakeClock) -> None:
    journal.append_many([env("once"), env("last")])
    last = journal.get(journal.list()[0].id if journal.list()[0].idempotency_key == "last" else journal.list()[1].id)
    for _ in range(2):  # "last" uses two of its three attempts
        now = clock.advance(LEASE)  # a record attempted before is claimed alone: two claims take both
        leased = [r for _ in range(2) for r in journal.claim_many(now, LEASE, None, 2) if r.id == last.id][0]
        journal.fail(leased.id, clock.now, leased.fencing_token, "boom")
    now = clock.advance(60_000)
    # both were attempted before: each is claimed alone
    claimed = {r.idempotency_key: r for _ in range(2) for r in journal.claim_many(now, LEASE, None, 2)}
    assert {k: r.attempts for k, r in claimed.items()} == {"once": 3, "last": 3}  # "once" expired twice too
    results = journal.fail_many(
        now,
        [
            (claimed["once"].id, claimed["once"].fencing_token + 100, "stale"),
            (claimed["last"].id, claimed["last"].fencing_token, "x" * 5000),
        ],
    )
    assert results[0] is None and journal.get(claimed["once"].id).state == "leased"
    assert results[1].state == "dead" and results[1].last_error.endswith("…") and len(results[1].last_error) == 2000
    journal.append(env("fresh"))
    fresh = journal.claim_many(now, LEASE, None, 5)
    assert [r.idempotency_key for r in fresh] == ["fresh"]
    (retried,) = journal.fail_many(now, [(fresh[0].id, fresh[0].fencing_token, "boom")])
    assert (retried.state, retried.available_at, retried.last_error) == ("pending", now + 1000, "boom")
    assert journal.get(retried.id) == retried


def test_batched_settlements_refuse_malformed_input_naming_the_item(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    (leased,) = journal.claim_many(clock.now, LEASE, None, 1)
    good = (leased.id, leased.fencing_token)
    for call, items, field in (
        (journal.ack_many, [good, (leased.id, leased.fencing_token)], "claims[1]"),
        (journal.ack_many, [good, ("bad id!", 1)], "claims[1].event_id"),
        (journal.ack_many, [good, (leased.id, 0)], "claims[1].fencing_token"),
        (journal.ack_many, [good, (leased.id,)], "claims[1]"),
        (journal.ack_many, "not a list", "claims"),
        (journal.fail_many, [(*good, "e"), good], "failures[1]"),
    ):
        with pytest.raises(ValidationError) as info:
            call(clock.now, items)  # type: ignore[operator]
        assert info.value.field == field
    assert journal.get(leased.id) == leased  # nothing changed


# -- replay --------------------------------------------------------------------------------


def test_replay_puts_a_dead_record_back_with_a_fresh_token(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    tokens = []
    for _ in range(3):
        leased = journal.claim(clock.advance(60_000), LEASE)
        tokens.append(leased.fencing_token)
        journal.fail(leased.id, clock.now, leased.fencing_token, "boom")
    replayed = journal.replay(leased.id)
    assert (replayed.state, replayed.attempts, replayed.available_at) == ("pending", 0, clock.now)
    assert replayed.fencing_token > max(tokens)
    with pytest.raises(StaleLeaseError):
        journal.release(leased.id, clock.now, tokens[-1])
    again = journal.claim(clock.now, LEASE)
    assert again.fencing_token > replayed.fencing_token
    assert journal.ack(again.id, clock.now, again.fencing_token).state == "done"


def test_replay_of_a_done_record_runs_it_again(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env())
    leased = journal.claim(clock.now, LEASE)
    journal.ack(leased.id, clock.now, leased.fencing_token)
    assert journal.replay(leased.id).state == "pending"
    assert journal.claim(clock.now, LEASE).id == leased.id


def test_replay_refuses_pending_and_leased_records(journal: EventJournal, clock: FakeClock) -> None:
    record = journal.append(env())
    with pytest.raises(Conflict, match="pending"):
        journal.replay(record.id)
    journal.claim(clock.now, LEASE)
    with pytest.raises(Conflict, match="leased"):
        journal.replay(record.id)
    with pytest.raises(NotFound):
        journal.replay("ev_nope")


# -- list and counts ----------------------------------------------------------------------------


def test_list_filters_by_tenant_state_and_channel(journal: EventJournal, clock: FakeClock) -> None:
    a1 = journal.append(env("a1", tenant="acme"))
    clock.advance(1)
    a2 = journal.append(env("a2", tenant="acme", channel="inbound"))
    clock.advance(1)
    b1 = journal.append(env("b1", tenant="beta"))
    journal.claim(clock.now, LEASE)  # a1 (oldest without channel)
    assert [r.id for r in journal.list(tenant="acme")] == [a2.id, a1.id]
    assert [r.id for r in journal.list(tenant="acme", state="leased")] == [a1.id]
    assert [r.id for r in journal.list(tenant="acme", channel="inbound")] == [a2.id]
    assert [r.id for r in journal.list(tenant="acme", channel="")] == [a1.id]
    assert [r.id for r in journal.list(state="pending", channel="")] == [b1.id]
    assert [r.id for r in journal.list()] == [b1.id, a2.id, a1.id]


def test_list_pages_newest_first_with_after(journal: EventJournal, clock: FakeClock) -> None:
    ids = []
    for i in range(7):
        ids.append(journal.append(env(f"p{i}", channel="outbox" if i % 2 else None)).id)
        clock.advance(1)
    pages, after = [], None
    while True:
        page = journal.list(tenant="acme", limit=3, after=after)
        if not page:
            break
        pages.append([r.id for r in page])
        after = page[-1].id
    assert pages == [ids[::-1][0:3], ids[::-1][3:6], ids[::-1][6:]]
    outbox = journal.list(tenant="acme", channel="outbox", limit=2)
    assert [r.id for r in outbox] == [ids[5], ids[3]]
    assert [r.id for r in journal.list(channel="outbox", after=ids[3], limit=5)] == [ids[1]]


def test_list_refuses_bad_filters(journal: EventJournal) -> None:
    for kwargs, field in (
        ({"state": "zombie"}, "state"),
        ({"limit": 0}, "limit"),
        ({"limit": 201}, "limit"),
        ({"tenant": "Bad Tenant"}, "tenant"),
    ):
        with pytest.raises(ValidationError) as info:
            journal.list(**kwargs)  # type: ignore[arg-type]
        assert info.value.field == field


def test_counts_by_state_and_channel_for_one_tenant(journal: EventJournal, clock: FakeClock) -> None:
    for key in ("a", "b"):
        journal.append(env(key))
        clock.advance(1)
    journal.append(env("c", channel="outbox"))
    journal.append(env("z", tenant="other"))
    leased = journal.claim(clock.now, LEASE, channel="outbox")
    journal.fail(leased.id, clock.now, leased.fencing_token, "x")
    assert journal.counts("acme") == {("pending", None): 2, ("pending", "outbox"): 1}
    leased = journal.claim(clock.now, LEASE)
    journal.ack(leased.id, clock.now, leased.fencing_token)
    assert journal.counts("acme") == {
        ("pending", None): 1,
        ("done", None): 1,
        ("pending", "outbox"): 1,
    }
    assert journal.counts("nobody") == {}


def test_ping_succeeds_on_an_open_journal(journal: EventJournal) -> None:
    journal.ping()


@pytest.mark.parametrize("backend", backend_params(journals.SHARED))
def test_close_while_other_threads_use_the_journal_stops_them_with_store_unavailable(journal_url: str) -> None:
    """``close`` while three threads append, claim and ack: each of them gets ``StoreUnavailable``.

    In a subprocess, 30 rounds, so a regression fails this test instead of
    taking the xdist worker down (closing a SQLite connection under a running
    statement crashes the interpreter; redis-py's ``close`` used to leave the
    other threads an ``AttributeError``, or waiting for a reply until the socket timeout).
    """
    code = "import sys; from tests.events.workers import close_while_in_use as run; run(sys.argv[1], 30)"
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code, journal_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
