"""The store contracts, run over the memory reference store and the Kv store on every backend."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from botmesh_admin.errors import ValidationError
from botmesh_admin.kv import DurableKv
from botmesh_admin.observability.stores.base import BotMetricsStore, CounterStore, TraceStore
from botmesh_admin.observability.stores.kv import KvBotMetricsStore, KvCounterStore, KvTraceStore
from botmesh_admin.observability.stores.memory import (
    MemoryBotMetricsStore,
    MemoryCounterStore,
    MemoryTraceStore,
)
from botmesh_admin.observability.stores.redis import RedisCounterStore
from tests.backends import open_kv
from tests.stores import STORE_KINDS  # memory, kv-<backend> (server backends marked services), as every package


def kv_of(kind: str, request: pytest.FixtureRequest) -> DurableKv:
    """Open the Kv backend named by a ``kv-<backend>`` param."""
    return open_kv(kind.removeprefix("kv-"), request)


@pytest.fixture(params=[*STORE_KINDS, pytest.param("redis", marks=pytest.mark.services)])
def counter_store(request: pytest.FixtureRequest) -> CounterStore:
    """A fresh counter store: memory, Kv (over every backend, through ``any_kv``) or Redis."""
    if request.param == "memory":
        return MemoryCounterStore()
    if request.param == "redis":
        store = RedisCounterStore(request.getfixturevalue("redis_url"), key=f"test:counters:{uuid.uuid4().hex}")
        request.addfinalizer(store.reset)
        return store
    return KvCounterStore(kv_of(request.param, request), table=f"observability/~test-{uuid.uuid4().hex[:10]}/counters")


def test_counters_add_read_and_reset(counter_store: CounterStore) -> None:
    assert isinstance(counter_store, CounterStore)
    assert counter_store.read() == {}
    counter_store.add({"messages.in": 2, "errors": 1})
    counter_store.add({"messages.in": 3, "triggered": 0})
    assert counter_store.read() == {"messages.in": 5, "errors": 1}
    counter_store.reset()
    assert counter_store.read() == {}
    counter_store.add({"errors": 1})
    assert counter_store.read() == {"errors": 1}


def test_counters_start_once_for_every_process_and_again_after_a_reset(counter_store: CounterStore) -> None:
    counter_store.add({"messages.in": 1})
    assert counter_store.started_at(1_000) == 1_000
    assert counter_store.started_at(5_000) == 1_000  # a later caller (another worker) reads the first's
    assert counter_store.read() == {"messages.in": 1}  # the start is not a counter
    counter_store.reset()
    assert counter_store.started_at(9_000) == 9_000


def test_concurrent_increments_are_never_lost(counter_store: CounterStore) -> None:
    threads, each = 4, 25

    def work() -> None:
        for _ in range(each):
            counter_store.add({"messages.out": 1, "conversations.duration_ms_sum": 10})

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert counter_store.read() == {
        "messages.out": threads * each,
        "conversations.duration_ms_sum": 10 * threads * each,
    }


@pytest.fixture(params=STORE_KINDS)
def bot_store(request: pytest.FixtureRequest) -> BotMetricsStore:
    """A bot metrics store keeping 5 samples per replica."""
    if request.param == "memory":
        return MemoryBotMetricsStore(history=5)
    return KvBotMetricsStore(kv_of(request.param, request), history=5)


def snap(n: int) -> dict[str, Any]:
    return {"messages": {"in": n, "out": 0, "out_failed": 0}, "errors": 0}


def test_latest_sample_per_replica(bot_store: BotMetricsStore, tenant_id: str) -> None:
    assert isinstance(bot_store, BotMetricsStore)
    bot_store.push(tenant_id, bot="tienda-bot", replica="r2", snapshot=snap(1), received_at_ms=1000)
    bot_store.push(tenant_id, bot="tienda-bot", replica="r1", snapshot=snap(2), received_at_ms=1000)
    third = bot_store.push(tenant_id, bot="tienda-bot", replica="r1", snapshot=snap(3), received_at_ms=2000)
    bot_store.push(tenant_id, bot="other-bot", replica="r1", snapshot=snap(9), received_at_ms=2000)
    assert third.seq == 2
    latest = bot_store.latest(tenant_id, bot="tienda-bot")
    assert [(s.replica, s.snapshot["messages"]["in"], s.seq) for s in latest] == [("r1", 3, 2), ("r2", 1, 1)]
    assert [s.bot for s in bot_store.latest(tenant_id)] == ["other-bot", "tienda-bot", "tienda-bot"]


def test_ids_of_any_text_are_kept_apart_and_read_back(bot_store: BotMetricsStore, tenant_id: str) -> None:
    """A "/" or "%" in an id never makes two replicas one, nor a bot another's prefix (issue 15 item 7)."""
    ids = [("a/b", "c"), ("a", "b/c"), ("a%2Fb", "c"), ("a~", "\n"), ("a", "~" + "0" * 32), ("🤖" * 63, "é" * 128)]
    for n, (bot, replica) in enumerate(ids, start=1):
        bot_store.push(tenant_id, bot=bot, replica=replica, snapshot=snap(n), received_at_ms=1000)
    latest = bot_store.latest(tenant_id)
    assert [(s.bot, s.replica, s.snapshot["messages"]["in"]) for s in latest] == sorted(
        (bot, replica, n) for n, (bot, replica) in enumerate(ids, start=1)
    )
    assert [s.replica for s in bot_store.latest(tenant_id, bot="a")] == ["b/c", "~" + "0" * 32]
    for n, (bot, replica) in enumerate(ids, start=1):
        assert [s.snapshot["messages"]["in"] for s in bot_store.history(tenant_id, bot=bot, replica=replica)] == [n]


def test_history_is_bounded_and_oldest_first(bot_store: BotMetricsStore, tenant_id: str) -> None:
    for n in range(1, 13):
        bot_store.push(tenant_id, bot="b", replica="r1", snapshot=snap(n), received_at_ms=n * 1000)
    history = bot_store.history(tenant_id, bot="b", replica="r1")
    assert [s.snapshot["messages"]["in"] for s in history] == [8, 9, 10, 11, 12]
    since = bot_store.history(tenant_id, bot="b", replica="r1", since_ms=10_000)
    assert [s.received_at_ms for s in since] == [11_000, 12_000]
    assert bot_store.history(tenant_id, bot="b", replica="nope") == []


def test_bot_metrics_of_another_tenant_are_invisible(bot_store: BotMetricsStore, tenant_id: str) -> None:
    bot_store.push(tenant_id, bot="b", replica="r1", snapshot=snap(1), received_at_ms=1)
    other = f"{tenant_id}x"
    assert bot_store.latest(other) == []
    assert bot_store.history(other, bot="b", replica="r1") == []


def test_concurrent_pushes_of_one_replica_get_distinct_sequence_numbers(
    bot_store: BotMetricsStore, tenant_id: str
) -> None:
    seqs: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for j in range(5):
            s = bot_store.push(tenant_id, bot="b", replica="r1", snapshot=snap(i * 10 + j), received_at_ms=1)
            with lock:
                seqs.append(s.seq)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert sorted(seqs) == list(range(1, 21))
    assert bot_store.latest(tenant_id)[0].seq == 20


def test_an_invalid_tenant_never_reaches_the_store(bot_store: BotMetricsStore) -> None:
    with pytest.raises(ValidationError):
        bot_store.latest("../other")


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_samples_expire_after_retention(kind: str, request: pytest.FixtureRequest, tenant_id: str) -> None:
    if kind == "memory":
        store: BotMetricsStore = MemoryBotMetricsStore(history=5, retention_ms=50)
    else:
        store = KvBotMetricsStore(kv_of(kind, request), history=5, retention_ms=50)
    store.push(tenant_id, bot="b", replica="r1", snapshot=snap(1), received_at_ms=1)
    assert len(store.latest(tenant_id)) == 1
    time.sleep(0.1)
    assert store.latest(tenant_id) == [] and store.history(tenant_id, bot="b", replica="r1") == []


@pytest.fixture(params=STORE_KINDS)
def trace_store(request: pytest.FixtureRequest) -> TraceStore:
    """A trace store keeping 4 traces per tenant (pruning on every new trace)."""
    clock = iter(range(1_000_000, 2_000_000, 10))

    def tick() -> int:
        return next(clock)

    if request.param == "memory":
        return MemoryTraceStore(max_traces=4, clock=tick)
    return KvTraceStore(
        kv_of(request.param, request),
        max_traces=4,
        prune_every=1,
        clock=tick,
        system_table=f"observability/~test-{uuid.uuid4().hex[:10]}/traces",
    )


def span(
    trace: str, span_id: str, parent: str | None, name: str, start: float, ms: float, **attributes: Any
) -> dict[str, Any]:
    return {
        "trace_id": trace,
        "span_id": span_id,
        "parent_id": parent,
        "name": name,
        "kind": "internal",
        "start_ms": start,
        "duration_ms": ms,
        "status": "ok",
        "status_message": None,
        "attributes": attributes,
        "events": [],
        "scope": "botmesh_admin",
        "service": "test",
    }


def tid(n: int) -> str:
    return f"{n:032x}"


def test_spans_of_one_trace_merge_across_batches(trace_store: TraceStore, tenant_id: str) -> None:
    assert isinstance(trace_store, TraceStore)
    trace_store.record(tenant_id, [span(tid(1), "b" * 16, "a" * 16, "message.project", 1010.0, 5.0)])
    trace_store.record(
        tenant_id,
        [
            span(tid(1), "a" * 16, None, "POST webhooks/whatsapp", 1000.0, 20.0),
            span(tid(1), "c" * 16, "b" * 16, "message.send", 1012.0, 30.0, **{"botmesh.conversation_id": "conv-1"}),
        ],
    )
    trace = trace_store.get(tenant_id, tid(1))
    assert trace is not None
    summary = trace["summary"]
    assert (summary.name, summary.kind, summary.span_count, summary.duration_ms) == (
        "POST webhooks/whatsapp",
        "message",
        3,
        42.0,
    )
    assert summary.conversation == "conv-1"
    assert [s["name"] for s in trace["spans"]] == ["POST webhooks/whatsapp", "message.project", "message.send"]


def test_trace_list_is_newest_first_filtered_and_paginated(trace_store: TraceStore, tenant_id: str) -> None:
    for n in range(1, 4):
        trace_store.record(tenant_id, [span(tid(n), "a" * 16, None, f"GET page{n}", 1000.0 * n, 1.0)])
    trace_store.record(
        tenant_id, [span(tid(4), "a" * 16, None, "message.receive", 5000.0, 1.0, **{"botmesh.conversation_id": "c9"})]
    )
    items, cursor = trace_store.list(tenant_id, limit=2)
    assert [i.name for i in items] == ["message.receive", "GET page3"]
    more, end = trace_store.list(tenant_id, limit=2, after=cursor)
    assert [i.name for i in more] == ["GET page2", "GET page1"] and end is None
    assert [i.trace_id for i in trace_store.list(tenant_id, kind="message")[0]] == [tid(4)]
    assert [i.trace_id for i in trace_store.list(tenant_id, conversation="c9")[0]] == [tid(4)]
    assert trace_store.list(tenant_id, conversation="nope")[0] == []


def test_only_the_newest_traces_are_kept(trace_store: TraceStore, tenant_id: str) -> None:
    for n in range(1, 8):
        trace_store.record(tenant_id, [span(tid(n), "a" * 16, None, f"t{n}", 1000.0 * n, 1.0)])
    names = [i.name for i in trace_store.list(tenant_id, limit=50)[0]]
    assert names == ["t7", "t6", "t5", "t4"]
    assert trace_store.get(tenant_id, tid(1)) is None


def test_traces_of_another_tenant_or_of_no_tenant_are_separate(trace_store: TraceStore, tenant_id: str) -> None:
    trace_store.record(tenant_id, [span(tid(1), "a" * 16, None, "mine", 1000.0, 1.0)])
    trace_store.record(None, [span(tid(2), "a" * 16, None, "system", 1000.0, 1.0)])
    assert trace_store.get(f"{tenant_id}x", tid(1)) is None
    assert trace_store.get(None, tid(1)) is None
    assert "system" in [i.name for i in trace_store.list(None)[0]]
    assert [i.name for i in trace_store.list(tenant_id)[0]] == ["mine"]


def test_record_many_merges_like_record_one_by_one(trace_store: TraceStore, tenant_id: str) -> None:
    trace_store.record(tenant_id, [span(tid(1), "b" * 16, "a" * 16, "message.project", 1010.0, 5.0)])
    trace_store.record_many(
        tenant_id,
        [
            [span(tid(1), "a" * 16, None, "POST webhooks/whatsapp", 1000.0, 20.0)],
            [span(tid(2), "a" * 16, None, "GET page2", 2000.0, 1.0)],
            [span(tid(1), "c" * 16, "b" * 16, "message.send", 1012.0, 30.0)],
            [],
        ],
    )
    one = trace_store.get(tenant_id, tid(1))
    assert one is not None
    assert [s["name"] for s in one["spans"]] == ["POST webhooks/whatsapp", "message.project", "message.send"]
    assert {i.trace_id for i in trace_store.list(tenant_id)[0]} == {tid(1), tid(2)}


def test_two_writers_merging_the_same_traces_lose_no_span(trace_store: TraceStore, tenant_id: str) -> None:
    """A web process and a worker write their parts of the same traces at once (one message, one trace)."""
    rounds, traces = 8, [tid(n) for n in range(1, 5)]

    def writer(side: str) -> None:
        for r in range(rounds):
            trace_store.record_many(
                tenant_id,
                [
                    [span(t, f"{side}{r:015x}", None if side == "a" else f"a{r:015x}", f"{side}.{r}", 1000.0 + r, 1.0)]
                    for t in traces
                ],
            )

    threads = [threading.Thread(target=writer, args=(side,)) for side in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for t in traces:
        got = trace_store.get(tenant_id, t)
        assert got is not None
        assert sorted(s["name"] for s in got["spans"]) == sorted(f"{side}.{r}" for side in "ab" for r in range(rounds))
    assert sorted(i.trace_id for i in trace_store.list(tenant_id)[0]) == traces
