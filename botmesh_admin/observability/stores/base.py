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
        """Set every counter to zero and forget when they started."""
        ...

    def started_at(self, now_ms: int) -> int:
        """Return when these counters started (epoch ms), storing ``now_ms`` as that time if none is stored.

        The first caller after an empty store (or a ``reset``) sets it; every
        process sharing the store then answers the same time.
        """
        ...


@dataclass(frozen=True)
class BotSample:
    """One pushed snapshot: ``snapshot`` is the snake_case JSON of a ``domain.Snapshot``."""

    bot: str
    replica: str
    received_at_ms: int
    seq: int
    snapshot: dict[str, Any]
    pushed_at_ms: int | None = None
    """When the push arrived (epoch ms; ``None`` in samples stored before it was kept)."""

    @property
    def last_push_ms(self) -> int:
        """Return when the replica last pushed: ``pushed_at_ms``, else the snapshot's own time."""
        return self.pushed_at_ms if self.pushed_at_ms is not None else self.received_at_ms


@dataclass(frozen=True)
class PushLimits:
    """Caps a push is checked against: live bots per tenant, live replicas per bot.

    A replica is live while its last push is younger than ``live_ms``.
    ``names`` are the settings the caps come from, for the error message.
    """

    max_bots: int
    max_replicas: int
    live_ms: int
    names: tuple[str, str] = ("BOTMESH_METRICS_MAX_BOTS", "BOTMESH_METRICS_MAX_REPLICAS")

    def check(self, live: list[tuple[str, str]], *, bot: str, replica: str) -> None:
        """Raise ``MetricsLimitExceeded`` unless ``(bot, replica)`` may join the ``live`` pairs."""
        from ..domain import MetricsLimitExceeded

        if (bot, replica) in live:
            return
        seconds = self.live_ms // 1000
        replicas = sum(1 for b, _ in live if b == bot)
        if replicas >= self.max_replicas:
            raise MetricsLimitExceeded(
                "replica",
                f"bot {bot!r} already has {replicas} live replicas, the limit ({self.names[1]}={self.max_replicas});"
                f" a replica stops counting {seconds} s after its last push",
                limit=self.names[1],
                maximum=self.max_replicas,
            )
        bots = {b for b, _ in live}
        if bot not in bots and len(bots) >= self.max_bots:
            raise MetricsLimitExceeded(
                "bot",
                f"the tenant already has {len(bots)} live bots, the limit ({self.names[0]}={self.max_bots});"
                f" a bot stops counting {seconds} s after its replicas' last push",
                limit=self.names[0],
                maximum=self.max_bots,
            )


@runtime_checkable
class BotMetricsStore(Protocol):
    """Snapshots pushed by bots, per tenant, bot and replica, with a bounded history.

    Each replica keeps its latest sample and at most ``history`` samples;
    a replica that stops pushing disappears after ``retention_ms``.
    """

    def push(
        self,
        tenant: str,
        *,
        bot: str,
        replica: str,
        snapshot: dict[str, Any],
        received_at_ms: int,
        pushed_at_ms: int | None = None,
        limits: PushLimits | None = None,
    ) -> BotSample:
        """Store ``snapshot`` as the replica's latest sample and append it to its history.

        ``pushed_at_ms`` (epoch ms, default now) is when the push arrived. With
        ``limits``, a replica that is not live is admitted only if
        ``limits.check`` passes against the tenant's live replicas, atomically
        with other admissions (two new replicas never both take the last
        place); else ``MetricsLimitExceeded`` is raised and nothing is written.
        """
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

    def to_json(self) -> dict[str, Any]:
        """Return the summary as a JSON object (the value of an index entry)."""
        return {
            "trace_id": self.trace_id,
            "name": self.name,
            "kind": self.kind,
            "start_ms": self.start_ms,
            "duration_ms": self.duration_ms,
            "span_count": self.span_count,
            "status": self.status,
            "conversation": self.conversation,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TraceSummary:
        """Return the summary stored as ``data`` (``to_json()`` output)."""
        return cls(**data)


@runtime_checkable
class TraceStore(Protocol):
    """Recent traces of one tenant (``tenant=None``: traces that belong to no tenant).

    Spans of one trace may arrive in several batches from several processes;
    they are merged by ``trace_id``. The store keeps at most ``keep[kind]``
    traces of each kind per tenant (the oldest of that kind go first; a burst
    of one kind never evicts another's) for at most ``retention_ms``. Lists
    are newest first by the trace's start (``trace_records.index_key``).
    """

    def record(self, tenant: str | None, spans: list[dict[str, Any]]) -> None:
        """Merge ``spans`` (dicts from ``tracing.span_to_dict``, all of one trace) into their trace."""
        ...

    def record_many(self, tenant: str | None, traces: list[list[dict[str, Any]]]) -> None:
        """Merge several traces' spans as ``record`` would, one by one (in fewer writes)."""
        ...

    def list(
        self,
        tenant: str | None,
        *,
        kind: str | None = None,
        conversation: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> tuple[list[TraceSummary], str | None]:
        """Return the newest traces first, filtered, and the cursor of the next page (or ``None``)."""
        ...

    def get(self, tenant: str | None, trace_id: str) -> dict[str, Any] | None:
        """Return the trace ``{"trace_id", "summary", "spans": [...]}`` or ``None`` (also for another tenant's)."""
        ...

    def of_message(self, tenant: str | None, message_hash: str) -> str | None:
        """Return the id of the newest trace that projected the message ``hash_id(message id)``, or ``None``."""
        ...
