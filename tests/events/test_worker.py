"""EventWorker: processed / failed / stale counts, expired leases, graceful stop, the handler registry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from botmesh_admin.events import Envelope, EventJournal, EventRecord, RetryPolicy
from botmesh_admin.events.handlers import dispatch, register, unregister
from botmesh_admin.events.memory import MemoryEventJournal
from botmesh_admin.events.worker import EventWorker

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
