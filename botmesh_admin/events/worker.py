"""EventWorker: claim, handle, settle — with fenced leases.

A worker claims a batch of records (``claim_many``, up to ``claim_batch``) with a
lease of ``lease_ms`` each; the handler runs on each record in turn (or, for a
handler with ``batch_for`` — the registry's ``dispatch`` — the records whose type has a
batch handler go to it at once, one outcome per record: see
``events.handlers.register_batch``); the
outcomes are settled with each claim's fencing token as the records finish
(what finished within ``SETTLE_EVERY_MS`` in one ``ack_many`` / ``fail_many``,
flushed before the next handler starts — so a process that dies mid-batch
redoes almost none of the work it finished):

- the handler returned → ``ack`` (``processed``);
- the handler raised → ``fail`` (``failed``): a retry after backoff, or the DLQ
  (then ``on_dead_letter(record)``, as for a record the claim dead-lettered);
- the lease had already expired before the handler started (the process was
  paused between claim and start) → ``release``, without spending an attempt
  (``stale``): another worker may already be entitled to the record;
- the handler outlived its lease → the journal refuses the ``ack``/``fail``
  with ``StaleLeaseError`` (``stale``); the record is redelivered. Handlers must
  therefore be idempotent (deliveries are at least once; the fencing token tells
  a handler's side effects which claim they belong to).

While a batch is held, a heartbeat thread renews the lease of every record
of it not yet settled (``journal.extend``) every ``lease_ms / 3``, so a slow but
live handler keeps its record and the records after it theirs; only a
process that stops (killed, frozen, partitioned from the journal) lets the
lease lapse and the record go to another worker.

``stop()`` (from a signal handler or another thread) lets the current record
finish and then returns from ``run_batch`` / ``run_forever`` (the batch's
records that did not start are released, without spending an attempt); so does the
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from botmesh_admin.errors import StoreUnavailable, store_unavailable

from .base import Clock, EventJournal, EventRecord, StaleLeaseError, now_ms

logger = logging.getLogger("botmesh.events.worker")

Handler = Callable[[EventRecord], None]
BatchHandler = Callable[[Sequence[EventRecord]], Sequence[Exception | None]]

DEFAULT_CLAIM_BATCH = 20
"""Records claimed at a time (``claim_many``), handled one by one and settled as they finish."""

SETTLE_EVERY_MS = 50
"""Finished records' settlements are flushed (one ``ack_many`` / ``fail_many``) before the next handler starts once
this many ms (real time) passed since the last flush: a crash mid-batch redoes at most this much finished work,
and a batch of fast handlers still settles in a few calls."""


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


Settlement = tuple[EventRecord, str, str | None, Exception | None]
"""``(record, action, outcome, failure)``: an ``ack`` / ``fail`` / ``release`` / ``return`` still to make.

``return`` gives back a claimed record whose handler never ran (a stop
between the records of a batch): a release that is not counted."""


class EventWorker:
    """Drain the records of one channel of ``journal`` (``channel=None``: the default channel).

    ``claim_batch`` records are claimed at a time (``claim_many``), handled one
    by one in claim order (a batch handler's records at once) — each in its own claim context, the heartbeat
    renewing every record held — and settled as they finish (``ack_many`` /
    ``fail_many`` of what finished within ``SETTLE_EVERY_MS``). ``claim_batch=1`` claims one record
    at a time: for records whose handler may take its whole lease (a job run,
    a provider send), so a worker never holds work another could do.
    """

    def __init__(
        self,
        journal: EventJournal,
        lease_ms: int = 30_000,
        clock: Clock | None = None,
        *,
        channel: str | None = None,
        max_backoff_ms: int = 5_000,
        claim_batch: int = DEFAULT_CLAIM_BATCH,
        on_dead_letter: Handler | None = None,
    ) -> None:
        self.journal = journal
        self.lease_ms = lease_ms
        self.clock: Clock = clock or now_ms
        self.channel = channel
        self.max_backoff_ms = max_backoff_ms
        self.claim_batch = max(1, claim_batch)
        # Called with each record the journal dead-lettered under this worker (its last attempt failed, or
        # its last lease had expired when this worker claimed): events.handlers.dead_lettered by worker_for.
        self.on_dead_letter = on_dead_letter
        self._stop = threading.Event()
        # The records claimed and not yet settled, for the heartbeat: event id -> (fencing token, leased_until).
        self._held: dict[str, tuple[int, int]] = {}
        self._heartbeat: threading.Thread | None = None
        self._heartbeat_lock = threading.Lock()
        # Settlements an outage held back, made first once the journal is back.
        self._unsettled: list[Settlement] = []
        # How many records a handler runs on now (for ``in_hand``): 1, or a batch handler's records.
        self._running = 0

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
        self._settle_all([], counts)  # what an outage held back, first
        left = limit
        while left > 0 and not self.stopping:
            want = min(left, self.claim_batch)
            if self.on_dead_letter is None:
                batch = self.journal.claim_many(self.clock(), self.lease_ms, self.channel, want)
            else:
                dead: list[EventRecord] = []
                batch = self.journal.claim_many(self.clock(), self.lease_ms, self.channel, want, dead_lettered=dead)
                for record in dead:
                    logger.warning(
                        "event %s (%s): dead-lettered at claim: %s", record.id, record.type, record.last_error
                    )
                    self.on_dead_letter(record)
            if not batch:
                break
            left -= len(batch)
            self._run_claimed(handler, batch, counts)
            if len(batch) < want:
                break  # nothing more is ready

    def _run_claimed(self, handler: Handler, batch: list[EventRecord], counts: dict[str, int]) -> None:
        """Handle the claimed ``batch`` in order, settling as it goes; on an outage settle what is known and raise.

        A finished record is settled promptly, not at the end of the batch: its
        settlement is flushed before the next handler starts once
        ``SETTLE_EVERY_MS`` passed since the last flush (and at the end). So a
        process that dies mid-batch (SIGKILL, OOM, a forced exit) leaves at most
        the last ``SETTLE_EVERY_MS`` of finished work to be redone, while a batch
        of fast handlers still settles in one ``ack_many``.
        """
        self._hold(batch)
        settlements: list[Settlement] = []
        flushed = time.monotonic()
        units = _units(handler, batch)
        try:
            for i, (batch_handler, records) in enumerate(units):
                if self.stopping:  # the rest never started: give them back without spending an attempt
                    settlements += [(r, "return", None, None) for _, rs in units[i:] for r in rs]
                    break
                if settlements and (time.monotonic() - flushed) * 1000 >= SETTLE_EVERY_MS:
                    self._flush(settlements, counts)
                    settlements = []
                    flushed = time.monotonic()
                self._running = len(records)
                try:
                    if batch_handler is None:
                        settlement, outage = self._handle(handler, records[0])
                        done = [settlement]
                    else:
                        done, outage = self._handle_many(batch_handler, records)
                finally:
                    self._running = 0
                settlements += done
                if outage is not None:
                    settlements += [(r, "return", None, None) for _, rs in units[i + 1 :] for r in rs]
                    self._flush(settlements, counts)
                    raise outage
            self._flush(settlements, counts)
        finally:
            self._release_held(batch)

    def _flush(self, settlements: list[Settlement], counts: dict[str, int]) -> None:
        """Settle ``settlements`` and stop renewing their leases."""
        try:
            self._settle_all(settlements, counts)
        finally:  # kept by an outage or not, the batch's end would stop renewing them too
            self._release_held([s[0] for s in settlements])

    def in_hand(self) -> tuple[int, int]:
        """Return ``(running, waiting)``: records a handler runs on now (0, 1, a batch's), claimed ones not started.

        For a forced exit's log line: both kinds are redelivered after their
        lease; the waiting ones have spent an attempt without running.
        """
        with self._heartbeat_lock:
            held = len(self._held)
        running = self._running
        return running, max(0, held - running)

    def _handle(self, handler: Handler, record: EventRecord) -> tuple[Settlement, Exception | None]:
        """Run ``handler`` on ``record``; return its settlement and the outage to raise (or ``None``)."""
        started = self.clock()
        leased_until = self._leased_until(record)
        if leased_until is not None and started >= leased_until:
            logger.warning("event %s: lease expired before its handler started; released", record.id)
            return (record, "release", "stale", None), None
        failure: Exception | None = None
        claimed = _current_claim.set(Claim(self.journal, record.id, record.fencing_token, self.lease_ms, self.clock))
        try:
            handler(record)
        except Exception as exc:  # a handler's failure is data for the journal, not a crash
            failure = exc
        finally:
            _current_claim.reset(claimed)
        if failure is None:
            return (record, "ack", "processed", None), None
        unavailable = store_unavailable(failure)
        if unavailable is None:
            return (record, "fail", "failed", failure), None
        # The store, not the record, is at fault: give it back without spending an attempt.
        if unavailable is not failure:
            unavailable.__cause__ = failure
        return (record, "release", None, None), unavailable

    def _handle_many(
        self, batch_handler: BatchHandler, records: list[EventRecord]
    ) -> tuple[list[Settlement], Exception | None]:
        """Run ``batch_handler`` on ``records`` at once; return their settlements and the outage to raise.

        A record whose lease expired before the call is released (``stale``)
        and not handed over. Each record is settled by its own outcome: done →
        ``ack``, failed → ``fail`` (that record alone is retried), met an
        outage → ``release``. A batch handler that raises (or answers the
        wrong number of outcomes) fails every record it was given.
        """
        started = self.clock()
        settlements: list[Settlement] = []
        live: list[EventRecord] = []
        for record in records:
            leased_until = self._leased_until(record)
            if leased_until is not None and started >= leased_until:
                logger.warning("event %s: lease expired before its handler started; released", record.id)
                settlements.append((record, "release", "stale", None))
            else:
                live.append(record)
        if not live:
            return settlements, None
        try:
            outcomes = list(batch_handler(live))
            if len(outcomes) != len(live):
                raise TypeError(f"batch handler answered {len(outcomes)} outcomes for {len(live)} records")
        except Exception as exc:  # a handler's failure is data for the journal, not a crash
            outcomes = [exc] * len(live)
        outage: Exception | None = None
        for record, failure in zip(live, outcomes, strict=True):
            if failure is None:
                settlements.append((record, "ack", "processed", None))
                continue
            unavailable = store_unavailable(failure)
            if unavailable is None:
                settlements.append((record, "fail", "failed", failure))
                continue
            if unavailable is not failure:
                unavailable.__cause__ = failure
            settlements.append((record, "release", None, None))
            outage = outage or unavailable
        return settlements, outage

    def _settle_all(self, settlements: list[Settlement], counts: dict[str, int]) -> None:
        """Make the kept settlements, then ``settlements``: acks and failures batched, releases one by one.

        When the journal cannot be reached, every settlement not yet made is
        kept (made first once it is back: an outage costs a retry, not a whole
        lease) and ``StoreUnavailable`` is raised.
        """
        pending = self._unsettled + settlements
        self._unsettled = []
        try:
            self._apply_all(pending, counts)
        except Exception as exc:
            unavailable = store_unavailable(exc)
            if unavailable is None:
                raise
            self._unsettled = pending  # what is left of it
            if unavailable is exc:
                raise
            raise unavailable from exc

    def _apply_all(self, pending: list[Settlement], counts: dict[str, int]) -> None:
        """Apply the settlements of ``pending``, removing each from it once made and counting its outcome."""
        if not pending:
            return
        now = self.clock()
        acks = [s for s in pending if s[1] == "ack"]
        if acks:
            done = self.journal.ack_many(now, [(r.id, r.fencing_token) for r, *_ in acks])
            for settlement, after in zip(acks, done, strict=True):
                record, _, outcome, _ = settlement
                if after is None:
                    logger.warning("event %s: handler outlived its lease; ack refused", record.id)
                counts["stale" if after is None else outcome or "processed"] += 1
                pending.remove(settlement)
        fails = [s for s in pending if s[1] == "fail"]
        if fails:
            failures = [(r.id, r.fencing_token, f"{type(f).__name__}: {f}") for r, _, _, f in fails]
            failed = self.journal.fail_many(now, failures)
            for settlement, after in zip(fails, failed, strict=True):
                record, _, outcome, failure = settlement
                if after is None:
                    logger.warning("event %s: handler failed after its lease was lost", record.id)
                else:
                    logger.warning(
                        "event %s (%s) failed on attempt %d: %s; now %s",
                        record.id, record.type, record.attempts, type(failure).__name__, after.state,
                    )  # fmt: skip
                counts["stale" if after is None else outcome or "failed"] += 1
                pending.remove(settlement)
                if after is not None and after.state == "dead" and self.on_dead_letter is not None:
                    self.on_dead_letter(after)
        for settlement in list(pending):
            record, action, outcome, _ = settlement
            try:
                self.journal.release(record.id, self.clock(), record.fencing_token)
            except StaleLeaseError:  # somebody else claimed it meanwhile; nothing of ours to give back
                outcome = "stale" if action == "release" else None
            if outcome:
                counts[outcome] += 1
            pending.remove(settlement)

    def _leased_until(self, record: EventRecord) -> int | None:
        with self._heartbeat_lock:
            held = self._held.get(record.id)
        return held[1] if held is not None and held[0] == record.fencing_token else record.leased_until

    def _hold(self, records: list[EventRecord]) -> None:
        """Hold ``records`` for the heartbeat; start one if none runs."""
        with self._heartbeat_lock:
            for record in records:
                self._held[record.id] = (record.fencing_token, record.leased_until or 0)
            if self._held and self._heartbeat is None:
                self._heartbeat = threading.Thread(target=self._beat, name="events-lease-heartbeat", daemon=True)
                self._heartbeat.start()

    def _release_held(self, records: list[EventRecord]) -> None:
        with self._heartbeat_lock:
            for record in records:
                if self._held.get(record.id, (None,))[0] == record.fencing_token:
                    del self._held[record.id]

    def _beat(self) -> None:
        """Renew every held record's lease every ``lease_ms / 3``; end when no record is held.

        A record is renewed once it has been held a whole period (a batch
        settled within it costs no renewal).
        """
        seen: set[tuple[str, int]] = set()
        while True:
            time.sleep(self.lease_ms / 3000)
            with self._heartbeat_lock:
                if not self._held:
                    self._heartbeat = None  # the next batch starts a new heartbeat
                    return
                held = {(event_id, token) for event_id, (token, _) in self._held.items()}
            for event_id, token in sorted(held & seen):
                try:
                    after = self.journal.extend(event_id, self.clock(), token, self.lease_ms)
                except StaleLeaseError:
                    with self._heartbeat_lock:
                        still = self._held.get(event_id, (None,))[0] == token
                    if still:  # not just settled: the lease was really lost
                        logger.warning("event %s: lease lost while its handler runs", event_id)
                    continue
                except Exception as exc:  # noqa: BLE001 - the journal may be briefly unreachable
                    logger.warning("event %s: lease renewal failed: %s", event_id, type(exc).__name__)
                    continue
                with self._heartbeat_lock:
                    if self._held.get(event_id, (None,))[0] == token:
                        self._held[event_id] = (token, after.leased_until or 0)
            seen = held

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


def _units(handler: Handler, batch: list[EventRecord]) -> list[tuple[BatchHandler | None, list[EventRecord]]]:
    """Split a claimed batch into what runs at once: ``(None, [record])`` or ``(batch handler, records)``.

    A handler with ``batch_for(type)`` (the registry's ``dispatch``) names the
    batch handler of each type; the records of one batch handler form one
    unit, placed where its first record was claimed, the others stay one by one
    in claim order.
    """
    batch_for = getattr(handler, "batch_for", None)
    units: list[tuple[BatchHandler | None, list[EventRecord]]] = []
    if batch_for is None:
        return [(None, [record]) for record in batch]
    grouped: dict[int, list[EventRecord]] = {}
    for record in batch:
        batch_handler = batch_for(record.type)
        if batch_handler is None:
            units.append((None, [record]))
        elif id(batch_handler) in grouped:
            grouped[id(batch_handler)].append(record)
        else:
            grouped[id(batch_handler)] = [record]
            units.append((batch_handler, grouped[id(batch_handler)]))
    return units


def _reset_database_connections() -> None:
    """Close the Django connections an outage broke, so the next query after it reconnects.

    A long-running process has no request cycle that would do it (Django
    closes an unusable connection at the end of each request).
    """
    from django.db import close_old_connections

    close_old_connections()
