"""The reference stores: plain dicts under a lock (one process)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from botmesh_admin.clock import now_ms
from botmesh_admin.kv.tenant import validate_id

from .. import trace_records
from .base import BotSample, PushLimits, TraceSummary

DEFAULT_HISTORY = 720
DEFAULT_RETENTION_MS = 24 * 3600 * 1000
DEFAULT_MAX_TRACES = 500  # per kind but message (``trace_records.KEEP``)


def kind_quotas(max_traces: int | None, keep: Mapping[str, int] | None) -> dict[str, int]:
    """Return the newest traces kept per kind: ``keep``, else ``max_traces`` for every kind, else ``KEEP``."""
    if keep is not None:
        return {kind: int(keep.get(kind, DEFAULT_MAX_TRACES)) for kind in trace_records.KINDS}
    if max_traces is not None:
        return dict.fromkeys(trace_records.KINDS, max_traces)
    return dict(trace_records.KEEP)


def _tenant(tenant: str | None) -> str | None:
    return None if tenant is None else validate_id(tenant, "tenant")


class MemoryCounterStore:
    """Counters in a dict."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, int] = {}
        self._started_at: int | None = None

    def add(self, deltas: Mapping[str, int]) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counters[name] = self._counters.get(name, 0) + delta

    def read(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in self._counters.items() if v}

    def reset(self) -> None:
        with self._lock:
            self._counters.clear()
            self._started_at = None

    def started_at(self, now_ms: int) -> int:
        with self._lock:
            if self._started_at is None:
                self._started_at = now_ms
            return self._started_at


class MemoryBotMetricsStore:
    """Per (tenant, bot, replica): a deque of the last ``history`` samples."""

    def __init__(
        self,
        *,
        history: int = DEFAULT_HISTORY,
        retention_ms: int = DEFAULT_RETENTION_MS,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.history_size = history
        self.retention_ms = retention_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[tuple[str, str, str], deque[tuple[int, BotSample]]] = {}

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
        key = (validate_id(tenant, "tenant"), bot, replica)
        pushed = self._clock() if pushed_at_ms is None else pushed_at_ms
        with self._lock:
            if limits is not None:
                live = [
                    (b, r)
                    for (t, b, r) in list(self._samples)
                    if t == key[0]
                    and (ring := self._live((t, b, r)))
                    and ring[-1][1].last_push_ms > pushed - limits.live_ms
                ]
                limits.check(live, bot=bot, replica=replica)
            ring = self._live(key)
            seq = ring[-1][1].seq + 1 if ring else 1
            sample = BotSample(
                bot=bot, replica=replica, received_at_ms=received_at_ms, seq=seq, snapshot=snapshot, pushed_at_ms=pushed
            )
            ring.append((self._clock() + self.retention_ms, sample))
            return sample

    def _live(self, key: tuple[str, str, str]) -> deque[tuple[int, BotSample]]:
        ring = self._samples.setdefault(key, deque(maxlen=self.history_size))
        now = self._clock()
        if ring and ring[-1][0] <= now:
            ring.clear()  # the replica's latest expired, so did its history
        while ring and ring[0][0] <= now:
            ring.popleft()
        return ring

    def latest(self, tenant: str, *, bot: str | None = None) -> list[BotSample]:
        tenant = validate_id(tenant, "tenant")
        with self._lock:
            out = []
            for key in sorted(self._samples):
                if key[0] == tenant and (bot is None or key[1] == bot):
                    ring = self._live(key)
                    if ring:
                        out.append(ring[-1][1])
            return out

    def history(self, tenant: str, *, bot: str, replica: str, since_ms: int | None = None) -> list[BotSample]:
        key = (validate_id(tenant, "tenant"), bot, replica)
        with self._lock:
            if key not in self._samples:
                return []
            return [s for _, s in self._live(key) if since_ms is None or s.received_at_ms > since_ms]


class MemoryTraceStore:
    """Per tenant: trace records by id, pruned to the newest ``keep[kind]`` of each kind (see ``kind_quotas``)."""

    def __init__(
        self,
        *,
        max_traces: int | None = None,
        keep: Mapping[str, int] | None = None,
        retention_ms: int = DEFAULT_RETENTION_MS,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.keep = kind_quotas(max_traces, keep)
        self.retention_ms = retention_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._traces: dict[str | None, dict[str, tuple[int, dict[str, Any]]]] = {}

    def record(self, tenant: str | None, spans: list[dict[str, Any]]) -> None:
        if not spans:
            return
        tenant = _tenant(tenant)
        trace_id = spans[0]["trace_id"]
        now = self._clock()
        with self._lock:
            table = self._live(tenant)
            existing = table.get(trace_id)
            merged = trace_records.merge_trace(existing[1] if existing else None, trace_id, tenant, spans, now)
            table[trace_id] = (now + self.retention_ms, merged)
            kind = trace_records.summarize(merged).kind
            same = [r for _, r in table.values() if trace_records.summarize(r).kind == kind]
            if len(same) > self.keep[kind]:
                for old in sorted(same, key=trace_records.index_key)[self.keep[kind] :]:
                    del table[old["trace_id"]]

    def record_many(self, tenant: str | None, traces: list[list[dict[str, Any]]]) -> None:
        for spans in traces:
            self.record(tenant, spans)

    def _live(self, tenant: str | None) -> dict[str, tuple[int, dict[str, Any]]]:
        table = self._traces.setdefault(tenant, {})
        now = self._clock()
        for trace_id in [t for t, (exp, _) in table.items() if exp <= now]:
            del table[trace_id]
        return table

    def list(
        self,
        tenant: str | None,
        *,
        kind: str | None = None,
        conversation: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> tuple[list[TraceSummary], str | None]:
        tenant = _tenant(tenant)
        with self._lock:
            records = sorted((r for _, r in self._live(tenant).values()), key=trace_records.index_key)
        out: list[TraceSummary] = []
        last_key: str | None = None
        for record in records:
            key = trace_records.index_key(record)
            if after is not None and key <= after:
                continue
            summary = trace_records.summarize(record)
            if trace_records.matches(summary, kind, conversation):
                if len(out) == limit:
                    return out, last_key
                out.append(summary)
                last_key = key
        return out, None

    def get(self, tenant: str | None, trace_id: str) -> dict[str, Any] | None:
        tenant = _tenant(tenant)
        with self._lock:
            entry = self._live(tenant).get(trace_id)
        if entry is None:
            return None
        record = entry[1]
        return {"trace_id": trace_id, "summary": trace_records.summarize(record), "spans": record["spans"]}

    def of_message(self, tenant: str | None, message_hash: str) -> str | None:
        tenant = _tenant(tenant)
        with self._lock:
            records = sorted((r for _, r in self._live(tenant).values()), key=trace_records.index_key)
        found = (r for r in records if message_hash in trace_records.message_hashes(r["spans"]))
        return next((r["trace_id"] for r in found), None)
