"""This process's snapshot: counters shared by every process, uptime kept across resets."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from botmesh_admin.errors import ValidationError
from botmesh_admin.kv import connect
from botmesh_admin.kv.runtime import use_kv
from botmesh_admin.observability import metrics
from botmesh_admin.observability.stores.kv import KvCounterStore
from botmesh_admin.observability.stores.memory import MemoryCounterStore
from botmesh_admin.observability.stores.redis import RedisCounterStore

ROOT = Path(__file__).resolve().parents[2]


def test_snapshot_has_the_botmesh_shape(counters: MemoryCounterStore) -> None:
    metrics.count("messages.in")
    metrics.count("messages.in", n=2)
    metrics.count("messages.out")
    metrics.count("messages.out_failed")
    metrics.count("dropped.handoff", n=1)
    metrics.count("presence_skipped.mark_read")
    metrics.count("conversations.started", n=3)
    metrics.count("conversations.completed", duration_ms=1000)
    metrics.count("conversations.timed_out", duration_ms=3000)
    metrics.count("flows.checkout.started", n=2)
    metrics.count("flows.checkout.completed", duration_ms=500)
    metrics.count("triggered")
    metrics.count("errors")
    snap = metrics.snapshot()
    assert set(snap) == {
        "started_at",
        "uptime_ms",
        "uptime",
        "conversations",
        "flows",
        "messages",
        "dropped",
        "presence_skipped",
        "triggered",
        "errors",
    }
    assert snap["messages"] == {"in": 3, "out": 1, "out_failed": 1}
    assert snap["dropped"] == {"duplicate": 0, "blocked": 0, "handoff": 1}
    assert snap["presence_skipped"] == {"typing": 0, "mark_read": 1}
    conv = snap["conversations"]
    assert (conv["started"], conv["completed"], conv["timed_out"], conv["active"]) == (3, 1, 1, 1)
    assert conv["avg_duration_ms"] == 2000
    assert snap["flows"]["checkout"]["started"] == 2 and snap["flows"]["checkout"]["avg_duration_ms"] == 500
    assert snap["flows"]["checkout"]["active"] == 1
    assert (snap["triggered"], snap["errors"]) == (1, 1)
    assert snap["started_at"].endswith("Z") and snap["uptime_ms"] >= 0


def test_reset_zeroes_counters_and_starts_their_uptime_again(counters: MemoryCounterStore) -> None:
    """The uptime is the shared counters' (issue 18 item 6): zeroed counters start again, as after a restart."""
    metrics.count("messages.in", n=5)
    before = metrics.snapshot()
    time.sleep(0.02)
    again = metrics.snapshot()
    assert again["started_at"] == before["started_at"] and again["uptime_ms"] >= before["uptime_ms"] + 20
    metrics.reset_metrics()
    after = metrics.snapshot()
    assert after["messages"]["in"] == 0
    assert after["started_at"] > before["started_at"] and after["uptime_ms"] < again["uptime_ms"]


@pytest.mark.parametrize("name", ["messages.inbound", "flows..started", "flows.x.finished", "conversations", ""])
def test_an_unknown_counter_is_a_validation_error(counters: MemoryCounterStore, name: str) -> None:
    with pytest.raises(ValidationError):
        metrics.count(name)


def test_duration_only_with_an_outcome(counters: MemoryCounterStore) -> None:
    with pytest.raises(ValidationError):
        metrics.count("messages.in", duration_ms=5)


class BrokenStore(MemoryCounterStore):
    def __init__(self) -> None:
        super().__init__()
        self.down = True

    def add(self, deltas: dict[str, int]) -> None:  # type: ignore[override]
        if self.down:
            raise ConnectionError("store down")
        super().add(deltas)


def test_counts_survive_a_store_outage_and_are_written_later() -> None:
    store = BrokenStore()
    with metrics.use_counter_store(store):
        metrics.count("messages.in")  # must not raise into the message path
        metrics.count("messages.in")
        store.down = False
        metrics.count("errors")
        assert store.read() == {"messages.in": 2, "errors": 1}


class WritesCounted(MemoryCounterStore):
    """The memory store, counting its writes."""

    writes = 0

    def add(self, deltas: Any) -> None:
        self.writes += 1
        super().add(deltas)


def test_deferred_counts_are_written_once_when_the_block_ends_even_on_error(redis_url: str) -> None:
    store = WritesCounted()
    with metrics.use_counter_store(store):
        with pytest.raises(RuntimeError), metrics.deferred():
            metrics.count("messages.in")
            with metrics.deferred():  # nested: to the outer block
                metrics.count("messages.in", n=2)
                metrics.count("conversations.completed", duration_ms=400)
            assert (store.writes, store.read()) == (0, {}), "nothing written inside the block"
            raise RuntimeError("the batch failed after counting")
        assert store.writes == 1
        assert store.read() == {
            "messages.in": 3,
            "conversations.completed": 1,
            "conversations.duration_ms_sum": 400,
            "conversations.duration_count": 1,
        }
    redis_store = RedisCounterStore(redis_url, key=f"test:metrics:{os.getpid()}:{time.time_ns()}")
    try:
        with metrics.use_counter_store(redis_store), metrics.deferred():
            for _ in range(5):
                metrics.count("messages.in")
        assert redis_store.read() == {"messages.in": 5}
    finally:
        redis_store.reset()
        redis_store.close()


def test_store_is_redis_when_redis_url_is_set(redis_url: str) -> None:
    with override_settings(BOTMESH_REDIS_URL=redis_url):
        assert isinstance(metrics.counter_store(), RedisCounterStore)
    kv = connect("memory://")
    with override_settings(BOTMESH_REDIS_URL=None), use_kv(kv):
        store = metrics.counter_store()
        assert isinstance(store, KvCounterStore) and store.kv is kv


CHILD = """
import os, sys
import django
django.setup()
from botmesh_admin.observability import metrics
for _ in range(int(sys.argv[1])):
    metrics.count("messages.in")
    metrics.count("conversations.completed", duration_ms=100)
"""


def test_counters_are_summed_over_worker_processes(tmp_path: Path) -> None:
    """Two processes count through the default path (Kv on a shared SQLite file); one snapshot sees all."""
    url = f"sqlite:///{tmp_path}/kv.sqlite3"
    env = {
        **os.environ,
        "BOTMESH_KV_URL": url,
        "DJANGO_SETTINGS_MODULE": "botmesh_admin.settings",
        "BOTMESH_DATA_DIR": str(tmp_path),
        "OTEL_SDK_DISABLED": "true",
    }
    env.pop("REDIS_URL", None)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, "40"], cwd=ROOT, env=env) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=90) == 0
    kv = connect(url)
    try:
        with metrics.use_counter_store(KvCounterStore(kv)):
            snap = metrics.snapshot()
    finally:
        kv.close()
    assert snap["messages"]["in"] == 80
    assert snap["conversations"]["completed"] == 80 and snap["conversations"]["avg_duration_ms"] == 100
