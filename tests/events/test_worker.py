"""EventWorker: processed / failed / stale counts, expired leases, graceful stop, the handler registry."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from botmesh_admin.events import Envelope, EventJournal, EventRecord, RetryPolicy
from botmesh_admin.events.handlers import dispatch, register, unregister
from botmesh_admin.events.memory import MemoryEventJournal
from botmesh_admin.events.worker import SETTLE_EVERY_MS, EventWorker

from .conftest import FakeClock

LEASE = 1000


def add(journal: EventJournal, n: int, channel: str | None = None, type: str = "test.event") -> None:
    for i in range(n):
        journal.append(
            Envelope(type=type, tenant="acme", payload={"i": i}, idempotency_key=f"{channel}-{i}", channel=channel)
        )


def test_run_batch_acks_what_the_handler_handled(journal: EventJournal, clock: FakeClock) -> None:
    add(journal, 5)
    seen: list[int] = []
    worker = EventWorker(journal, LEASE, clock)
    assert worker.run_batch(lambda r: seen.append(r.payload["i"]), limit=3) == {
        "processed": 3, "failed": 0, "stale": 0,
    }  # fmt: skip
    assert worker.run_batch(lambda r: seen.append(r.payload["i"]), limit=10)["processed"] == 2
    assert sorted(seen) == [0, 1, 2, 3, 4]
    assert {r.state for r in journal.list()} == {"done"}


def test_run_batch_fails_what_the_handler_raised(journal: EventJournal, clock: FakeClock) -> None:
    add(journal, 2)

    def handler(record: EventRecord) -> None:
        if record.payload["i"] == 1:
            raise RuntimeError("provider said 500")

    counts = EventWorker(journal, LEASE, clock).run_batch(handler, limit=10)
    assert counts == {"processed": 1, "failed": 1, "stale": 0}
    [failed] = journal.list(state="pending")
    assert failed.last_error == "RuntimeError: provider said 500"
    assert failed.available_at > clock.now


def test_worker_only_takes_its_channel(journal: EventJournal, clock: FakeClock) -> None:
    add(journal, 2, channel="outbox")
    add(journal, 1)
    outbox = EventWorker(journal, LEASE, clock, channel="outbox")
    assert outbox.run_batch(lambda r: None, 10)["processed"] == 2
    assert [r.channel for r in journal.list(state="pending")] == [None]


class JumpingClock(FakeClock):
    """Jumps ``jump`` ms right after the first reading (a process paused after its claim)."""

    def __init__(self, jump: int) -> None:
        super().__init__()
        self.jump, self.calls = jump, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls == 2:
            self.now += self.jump
        return self.now


def test_a_lease_expired_before_the_handler_started_is_released_without_an_attempt(
    journal: EventJournal,
) -> None:
    add(journal, 1)
    clock = JumpingClock(jump=LEASE + 1)  # the worker's clock
    called: list[str] = []
    counts = EventWorker(journal, LEASE, clock).run_batch(lambda r: called.append(r.id), limit=1)
    assert counts == {"processed": 0, "failed": 0, "stale": 1}
    assert called == []
    [record] = journal.list()
    assert (record.state, record.attempts) == ("pending", 0)


def test_a_handler_that_outlives_its_lease_is_stale_and_the_event_is_redelivered(
    journal: EventJournal, clock: FakeClock
) -> None:
    add(journal, 1)
    calls: list[int] = []

    def slow(record: EventRecord) -> None:
        calls.append(record.fencing_token)
        if len(calls) == 1:
            clock.advance(LEASE + 5)  # the handler took longer than its lease

    worker = EventWorker(journal, LEASE, clock)
    assert worker.run_batch(slow, limit=1) == {"processed": 0, "failed": 0, "stale": 1}
    assert worker.run_batch(slow, limit=1) == {"processed": 1, "failed": 0, "stale": 0}
    assert calls[1] > calls[0]
    assert journal.list()[0].state == "done"


def test_a_slow_live_handler_keeps_its_lease_by_heartbeat(journal: EventJournal) -> None:
    """Real time: a handler three leases long is not redelivered meanwhile and its ack is accepted."""
    import time

    from botmesh_admin.events.base import now_ms

    add(journal, 1)
    lease_ms, taken = 900, []  # renewed every 300 ms: generous for a loaded 2-core CI machine

    def slow(record: EventRecord) -> None:
        for _ in range(3):
            time.sleep(lease_ms / 1000)
            taken.append(journal.claim(now_ms(), lease_ms))  # another worker finds nothing to take

    assert EventWorker(journal, lease_ms).run_batch(slow, limit=1) == {"processed": 1, "failed": 0, "stale": 0}
    assert taken == [None, None, None]
    [record] = journal.list()
    assert (record.state, record.attempts) == ("done", 1)


class CountingJournal(MemoryEventJournal):
    """The memory journal, counting the calls the worker makes of each kind."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls: dict[str, int] = {}

    def __getattribute__(self, name: str) -> object:
        if name in ("claim", "claim_many", "ack", "ack_many", "fail", "fail_many", "release"):
            calls = object.__getattribute__(self, "calls")
            calls[name] = calls.get(name, 0) + 1
        return object.__getattribute__(self, name)


def test_a_batch_is_claimed_acked_and_failed_in_a_few_calls_and_handled_one_by_one_in_order(
    clock: FakeClock,
) -> None:
    journal = CountingJournal(clock=clock, policy=RetryPolicy(max_attempts=3, jitter=0.0))
    for i in range(45):
        journal.append(Envelope(type="test.event", tenant="acme", payload={"i": i}, idempotency_key=f"k{i}"))
        clock.advance(1)
    seen: list[int] = []

    def handler(record: EventRecord) -> None:
        seen.append(record.payload["i"])
        if record.payload["i"] % 10 == 0:
            raise ValueError("every tenth fails")

    worker = EventWorker(journal, LEASE, clock, claim_batch=20)
    assert worker.run_batch(handler, limit=100) == {"processed": 40, "failed": 5, "stale": 0}
    assert seen == list(range(45))  # claim order, one at a time
    # 20 + 20 + 5: three claims (the short third one says nothing more is ready), an ack and a fail per batch.
    assert journal.calls == {"claim_many": 3, "ack_many": 3, "fail_many": 3}
    failed = [r for r in journal.list(limit=200) if r.state == "pending"]
    assert sorted(r.payload["i"] for r in failed) == [0, 10, 20, 30, 40]
    assert all(r.last_error == "ValueError: every tenth fails" and r.attempts == 1 for r in failed)


def test_the_heartbeat_keeps_the_leases_of_the_records_waiting_behind_a_slow_one(journal: EventJournal) -> None:
    """Real time: the second record of a batch waits two leases behind the first and is not redelivered."""
    import time

    from botmesh_admin.events.base import now_ms

    add(journal, 2)
    # A lease long enough that a heartbeat (every third of it) delayed by a loaded machine still renews in time:
    # 1 s lost a file journal's lease once in CI at load ~8 (a renewal more than 667 ms late).
    lease_ms, taken, handled = 2_000, [], []

    def handler(record: EventRecord) -> None:
        handled.append(record.payload["i"])
        if len(handled) == 1:
            for _ in range(2):
                time.sleep(lease_ms / 1000)
                taken.append(journal.claim(now_ms(), lease_ms))  # another worker finds nothing to take

    counts = EventWorker(journal, lease_ms, claim_batch=2).run_batch(handler, limit=2)
    assert counts == {"processed": 2, "failed": 0, "stale": 0}
    assert taken == [None, None] and sorted(handled) == [0, 1]
    assert [(r.state, r.attempts) for r in journal.list()] == [("done", 1), ("done", 1)]


def test_stop_finishes_the_record_in_hand_then_returns(journal: EventJournal, clock: FakeClock) -> None:
    add(journal, 5)
    worker = EventWorker(journal, LEASE, clock)

    def handler(record: EventRecord) -> None:
        worker.stop()  # e.g. SIGTERM arrives while handling

    assert worker.run_batch(handler, limit=10) == {"processed": 1, "failed": 0, "stale": 0}
    assert worker.run_forever(handler) == {"processed": 0, "failed": 0, "stale": 0}
    assert sorted(r.state for r in journal.list()) == ["done"] + ["pending"] * 4


def test_run_forever_stops_after_max_events(journal: EventJournal, clock: FakeClock) -> None:
    add(journal, 7)
    totals = EventWorker(journal, LEASE, clock).run_forever(lambda r: None, batch=3, max_events=5)
    assert totals["processed"] == 5


# -- the handler registry ----------------------------------------------------------------------


@pytest.fixture
def registered() -> Iterator[list[EventRecord]]:
    seen: list[EventRecord] = []

    @register("test.registered")
    def handle(record: EventRecord) -> None:
        seen.append(record)

    yield seen
    unregister("test.registered")


def test_dispatch_calls_the_registered_handler(registered: list[EventRecord], clock: FakeClock) -> None:
    journal = MemoryEventJournal(clock=clock)
    add(journal, 1, type="test.registered")
    assert EventWorker(journal, LEASE, clock).run_batch(dispatch, 5)["processed"] == 1
    assert [r.type for r in registered] == ["test.registered"]


@pytest.fixture
def dead_letters() -> Iterator[list[EventRecord]]:
    """``test.doomed``: a handler that always raises, and a dead-letter hook that records what it is given."""
    hooked: list[EventRecord] = []

    def hook(record: EventRecord) -> None:
        hooked.append(record)
        raise RuntimeError("a hook's own failure is logged, not raised into the worker")

    @register("test.doomed", on_dead_letter=hook)
    def handle(record: EventRecord) -> None:
        raise RuntimeError("provider said 500")

    yield hooked
    unregister("test.doomed")


def test_a_record_whose_last_attempt_fails_calls_its_types_dead_letter_hook(
    journal: EventJournal, clock: FakeClock, dead_letters: list[EventRecord]
) -> None:
    add(journal, 1, type="test.doomed")
    worker = worker_with_hooks(journal, clock)
    for attempt in range(3):  # the policy's max_attempts
        assert worker.run_batch(dispatch, 5)["failed"] == 1
        assert len(dead_letters) == (1 if attempt == 2 else 0)
        clock.advance(120_000)  # past the backoff
    [dead] = dead_letters
    assert (dead.state, dead.attempts, dead.last_error) == ("dead", 3, "RuntimeError: provider said 500")


def test_a_record_dead_lettered_at_claim_calls_its_types_dead_letter_hook(
    journal: EventJournal, clock: FakeClock, dead_letters: list[EventRecord]
) -> None:
    add(journal, 1, type="test.doomed")
    for _ in range(3):  # a worker died on it three times (max_attempts): claimed, never settled
        journal.claim_many(clock.advance(LEASE), LEASE)
    journal.append(Envelope(type="test.other", tenant="acme", payload={}, idempotency_key="after-the-poison"))
    clock.advance(LEASE)  # the third (last) lease has just expired
    counts = worker_with_hooks(journal, clock).run_batch(lambda r: None, 5)
    assert counts == {"processed": 1, "failed": 0, "stale": 0}  # the next record is still handled
    [dead] = dead_letters
    assert dead.state == "dead" and "lease expired on attempt 3" in (dead.last_error or "")


def worker_with_hooks(journal: EventJournal, clock: FakeClock) -> EventWorker:
    """An ``EventWorker`` calling the registered dead-letter hooks, as ``events.services.worker_for`` builds it."""
    from botmesh_admin.events.handlers import dead_lettered

    return EventWorker(journal, LEASE, clock, on_dead_letter=dead_lettered)


def test_registering_another_function_for_a_type_is_refused(registered: list[EventRecord]) -> None:
    with pytest.raises(ValueError, match="already handled"):
        register("test.registered")(lambda record: None)
    with pytest.raises(ValueError, match="not an event type"):
        register("Not A Type")


def test_an_unknown_type_fails_and_dead_letters_with_a_clear_error(clock: FakeClock) -> None:
    journal = MemoryEventJournal(clock=clock, policy=RetryPolicy(max_attempts=2, jitter=0.0))
    add(journal, 1, type="nobody.handles")
    worker = EventWorker(journal, LEASE, clock)
    assert worker.run_batch(dispatch, 5)["failed"] == 1
    clock.advance(60_000)
    assert worker.run_batch(dispatch, 5)["failed"] == 1
    [dead] = journal.list(state="dead")
    assert dead.last_error == "UnknownEventType: no handler registered for event type 'nobody.handles'"


class _Killed(BaseException):
    """The process dying inside a handler (SIGKILL, OOM): nothing after it runs, not even ``except Exception``."""


def test_a_finished_record_is_acked_before_a_later_one_of_its_batch_kills_the_worker(
    journal: EventJournal, clock: FakeClock
) -> None:
    for n in range(3):
        journal.append(Envelope(type="t", tenant="acme", payload={"n": n}, idempotency_key=f"k{n}"))
    order: list[str] = []

    def handler(record: EventRecord) -> None:
        if order:
            raise _Killed()
        order.append(record.id)
        time.sleep(SETTLE_EVERY_MS / 1000)  # a handler that takes a while: its ack is flushed before the next starts

    with pytest.raises(_Killed):
        EventWorker(journal, LEASE, clock).run_batch(handler, limit=10)
    first = journal.get(order[0])
    assert first is not None and first.state == "done"
