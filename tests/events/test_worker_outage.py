"""EventWorker through a store outage: it waits and resumes instead of dying (issue 17, item 4).

The journal here is the real in-memory journal with a switch that makes every
call raise ``StoreUnavailable`` while it is "down", as a PostgreSQL journal
does while its server is stopped. The real-server proof (a PostgreSQL of the
test's own, stopped mid-ingest) is ``tests/faults/test_postgres_outage.py``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import django.db
import pytest

from botmesh_admin.errors import StoreUnavailable
from botmesh_admin.events import Envelope, EventRecord
from botmesh_admin.events.memory import MemoryEventJournal
from botmesh_admin.events.worker import EventWorker
from tests.polling import wait_until

LEASE = 5_000


class SwitchableJournal(MemoryEventJournal):
    """A memory journal whose server can be "stopped": every call raises ``StoreUnavailable`` meanwhile."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.down = threading.Event()
        self.refused = 0

    def _gate(self) -> None:
        if self.down.is_set():
            self.refused += 1
            raise StoreUnavailable("PostgreSQL journal: connection refused")

    def claim(self, *args: Any, **kwargs: Any) -> EventRecord | None:
        self._gate()
        return super().claim(*args, **kwargs)

    def ack(self, *args: Any, **kwargs: Any) -> EventRecord:
        self._gate()
        return super().ack(*args, **kwargs)

    def fail(self, *args: Any, **kwargs: Any) -> EventRecord:
        self._gate()
        return super().fail(*args, **kwargs)

    def release(self, *args: Any, **kwargs: Any) -> EventRecord:
        self._gate()
        return super().release(*args, **kwargs)

    def claim_many(self, *args: Any, **kwargs: Any) -> list[EventRecord]:
        self._gate()
        return super().claim_many(*args, **kwargs)

    def ack_many(self, *args: Any, **kwargs: Any) -> list[EventRecord | None]:
        self._gate()
        return super().ack_many(*args, **kwargs)

    def fail_many(self, *args: Any, **kwargs: Any) -> list[EventRecord | None]:
        self._gate()
        return super().fail_many(*args, **kwargs)


def add(journal: MemoryEventJournal, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        journal.append(Envelope(type="test.event", tenant="acme", payload={"i": i}, idempotency_key=f"k{i}"))


def run_in_thread(worker: EventWorker, handler: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["totals"] = worker.run_forever(handler, batch=5, idle_ms=10)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_run_forever_waits_out_a_journal_outage_and_resumes(caplog: pytest.LogCaptureFixture) -> None:
    journal = SwitchableJournal()
    worker = EventWorker(journal, LEASE, max_backoff_ms=50)
    seen: list[int] = []
    add(journal, 3)
    caplog.set_level(logging.WARNING, logger="botmesh.events.worker")
    thread, out = run_in_thread(worker, lambda r: seen.append(r.payload["i"]))
    try:
        wait_until(lambda: len(seen) == 3, "the first three records", timeout_s=10)
        journal.down.set()  # the server stops
        wait_until(lambda: journal.refused >= 5, "several refused claims", timeout_s=10)
        assert thread.is_alive(), out.get("error")
        add(journal, 2, start=3)  # written while the worker cannot see them (another path to the store)
        journal.down.clear()  # the server is back
        wait_until(lambda: len(seen) == 5, "the records written during the outage", timeout_s=10)
    finally:
        worker.stop()
        thread.join(10)
    assert "error" not in out, out.get("error")
    assert out["totals"] == {"processed": 5, "failed": 0, "stale": 0}
    assert sorted(seen) == [0, 1, 2, 3, 4]
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "connection refused" in m]) == 1, lines  # the outage, logged once
    assert len([m for m in lines if "the store is back after" in m]) == 1, lines


@pytest.mark.parametrize(
    "outage",
    [StoreUnavailable("Kv: connection refused"), django.db.OperationalError("server closed the connection")],
    ids=["kv-store-unavailable", "django-operational-error"],
)
def test_a_handler_that_meets_an_outage_keeps_its_attempt_and_runs_once_the_store_is_back(outage: Exception) -> None:
    journal = MemoryEventJournal()
    add(journal, 1)
    store_down = threading.Event()
    store_down.set()
    done: list[int] = []

    def handler(record: EventRecord) -> None:
        if store_down.is_set():
            raise outage
        done.append(record.payload["i"])

    worker = EventWorker(journal, LEASE, max_backoff_ms=20)
    with pytest.raises(StoreUnavailable):
        worker.run_batch(handler)
    [record] = journal.list()
    assert (record.state, record.attempts, record.last_error) == ("pending", 0, None)  # released, not failed

    thread, out = run_in_thread(worker, handler)
    try:
        wait_until(lambda: thread.is_alive(), "the worker to start")
        threading.Event().wait(0.2)  # several retries against the store that is still down
        assert journal.list()[0].state in ("pending", "leased") and journal.list()[0].attempts <= 1
        store_down.clear()
        wait_until(lambda: done == [0], "the record to be handled once the store is back", timeout_s=10)
    finally:
        worker.stop()
        thread.join(10)
    assert "error" not in out, out.get("error")
    [record] = journal.list()
    assert (record.state, record.attempts) == ("done", 1)


def test_an_error_that_is_not_an_outage_still_ends_run_forever() -> None:
    class Broken(MemoryEventJournal):
        def claim(self, *args: Any, **kwargs: Any) -> EventRecord | None:
            raise RuntimeError("a bug, not an outage")

        def claim_many(self, *args: Any, **kwargs: Any) -> list[EventRecord]:
            raise RuntimeError("a bug, not an outage")

    with pytest.raises(RuntimeError, match="a bug"):
        EventWorker(Broken(), LEASE).run_forever(lambda r: None, idle_ms=10)


def test_an_ack_the_outage_refused_is_made_once_the_journal_is_back_and_the_handler_runs_once() -> None:
    journal = SwitchableJournal()
    add(journal, 1)
    runs: list[int] = []

    def handler(record: EventRecord) -> None:
        runs.append(record.payload["i"])
        journal.down.set()  # the server stops while the handler runs: its ack is refused

    worker = EventWorker(journal, LEASE, max_backoff_ms=20)
    with pytest.raises(StoreUnavailable):
        worker.run_batch(handler)
    journal.down.clear()
    assert worker.run_batch(handler) == {"processed": 1, "failed": 0, "stale": 0}  # the kept ack
    [record] = journal.list()
    assert (record.state, record.attempts, runs) == ("done", 1, [0])
