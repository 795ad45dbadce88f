"""EventWorker: claim, handle, settle — with fenced leases.

A worker claims one record at a time with a lease of ``lease_ms``; the handler
runs; the outcome is settled with the claim's fencing token:

- the handler returned → ``ack`` (``processed``);
- the handler raised → ``fail`` (``failed``): a retry after backoff, or the DLQ;
- the lease had already expired before the handler started (the process was
  paused between claim and start) → ``release``, without spending an attempt
  (``stale``): another worker may already be entitled to the record;
- the handler outlived its lease → the journal refuses the ``ack``/``fail``
  with ``StaleLeaseError`` (``stale``); the record is redelivered. Handlers must
  therefore be idempotent (deliveries are at least once; the fencing token tells
  a handler's side effects which claim they belong to).

``stop()`` (from a signal handler or another thread) lets the current record
finish and then returns from ``run_batch`` / ``run_forever``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .base import Clock, EventJournal, EventRecord, StaleLeaseError, now_ms

logger = logging.getLogger("botmesh.events.worker")

Handler = Callable[[EventRecord], None]


class EventWorker:
    """Drain the records of one channel of ``journal`` (``channel=None``: the default channel)."""

    def __init__(
        self,
        journal: EventJournal,
        lease_ms: int = 30_000,
        clock: Clock | None = None,
        *,
        channel: str | None = None,
    ) -> None:
        self.journal = journal
        self.lease_ms = lease_ms
        self.clock: Clock = clock or now_ms
        self.channel = channel
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask the worker to stop after the record it is handling (safe from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Return True once ``stop()`` was called."""
        return self._stop.is_set()

    def run_batch(self, handler: Handler, limit: int = 100) -> dict[str, int]:
        """Handle up to ``limit`` records; return ``{"processed", "failed", "stale"}`` counts.

        Stops early when no record is ready or ``stop()`` was called.
        """
        counts = {"processed": 0, "failed": 0, "stale": 0}
        for _ in range(limit):
            if self._stop.is_set():
                break
            record = self.journal.claim(self.clock(), self.lease_ms, self.channel)
            if record is None:
                break
            counts[self._handle(handler, record)] += 1
        return counts

    def _handle(self, handler: Handler, record: EventRecord) -> str:
        token = record.fencing_token
        started = self.clock()
        if record.leased_until is not None and started >= record.leased_until:
            try:
                self.journal.release(record.id, started, token)
            except StaleLeaseError:
                pass  # somebody else claimed it meanwhile: nothing of ours to give back
            logger.warning("event %s: lease expired before its handler started; released", record.id)
            return "stale"
        try:
            handler(record)
        except Exception as exc:  # a handler's failure is data for the journal, not a crash
            error = f"{type(exc).__name__}: {exc}"
            try:
                after = self.journal.fail(record.id, self.clock(), token, error)
            except StaleLeaseError:
                logger.warning("event %s: handler failed after its lease was lost", record.id)
                return "stale"
            logger.warning(
                "event %s (%s) failed on attempt %d: %s; now %s",
                record.id, record.type, record.attempts, type(exc).__name__, after.state,
            )  # fmt: skip
            return "failed"
        try:
            self.journal.ack(record.id, self.clock(), token)
        except StaleLeaseError:
            logger.warning("event %s: handler outlived its lease; ack refused", record.id)
            return "stale"
        return "processed"

    def run_forever(
        self,
        handler: Handler,
        *,
        batch: int = 20,
        idle_ms: int = 500,
        max_events: int | None = None,
    ) -> dict[str, int]:
        """Handle records until ``stop()`` (or ``max_events`` settled); return the totals.

        Sleeps ``idle_ms`` when nothing is ready. The record in hand is always
        finished before returning.
        """
        totals = {"processed": 0, "failed": 0, "stale": 0}
        while not self._stop.is_set():
            room = batch if max_events is None else min(batch, max_events - sum(totals.values()))
            if room <= 0:
                break
            counts = self.run_batch(handler, room)
            for key, value in counts.items():
                totals[key] += value
            if not any(counts.values()):
                self._stop.wait(idle_ms / 1000)
        return totals
