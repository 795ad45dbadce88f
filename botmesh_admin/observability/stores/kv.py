"""The stores over DurableKv.

Tables (through ``TenantKv(kv, "observability")``)::

    observability/<tenant>/bot_metrics   l/<bot>/<replica>           latest sample (+ its seq)
                                         h/<bot>/<replica>/<slot>    ring of the last ``history`` samples
    observability/<tenant>/traces        t/<trace id>                trace record (merged spans)
                                         r/<inverted ms>/<trace id>  summary, newest first
    observability/~system/traces         traces of no tenant ("~" is never in a tenant id)
    observability/~process/counters      process counters, one key per counter

Every write is a compare-and-set batch retried on conflict, so several
processes may write the same table at once; every entry has a TTL
(``retention_ms``), so nothing outlives its retention even if pruning stops.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from botmesh_admin.kv import ABSENT, ConflictError, Delete, DurableKv, Op, Put, TenantKv
from botmesh_admin.kv.tenant import validate_id

from .. import trace_records
from .base import BotSample, TraceSummary
from .memory import DEFAULT_HISTORY, DEFAULT_MAX_TRACES, DEFAULT_RETENTION_MS

PACKAGE = "observability"
SYSTEM_TRACES = f"{PACKAGE}/~system/traces"
COUNTERS = f"{PACKAGE}/~process/counters"
MAX_ATTEMPTS = 200
PRUNE_BATCH = 100  # traces deleted per commit
RECORD_BATCH = 50  # traces written per commit by record_many

T = TypeVar("T")


def retry_cas(attempt: Callable[[], T]) -> T:
    """Run ``attempt`` (read, then commit with expectations) until it commits without conflict."""
    for n in range(MAX_ATTEMPTS):
        try:
            return attempt()
        except ConflictError:
            time.sleep(random.uniform(0, min(0.02, 0.0005 * (n + 1))))
    return attempt()


def _scan_all(kv: DurableKv, table: str, prefix: str, limit: int = 10_000) -> list[Any]:
    out: list[Any] = []
    after: str | None = None
    while len(out) < limit:
        want = min(1000, limit - len(out))
        page = kv.scan(table, prefix=prefix, after=after, limit=want)
        out.extend(page)
        if len(page) < want:
            break
        after = page[-1].key
    return out


class KvCounterStore:
    """Counters sharded by process: key ``<counter>#<shard>``; ``add`` is one compare-and-set batch.

    Each process writes its own shard (``pid % shards``), so processes rarely
    contend for a key; ``read`` sums the shards.
    """

    def __init__(self, kv: DurableKv, table: str = COUNTERS, shards: int = 64) -> None:
        self.kv = kv
        self.table = table
        self.shards = shards

    def add(self, deltas: Mapping[str, int]) -> None:
        names = sorted(n for n, d in deltas.items() if d)
        if not names:
            return
        shard = os.getpid() % self.shards

        def attempt() -> None:
            ops = []
            for name in names:
                key = f"{name}#{shard}"
                entry = self.kv.get(self.table, key)
                current = entry.value if entry else 0
                ops.append(Put(key, current + deltas[name], expect=entry.version if entry else ABSENT))
            self.kv.commit(self.table, ops)

        retry_cas(attempt)

    def read(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for entry in _scan_all(self.kv, self.table, ""):
            name = entry.key.rsplit("#", 1)[0]
            totals[name] = totals.get(name, 0) + int(entry.value)
        return {k: v for k, v in totals.items() if v}

    def reset(self) -> None:
        self.kv.drop(self.table)


class KvBotMetricsStore:
    """Latest sample and a ring buffer of ``history`` samples per replica, written in one batch."""

    def __init__(self, kv: DurableKv, *, history: int = DEFAULT_HISTORY,
                 retention_ms: int = DEFAULT_RETENTION_MS) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, PACKAGE)
        self.history_size = history
        self.retention_ms = retention_ms

    def push(self, tenant: str, *, bot: str, replica: str, snapshot: dict[str, Any], received_at_ms: int) -> BotSample:
        table = self.tables.table(tenant, "bot_metrics")
        latest_key = f"l/{bot}/{replica}"

        def attempt() -> BotSample:
            entry = self.kv.get(table, latest_key)
            seq = entry.value["seq"] + 1 if entry else 1
            value = {"seq": seq, "at": received_at_ms, "snapshot": snapshot}
            self.kv.commit(table, [
                Put(latest_key, value, expect=entry.version if entry else ABSENT, ttl_ms=self.retention_ms),
                Put(f"h/{bot}/{replica}/{seq % self.history_size:06d}", value, ttl_ms=self.retention_ms),
            ])
            return BotSample(bot=bot, replica=replica, received_at_ms=received_at_ms, seq=seq, snapshot=snapshot)

        return retry_cas(attempt)

    def latest(self, tenant: str, *, bot: str | None = None) -> list[BotSample]:
        table = self.tables.table(tenant, "bot_metrics")
        prefix = f"l/{bot}/" if bot is not None else "l/"
        out = []
        for entry in _scan_all(self.kv, table, prefix, limit=2000):
            _, bot_id, replica = entry.key.split("/", 2)
            out.append(self._sample(bot_id, replica, entry.value))
        return out

    def history(self, tenant: str, *, bot: str, replica: str, since_ms: int | None = None) -> list[BotSample]:
        table = self.tables.table(tenant, "bot_metrics")
        latest = self.kv.get(table, f"l/{bot}/{replica}")
        if latest is None:
            return []
        newest = latest.value["seq"]
        entries = _scan_all(self.kv, table, f"h/{bot}/{replica}/", limit=self.history_size)
        samples = [
            self._sample(bot, replica, e.value) for e in entries
            # a slot left from before a restart of the sequence is not part of this history
            if newest - self.history_size < e.value["seq"] <= newest
        ]
        samples.sort(key=lambda s: s.seq)
        return [s for s in samples if since_ms is None or s.received_at_ms > since_ms]

    @staticmethod
    def _sample(bot: str, replica: str, value: dict[str, Any]) -> BotSample:
        return BotSample(bot=bot, replica=replica, received_at_ms=value["at"], seq=value["seq"],
                         snapshot=value["snapshot"])


class KvTraceStore:
    """Trace records and a newest-first index, pruned every ``prune_every`` new traces.

    A prune reads the whole index (``max_traces`` summaries and more), and every
    writing process prunes: by default once per ``max_traces`` new traces of its
    own (pruning every 100 cost 2 ms of CPU per message at 150 messages/s with
    six writers). The store may hold up to ``prune_every`` traces beyond
    ``max_traces`` per writing process until then; every entry's TTL
    (``retention_ms``) bounds it too.
    """

    def __init__(self, kv: DurableKv, *, max_traces: int = DEFAULT_MAX_TRACES,
                 retention_ms: int = DEFAULT_RETENTION_MS, prune_every: int | None = None,
                 clock: Callable[[], int] | None = None, system_table: str = SYSTEM_TRACES) -> None:
        from botmesh_admin.kv.validation import now_ms

        self.kv = kv
        self.tables = TenantKv(kv, PACKAGE)
        self.max_traces = max_traces
        self.retention_ms = retention_ms
        self.prune_every = prune_every or max_traces
        self.system_table = system_table
        self._clock = clock or now_ms
        self._created = 0
        self._lock = threading.Lock()

    def _table(self, tenant: str | None) -> str:
        return self.system_table if tenant is None else self.tables.table(tenant, "traces")

    def _put_ops(self, tenant: str | None, trace_id: str, spans: list[dict[str, Any]],
                 entry: Any) -> list[Op]:
        previous = entry.value if entry else None
        merged = trace_records.merge_trace(previous, trace_id, tenant, spans, self._clock())
        summary = trace_records.summary_json(trace_records.summarize(merged))
        expect = entry.version if entry else ABSENT
        return [
            Put(f"t/{trace_id}", merged, expect=expect, ttl_ms=self.retention_ms),
            Put(trace_records.index_key(merged), summary, ttl_ms=self.retention_ms),
        ]

    def record(self, tenant: str | None, spans: list[dict[str, Any]]) -> None:
        if not spans:
            return
        table = self._table(tenant)
        trace_id = spans[0]["trace_id"]

        def attempt() -> bool:
            entry = self.kv.get(table, f"t/{trace_id}")
            self.kv.commit(table, self._put_ops(tenant, trace_id, spans, entry))
            return entry is None

        if retry_cas(attempt):
            self._created_more(tenant, 1)

    def record_many(self, tenant: str | None, traces: list[list[dict[str, Any]]]) -> None:
        """Merge the spans of several traces, ``RECORD_BATCH`` traces per commit.

        A busy process's writer has dozens of traces ready at every flush; one
        commit per trace cost more (client and server) than the reads. When a
        batch meets another writer (another process merging its part of one of
        the traces), that trace is merged alone and the rest of the batch is
        committed again: one message's trace is written by the web and by the
        worker within milliseconds.
        """
        by_trace: dict[str, list[dict[str, Any]]] = {}
        for spans in traces:
            if spans:
                by_trace.setdefault(spans[0]["trace_id"], []).extend(spans)
        items = list(by_trace.items())
        table = self._table(tenant)
        for start in range(0, len(items), RECORD_BATCH):
            batch = dict(items[start:start + RECORD_BATCH])
            for _ in range(MAX_ATTEMPTS):
                if not batch:
                    break
                ops: list[Op] = []
                created = 0
                for trace_id, spans in batch.items():
                    entry = self.kv.get(table, f"t/{trace_id}")
                    ops += self._put_ops(tenant, trace_id, spans, entry)
                    created += entry is None
                try:
                    self.kv.commit(table, ops)
                except ConflictError as exc:
                    contended = exc.key.removeprefix("t/")
                    if contended in batch:
                        self.record(tenant, batch.pop(contended))
                    continue
                self._created_more(tenant, created)
                break
            else:
                for spans in batch.values():
                    self.record(tenant, spans)

    def _created_more(self, tenant: str | None, n: int) -> None:
        """Count ``n`` new traces; prune whenever the count passes a multiple of ``prune_every``."""
        with self._lock:
            before = self._created
            self._created += n
            due = self._created // self.prune_every > before // self.prune_every
        if due:
            self.prune(tenant)

    def prune(self, tenant: str | None) -> int:
        """Delete every trace after the newest ``max_traces``; return how many went."""
        table = self._table(tenant)
        index = _scan_all(self.kv, table, "r/", limit=self.max_traces + 4 * self.prune_every)
        doomed = index[self.max_traces:]
        # A few commits of many deletes: one commit per trace cost as much as writing it.
        for start in range(0, len(doomed), PRUNE_BATCH):
            ops: list[Delete] = []
            for entry in doomed[start:start + PRUNE_BATCH]:
                ops += [Delete(entry.key), Delete(f"t/{entry.key.rsplit('/', 1)[1]}")]
            self.kv.commit(table, ops)
        return len(doomed)

    def list(self, tenant: str | None, *, kind: str | None = None, conversation: str | None = None,
             limit: int = 50, after: str | None = None) -> tuple[list[TraceSummary], str | None]:
        table = self._table(tenant)
        out: list[TraceSummary] = []
        last_key: str | None = None
        cursor = after
        scanned = 0
        while scanned < self.max_traces + 1000:
            page = self.kv.scan(table, prefix="r/", after=cursor, limit=200)
            for entry in page:
                summary = trace_records.summary_from_json(entry.value)
                if trace_records.matches(summary, kind, conversation):
                    if len(out) == limit:
                        return out, last_key
                    out.append(summary)
                    last_key = entry.key
            scanned += len(page)
            if len(page) < 200:
                break
            cursor = page[-1].key
        return out, None

    def get(self, tenant: str | None, trace_id: str) -> dict[str, Any] | None:
        if tenant is not None:
            validate_id(tenant, "tenant")
        if not trace_id or "/" in trace_id:
            return None
        entry = self.kv.get(self._table(tenant), f"t/{trace_id}")
        if entry is None:
            return None
        record = entry.value
        return {"trace_id": trace_id, "summary": trace_records.summarize(record), "spans": record["spans"]}
