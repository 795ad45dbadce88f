"""This process's metrics snapshot, with counters shared by every web and worker process.

Other packages count events with::

    from botmesh_admin.observability.metrics import count
    count("messages.in")
    count("dropped.handoff", n=1)
    count("messages.out_failed")
    count("conversations.completed", duration_ms=5400)   # also feeds avg_duration_ms
    count("flows.checkout.started")

Counter names: ``conversations.<started|completed|ended|guarded|cancelled|timed_out|
retries_exceeded|errored>``, ``messages.<in|out|out_failed>``,
``dropped.<duplicate|blocked|handoff>``, ``presence_skipped.<typing|mark_read>``,
``triggered``, ``errors`` and ``flows.<flow name>.<started|outcome>``. An unknown
name raises ``ValidationError`` (a programming error); a store that cannot be
reached never raises into the caller: the counts are kept and added with the
next successful write.

Counters live in Redis when ``REDIS_URL`` is set, else in the Kv
(``default_kv()``, compare-and-set increments), so ``snapshot()`` in any
process shows the sum over all of them. ``started_at`` and ``uptime`` are the
counters' own (when the first process counted into an empty store), the same
in every process; ``reset_metrics()`` zeroes the counters and starts them again.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import BadType, ValidationError
from botmesh_admin.processlocal import ProcessLocal

from .domain import (
    OUTCOMES,
    DroppedCounts,
    MessageCounts,
    OutcomeCounts,
    PresenceSkipped,
    Snapshot,
)
from .stores.base import CounterStore

log = logging.getLogger(__name__)

COUNTERS = frozenset(
    [f"conversations.{o}" for o in ("started", *OUTCOMES)]
    + ["messages.in", "messages.out", "messages.out_failed"]
    + ["dropped.duplicate", "dropped.blocked", "dropped.handoff"]
    + ["presence_skipped.typing", "presence_skipped.mark_read"]
    + ["triggered", "errors"]
)
_FLOW_EVENTS = frozenset(("started", *OUTCOMES))
_DURATION_SUM, _DURATION_COUNT = "duration_ms_sum", "duration_count"
MAX_PENDING = 1000

_lock = threading.Lock()
_pending: dict[str, int] = {}
_override: CounterStore | None = None
_deferred: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("metrics_deferred", default=None)


def _redis_counter_store() -> CounterStore:
    from django.conf import settings

    from .stores.redis import RedisCounterStore

    return RedisCounterStore(settings.BOTMESH_REDIS_URL)


_redis_store: ProcessLocal[CounterStore] = ProcessLocal(_redis_counter_store)
_last_error_log = 0.0


def counter_store() -> CounterStore:
    """Return the shared counter store: Redis if ``REDIS_URL`` is set, else the default Kv."""
    if _override is not None:
        return _override
    from django.conf import settings

    if settings.BOTMESH_REDIS_URL:
        return _redis_store.get()
    from botmesh_admin.kv.runtime import default_kv

    from .stores.kv import KvCounterStore

    return KvCounterStore(default_kv())


@contextmanager
def use_counter_store(store: CounterStore) -> Iterator[CounterStore]:
    """Count into ``store`` for the duration of the block (tests, benchmarks)."""
    global _override
    previous, _override = _override, store
    try:
        yield store
    finally:
        _override = previous


def _validate(name: object) -> tuple[str, str | None]:
    """Return ``(group, event)`` of a counter name: ``("conversations", "completed")``, ``("flows.x", "started")``."""
    if not isinstance(name, str):
        raise BadType("metric", f"must be a string, not {type(name).__name__}")
    if name in COUNTERS:
        group, _, event = name.rpartition(".")
        return group, event or None
    if name.startswith("flows."):
        group, _, event = name.rpartition(".")
        flow = group[len("flows.") :]
        if event in _FLOW_EVENTS and flow and len(flow) <= 100 and flow.isprintable():
            return group, event
    raise ValidationError("metric", f"unknown counter {name!r}")


def count(name: str, n: int = 1, *, duration_ms: float | None = None) -> None:
    """Add ``n`` to counter ``name``; with ``duration_ms`` (an outcome) also feed the average duration."""
    group, event = _validate(name)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValidationError("n", "must be a non-negative integer")
    deltas = {name: n}
    if duration_ms is not None:
        if event not in OUTCOMES:
            raise ValidationError("duration_ms", "is given only with an outcome (completed, ended, …)")
        deltas[f"{group}.{_DURATION_SUM}"] = max(0, round(duration_ms))
        deltas[f"{group}.{_DURATION_COUNT}"] = n
    _add(deltas)


@contextmanager
def deferred() -> Iterator[None]:
    """Sum the counts of the block in memory and add them to the store once, when it ends (also on error).

    For a batch that counts per item (a projected journal batch counts each
    message): one store write (one Redis round trip) instead of one per count.
    Counts of a nested block go to the outermost one.
    """
    if _deferred.get() is not None:
        yield
        return
    held: dict[str, int] = {}
    token = _deferred.set(held)
    try:
        yield
    finally:
        _deferred.reset(token)
        if held:
            _add(held)


def _add(deltas: dict[str, int]) -> None:
    global _last_error_log
    held = _deferred.get()
    if held is not None:
        for key, value in deltas.items():
            held[key] = held.get(key, 0) + value
        return
    with _lock:
        if _pending:
            for key, value in _pending.items():
                deltas[key] = deltas.get(key, 0) + value
            _pending.clear()
    try:
        counter_store().add(deltas)
    except Exception as exc:  # counting never breaks the message path
        with _lock:
            for key, value in deltas.items():
                if key in _pending or len(_pending) < MAX_PENDING:
                    _pending[key] = _pending.get(key, 0) + value
            if time.monotonic() - _last_error_log > 60:
                _last_error_log = time.monotonic()
                log.warning("metrics store unreachable, keeping counts in memory: %s", type(exc).__name__)


def flush() -> None:
    """Write counts kept in memory after a store error (called on shutdown)."""
    with _lock:
        pending = dict(_pending)
    if pending:
        with _lock:
            _pending.clear()
        _add(pending)


def _outcome_counts(counters: dict[str, int], group: str) -> OutcomeCounts:
    values = {o: counters.get(f"{group}.{o}", 0) for o in ("started", *OUTCOMES)}
    total = counters.get(f"{group}.{_DURATION_COUNT}", 0)
    avg = counters.get(f"{group}.{_DURATION_SUM}", 0) / total if total else 0.0
    active = max(0, values["started"] - sum(values[o] for o in OUTCOMES))
    return OutcomeCounts(**values, avg_duration_ms=round(avg, 3), active=active)


def snapshot_of(counters: dict[str, int], *, started_at_ms: int, uptime_ms: int) -> Snapshot:
    """Return the ``Snapshot`` of a counter dict (as ``CounterStore.read`` returns it)."""
    flows = sorted({k.rpartition(".")[0] for k in counters if k.startswith("flows.")})
    return Snapshot(
        started_at_ms=started_at_ms,
        uptime_ms=uptime_ms,
        conversations=_outcome_counts(counters, "conversations"),
        flows=tuple((f[len("flows.") :], _outcome_counts(counters, f)) for f in flows),
        messages=MessageCounts(
            in_=counters.get("messages.in", 0),
            out=counters.get("messages.out", 0),
            out_failed=counters.get("messages.out_failed", 0),
        ),
        dropped=DroppedCounts(**{k: counters.get(f"dropped.{k}", 0) for k in ("duplicate", "blocked", "handoff")}),
        presence_skipped=PresenceSkipped(
            **{k: counters.get(f"presence_skipped.{k}", 0) for k in ("typing", "mark_read")}
        ),
        triggered=counters.get("triggered", 0),
        errors=counters.get("errors", 0),
    )


def process_snapshot() -> Snapshot:
    """Return the admin's ``Snapshot``: counters summed over every process, and their shared start.

    ``started_at``/``uptime`` are those of the shared counters
    (``CounterStore.started_at``), not of the process that answers: every
    gunicorn worker, Celery worker and host reports the same start, so a scrape
    does not depend on which worker answered it.
    """
    flush()
    store = counter_store()
    counters = store.read()
    now = now_ms()
    started = store.started_at(now)
    return snapshot_of(counters, started_at_ms=started, uptime_ms=max(0, now - started))


def snapshot() -> dict[str, Any]:
    """Return the snapshot as snake_case JSON: ``started_at``, ``uptime_ms``, ``uptime``, ``conversations``…"""
    return process_snapshot().to_json()


def reset_metrics() -> None:
    """Zero every counter (in every process); their start (``started_at``, uptime) starts again."""
    with _lock:
        _pending.clear()
    counter_store().reset()
