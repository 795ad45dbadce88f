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
finish and then returns from ``run_batch`` / ``run_forever``; so does the
process's stop (``shutdown.stopping()``: a SIGTERM to a Celery worker reaches
its pool children too), so no new record (a reply send of the outbox) starts
after a SIGTERM; the one in hand finishes and is settled.

A store outage is not a handler failure. When the journal, the Kv or the
Django database cannot be reached (``errors.store_unavailable``) — on a claim,
an ack, or inside the handler — ``run_batch`` raises ``StoreUnavailable``; a
record whose handler met the outage is first released without spending an
attempt (an outage never walks records into the DLQ). An ack, fail or
release the journal refused for the outage is kept and made first once it is
back (the handler does not run again for want of an ack, as long as the lease
holds). ``run_forever`` waits instead of dying: it logs the outage once,
retries with a growing delay (up to ``max_backoff_ms``), and logs once more
when the store is back.
"""

from __future__ import annotations

import contextvars
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from botmesh_admin.errors import StoreUnavailable, store_unavailable

from .base import Clock, EventJournal, EventRecord, StaleLeaseError, now_ms

logger = logging.getLogger("botmesh.events.worker")

Handler = Callable[[EventRecord], None]


@dataclass(frozen=True)
class Claim:
    """One claim of a record: ``(event_id, fencing_token)`` in ``journal``, renewed by ``lease_ms`` at a time."""

    journal: EventJournal
    event_id: str
    fencing_token: int
    lease_ms: int
    clock: Clock = now_ms

    def check(self) -> None:
        """Renew the lease (``journal.extend``) if this claim still holds it; else raise ``StaleLeaseError``.

        Call it immediately before a side effect only the lease fences (a
        provider request). ``StaleLeaseError`` means another worker claimed the
        record since (a higher fencing token) or the lease expired first.
        """
        self.journal.extend(self.event_id, self.clock(), self.fencing_token, self.lease_ms)


_current_claim: contextvars.ContextVar[Claim | None] = contextvars.ContextVar("botmesh_event_claim", default=None)


def current_claim() -> Claim | None:
    """Return the claim of the record whose handler runs in this context (``None`` outside an ``EventWorker``)."""
    return _current_claim.get()


class EventWorker:
    """Drain the records of one channel of ``journal`` (``channel=None``: the default channel)."""

    def __init__(
        self,
        journal: EventJournal,
        lease_ms: int = 30_000,
        clock: Clock | None = None,
        *,
        channel: str | None = None,
        max_backoff_ms: int = 5_000,
    ) -> None:
        self.journal = journal
        self.lease_ms = lease_ms
        self.clock: Clock = clock or now_ms
        self.channel = channel
        self.max_backoff_ms = max_backoff_ms
        self._stop = threading.Event()
        # The record in hand, for the heartbeat: (event id, fencing token), or None between records.
        self._in_hand: tuple[str, int] | None = None
        self._heartbeat: threading.Thread | None = None
        self._heartbeat_lock = threading.Lock()
        # Settlements (record, "ack" | "fail" | "release", outcome, failure) an outage held back.
        self._unsettled: list[tuple[EventRecord, str, str | None, Exception | None]] = []

    def stop(self) -> None:
        """Ask the worker to stop after the record it is handling (safe from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Return True once ``stop()`` was called or the process was told to stop (SIGTERM)."""
        from botmesh_admin.observability import shutdown

        return self._stop.is_set() or shutdown.stopping()

    def run_batch(self, handler: Handler, limit: int = 100) -> dict[str, int]:
        """Handle up to ``limit`` records; return ``{"processed", "failed", "stale"}`` counts.

        Stops early when no record is ready or ``stop()`` was called. Raise
        ``StoreUnavailable`` when a store cannot be reached (see the module docstring).
        """
        counts = {"processed": 0, "failed": 0, "stale": 0}
        self._run_batch(handler, limit, counts)
        return counts

    def _run_batch(self, handler: Handler, limit: int, counts: dict[str, int]) -> None:
        """``run_batch`` counting into ``counts`` as it goes, so an outage mid-batch keeps what was settled."""
        self._settle_kept(counts)
        for _ in range(limit):
            if self.stopping:
                break
            record = self.journal.claim(self.clock(), self.lease_ms, self.channel)
            if record is None:
                break
            counts[self._handle(handler, record)] += 1

    def _handle(self, handler: Handler, record: EventRecord) -> str:
        started = self.clock()
        if record.leased_until is not None and started >= record.leased_until:
            outcome = self._settle(record, "release", "stale")
            logger.warning("event %s: lease expired before its handler started; released", record.id)
            return outcome
        failure: Exception | None = None
        self._hold((record.id, record.fencing_token))
        claimed = _current_claim.set(Claim(self.journal, record.id, record.fencing_token, self.lease_ms, self.clock))
        try:
            handler(record)
        except Exception as exc:  # a handler's failure is data for the journal, not a crash
            failure = exc
        finally:  # the lease is renewed only while the handler runs (a BaseException ends that too)
            _current_claim.reset(claimed)
            self._hold(None)
        if failure is None:
            return self._settle(record, "ack", "processed")
        unavailable = store_unavailable(failure)
        if unavailable is None:
            return self._settle(record, "fail", "failed", failure)
        # The store, not the record, is at fault: give it back without spending an attempt.
        self._settle(record, "release", None)
        if unavailable is failure:
            raise failure
        raise unavailable from failure

    def _settle(self, record: EventRecord, action: str, outcome: str | None, failure: Exception | None = None) -> str:
        """``ack`` / ``fail`` / ``release`` the claim on ``record``; return ``outcome``.

        The outcome is ``stale`` if the lease was lost.

        When the journal cannot be reached, the settlement is kept and made
        first thing once it is back (so an outage costs a retry, not a whole
        lease), and ``StoreUnavailable`` is raised.
        """
        try:
            return self._apply(record, action, outcome, failure)
        except Exception as exc:
            unavailable = store_unavailable(exc)
            if unavailable is None:
                raise
            self._unsettled.append((record, action, outcome, failure))
            if unavailable is exc:
                raise
            raise unavailable from exc

    def _apply(self, record: EventRecord, action: str, outcome: str | None, failure: Exception | None) -> str:
        token = record.fencing_token
        try:
            if action == "ack":
                self.journal.ack(record.id, self.clock(), token)
            elif action == "fail":
                assert failure is not None
                after = self.journal.fail(record.id, self.clock(), token, f"{type(failure).__name__}: {failure}")
                logger.warning(
                    "event %s (%s) failed on attempt %d: %s; now %s",
                    record.id, record.type, record.attempts, type(failure).__name__, after.state,
                )  # fmt: skip
            else:
                self.journal.release(record.id, self.clock(), token)
        except StaleLeaseError:
            if action == "ack":
                logger.warning("event %s: handler outlived its lease; ack refused", record.id)
            elif action == "fail":
                logger.warning("event %s: handler failed after its lease was lost", record.id)
            # release: somebody else claimed it meanwhile; nothing of ours to give back
            return "stale"
        return outcome or ""

    def _settle_kept(self, counts: dict[str, int]) -> None:
        """Make the settlements an outage held back, oldest first (raise ``StoreUnavailable`` if still down)."""
        while self._unsettled:
            record, action, outcome, failure = self._unsettled[0]
            result = self._apply(record, action, outcome, failure)
            self._unsettled.pop(0)
            if result:
                counts[result] += 1

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
        finished before returning. A store outage does not end it: it waits
        (``idle_ms``, doubling up to ``max_backoff_ms``, with jitter) and tries
        again, logging the outage when it starts and when it ends. Any other
        error is raised.
        """
        totals = {"processed": 0, "failed": 0, "stale": 0}
        outage_since: float | None = None  # time.monotonic() of the first failure of the current outage
        delay_ms = float(idle_ms)
        while not self.stopping:
            room = batch if max_events is None else min(batch, max_events - sum(totals.values()))
            if room <= 0:
                break
            counts = {"processed": 0, "failed": 0, "stale": 0}
            try:
                self._run_batch(handler, room, counts)
            except Exception as exc:
                unavailable = store_unavailable(exc)
                if unavailable is None:
                    raise
                if outage_since is None:
                    outage_since = time.monotonic()
                    delay_ms = float(max(idle_ms, 100))
                    self._log_outage_start(unavailable, exc)
                _reset_database_connections()
                self._stop.wait(delay_ms * random.uniform(0.8, 1.2) / 1000)
                delay_ms = min(delay_ms * 2, float(self.max_backoff_ms))
                continue
            finally:
                for key, value in counts.items():
                    totals[key] += value
            if outage_since is not None:
                logger.warning(
                    "events worker (channel %s): the store is back after %.1f s; resuming",
                    self.channel or "(default)", time.monotonic() - outage_since,
                )  # fmt: skip
                outage_since = None
            if not any(counts.values()):
                self._stop.wait(idle_ms / 1000)
        return totals

    def _log_outage_start(self, unavailable: StoreUnavailable, exc: Exception) -> None:
        cause = exc if exc is not unavailable else (unavailable.__cause__ or exc)
        logger.warning(
            "events worker (channel %s): %s (%s: %s); waiting for it, retrying every up to %.0f s",
            self.channel or "(default)", unavailable.message, type(cause).__name__, cause,
            self.max_backoff_ms / 1000,
        )  # fmt: skip


def _reset_database_connections() -> None:
    """Close the Django connections an outage broke, so the next query after it reconnects.

    A long-running process has no request cycle that would do it (Django
    closes an unusable connection at the end of each request).
    """
    from django.db import close_old_connections

    close_old_connections()
