"""The EventJournal contract (ARCHITECTURE §6).

A journal holds *records*: an ``Envelope`` (what happened, for which tenant, on
which channel) plus its delivery state. Inbound webhooks, the outbox for sends
and the durable scheduled jobs all go through it, so every backend must keep
these promises even when a worker process dies at any instruction:

- ``append`` is idempotent by ``(tenant, idempotency_key)``: the second append
  returns the first record unchanged.
- ``claim`` leases the oldest ready record of one channel and gives it a new
  ``fencing_token``, taken from one counter per journal that only grows (a
  PostgreSQL sequence, a Redis ``INCR``, a counter row): strictly increasing per
  event and never reused, also after ``replay`` and after a restart.
- ``ack``, ``fail`` and ``release`` present that token; the journal checks it in
  the same atomic statement (or script, or lock-held step) that changes the
  state. A superseded token raises ``StaleLeaseError`` and changes nothing.

States: ``pending`` (waiting, maybe until ``available_at`` for a retry) →
``leased`` (a worker holds it until ``leased_until``) → ``done``, or back to
``pending`` (``fail`` with attempts left, ``release``), or ``dead`` (the dead
letter queue: ``fail`` after ``max_attempts``, or a lease that expired on its
last attempt). ``replay`` puts a ``dead`` or ``done`` record back to ``pending``.

Times are epoch **milliseconds** (``int``) passed in by the caller (the worker's
clock), so tests can drive time; durations are milliseconds too.

Optional capabilities, which every shipped backend has: ``RecordExport``
(backups and restores, ``botmesh_admin.backup``) and ``RecordPruning``
(retention of ``done`` records, the ``events.prune`` beat task).
"""

from __future__ import annotations

import json
import random
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from botmesh_admin.clock import now_ms as now_ms  # re-exported: the default journal clock
from botmesh_admin.errors import BadType, Conflict, DomainError, ValidationError
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.pagination import validate_limit

Clock = Callable[[], int]

STATES = ("pending", "leased", "done", "dead")
TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(?:[.:-][a-z0-9_]+)*$")
EVENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
# One regex pass over a payload's JSON text: a Python loop over its characters
# cost more than the rest of the validation (webhook payloads are ~1 KB).
_NUL_OR_SURROGATE_RE = re.compile("[\x00\ud800-\udfff]")
MAX_TYPE = 100
MAX_IDEMPOTENCY_KEY = 200
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_ERROR_CHARS = 2000
MAX_LIST = 200
MAX_BATCH = 5000
"""The most records one ``append_many`` / ``claim_many`` / ``ack_many`` / ``fail_many`` call takes
(a ledger push's 5,000 records are one commit)."""


def new_event_id(now: int) -> str:
    """Return a fresh event id that sorts by creation time: ``ev_<12 hex ms><12 hex random>``."""
    return f"ev_{now:012x}{secrets.token_hex(6)}"


def new_event_ids(now: int, n: int) -> list[str]:
    """Return ``n`` fresh event ids that sort by creation time and, within ``now``, in the order given.

    One random 48-bit base per call, counted up: ids of one batch claim in batch
    order (``claim`` orders by ``(available_at, id)``), yet never collide with
    another batch's (the base is random, like ``new_event_id``'s suffix).
    """
    base = secrets.randbelow(2**48 - n)
    return [f"ev_{now:012x}{base + i:012x}" for i in range(n)]


class StaleLeaseError(DomainError):
    """The fencing token presented is not the record's current lease (superseded, expired or gone).

    Nothing was changed. HTTP 409.
    """

    code = "stale_lease"
    status = 409

    def __init__(self, event_id: str, fencing_token: int, reason: str = "superseded") -> None:
        super().__init__(
            f"event {event_id!r}: lease with fencing token {fencing_token} is {reason}",
            event_id=event_id,
            fencing_token=fencing_token,
        )
        self.event_id = event_id
        self.fencing_token = fencing_token


@dataclass(frozen=True)
class Envelope:
    """What is appended: an event of ``type`` for ``tenant`` with a JSON ``payload``.

    ``id`` is generated when ``None``; ``created_at`` (epoch ms) comes from the
    journal's clock when ``None``. ``channel`` ``None`` is the default channel.
    """

    type: str
    tenant: str
    payload: dict[str, Any]
    idempotency_key: str
    channel: str | None = None
    id: str | None = None
    created_at: int | None = None


@dataclass(frozen=True)
class EventRecord:
    """A journal record: the envelope plus its delivery state.

    ``available_at`` (epoch ms) is when a ``pending`` record may next be claimed
    (for a ``leased`` one it equals ``leased_until``); ``fencing_token`` is the
    token of the latest claim (0 before the first); ``attempts`` counts claims
    that were not released; ``last_error`` is the latest failure text.
    """

    id: str
    type: str
    channel: str | None
    tenant: str
    payload: dict[str, Any]
    idempotency_key: str
    created_at: int
    state: str = "pending"
    attempts: int = 0
    available_at: int = 0
    leased_until: int | None = None
    fencing_token: int = 0
    last_error: str | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """When ``fail`` retries and when it dead-letters.

    The n-th failure (``attempts`` = n) waits ``min(max_delay_ms, base_delay_ms *
    2**(n-1))`` milliseconds, shortened by up to ``jitter`` (a fraction, 0..1)
    at random, so records that failed together do not retry together. After
    ``max_attempts`` attempts the record goes to the dead letter queue.
    """

    max_attempts: int = 5
    base_delay_ms: int = 1000
    max_delay_ms: int = 5 * 60 * 1000
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 1000:
            raise ValidationError("policy.max_attempts", "must be 1..1000")
        if self.base_delay_ms < 0 or self.max_delay_ms < self.base_delay_ms:
            raise ValidationError("policy.max_delay_ms", "must be >= base_delay_ms >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValidationError("policy.jitter", "must be between 0 and 1")

    def jitter_factor(self) -> float:
        """Return the factor (``1 - jitter .. 1``) one retry delay is multiplied by."""
        return 1.0 - self.jitter * self.rng.random()

    def delay_ms(self, attempts: int, factor: float) -> int:
        """Return the delay before the retry after the ``attempts``-th failed attempt."""
        raw = min(self.max_delay_ms, self.base_delay_ms << min(max(attempts - 1, 0), 40))
        return int(raw * factor)


@runtime_checkable
class EventJournal(Protocol):
    """Contract of every journal backend. All methods are thread-safe.

    Every backend passes ``tests/events/test_conformance.py``.
    """

    url: str
    policy: RetryPolicy

    def append(self, envelope: Envelope) -> EventRecord:
        """Store ``envelope`` as a ``pending`` record available now and return it.

        If the tenant already has a record with the same ``idempotency_key``,
        return that record unchanged. Raise ``ValidationError`` (naming the
        field, e.g. ``envelope.payload``) for a bad envelope and ``Conflict`` if
        an explicit ``id`` is taken by another record.
        """
        ...

    def append_many(self, envelopes: Sequence[Envelope]) -> list[EventRecord]:
        """Store every envelope as ``append`` does, in one commit; return the records in input order.

        An envelope whose ``(tenant, idempotency_key)`` is stored already — or
        repeated earlier in the same batch — answers that record unchanged.
        Every envelope is checked before anything is written: ``ValidationError``
        names the one at fault (``envelopes[3].payload``), ``Conflict`` an explicit
        ``id`` taken by another record; either way nothing of the batch is
        stored. At most ``MAX_BATCH`` envelopes (``ValidationError`` on ``envelopes``).
        """
        ...

    def get(self, event_id: str) -> EventRecord | None:
        """Return the record ``event_id``, or ``None``."""
        ...

    def claim(self, now: int, lease_ms: int, channel: str | None = None) -> EventRecord | None:
        """Lease the oldest record of ``channel`` that is ready at ``now``; return it or ``None``.

        Ready: ``pending`` with ``available_at <= now``, or ``leased`` with an
        expired lease. ``channel=None`` takes only records without a channel.
        The record comes back ``leased`` until ``now + lease_ms`` with
        ``attempts`` + 1 and a new ``fencing_token``. An expired lease that was
        the record's last attempt dead-letters the record instead (the worker
        died on it ``max_attempts`` times), and the next record is tried.
        """
        ...

    def claim_many(
        self,
        now: int,
        lease_ms: int,
        channel: str | None = None,
        limit: int = 100,
        *,
        dead_lettered: list[EventRecord] | None = None,
    ) -> list[EventRecord]:
        """Lease up to ``limit`` (1..``MAX_BATCH``) oldest ready records of ``channel`` at once, oldest first.

        Each record is leased as ``claim`` leases it — its own new fencing token,
        ``attempts`` + 1, ``leased_until = now + lease_ms`` — in one statement
        (or script, or lock-held step). Expired last attempts are dead-lettered
        as ``claim`` does and not returned; fewer than ``limit`` records (or
        none) come back when fewer are ready. Each record this claim
        dead-lettered is appended, as stored (``dead``, its ``last_error``), to
        ``dead_lettered`` when given — the worker calls its type's dead-letter
        hook with it (``events.handlers.register(..., on_dead_letter=)``).

        A record attempted before (``attempts > 0``: an earlier lease lapsed or
        failed) is claimed alone: when it is first in line it comes back by
        itself, else the batch ends before it. So a poison record that kills
        its worker is isolated after its first crash, and the records claimed
        with it are not charged an attempt for it again.
        """
        ...

    def ack_many(self, now: int, claims: Sequence[tuple[str, int]]) -> list[EventRecord | None]:
        """``ack`` each ``(event_id, fencing_token)`` in one statement; return the records in input order.

        Every record's token is checked in that statement, record by record: a
        claim that is not the live lease at ``now`` (superseded, expired, or no
        such record) changes nothing and answers ``None`` in its place, the
        others are settled. Raise ``ValidationError`` naming ``claims`` (not a
        list, an id repeated, more than ``MAX_BATCH``) or ``claims[i]``; then nothing changes.
        """
        ...

    def fail_many(self, now: int, failures: Sequence[tuple[str, int, str]]) -> list[EventRecord | None]:
        """``fail`` each ``(event_id, fencing_token, error)`` in one statement; answers as ``ack_many``.

        Each failure draws its own backoff jitter, so records that failed
        together do not retry together.
        """
        ...

    def ack(self, event_id: str, now: int, fencing_token: int) -> EventRecord:
        """Mark the leased record ``done``.

        Raise ``StaleLeaseError`` unless ``fencing_token`` is the current lease
        and the lease is still valid at ``now``; ``NotFound`` if there is no such record.
        """
        ...

    def fail(self, event_id: str, now: int, fencing_token: int, error: str) -> EventRecord:
        """Record a failed attempt with ``error``.

        With attempts left the record goes back to ``pending``, available after
        the policy's backoff; after ``max_attempts`` it goes to ``dead`` (the
        DLQ) keeping ``error`` as ``last_error``. Raise ``StaleLeaseError`` as ``ack`` does.
        """
        ...

    def extend(self, event_id: str, now: int, fencing_token: int, lease_ms: int) -> EventRecord:
        """Renew a live lease (a heartbeat): ``leased_until = now + lease_ms``; the token stays.

        Raise ``StaleLeaseError`` as ``ack`` does (superseded, or already expired at
        ``now``: an expired lease may have been claimed by another worker), and
        ``NotFound`` if there is no such record.
        """
        ...

    def release(self, event_id: str, now: int, fencing_token: int) -> EventRecord:
        """Give the lease back without spending an attempt: ``pending``, available at ``now``.

        Works on an expired lease as long as nobody claimed the record since;
        raise ``StaleLeaseError`` if ``fencing_token`` is not the current lease.
        """
        ...

    def replay(self, event_id: str) -> EventRecord:
        """Put a ``dead`` or ``done`` record back to ``pending`` (attempts 0, a fresh token).

        The fresh fencing token supersedes every earlier one. Raise ``NotFound``
        for an unknown id and ``Conflict`` for a ``pending`` or ``leased`` record.
        """
        ...

    def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        channel: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> list[EventRecord]:
        """Return up to ``limit`` (1..200) records, newest id first, ids below ``after``.

        ``tenant``/``state``/``channel`` filter (``None``: any); ``channel=""``
        selects records without a channel. Pass the last id as ``after`` for the next page.
        """
        ...

    def counts(self, tenant: str) -> dict[tuple[str, str | None], int]:
        """Return ``{(state, channel): number of records}`` of ``tenant`` (non-zero only)."""
        ...

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` if the backend cannot be reached."""
        ...

    def close(self) -> None:
        """Release connections and files. The instance is unusable afterwards."""
        ...


@runtime_checkable
class RecordExport(Protocol):
    """Optional capability: copy every record out and back in (backups, restores)."""

    def export_records(self, *, after: str | None = None, limit: int = 1000) -> list[EventRecord]:
        """Return up to ``limit`` (1..10000) records of every tenant and state, ascending by id.

        Only ids greater than ``after`` are returned: pass the last id of a page
        to get the next one.
        """
        ...

    def fencing_counter(self) -> int:
        """Return the highest fencing token handed out so far (0 if none)."""
        ...

    def import_records(self, records: Sequence[EventRecord], *, fencing_counter: int = 0) -> int:
        """Store ``records`` exactly as given (state, attempts, tokens, times); return how many.

        A record with an id already stored replaces it. The fencing counter is
        raised to at least ``fencing_counter`` and every imported token, so no
        token is handed out twice after a restore. Raise ``ValidationError``
        naming the record field at fault and ``Conflict`` if a record reuses
        another id's ``(tenant, idempotency_key)``. Only restores use this.
        """
        ...


@runtime_checkable
class RecordPruning(Protocol):
    """Optional capability: forget old ``done`` records (journal retention)."""

    def prune(self, before: int, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` ``done`` records that were done before ``before`` (epoch ms).

        The time a record was done is its ``available_at`` (``ack`` sets it).
        ``pending``, ``leased`` and ``dead`` records are never pruned. Once a
        record is pruned its idempotency key is free again: the retention is
        also the window in which a redelivered event is recognised. Return how
        many records were deleted.
        """
        ...


@runtime_checkable
class TenantErasure(Protocol):
    """Optional capability: forget every record of one tenant (tenant erasure)."""

    def erase_tenant(self, tenant: str, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` records of ``tenant`` in any state; return how many.

        Their idempotency keys are freed and their counts go with them; other
        tenants' records are untouched. Call until it returns 0 (each call is a
        batch, so a killed erasure resumes where it stopped). Raise
        ``ValidationError`` for a bad tenant id or limit.
        """
        ...


def validate_erase_args(tenant: object, limit: object) -> str:
    """Check the arguments of ``erase_tenant``; return the tenant id."""
    validate_id(tenant, "tenant")
    validate_limit(limit, maximum=MAX_EXPORT)
    return str(tenant)


# -- validation, shared by every backend ----------------------------------------------


def validate_channel(channel: object, field: str = "envelope.channel") -> str | None:
    """Return ``channel`` (``None`` or a channel id), else raise ``ValidationError``."""
    if channel is None:
        return None
    return validate_id(channel, field)


def validate_envelope(envelope: object, now: int) -> EventRecord:
    """Return the ``pending`` record ``envelope`` becomes at ``now``; raise ``ValidationError``."""
    if not isinstance(envelope, Envelope):
        raise BadType("envelope", f"must be an Envelope, not {type(envelope).__name__}")
    e = envelope
    if not isinstance(e.type, str) or not 0 < len(e.type) <= MAX_TYPE or not TYPE_RE.match(e.type):
        raise ValidationError("envelope.type", "must be a dotted lower-case name like 'inbox.message'")
    validate_id(e.tenant, "envelope.tenant")
    channel = validate_channel(e.channel)
    if not isinstance(e.idempotency_key, str):
        raise BadType("envelope.idempotency_key", "must be a string")
    if not 0 < len(e.idempotency_key) <= MAX_IDEMPOTENCY_KEY or not e.idempotency_key.isprintable():
        raise ValidationError("envelope.idempotency_key", f"must be 1..{MAX_IDEMPOTENCY_KEY} printable characters")
    if not isinstance(e.payload, dict):
        raise BadType("envelope.payload", "must be a JSON object (dict)")
    try:
        text = json.dumps(e.payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        # Round-trip: tuples, non-string keys and the like would come back different.
        payload = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValidationError("envelope.payload", f"not plain JSON: {exc}") from None
    if payload != e.payload:
        raise ValidationError("envelope.payload", "not plain JSON: keys must be strings, no tuples")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PAYLOAD_BYTES:
        raise ValidationError("envelope.payload", f"larger than {MAX_PAYLOAD_BYTES} bytes")
    if _NUL_OR_SURROGATE_RE.search(text):
        raise ValidationError("envelope.payload", "contains NUL or a lone surrogate")
    created_at = now if e.created_at is None else e.created_at
    if not isinstance(created_at, int) or isinstance(created_at, bool) or not 0 <= created_at < 2**53:
        raise ValidationError("envelope.created_at", "must be epoch milliseconds (int)")
    event_id = new_event_id(now) if e.id is None else e.id
    if not isinstance(event_id, str) or not EVENT_ID_RE.match(event_id):
        raise ValidationError("envelope.id", "must be 1..64 characters of A-Z a-z 0-9 _ . : -")
    return EventRecord(
        id=event_id,
        type=e.type,
        channel=channel,
        tenant=e.tenant,
        payload=payload,
        idempotency_key=e.idempotency_key,
        created_at=created_at,
        state="pending",
        attempts=0,
        available_at=now,
    )


def validate_envelopes(envelopes: object, now: int) -> list[EventRecord]:
    """Return the ``pending`` records a batch of envelopes becomes at ``now`` (``append_many``).

    Raise ``ValidationError`` naming ``envelopes`` (not a list, more than
    ``MAX_BATCH``) or ``envelopes[i].<field>`` for the first bad envelope.
    """
    if isinstance(envelopes, (str, bytes)) or not isinstance(envelopes, Sequence):
        raise BadType("envelopes", "must be a list of Envelope")
    if len(envelopes) > MAX_BATCH:
        raise ValidationError("envelopes", f"at most {MAX_BATCH} per call")
    out: list[EventRecord] = []
    for i, envelope in enumerate(envelopes):
        try:
            out.append(validate_envelope(envelope, now))
        except ValidationError as exc:
            field = (exc.field or "").removeprefix("envelope")
            raise type(exc)(f"envelopes[{i}]{field}", exc.problem) from None
    return out


def first_of_keys(records: Sequence[EventRecord]) -> tuple[list[EventRecord], list[int]]:
    """Return the records of a batch whose ``(tenant, idempotency_key)`` is new to it, and for
    every record the index (into that list) of the first with its key."""
    firsts: list[EventRecord] = []
    seen: dict[tuple[str, str], int] = {}
    where: list[int] = []
    for record in records:
        key = (record.tenant, record.idempotency_key)
        if key not in seen:
            seen[key] = len(firsts)
            firsts.append(record)
        where.append(seen[key])
    return firsts, where


def validate_batch_limit(limit: object) -> int:
    """Return ``limit`` if it is an int of 1..``MAX_BATCH`` (``claim_many``)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_BATCH:
        raise ValidationError("limit", f"must be 1..{MAX_BATCH}")
    return limit


def validate_settlements(now: object, items: object, field: str, *, errors: bool) -> list[tuple[str, int, str]]:
    """Check ``ack_many`` claims (``errors`` False) or ``fail_many`` failures; return ``(id, token, error)`` triples.

    The error text is clipped (``clip_error``); ``""`` for an ack.
    """
    validate_time(now, "now")
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise BadType(field, "must be a list of (event_id, fencing_token" + (", error)" if errors else ")"))
    if len(items) > MAX_BATCH:
        raise ValidationError(field, f"at most {MAX_BATCH} per call")
    out: list[tuple[str, int, str]] = []
    seen: set[str] = set()
    width = 3 if errors else 2
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        if not isinstance(item, (tuple, list)) or len(item) != width:
            raise BadType(where, f"must be a tuple of {width}")
        try:
            event_id, token = validate_event_id(item[0]), validate_token(item[1])
        except ValidationError as exc:
            raise type(exc)(f"{where}.{exc.field}", exc.problem) from None
        if event_id in seen:
            raise ValidationError(where, f"event {event_id!r} is repeated in the batch")
        seen.add(event_id)
        out.append((event_id, token, clip_error(item[2]) if errors else ""))
    return out


def validate_time(value: object, field: str) -> int:
    """Return ``value`` if it is a non-negative int of epoch ms / a duration in ms."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**53:
        raise ValidationError(field, "must be a non-negative integer of milliseconds")
    return value


def validate_lease(now: object, lease_ms: object) -> None:
    """Check the arguments of ``claim``."""
    validate_time(now, "now")
    validate_time(lease_ms, "lease_ms")
    if lease_ms == 0:
        raise ValidationError("lease_ms", "must be positive")


def validate_event_id(event_id: object) -> str:
    """Return ``event_id`` if well-formed (else ``ValidationError``)."""
    if not isinstance(event_id, str) or not EVENT_ID_RE.match(event_id):
        raise ValidationError("event_id", "not an event id")
    return event_id


def validate_token(fencing_token: object) -> int:
    """Return ``fencing_token`` if it is a positive int."""
    if not isinstance(fencing_token, int) or isinstance(fencing_token, bool) or fencing_token < 1:
        raise ValidationError("fencing_token", "must be a positive integer")
    return fencing_token


def clip_error(error: object) -> str:
    """Return ``error`` as text of at most ``MAX_ERROR_CHARS`` characters."""
    text = error if isinstance(error, str) else repr(error)
    text = text.replace("\x00", "\\0")
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def validate_list_args(tenant: object, state: object, channel: object, limit: object, after: object) -> None:
    """Check the filters of ``list``."""
    if tenant is not None:
        validate_id(tenant, "tenant")
    if state is not None and state not in STATES:
        raise ValidationError("state", f"must be one of {', '.join(STATES)}")
    if channel not in (None, ""):
        validate_id(channel, "channel")
    validate_limit(limit, maximum=MAX_LIST)
    if after is not None and (not isinstance(after, str) or len(after) > 64):
        raise ValidationError("after", "not an event id")


def not_replayable(record: EventRecord) -> Conflict:
    """Return the error ``replay`` raises for a record that is not ``dead`` or ``done``."""
    return Conflict(
        f"event {record.id!r} is {record.state}: only dead or done records can be replayed",
        state=record.state,
    )


def lease_expired_error(attempts: int) -> str:
    """Return the ``last_error`` of a record dead-lettered because its last lease expired."""
    return f"lease expired on attempt {attempts}: the worker stopped or outlived its lease"


MAX_EXPORT = 10_000


def validate_export_args(after: object, limit: object) -> None:
    """Check the arguments of ``export_records``."""
    if after is not None and (not isinstance(after, str) or len(after) > 64):
        raise ValidationError("after", "not an event id")
    validate_limit(limit, maximum=MAX_EXPORT)


def validate_prune_args(before: object, limit: object) -> None:
    """Check the arguments of ``prune``."""
    validate_time(before, "before")
    validate_limit(limit, maximum=MAX_EXPORT)


def validate_imported(records: object, fencing_counter: object) -> list[EventRecord]:
    """Return ``records`` if each is a well-formed ``EventRecord``; else raise ``ValidationError``."""
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise BadType("records", "must be a list of EventRecord")
    validate_time(fencing_counter, "fencing_counter")
    out: list[EventRecord] = []
    for i, record in enumerate(records):
        where = f"records[{i}]"
        if not isinstance(record, EventRecord):
            raise BadType(where, f"{type(record).__name__} is not an EventRecord")
        envelope = Envelope(
            type=record.type, tenant=record.tenant, payload=record.payload,
            idempotency_key=record.idempotency_key, channel=record.channel, id=record.id,
            created_at=record.created_at,
        )  # fmt: skip
        try:
            validate_envelope(envelope, record.created_at if isinstance(record.created_at, int) else 0)
        except ValidationError as exc:
            field = (exc.field or "").removeprefix("envelope.")
            raise type(exc)(f"{where}.{field}", exc.problem) from None
        if record.state not in STATES:
            raise ValidationError(f"{where}.state", f"must be one of {', '.join(STATES)}")
        for name in ("attempts", "available_at", "fencing_token"):
            validate_time(getattr(record, name), f"{where}.{name}")
        if record.state == "leased" and record.leased_until is None:
            raise ValidationError(f"{where}.leased_until", "a leased record needs leased_until")
        if record.leased_until is not None:
            validate_time(record.leased_until, f"{where}.leased_until")
        if record.last_error is not None and not isinstance(record.last_error, str):
            raise BadType(f"{where}.last_error", "must be a string or None")
        out.append(record)
    return out
