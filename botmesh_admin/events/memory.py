"""MemoryEventJournal: the reference journal, in one process's memory.

Every method runs under one lock, so each state change and its fencing-token
check are one atomic step. ``FileEventJournal`` adds a durable snapshot.
"""

from __future__ import annotations

import builtins
import dataclasses
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from botmesh_admin.errors import Conflict, NotFound, StoreUnavailable

from .base import (
    Clock,
    Envelope,
    EventRecord,
    RetryPolicy,
    StaleLeaseError,
    clip_error,
    first_of_keys,
    lease_expired_error,
    not_replayable,
    now_ms,
    validate_batch_limit,
    validate_channel,
    validate_envelope,
    validate_envelopes,
    validate_erase_args,
    validate_event_id,
    validate_export_args,
    validate_imported,
    validate_lease,
    validate_list_args,
    validate_prune_args,
    validate_settlements,
    validate_time,
    validate_token,
)


class MemoryEventJournal:
    """EventJournal in memory (``memory://``): the reference for every backend."""

    def __init__(
        self, url: str = "memory://", *, policy: RetryPolicy | None = None, clock: Clock | None = None
    ) -> None:
        self.url = url
        self.policy = policy or RetryPolicy()
        self.clock: Clock = clock or now_ms
        self._lock = threading.RLock()
        self._records: dict[str, EventRecord] = {}
        self._by_key: dict[tuple[str, str], str] = {}
        self._fence = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self._records)} records>"

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Hold the lock for one change; subclasses persist it before the lock is released."""
        with self._lock:
            self._check_open()
            yield
            self._persist()

    def _persist(self) -> None:
        """Make the last change durable (nothing to do in memory)."""

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the journal is closed")

    def _next_token(self) -> int:
        self._fence += 1
        return self._fence

    # -- the contract ----------------------------------------------------------------

    def append(self, envelope: Envelope) -> EventRecord:
        """Store ``envelope`` as a ``pending`` record, or return the tenant's record with its key."""
        record = validate_envelope(envelope, self.clock())
        with self._writing():
            existing = self._by_key.get((record.tenant, record.idempotency_key))
            if existing is not None:
                return self._records[existing]
            if record.id in self._records:
                raise Conflict(f"event id {record.id!r} is taken by another record")
            self._records[record.id] = record
            self._by_key[(record.tenant, record.idempotency_key)] = record.id
            return record

    def append_many(self, envelopes: Sequence[Envelope]) -> builtins.list[EventRecord]:
        """Store every envelope (or answer its key's record) under one lock and one persist."""
        firsts, where = first_of_keys(validate_envelopes(envelopes, self.clock()))
        with self._writing():
            stored: builtins.list[EventRecord] = []
            new_ids: set[str] = set()
            for record in firsts:
                existing = self._by_key.get((record.tenant, record.idempotency_key))
                if existing is not None:
                    stored.append(self._records[existing])
                    continue
                if record.id in self._records or record.id in new_ids:
                    raise Conflict(f"event id {record.id!r} is taken by another record")
                new_ids.add(record.id)
                stored.append(record)
            for record in stored:  # every check passed: now write
                if record.id in new_ids:
                    self._records[record.id] = record
                    self._by_key[(record.tenant, record.idempotency_key)] = record.id
            return [stored[i] for i in where]

    def get(self, event_id: str) -> EventRecord | None:
        """Return the record ``event_id``, or ``None``."""
        validate_event_id(event_id)
        with self._lock:
            self._check_open()
            return self._records.get(event_id)

    def claim(self, now: int, lease_ms: int, channel: str | None = None) -> EventRecord | None:
        """Lease the oldest ready record of ``channel`` until ``now + lease_ms``."""
        claimed = self._claim(now, lease_ms, channel, 1)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        now: int,
        lease_ms: int,
        channel: str | None = None,
        limit: int = 100,
        *,
        dead_lettered: builtins.list[EventRecord] | None = None,
    ) -> builtins.list[EventRecord]:
        """Lease up to ``limit`` oldest ready records of ``channel`` under one lock (one persist)."""
        return self._claim(now, lease_ms, channel, validate_batch_limit(limit), dead_lettered)

    def _claim(
        self,
        now: int,
        lease_ms: int,
        channel: str | None,
        limit: int,
        dead_lettered: builtins.list[EventRecord] | None = None,
    ) -> builtins.list[EventRecord]:
        validate_lease(now, lease_ms)
        validate_channel(channel, "channel")
        with self._writing():
            ready = sorted(
                (
                    r
                    for r in self._records.values()
                    if r.channel == channel and r.state in ("pending", "leased") and r.available_at <= now
                ),
                key=lambda r: (r.available_at, r.id),
            )
            claimed: builtins.list[EventRecord] = []
            for record in ready:
                if len(claimed) == limit:
                    break
                expired_last = record.state == "leased" and record.attempts >= self.policy.max_attempts
                if not expired_last and record.attempts > 0 and limit > 1:
                    # attempted before: claimed alone (base.claim_many); decided before a token is
                    # taken, so a batch that ends here spends no token on it (as the SQL and Redis claims)
                    if claimed:
                        break
                    limit = 1
                token = self._next_token()
                if expired_last:
                    dead = dataclasses.replace(
                        record,
                        state="dead",
                        fencing_token=token,
                        leased_until=None,
                        available_at=now,
                        last_error=lease_expired_error(record.attempts),
                    )
                    self._records[record.id] = dead
                    if dead_lettered is not None:
                        dead_lettered.append(dead)
                    continue
                leased = dataclasses.replace(
                    record,
                    state="leased",
                    attempts=record.attempts + 1,
                    fencing_token=token,
                    leased_until=now + lease_ms,
                    available_at=now + lease_ms,
                )
                self._records[record.id] = leased
                claimed.append(leased)
            return claimed

    def _leased(self, event_id: str, now: int, fencing_token: int, *, live: bool) -> EventRecord:
        validate_event_id(event_id)
        validate_time(now, "now")
        validate_token(fencing_token)
        record = self._records.get(event_id)
        if record is None:
            raise NotFound(f"event {event_id!r} not found")
        if record.state != "leased" or record.fencing_token != fencing_token:
            raise StaleLeaseError(event_id, fencing_token)
        if live and record.leased_until is not None and record.leased_until <= now:
            raise StaleLeaseError(event_id, fencing_token, "expired")
        return record

    def ack(self, event_id: str, now: int, fencing_token: int) -> EventRecord:
        """Mark the leased record ``done`` if ``fencing_token`` is its live lease."""
        with self._writing():
            record = self._leased(event_id, now, fencing_token, live=True)
            return self._done(record, now)

    def _done(self, record: EventRecord, now: int) -> EventRecord:
        done = dataclasses.replace(record, state="done", leased_until=None, available_at=now)
        self._records[record.id] = done
        return done

    def fail(self, event_id: str, now: int, fencing_token: int, error: str) -> EventRecord:
        """Retry the record after the backoff, or dead-letter it after ``max_attempts``."""
        error = clip_error(error)
        factor = self.policy.jitter_factor()
        with self._writing():
            record = self._leased(event_id, now, fencing_token, live=True)
            return self._failed(record, now, error, factor)

    def _failed(self, record: EventRecord, now: int, error: str, factor: float) -> EventRecord:
        if record.attempts >= self.policy.max_attempts:
            after = dataclasses.replace(record, state="dead", leased_until=None, available_at=now, last_error=error)
        else:
            after = dataclasses.replace(
                record,
                state="pending",
                leased_until=None,
                available_at=now + self.policy.delay_ms(record.attempts, factor),
                last_error=error,
            )
        self._records[record.id] = after
        return after

    def _live(self, event_id: str, now: int, fencing_token: int) -> EventRecord | None:
        """Return the record if ``fencing_token`` is its live lease at ``now``, else ``None``."""
        record = self._records.get(event_id)
        if record is None or record.state != "leased" or record.fencing_token != fencing_token:
            return None
        if record.leased_until is not None and record.leased_until <= now:
            return None
        return record

    def ack_many(self, now: int, claims: Sequence[tuple[str, int]]) -> builtins.list[EventRecord | None]:
        """``ack`` every live claim under one lock (one persist); ``None`` for a refused one."""
        items = validate_settlements(now, claims, "claims", errors=False)
        with self._writing():
            out: builtins.list[EventRecord | None] = []
            for event_id, token, _ in items:
                record = self._live(event_id, now, token)
                out.append(None if record is None else self._done(record, now))
            return out

    def fail_many(self, now: int, failures: Sequence[tuple[str, int, str]]) -> builtins.list[EventRecord | None]:
        """``fail`` every live claim under one lock (one persist); ``None`` for a refused one."""
        items = validate_settlements(now, failures, "failures", errors=True)
        with self._writing():
            out: builtins.list[EventRecord | None] = []
            for event_id, token, error in items:
                record = self._live(event_id, now, token)
                out.append(None if record is None else self._failed(record, now, error, self.policy.jitter_factor()))
            return out

    def extend(self, event_id: str, now: int, fencing_token: int, lease_ms: int) -> EventRecord:
        """Renew the live lease ``fencing_token`` until ``now + lease_ms``."""
        validate_lease(now, lease_ms)
        with self._writing():
            record = self._leased(event_id, now, fencing_token, live=True)
            after = dataclasses.replace(record, leased_until=now + lease_ms, available_at=now + lease_ms)
            self._records[event_id] = after
            return after

    def release(self, event_id: str, now: int, fencing_token: int) -> EventRecord:
        """Give the lease back without spending an attempt."""
        with self._writing():
            record = self._leased(event_id, now, fencing_token, live=False)
            after = dataclasses.replace(
                record,
                state="pending",
                attempts=max(record.attempts - 1, 0),
                leased_until=None,
                available_at=now,
            )
            self._records[event_id] = after
            return after

    def replay(self, event_id: str) -> EventRecord:
        """Put a ``dead`` or ``done`` record back to ``pending`` with a fresh token."""
        validate_event_id(event_id)
        now = self.clock()
        with self._writing():
            record = self._records.get(event_id)
            if record is None:
                raise NotFound(f"event {event_id!r} not found")
            if record.state not in ("dead", "done"):
                raise not_replayable(record)
            after = dataclasses.replace(
                record,
                state="pending",
                attempts=0,
                fencing_token=self._next_token(),
                leased_until=None,
                available_at=now,
            )
            self._records[event_id] = after
            return after

    def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        channel: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> list[EventRecord]:
        """Return up to ``limit`` records, newest id first, ids below ``after``."""
        validate_list_args(tenant, state, channel, limit, after)
        want_channel = None if channel == "" else channel
        with self._lock:
            self._check_open()
            rows = [
                r
                for r in self._records.values()
                if (tenant is None or r.tenant == tenant)
                and (state is None or r.state == state)
                and (channel is None or r.channel == want_channel)
                and (after is None or r.id < after)
            ]
        rows.sort(key=lambda r: r.id, reverse=True)
        return rows[:limit]

    def counts(self, tenant: str) -> dict[tuple[str, str | None], int]:
        """Return ``{(state, channel): n}`` for ``tenant``."""
        validate_list_args(tenant, None, None, 1, None)
        out: dict[tuple[str, str | None], int] = {}
        with self._lock:
            self._check_open()
            for r in self._records.values():
                if r.tenant == tenant:
                    out[(r.state, r.channel)] = out.get((r.state, r.channel), 0) + 1
        return out

    # -- optional capabilities: export/import (backups), prune (retention) -------------

    def export_records(self, *, after: str | None = None, limit: int = 1000) -> builtins.list[EventRecord]:
        """Return up to ``limit`` records of every tenant, ascending by id, ids above ``after``."""
        validate_export_args(after, limit)
        with self._lock:
            self._check_open()
            ids = sorted(i for i in self._records if after is None or i > after)[:limit]
            return [self._records[i] for i in ids]

    def fencing_counter(self) -> int:
        """Return the highest fencing token handed out so far."""
        with self._lock:
            self._check_open()
            return self._fence

    def import_records(self, records: Sequence[EventRecord], *, fencing_counter: int = 0) -> int:
        """Store ``records`` as given (restore); raise the fencing counter past every token."""
        records = validate_imported(records, fencing_counter)
        with self._writing():
            by_key = dict(self._by_key)
            for record in records:
                owner = by_key.get((record.tenant, record.idempotency_key))
                if owner is not None and owner != record.id:
                    raise Conflict(f"event {record.id!r}: idempotency key already used by event {owner!r}")
                old = self._records.get(record.id)
                if old is not None:
                    by_key.pop((old.tenant, old.idempotency_key), None)
                by_key[(record.tenant, record.idempotency_key)] = record.id
            for record in records:
                self._records[record.id] = record
            self._by_key = by_key
            tokens = [r.fencing_token for r in records]
            self._fence = max(self._fence, fencing_counter, *tokens)
            return len(records)

    def prune(self, before: int, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` records done before ``before``, oldest first; return how many."""
        validate_prune_args(before, limit)
        with self._writing():
            old = sorted(
                (r for r in self._records.values() if r.state == "done" and r.available_at < before),
                key=lambda r: (r.available_at, r.id),
            )[:limit]
            for record in old:
                del self._records[record.id]
                self._by_key.pop((record.tenant, record.idempotency_key), None)
            return len(old)

    def erase_tenant(self, tenant: str, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` records of ``tenant`` (any state); return how many."""
        validate_erase_args(tenant, limit)
        with self._writing():
            gone = [r for r in self._records.values() if r.tenant == tenant][:limit]
            for record in gone:
                del self._records[record.id]
                self._by_key.pop((record.tenant, record.idempotency_key), None)
            return len(gone)

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` once closed."""
        with self._lock:
            self._check_open()

    def close(self) -> None:
        """Forget nothing (memory), but refuse later calls."""
        self._closed = True
