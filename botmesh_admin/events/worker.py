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

While a handler runs, a heartbeat thread renews its lease (``journal.extend``)
every ``lease_ms / 3``, so a slow but live handler keeps its record; only a
process that stops (killed, frozen, partitioned from the journal) lets the
lease lapse and the record go to another worker.

``stop()`` (from a signal handler or another thread) lets the current record
finish and then returns from ``run_batch`` / ``run_forever``.
"""

from __future__ import annotations

import logging
import threading
import time
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
        # The record in hand, for the heartbeat: (event id, fencing token), or None between records.
        self._in_hand: tuple[str, int] | None = None
        self._heartbeat: threading.Thread | None = None
        self._heartbeat_lock = threading.Lock()

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
        failure: Exception | None = None
        self._hold((record.id, token))
        try:
            handler(record)
        except Exception as exc:  # a handler's failure is data for the journal, not a crash
            failure = exc
        finally:  # the lease is renewed only while the handler runs (a BaseException ends that too)
            self._hold(None)
        if failure is not None:
            error = f"{type(failure).__name__}: {failure}"
            try:
                after = self.journal.fail(record.id, self.clock(), token, error)
            except StaleLeaseError:
                logger.warning("event %s: handler failed after its lease was lost", record.id)
                return "stale"
            logger.warning(
                "event %s (%s) failed on attempt %d: %s; now %s",
                record.id, record.type, record.attempts, type(failure).__name__, after.state,
            )  # fmt: skip
            return "failed"
        try:
            self.journal.ack(record.id, self.clock(), token)
        except StaleLeaseError:
            logger.warning("event %s: handler outlived its lease; ack refused", record.id)
            return "stale"
        return "processed"

    def _hold(self, record: tuple[str, int] | None) -> None:
        """Set the record in hand (``(event id, fencing token)`` or ``None``); start a heartbeat if none runs."""
        with self._heartbeat_lock:
            self._in_hand = record
            if record is not None and self._heartbeat is None:
                self._heartbeat = threading.Thread(target=self._beat, name="events-lease-heartbeat", daemon=True)
                self._heartbeat.start()

    def _beat(self) -> None:
        """Renew the lease of the record in hand every ``lease_ms / 3``; end when no record is in hand."""
        seen: tuple[str, int] | None = None
        while True:
            time.sleep(self.lease_ms / 3000)
            with self._heartbeat_lock:
                in_hand = self._in_hand
                if in_hand is None:
                    self._heartbeat = None  # the next record starts a new heartbeat
                    return
            if in_hand == seen:  # the same record for a whole period: renew its lease
                try:
                    self.journal.extend(in_hand[0], self.clock(), in_hand[1], self.lease_ms)
                except StaleLeaseError:
                    if self._in_hand == in_hand:  # not just finished: the lease was really lost
                        logger.warning("event %s: lease lost while its handler runs", in_hand[0])
                except Exception as exc:  # noqa: BLE001 - the journal may be briefly unreachable
                    logger.warning("event %s: lease renewal failed: %s", in_hand[0], type(exc).__name__)
            seen = in_hand

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
