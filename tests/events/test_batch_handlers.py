"""Batch handlers (issue 21, item 2): a claimed batch's records of one batch handler go to it at once.

Each record is settled by its own outcome: done records are acked together, a
failing record is failed alone (retried after its backoff, claimed alone), an
outage releases without spending an attempt; single-record handlers keep working
beside them, and fencing tokens are honoured as for single records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from botmesh_admin.errors import StoreUnavailable
from botmesh_admin.events import Envelope, EventJournal, EventRecord
from botmesh_admin.events.handlers import dispatch, register, register_batch, unregister
from botmesh_admin.events.worker import EventWorker

from .conftest import FakeClock

LEASE = 1000


def add(journal: EventJournal, n: int, type: str, start: int = 0) -> None:
    for i in range(start, start + n):
        journal.append(Envelope(type=type, tenant="acme", payload={"i": i}, idempotency_key=f"{type}-{i}"))


@pytest.fixture
def calls() -> Iterator[list[list[int]]]:
    """A batch handler of ``test.batch-a`` and ``test.batch-b`` recording each call's records; ``i == 3`` fails."""
    seen: list[list[int]] = []

    def project(records: Sequence[EventRecord]) -> list[Exception | None]:
        seen.append([r.payload["i"] for r in records])  # claim order: by id within one millisecond
        return [ValueError("poisoned") if r.payload["i"] == 3 else None for r in records]

    register_batch("test.batch-a")(project)
    register_batch("test.batch-b")(project)
    yield seen
    unregister("test.batch-a")
    unregister("test.batch-b")


def test_a_batch_goes_to_its_batch_handler_at_once_and_a_failing_record_is_retried_alone(
    journal: EventJournal, clock: FakeClock, calls: list[list[int]]
) -> None:
    add(journal, 6, "test.batch-a")
    worker = EventWorker(journal, LEASE, clock, claim_batch=20)
    assert worker.run_batch(dispatch, 20) == {"processed": 5, "failed": 1, "stale": 0}
    assert [sorted(c) for c in calls] == [[0, 1, 2, 3, 4, 5]], "one call for the whole batch"
    [poisoned] = journal.list(state="pending")
    assert poisoned.payload == {"i": 3} and poisoned.last_error == "ValueError: poisoned"
    assert {r.payload["i"] for r in journal.list(state="done")} == {0, 1, 2, 4, 5}
    clock.advance(60_000)
    assert worker.run_batch(dispatch, 20) == {"processed": 0, "failed": 1, "stale": 0}
    assert calls[1:] == [[3]], "the retried record alone"


def test_types_sharing_a_batch_handler_share_a_call_and_single_handlers_run_beside(
    journal: EventJournal, clock: FakeClock, calls: list[list[int]]
) -> None:
    single: list[int] = []
    register("test.single")(lambda r: single.append(r.payload["i"]))
    try:
        add(journal, 2, "test.batch-a")
        add(journal, 2, "test.single", start=10)
        add(journal, 2, "test.batch-b", start=20)
        counts = EventWorker(journal, LEASE, clock, claim_batch=20).run_batch(dispatch, 20)
    finally:
        unregister("test.single")
    assert counts == {"processed": 6, "failed": 0, "stale": 0}
    assert [sorted(c) for c in calls] == [[0, 1, 20, 21]] and sorted(single) == [10, 11]


def test_a_plain_function_handler_still_runs_record_by_record(journal: EventJournal, clock: FakeClock) -> None:
    add(journal, 3, "test.batch-a")
    seen: list[int] = []
    assert EventWorker(journal, LEASE, clock).run_batch(lambda r: seen.append(r.payload["i"]), 10)["processed"] == 3
    assert sorted(seen) == [0, 1, 2]


def test_dispatch_of_one_record_calls_the_batch_handler_and_raises_its_failure(
    journal: EventJournal, calls: list[list[int]]
) -> None:
    add(journal, 4, "test.batch-a")
    records = sorted(journal.list(), key=lambda r: r.payload["i"])
    dispatch(records[0])
    with pytest.raises(ValueError, match="poisoned"):
        dispatch(records[3])
    assert calls == [[0], [3]]


def test_a_batch_handler_that_raises_fails_every_record_it_was_given(journal: EventJournal, clock: FakeClock) -> None:
    def broken(records: Sequence[EventRecord]) -> list[Exception | None]:
        raise RuntimeError("bug")

    register_batch("test.broken")(broken)
    try:
        add(journal, 3, "test.broken")
        assert EventWorker(journal, LEASE, clock).run_batch(dispatch, 10) == {"processed": 0, "failed": 3, "stale": 0}
    finally:
        unregister("test.broken")
    assert {r.last_error for r in journal.list(state="pending")} == {"RuntimeError: bug"}


def test_an_outage_in_a_batch_releases_its_records_without_an_attempt_and_acks_the_done(
    journal: EventJournal, clock: FakeClock
) -> None:
    def project(records: Sequence[EventRecord]) -> list[Exception | None]:
        return [StoreUnavailable("kv down") if r.payload["i"] else None for r in records]

    register_batch("test.outage")(project)
    try:
        add(journal, 3, "test.outage")
        with pytest.raises(StoreUnavailable):
            EventWorker(journal, LEASE, clock).run_batch(dispatch, 10)
    finally:
        unregister("test.outage")
    assert [r.payload["i"] for r in journal.list(state="done")] == [0]
    pending = journal.list(state="pending")
    assert sorted(r.payload["i"] for r in pending) == [1, 2]
    assert all(r.attempts == 0 or r.last_error is None for r in pending)
    assert journal.claim_many(clock(), LEASE, None, 10), "released: claimable at once, no backoff"


def test_a_batch_handler_that_outlives_its_lease_has_its_acks_refused(journal: EventJournal, clock: FakeClock) -> None:
    other = EventWorker(journal, LEASE, clock)

    def slow(records: Sequence[EventRecord]) -> list[Exception | None]:
        clock.advance(LEASE + 1)  # the lease lapses (no heartbeat in a fake clock) and another worker claims
        assert len(journal.claim_many(clock(), LEASE, None, 10)) == len(records)
        return [None for _ in records]

    register_batch("test.slow")(slow)
    try:
        add(journal, 2, "test.slow")
        assert other.run_batch(dispatch, 10) == {"processed": 0, "failed": 0, "stale": 2}
    finally:
        unregister("test.slow")
    assert {r.state for r in journal.list()} == {"leased"}, "the newer claims hold them"
