"""Writes to the event journal: publish, replay, drain (HackSoft services).

Tenant first and positional, the rest keyword-only. Dispatching the drain task
happens after the enclosing database transaction commits (``on_commit``), and
a broker that is down never fails a publish: the beat safety net drains anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction

from botmesh_admin.errors import BadType, NotFound, ValidationError
from botmesh_admin.kv.tenant import validate_id

from .base import (
    MAX_BATCH,
    Envelope,
    EventJournal,
    EventRecord,
    new_event_ids,
    now_ms,
    validate_channel,
    validate_event_id,
)
from .runtime import default_journal
from .tasks import drain as drain_task
from .wakeups import DrainWakeups

if TYPE_CHECKING:
    from .worker import EventWorker

logger = logging.getLogger("botmesh.events")

DEFAULT_LEASE_MS = 30_000
DAY_MS = 24 * 3600 * 1000
PRUNE_BATCH = 1000
CLAIM_BATCH: dict[str | None, int] = {"outbox": 1, "campaigns-run": 1, "crm-import": 1}
"""Records a drain claims at a time per channel (``EventWorker.claim_batch``; others: its default).
A reply send waits on the provider: a worker holding 20 sends behind one slow request would keep
them from the other workers, so the outbox claims one at a time; so do campaign runs (minutes to hours each)
and CSV imports (minutes each)."""


def _queue_drain(channel: str | None) -> None:
    try:
        drain_task.delay(channel)
    except Exception as exc:  # the broker is optional for correctness: beat drains too
        logger.warning("could not queue events.drain(%s): %s", channel, type(exc).__name__)


def _queue_trailing_drain(channel: str | None) -> None:
    from botmesh_admin.observability.tracing import untraced

    with untraced():  # it serves many webhooks, none of which is its parent: no trace of its own
        _queue_drain(channel)


_wakeups = DrainWakeups(_queue_drain, send_later=_queue_trailing_drain)


def event_drain_soon(channel: str | None) -> None:
    """Queue a drain of ``channel`` once the enclosing transaction commits (coalesced: see ``wakeups``).

    ``event_publish`` and ``event_publish_many`` call it for what they append;
    call it yourself only after a change that makes records ready another way.
    A broker that is down never raises here: beat's safety net drains anyway.
    """

    def send() -> None:
        if drain_task.app.conf.task_always_eager:
            _queue_drain(channel)  # eager drains run here and now, as callers of eager mode expect
        else:
            _wakeups.request(channel)  # coalesced: see ``wakeups``

    transaction.on_commit(send)


@dataclass(frozen=True)
class NewEvent:
    """One event of an ``event_publish_many`` batch: the arguments of ``event_publish`` but the tenant."""

    type: str
    payload: dict[str, Any]
    idempotency_key: str
    channel: str | None = None


@dataclass(frozen=True)
class Published:
    """What ``event_publish_many`` did with one event: the stored ``record``; ``new`` is False when
    its idempotency key was seen before (then ``record`` is the first one, unchanged)."""

    record: EventRecord
    new: bool


def event_publish(
    tenant: str,
    *,
    type: str,
    payload: dict[str, Any],
    idempotency_key: str,
    channel: str | None = None,
) -> EventRecord:
    """Append an event for ``tenant`` and queue a drain of its channel after commit.

    Return the stored record — the first one if ``idempotency_key`` was seen
    before for this tenant (then nothing new is queued). Raise
    ``ValidationError`` naming the envelope field at fault.
    """
    record = default_journal().append(
        Envelope(type=type, tenant=tenant, payload=payload, idempotency_key=idempotency_key, channel=channel)
    )
    if record.state == "pending":
        event_drain_soon(record.channel)
    return record


def event_publish_many(
    tenant: str, events: Sequence[NewEvent], *, journal: EventJournal | None = None, wake: bool = True
) -> list[Published]:
    """Append a batch of events for ``tenant`` in one journal commit; queue one drain per channel after commit.

    The batch variant of ``event_publish``, with the same validation and
    idempotency: return one ``Published`` per event, in order; an event whose
    idempotency key was seen before for this tenant — or earlier in the same
    batch — answers that first record (``new`` False). Every event is checked
    before anything is written: ``ValidationError`` names ``tenant``,
    ``events`` (not a list of ``NewEvent``, more than ``MAX_BATCH``) or the
    event at fault (``events[3].payload``), and nothing of the batch is stored.
    Within one millisecond the records are claimed in batch order.

    ``journal`` defaults to ``default_journal()``. ``wake=False`` queues no
    ``events.drain``: for channels another runner drains (the scheduler's
    ``jobs-*`` occurrences, run by ``jobs.run``).
    """
    validate_id(tenant, "tenant")
    if isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
        raise BadType("events", "must be a list of NewEvent")
    if len(events) > MAX_BATCH:
        raise ValidationError("events", f"at most {MAX_BATCH} events per call")
    for i, event in enumerate(events):
        if not isinstance(event, NewEvent):
            raise BadType(f"events[{i}]", f"must be a NewEvent, not {type(event).__name__}")
    if not events:
        return []
    journal = journal or default_journal()
    ids = new_event_ids(getattr(journal, "clock", now_ms)(), len(events))
    envelopes = [
        Envelope(
            type=e.type, tenant=tenant, payload=e.payload, idempotency_key=e.idempotency_key,
            channel=e.channel, id=event_id,
        )
        for e, event_id in zip(events, ids, strict=True)
    ]  # fmt: skip
    try:
        records = journal.append_many(envelopes)
    except ValidationError as exc:
        raise type(exc)((exc.field or "events").replace("envelopes", "events", 1), exc.problem) from None
    published = [Published(r, r.id == event_id) for r, event_id in zip(records, ids, strict=True)]
    if wake:
        for channel in dict.fromkeys(p.record.channel for p in published if p.new):
            event_drain_soon(channel)
    return published


def event_replay(tenant: str, *, event_id: str, actor: str) -> EventRecord:
    """Put ``tenant``'s dead or done event back to pending and queue a drain after commit.

    Raise ``NotFound`` for an unknown or foreign event and ``Conflict`` if it
    is pending or leased. ``actor`` is logged (audit), never the payload.
    """
    validate_id(tenant, "tenant")
    journal = default_journal()
    current = journal.get(validate_event_id(event_id))
    if current is None or current.tenant != tenant:
        raise NotFound(f"event {event_id!r} not found")
    record = journal.replay(event_id)
    logger.info("event %s replayed by %s (was %s)", event_id, actor, current.state)
    event_drain_soon(record.channel)
    return record


def channel_lease_ms(channel: str | None) -> int:
    """Return the lease (ms) of a drain of ``channel``: ``BOTMESH_CAMPAIGN_LEASE_MS`` for ``campaigns-run``, else 30 s.

    A campaign run holds its lease for minutes to hours (renewed every third of it);
    an operator tunes how soon a dead worker's run is taken over.
    """
    if channel == "campaigns-run":
        from django.conf import settings

        return int(settings.BOTMESH_CAMPAIGN_LEASE_MS)
    return DEFAULT_LEASE_MS


def worker_for(channel: str | None, *, lease_ms: int | None = None, **options: Any) -> EventWorker:
    """Return an ``EventWorker`` over the default journal for ``channel``, claiming ``CLAIM_BATCH`` records at a time.

    The one place a drain of a channel is built (``journal_drain`` and
    ``manage.py botmesh_events_worker``), so every worker of ``campaigns-run``,
    ``crm-import`` and ``outbox`` claims one record at a time, with the channel's
    lease unless ``lease_ms`` is given (``channel_lease_ms``). ``options`` go to
    ``EventWorker`` (``max_backoff_ms``, ``clock``); its ``on_dead_letter`` is the
    registered types' dead-letter hooks (``handlers.dead_lettered``). Raise ``ValidationError``
    naming ``channel`` for a malformed channel.
    """
    from .handlers import dead_lettered
    from .worker import DEFAULT_CLAIM_BATCH, EventWorker

    channel = validate_channel(channel, "channel")
    batch = CLAIM_BATCH.get(channel, DEFAULT_CLAIM_BATCH)
    options.setdefault("on_dead_letter", dead_lettered)
    lease_ms = channel_lease_ms(channel) if lease_ms is None else lease_ms
    return EventWorker(default_journal(), lease_ms=lease_ms, channel=channel, claim_batch=batch, **options)


def journal_drain(*, channel: str | None = None, limit: int = 100, lease_ms: int | None = None) -> dict[str, int]:
    """Handle up to ``limit`` ready records of ``channel`` with the registered handlers (the channel's lease).

    Return ``{"processed", "failed", "stale"}`` (see ``EventWorker.run_batch``).
    """
    from .handlers import dispatch

    return worker_for(channel, lease_ms=lease_ms).run_batch(dispatch, limit)


def journal_prune(*, retention_days: int | None = None, now: int | None = None, max_records: int = 100_000) -> int:
    """Delete ``done`` records done more than ``retention_days`` days ago; return how many.

    ``retention_days`` defaults to ``settings.BOTMESH_JOURNAL_RETENTION_DAYS``
    (env ``BOTMESH_JOURNAL_RETENTION_DAYS``, 7); 0 keeps everything. ``now`` is
    epoch ms (the wall clock by default). Dead records (the DLQ) are never
    pruned: a person decides about them. At most ``max_records`` per call, in
    batches, so one run never holds the journal for long.
    """
    from django.conf import settings

    from .base import RecordPruning, now_ms

    days = settings.BOTMESH_JOURNAL_RETENTION_DAYS if retention_days is None else retention_days
    journal = default_journal()
    if days <= 0 or not isinstance(journal, RecordPruning):
        return 0
    before = (now_ms() if now is None else now) - days * DAY_MS
    removed = 0
    while removed < max_records:
        batch = min(PRUNE_BATCH, max_records - removed)
        gone = journal.prune(before, limit=batch)
        removed += gone
        if gone < batch:
            break
    if removed:
        logger.info("journal retention: pruned %d done records older than %d days", removed, days)
    return removed
