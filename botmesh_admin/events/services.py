"""Writes to the event journal: publish, replay, drain (HackSoft services).

Tenant first and positional, the rest keyword-only. Dispatching the drain task
happens after the enclosing database transaction commits (``on_commit``), and
a broker that is down never fails a publish: the beat safety net drains anyway.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from botmesh_admin.errors import NotFound
from botmesh_admin.kv.tenant import validate_id

from .base import Envelope, EventRecord, validate_channel, validate_event_id
from .runtime import default_journal
from .wakeups import DrainWakeups

logger = logging.getLogger("botmesh.events")

DEFAULT_LEASE_MS = 30_000
DAY_MS = 24 * 3600 * 1000
PRUNE_BATCH = 1000


def _queue_drain(channel: str | None) -> None:
    from .tasks import drain

    try:
        drain.delay(channel)
    except Exception as exc:  # the broker is optional for correctness: beat drains too
        logger.warning("could not queue events.drain(%s): %s", channel, type(exc).__name__)


def _queue_trailing_drain(channel: str | None) -> None:
    from botmesh_admin.observability.tracing import untraced

    with untraced():  # it serves many webhooks, none of which is its parent: no trace of its own
        _queue_drain(channel)


_wakeups = DrainWakeups(_queue_drain, send_later=_queue_trailing_drain)


def _drain_after_commit(channel: str | None) -> None:
    def send() -> None:
        from .tasks import drain

        if drain.app.conf.task_always_eager:
            _queue_drain(channel)  # eager drains run here and now, as callers of eager mode expect
        else:
            _wakeups.request(channel)  # coalesced: see ``wakeups``

    transaction.on_commit(send)


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
        _drain_after_commit(record.channel)
    return record


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
    _drain_after_commit(record.channel)
    return record


def journal_drain(*, channel: str | None = None, limit: int = 100, lease_ms: int = DEFAULT_LEASE_MS) -> dict[str, int]:
    """Handle up to ``limit`` ready records of ``channel`` with the registered handlers.

    Return ``{"processed", "failed", "stale"}`` (see ``EventWorker.run_batch``).
    """
    from .handlers import dispatch
    from .worker import EventWorker

    worker = EventWorker(default_journal(), lease_ms=lease_ms, channel=validate_channel(channel, "channel"))
    return worker.run_batch(dispatch, limit)


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
