"""The trace list by kind and by conversation, newest first, a page at a time (issue 16, item 5).

Every filter of the traces page is checked against its definition on the
memory reference and the Kv store over every backend; on the Kv store the
value indexes must stay exact (``IndexedTable.check``) through merges that
change a trace's kind or conversation, pruning, expiry and two writers, a
table written before the indexes must list right, and a page must touch the
entries of one page, however many traces the table holds.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from botmesh_admin.kv import ABSENT, DurableKv, Op, Put
from botmesh_admin.observability import trace_records
from botmesh_admin.observability.stores.base import TraceStore
from botmesh_admin.observability.stores.kv import TRACES, KvTraceStore
from botmesh_admin.observability.stores.memory import MemoryTraceStore
from tests import backends

from .test_store_contract import STORE_KINDS, kv_of, span, tid

KINDS = trace_records.KINDS


def system_table() -> str:
    return f"observability/~test-{uuid.uuid4().hex[:10]}/traces"


def ticking() -> Any:
    clock = iter(range(1_000_000, 9_000_000, 10))
    return lambda: next(clock)


def make_store(kind: str, request: pytest.FixtureRequest, **options: Any) -> TraceStore:
    if kind == "memory":
        return MemoryTraceStore(clock=ticking(), **options)
    return KvTraceStore(kv_of(kind, request), clock=ticking(), system_table=system_table(), **options)


def root(n: int, kind: str, conversation: str | None) -> dict[str, Any]:
    """The first span of trace ``n``: its root, of ``kind`` (``message`` by its name)."""
    name = {"http": "GET /inbox", "task": "celery.run", "message": "message.receive"}.get(kind, "job")
    attrs = {"botmesh.conversation_id": conversation} if conversation else {}
    if kind in ("task", "internal"):
        attrs["botmesh.kind"] = kind
    scope = "opentelemetry.instrumentation.django" if kind == "http" else "botmesh_admin"
    return {**span(tid(n), "a" * 16, None, name, 1000.0 + n, 1.0, **attrs), "scope": scope}


def recorded(store: TraceStore, tenant: str) -> dict[str, tuple[str, str | None]]:
    """Record 30 traces (kinds and conversations in turn), then change a few by later spans.

    Return ``{trace id: (kind, conversation)}`` as they end up. Traces are created
    in id order, so newest first is descending trace id.
    """
    conversations = ("c1", "c2", None)
    want: dict[str, tuple[str, str | None]] = {}
    for n in range(1, 31):
        kind, conversation = KINDS[n % 4], conversations[n % 3]
        store.record(tenant, [root(n, kind, conversation)])
        want[tid(n)] = (kind, conversation)
    for n in (2, 7, 12):  # a message span arrives later: the trace becomes a message trace of c2
        store.record(tenant, [span(tid(n), "b" * 16, "a" * 16, "message.send", 1005.0 + n, 2.0,
                                   **{"botmesh.conversation_id": "c2"})])  # fmt: skip
        want[tid(n)] = ("message", want[tid(n)][1] or "c2")
    return want


def pages(store: TraceStore, tenant: str, limit: int, **filters: Any) -> list[list[str]]:
    out: list[list[str]] = []
    after = None
    while True:
        items, after = store.list(tenant, limit=limit, after=after, **filters)
        out.append([i.trace_id for i in items])
        if after is None:
            return out


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_each_filter_pages_newest_first_and_its_cursor_continues(
    kind: str, request: pytest.FixtureRequest, tenant_id: str
) -> None:
    store = make_store(kind, request, max_traces=100)
    want = recorded(store, tenant_id)
    newest_first = sorted(want, reverse=True)
    filters: list[dict[str, Any]] = [{}]
    filters += [{"kind": k} for k in KINDS]
    filters += [{"conversation": c} for c in ("c1", "c2", "nope")]
    filters += [{"kind": "message", "conversation": "c2"}, {"kind": "http", "conversation": "c1"}]
    for f in filters:
        expected = [
            t
            for t in newest_first
            if want[t][0] == f.get("kind", want[t][0]) and want[t][1] == f.get("conversation", want[t][1])
        ]
        got = pages(store, tenant_id, 4, **f)
        assert [t for page in got for t in page] == expected, f
        assert all(len(page) == 4 for page in got[:-1]), f
        if expected and len(expected) % 4 == 0:
            assert got[-1] == expected[-4:]  # the last full page says there is no next one


@pytest.mark.parametrize("kind", [k for k in STORE_KINDS if k != "memory"])
def test_the_trace_indexes_stay_exact_through_merges_prunes_expiry_and_two_writers(
    kind: str, request: pytest.FixtureRequest, tenant_id: str
) -> None:
    kv = kv_of(kind, request)
    store = KvTraceStore(kv, max_traces=12, prune_every=3, clock=ticking())
    layout = TRACES.layout(kv)
    table = store.tables.table(tenant_id, "traces")

    def writer(side: str) -> None:
        for r in range(6):
            store.record_many(tenant_id, [
                [root(n, KINDS[(n + r) % 4], f"c{r % 2}") if side == "a" else
                 span(tid(n), f"b{r:015x}", "a" * 16, "message.send", 1002.0 + n, 1.0)]
                for n in range(r * 3, r * 3 + 8)
            ])  # fmt: skip

    threads = [threading.Thread(target=writer, args=(side,)) for side in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    store.prune(tenant_id)
    for name in layout.index_names():
        assert layout.check(table, name) == {"missing": 0, "extra": 0, "wrong": 0}, name
    listed = store.list(tenant_id, limit=50)[0]
    per_kind = {k: sum(1 for s in listed if s.kind == k) for k in KINDS}  # each kind keeps its own newest 12
    assert max(per_kind.values()) == per_kind["message"] == 12, per_kind
    assert all(store.get(tenant_id, s.trace_id) is not None for s in listed)

    brief = KvTraceStore(kv, retention_ms=100, clock=ticking(), system_table=system_table())
    brief.record(None, [root(1, "http", "c1")])
    assert [s.trace_id for s in brief.list(None, conversation="c1")[0]] == [tid(1)]
    time.sleep(0.2)
    assert brief.list(None)[0] == [] and brief.list(None, kind="http")[0] == []
    for name in layout.index_names():
        assert layout.check(brief.system_table, name) == {"missing": 0, "extra": 0, "wrong": 0}


def legacy_write(kv: DurableKv, table: str, record: dict[str, Any]) -> None:
    """Write a trace as the store did before its indexes: the record and an ``r/`` summary."""
    summary = trace_records.summarize(record).to_json()
    ops: list[Op] = [
        Put(f"t/{record['trace_id']}", record, expect=ABSENT, ttl_ms=60_000),
        Put(trace_records.index_key(record), summary, ttl_ms=60_000),
    ]
    kv.commit(table, ops)


@pytest.mark.parametrize("kind", [k for k in STORE_KINDS if k != "memory"])
def test_a_trace_table_from_before_the_indexes_lists_right_at_once(
    kind: str, request: pytest.FixtureRequest, tenant_id: str
) -> None:
    kv = kv_of(kind, request)
    store = KvTraceStore(kv, clock=ticking())
    table = store.tables.table(tenant_id, "traces")
    for n in range(1, 8):
        record = trace_records.merge_trace(None, tid(n), tenant_id, [root(n, KINDS[n % 4], "c1")], 5000 + n)
        legacy_write(kv, table, record)
    store.record(tenant_id, [root(9, "message", "c9")])  # a write before the first read
    assert [s.trace_id for s in store.list(tenant_id, limit=3)[0]] == [tid(9), tid(7), tid(6)]
    assert [s.trace_id for s in store.list(tenant_id, conversation="c1", kind="task")[0]] == [
        tid(5),
        tid(1),
    ]
    layout = TRACES.layout(kv)
    for name in layout.index_names():
        assert layout.state(table, name) == "built"
        assert layout.check(table, name) == {"missing": 0, "extra": 0, "wrong": 0}


@pytest.mark.parametrize("size", [300, 1200])
def test_a_trace_page_touches_one_page_of_entries_whatever_the_table_holds(size: int, tenant_id: str) -> None:
    kv = backends.CountingKv()
    store = KvTraceStore(kv, max_traces=size, prune_every=size, clock=ticking())
    store.record_many(tenant_id, [
        [root(n, "message" if n % 100 == 0 else "http", "rare" if n % 300 == 0 else None)]
        for n in range(1, size + 1)
    ])  # fmt: skip
    reads = {
        "all": {},
        "kind": {"kind": "message"},
        "conversation": {"conversation": "rare"},
        "nothing": {"conversation": "nope"},
    }
    for name, f in reads.items():
        kv.touched = 0
        items, cursor = store.list(tenant_id, limit=10, **f)
        # an index state read, the page (+1 to know there is more), the rows it leads to
        assert kv.touched <= 2 * 11 + 3, (name, kv.touched)
        if name == "all":
            kv.touched = 0
            store.list(tenant_id, limit=10, after=cursor)
            assert kv.touched <= 11 + 3
