"""Contracts of the observability stores (STYLE §6).

Three stores, each with a memory reference implementation and one over
DurableKv (``stores/kv.py``); counters also have a Redis one. All methods are
thread-safe; times are epoch milliseconds. Every implementation passes
``tests/observability/test_store_contract.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class CounterStore(Protocol):
    """Monotonic counters shared by every process that opens the same store."""

    def add(self, deltas: Mapping[str, int]) -> None:
        """Add each delta (an int >= 0) to its counter, all of them atomically."""
        ...

    def read(self) -> dict[str, int]:
        """Return every counter that is not zero."""
        ...

    def reset(self) -> None:
        """Set every counter to zero."""
        ...


@dataclass(frozen=True)
class BotSample:
    """One pushed snapshot: ``snapshot`` is the snake_case JSON of a ``domain.Snapshot``."""

    bot: str
    replica: str
    received_at_ms: int
    seq: int
    snapshot: dict[str, Any]


@runtime_checkable
class BotMetricsStore(Protocol):
    """Snapshots pushed by bots, per tenant, bot and replica, with a bounded history.

    Each replica keeps its latest sample and at most ``history`` samples;
    a replica that stops pushing disappears after ``retention_ms``.
    """

    def push(self, tenant: str, *, bot: str, replica: str, snapshot: dict[str, Any], received_at_ms: int) -> BotSample:
        """Store ``snapshot`` as the replica's latest sample and append it to its history."""
        ...

    def latest(self, tenant: str, *, bot: str | None = None) -> list[BotSample]:
        """Return the latest sample of every live replica (of ``bot`` if given), by bot then replica."""
        ...

    def history(self, tenant: str, *, bot: str, replica: str, since_ms: int | None = None) -> list[BotSample]:
        """Return the replica's kept samples received after ``since_ms``, oldest first."""
        ...


@dataclass(frozen=True)
class TraceSummary:
    """One line of the trace list. ``start_ms`` is epoch ms (float, µs precision)."""

    trace_id: str
    name: str
    kind: str
    start_ms: float
    duration_ms: float
    span_count: int
    status: str
    conversation: str | None = None


@runtime_checkable
class TraceStore(Protocol):
    """Recent traces of one tenant (``tenant=None``: traces that belong to no tenant).

    Spans of one trace may arrive in several batches from several processes;
    they are merged by ``trace_id``. The store keeps at most ``max_traces``
    traces per tenant (the oldest go first) for at most ``retention_ms``.
    """

    def record(self, tenant: str | None, spans: list[dict[str, Any]]) -> None:
        """Merge ``spans`` (dicts from ``tracing.span_to_dict``, all of one trace) into their trace."""
        ...

    def record_many(self, tenant: str | None, traces: list[list[dict[str, Any]]]) -> None:
        """Merge several traces' spans as ``record`` would, one by one (in fewer writes)."""
        ...

    def list(
        self, tenant: str | None, *, kind: str | None = None, conversation: str | None = None,
        limit: int = 50, after: str | None = None,
    ) -> tuple[list[TraceSummary], str | None]:
        """Return the newest traces first, filtered, and the cursor of the next page (or ``None``)."""
        ...

    def get(self, tenant: str | None, trace_id: str) -> dict[str, Any] | None:
        """Return the trace ``{"trace_id", "summary", "spans": [...]}`` or ``None`` (also for another tenant's)."""
        ...
