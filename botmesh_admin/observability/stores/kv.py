"""The stores over DurableKv.

Tables (through ``TenantKv(kv, "observability")``)::

    observability/<tenant>/bot_metrics   l/<bot>/<replica>           latest sample (+ its seq)
                                         h/<bot>/<replica>/<slot>    ring of the last ``history`` samples
                                         a/admission                 rewritten by each new live replica

A bot or replica id is any Unicode text (``domain.label_text``), so each
stands in a key as ``key_segment(id)``: the id itself with ``%``, ``/``, ``~``
and control characters percent-escaped (an id of the old ``[a-z0-9_.:-]``
alphabets is its own segment, so tables written before keep their keys), or
``~`` and a SHA-256 digest when that would not fit the Kv's 512-byte keys. Each
sample also holds its bot and replica ids, which is what reads return.
    observability/<tenant>/traces        t/<trace id>                trace record (merged spans)
                                         x/started/…, x/started_by_kind/…,   its summary in value
                                         x/started_by_conversation/…,        indexes (``TRACE``),
                                         x/by_message/…                      newest start first
    observability/~system/traces         traces of no tenant ("~" is never in a tenant id)
    observability/~process/counters      process counters, one key per counter

Every write is a compare-and-set batch retried on conflict, so several
processes may write the same table at once; every entry has a TTL
(``retention_ms``), so nothing outlives its retention even if pruning stops.

The trace list is a page of one value index (``botmesh_admin.kv.indexes``):
``started`` (newest start first, each entry holding the summary a list row
shows), ``started_by_kind`` or ``started_by_conversation`` (whose entries lead
to the ``started`` ones: one ``get_many`` per page), so a page touches O(page)
entries whatever the filter; ``by_message`` finds the trace of an inbox message
(one entry per message hash the trace names). ``started_by_kind`` also serves
the per-kind prune. A trace table is bounded (the per-kind quotas and the TTL),
so a table written before these indexes is indexed by its first list or prune
(``_require_built``); ``botmesh_reindex`` builds tenants' tables too. Tables of
earlier versions also hold ``r/<inverted ms>/<trace id>`` summaries and
``x/recent``, ``x/by_kind``, ``x/by_conversation`` entries ordered by first
sight, which nothing reads any more and which expire with their retention.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar
from urllib.parse import unquote

from botmesh_admin.kv import ABSENT, ConflictError, Delete, DurableKv, Entry, Op, Put, TenantKv
from botmesh_admin.kv.cas import cas_retry
from botmesh_admin.kv.indexes import (
    INDEX_ROOT,
    Desc,
    IndexNotBuilt,
    RecordChange,
    RecordType,
    ValueIndex,
    declare,
    encode,
)
from botmesh_admin.kv.tenant import validate_id

from .. import trace_records
from .base import BotSample, PushLimits, TraceSummary
from .memory import DEFAULT_HISTORY, DEFAULT_RETENTION_MS, kind_quotas

PACKAGE = "observability"
SYSTEM_TRACES = f"{PACKAGE}/~system/traces"
COUNTERS = f"{PACKAGE}/~process/counters"
MAX_ATTEMPTS = 200  # compare-and-set attempts: every web and worker process writes here (cas_retry)
STARTED_AT_KEY = "~started_at"  # when the counters started (no counter name holds "~")
PRUNE_BATCH = 100  # traces deleted per commit
RECORD_BATCH = 50  # traces written per commit by record_many

T = TypeVar("T")


def _trace_view(value: Any) -> Mapping[str, Any]:
    """Return what the trace indexes read of a stored trace record: its summary, start and message hashes."""
    summary = trace_records.summarize(value).to_json()
    return {
        **summary,
        "started_ms": trace_records.started_ms(value),
        "messages": trace_records.message_hashes(value["spans"]),
    }


def _list_row(view: Mapping[str, Any]) -> dict[str, Any]:
    """Return the copy of a list row a ``started`` entry holds (a covering index)."""
    return {k: v for k, v in view.items() if k != "messages"}


def _started(view: Mapping[str, Any]) -> dict[str, Any]:
    """Return what a filtered index entry holds besides ``pk``: enough to find the ``started`` one."""
    return {"started_ms": view["started_ms"]}


def _message_keys(view: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    return [(h, -int(view["started_ms"])) for h in view["messages"]]


NEWEST = Desc("started_ms")
# Only ``started`` copies the list row: the filtered indexes lead to its entries (one
# ``get_many`` per page), so a trace write puts one summary, not three.
TRACE = RecordType(
    "trace",
    "t/",
    (
        ValueIndex("started", fields=(NEWEST,), payload=_list_row),
        ValueIndex("started_by_kind", fields=("kind", NEWEST), payload=_started),
        ValueIndex(
            "started_by_conversation",
            fields=("conversation", NEWEST),
            where=lambda view: view.get("conversation") is not None,
            payload=_started,
        ),
        ValueIndex("by_message", keys=_message_keys, where=lambda view: bool(view["messages"])),
    ),
    decode=_trace_view,
    ttl=True,
    # A companion (what ``reuses_keys`` adds) has no TTL while its record lives, and a
    # trace record only ever expires: every trace would leave one behind for good.
    reuses_keys=False,
)
TRACES = declare(PACKAGE, "traces", [TRACE])


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

        cas_retry(attempt, what="the counters", attempts=MAX_ATTEMPTS)

    def read(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for entry in _scan_all(self.kv, self.table, ""):
            if entry.key == STARTED_AT_KEY:
                continue
            name = entry.key.rsplit("#", 1)[0]
            totals[name] = totals.get(name, 0) + int(entry.value)
        return {k: v for k, v in totals.items() if v}

    def reset(self) -> None:
        self.kv.drop(self.table)

    def started_at(self, now_ms: int) -> int:
        entry = self.kv.get(self.table, STARTED_AT_KEY)
        if entry is not None:
            return int(entry.value)
        try:
            self.kv.commit(self.table, [Put(STARTED_AT_KEY, now_ms, expect=ABSENT)])
        except ConflictError:  # another process stored it first: its time is the start
            entry = self.kv.get(self.table, STARTED_AT_KEY)
            if entry is not None:
                return int(entry.value)
        return now_ms


ADMISSION_KEY = "a/admission"  # rewritten by each admission of a new replica (``KvBotMetricsStore._admission``)
MAX_LATEST = 2000  # latest samples a read returns (live ones are capped far below by PushLimits)
_SEGMENT_ESCAPES = re.compile(r"[%/~\x00-\x1f\x7f-\x9f]")
BOT_SEGMENT_BYTES = 160
REPLICA_SEGMENT_BYTES = 300  # "l/" + 160 + "/" + 300 + "/000000" stays under the 512-byte key limit


def key_segment(name: str, max_bytes: int) -> str:
    """Return ``name`` as one segment of a Kv key: no ``/``, no control character, at most ``max_bytes``.

    Percent-escaping is the identity on ids without ``%``, ``/``, ``~`` or
    controls; a longer result becomes ``~<32 hex digits of SHA-256>`` (``~``
    never starts an escaped segment, so the two never collide).
    """
    escaped = _SEGMENT_ESCAPES.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), name)
    if len(escaped.encode("utf-8")) <= max_bytes:
        return escaped
    return "~" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]


class KvBotMetricsStore:
    """Latest sample and a ring buffer of ``history`` samples per replica, written in one batch."""

    def __init__(
        self, kv: DurableKv, *, history: int = DEFAULT_HISTORY, retention_ms: int = DEFAULT_RETENTION_MS
    ) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, PACKAGE)
        self.history_size = history
        self.retention_ms = retention_ms

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
        from botmesh_admin.clock import now_ms

        table = self.tables.table(tenant, "bot_metrics")
        pair = self._pair(bot, replica)
        pushed = now_ms() if pushed_at_ms is None else pushed_at_ms

        def attempt() -> BotSample:
            entry = self.kv.get(table, f"l/{pair}")
            ops: list[Op] = []
            if limits is not None and (entry is None or self._last_push(entry.value) <= pushed - limits.live_ms):
                ops.append(self._admission(table, bot, replica, pushed, limits))
            seq = entry.value["seq"] + 1 if entry else 1
            value = {
                "seq": seq,
                "at": received_at_ms,
                "pushed_at": pushed,
                "bot": bot,
                "replica": replica,
                "snapshot": snapshot,
            }
            self.kv.commit(
                table,
                [
                    *ops,
                    Put(f"l/{pair}", value, expect=entry.version if entry else ABSENT, ttl_ms=self.retention_ms),
                    Put(f"h/{pair}/{seq % self.history_size:06d}", value, ttl_ms=self.retention_ms),
                ],
            )
            return BotSample(
                bot=bot, replica=replica, received_at_ms=received_at_ms, seq=seq, snapshot=snapshot, pushed_at_ms=pushed
            )

        return cas_retry(attempt, what=f"the metrics of {bot}/{replica}", attempts=MAX_ATTEMPTS)

    def _admission(self, table: str, bot: str, replica: str, pushed: int, limits: PushLimits) -> Op:
        """Check a replica that is not live against ``limits``; return the op that serialises admissions.

        Every admission rewrites ``a/admission`` with its expected version, so two
        replicas admitted at once conflict and one retries, counting the other.
        Pushes of live replicas skip this: they change no count.
        """
        marker = self.kv.get(table, ADMISSION_KEY)
        live = [
            (sample.bot, sample.replica)
            for sample in self._scan_latest(table, "l/")
            if sample.last_push_ms > pushed - limits.live_ms
        ]
        limits.check(live, bot=bot, replica=replica)
        return Put(ADMISSION_KEY, {"at": pushed}, expect=marker.version if marker else ABSENT, ttl_ms=self.retention_ms)

    def _scan_latest(self, table: str, prefix: str) -> list[BotSample]:
        out = []
        for entry in _scan_all(self.kv, table, prefix, limit=MAX_LATEST):
            _, bot_segment, replica_segment = entry.key.split("/", 2)
            out.append(self._sample(unquote(bot_segment), unquote(replica_segment), entry.value))
        return out

    @staticmethod
    def _last_push(value: dict[str, Any]) -> int:
        return int(value.get("pushed_at", value["at"]))

    def latest(self, tenant: str, *, bot: str | None = None) -> list[BotSample]:
        table = self.tables.table(tenant, "bot_metrics")
        prefix = f"l/{key_segment(bot, BOT_SEGMENT_BYTES)}/" if bot is not None else "l/"
        out = self._scan_latest(table, prefix)
        # Keys sort by their escaped or hashed segments; the contract orders by the ids themselves.
        out.sort(key=lambda sample: (sample.bot, sample.replica))
        return out

    def history(self, tenant: str, *, bot: str, replica: str, since_ms: int | None = None) -> list[BotSample]:
        table = self.tables.table(tenant, "bot_metrics")
        pair = self._pair(bot, replica)
        latest = self.kv.get(table, f"l/{pair}")
        if latest is None:
            return []
        newest = latest.value["seq"]
        entries = _scan_all(self.kv, table, f"h/{pair}/", limit=self.history_size)
        samples = [
            self._sample(bot, replica, e.value)
            for e in entries
            # a slot left from before a restart of the sequence is not part of this history
            if newest - self.history_size < e.value["seq"] <= newest
        ]
        samples.sort(key=lambda s: s.seq)
        return [s for s in samples if since_ms is None or s.received_at_ms > since_ms]

    @staticmethod
    def _pair(bot: str, replica: str) -> str:
        return f"{key_segment(bot, BOT_SEGMENT_BYTES)}/{key_segment(replica, REPLICA_SEGMENT_BYTES)}"

    @staticmethod
    def _sample(bot: str, replica: str, value: dict[str, Any]) -> BotSample:
        # Samples written before ids were any text hold no ids: their keys are the ids.
        return BotSample(
            bot=value.get("bot", bot),
            replica=value.get("replica", replica),
            received_at_ms=value["at"],
            seq=value["seq"],
            snapshot=value["snapshot"],
            pushed_at_ms=value.get("pushed_at"),
        )


class KvTraceStore:
    """Trace records and newest-first indexes, pruned per kind every ``prune_every`` new traces.

    ``keep`` is the newest traces kept of each kind (``kind_quotas``:
    ``trace_records.KEEP`` by default, or ``max_traces`` for every kind), so a
    burst of one kind — the admin's own page polls — never evicts another's
    (the message traces). A prune reads each kind's index past its quota, and
    every writing process prunes: by default once per 500 new traces of its own
    (pruning every 100 cost 2 ms of CPU per message at 150 messages/s with six
    writers). The store may hold up to ``prune_every`` traces beyond the quotas
    per writing process until then; every entry's TTL (``retention_ms``) bounds
    it too.
    """

    def __init__(
        self,
        kv: DurableKv,
        *,
        max_traces: int | None = None,
        keep: Mapping[str, int] | None = None,
        retention_ms: int = DEFAULT_RETENTION_MS,
        prune_every: int | None = None,
        clock: Callable[[], int] | None = None,
        system_table: str = SYSTEM_TRACES,
    ) -> None:
        from botmesh_admin.clock import now_ms

        self.kv = kv
        self.tables = TenantKv(kv, PACKAGE)
        self.keep = kind_quotas(max_traces, keep)
        self.retention_ms = retention_ms
        self.prune_every = prune_every or max_traces or min(self.keep.values())
        self.system_table = system_table
        self._clock = clock or now_ms
        self._created = 0
        self._lock = threading.Lock()
        self.layout = TRACES.layout(kv)

    def _table(self, tenant: str | None) -> str:
        return self.system_table if tenant is None else self.tables.table(tenant, "traces")

    def _put(
        self, tenant: str | None, trace_id: str, spans: list[dict[str, Any]], entry: Entry | None
    ) -> tuple[Op, RecordChange]:
        """Return the write of ``spans`` merged into the trace read as ``entry``, and its change."""
        previous = entry.value if entry else None
        merged = trace_records.merge_trace(previous, trace_id, tenant, spans, self._clock())
        expect = entry.version if entry else ABSENT
        key = f"t/{trace_id}"
        return (
            Put(key, merged, expect=expect, ttl_ms=self.retention_ms),
            RecordChange(TRACE, key, previous, merged, ttl_ms=self.retention_ms),
        )

    def record(self, tenant: str | None, spans: list[dict[str, Any]]) -> None:
        if not spans:
            return
        table = self._table(tenant)
        trace_id = spans[0]["trace_id"]

        def attempt() -> bool:
            entry = self.kv.get(table, f"t/{trace_id}")
            op, change = self._put(tenant, trace_id, spans, entry)
            self.layout.commit(table, [op], [change])
            return entry is None

        if cas_retry(attempt, what=f"trace {trace_id}", attempts=MAX_ATTEMPTS):
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
            batch = dict(items[start : start + RECORD_BATCH])
            for _ in range(MAX_ATTEMPTS):
                if not batch:
                    break
                ops: list[Op] = []
                changes: list[RecordChange] = []
                created = 0
                entries = self.kv.get_many(table, [f"t/{trace_id}" for trace_id in batch])
                for (trace_id, spans), entry in zip(batch.items(), entries, strict=True):
                    op, change = self._put(tenant, trace_id, spans, entry)
                    ops.append(op)
                    changes.append(change)
                    created += entry is None
                try:
                    self.layout.commit(table, ops, changes)
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
        """Delete every trace after the newest ``keep[kind]`` of its kind; return how many went.

        Reads each kind's ``started_by_kind`` entries past its quota (up to
        ``4 * prune_every`` more in all), then deletes those records with their
        index entries; a trace another writer changed meanwhile is read again.
        """
        table = self._table(tenant)
        self._require_built(table)
        doomed: list[str] = []
        for kind, quota in self.keep.items():
            after: str | None = None
            skip = quota
            while len(doomed) < 4 * self.prune_every:
                page = self.layout.scan(table, "started_by_kind", (kind,), after=after, limit=1000)
                doomed += [e.value["pk"] for e in page[skip:]]
                skip = max(0, skip - len(page))
                if len(page) < 1000:
                    break
                after = page[-1].key
        # One trace once, even if an index entry drifted (a writer of a version without indexes).
        doomed = list(dict.fromkeys(doomed))[: 4 * self.prune_every]
        # A few commits of many deletes: one commit per trace cost as much as writing it.
        for start in range(0, len(doomed), PRUNE_BATCH):
            keys = doomed[start : start + PRUNE_BATCH]
            cas_retry(partial(self._delete, table, keys), what="the traces to prune", attempts=MAX_ATTEMPTS)
        return len(doomed)

    def _delete(self, table: str, keys: list[str]) -> None:
        """Delete the trace records at ``keys`` (those still there) and their index entries."""
        ops: list[Op] = []
        changes: list[RecordChange] = []
        for key, entry in zip(keys, self.kv.get_many(table, keys), strict=True):
            if entry is not None:
                ops.append(Delete(key, expect=entry.version))
                changes.append(RecordChange(TRACE, key, entry.value, None))
        if ops:
            self.layout.commit(table, ops, changes)

    def _require_built(self, table: str) -> None:
        """Index a trace table written before its indexes (bounded: the quotas and the TTL)."""
        for name in self.layout.index_names():
            if self.layout.state(table, name) != "built":
                self.layout.build(table, name)

    def list(
        self,
        tenant: str | None,
        *,
        kind: str | None = None,
        conversation: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> tuple[list[TraceSummary], str | None]:
        """Return a page of one index: by conversation, by kind, or all, newest first.

        ``after`` is the ``r/<inverted start ms>/<trace id>`` of the previous
        page's last trace (``trace_records.index_key``), the same cursor
        whatever the filter. With both filters the conversation's entries are
        read and other kinds skipped (one conversation's traces are few).
        """
        table = self._table(tenant)
        values: tuple[str, ...]
        if conversation is not None:
            index, values = "started_by_conversation", (conversation,)
        elif kind is not None:
            index, values = "started_by_kind", (kind,)
        else:
            index, values = "started", ()
        cursor = None if after is None else _index_after(index, values, after)
        out: list[TraceSummary] = []
        last_key: str | None = None
        while True:
            try:
                page = self.layout.scan(table, index, values, after=cursor, limit=min(limit + 1, 1000))
            except IndexNotBuilt:
                self._require_built(table)
                continue
            rows = [e.value for e in page]
            if index != "started":  # the list rows are in the ``started`` entries
                keys = [_index_after("started", (), _cursor(r)) for r in rows]
                rows = [e.value for e in self.kv.get_many(table, keys) if e is not None]
            for row in rows:
                summary = TraceSummary.from_json({k: v for k, v in row.items() if k not in ("pk", "started_ms")})
                if trace_records.matches(summary, kind, conversation):
                    if len(out) == limit:
                        return out, last_key
                    out.append(summary)
                    last_key = _cursor(row)
            if len(page) <= limit:
                return out, None
            cursor = page[-1].key

    def get(self, tenant: str | None, trace_id: str) -> dict[str, Any] | None:
        """Return the trace ``{"trace_id", "summary", "spans"}``, or ``None``."""
        if tenant is not None:
            validate_id(tenant, "tenant")
        if not trace_id or "/" in trace_id:
            return None
        entry = self.kv.get(self._table(tenant), f"t/{trace_id}")
        if entry is None:
            return None
        record = entry.value
        return {"trace_id": trace_id, "summary": trace_records.summarize(record), "spans": record["spans"]}

    def of_message(self, tenant: str | None, message_hash: str) -> str | None:
        """Return the newest trace naming ``message_hash``: one ``by_message`` entry read."""
        table = self._table(tenant)
        while True:
            try:
                page = self.layout.scan(table, "by_message", (message_hash,), limit=1)
            except IndexNotBuilt:
                self._require_built(table)
                continue
            return str(page[0].value["pk"]).removeprefix("t/") if page else None


def _cursor(entry: Mapping[str, Any]) -> str:
    """Return the list cursor of an index entry's trace: ``r/<inverted start ms>/<trace id>``."""
    return trace_records.cursor_of(int(entry["started_ms"]), str(entry["pk"]).removeprefix("t/"))


def _index_after(index: str, values: tuple[str, ...], cursor: str) -> str:
    """Return the key of the entry of ``index`` for the trace of list cursor ``cursor``.

    The key ``ValueIndex`` gives it: ``x/<index>/<encoded values, -first_seen_ms><pk>``.
    """
    inverted, trace_id = cursor.removeprefix("r/").split("/", 1)
    started = trace_records.INDEX_BASE - 1 - int(inverted)
    return f"{INDEX_ROOT}{index}/" + encode((*values, -started)) + f"t/{trace_id}"
