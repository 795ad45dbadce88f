"""KvCoordinator specifics: the durable fence counter, the key layout, the bounded events, URLs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from botmesh_admin.coordination import CoordinationEvent, bot_prefix
from botmesh_admin.coordination.kv import EVENTS_KEPT, KvBackend, KvCoordinator, coordination_table
from botmesh_admin.coordination.memory import MemoryCoordinator
from botmesh_admin.coordination.redis import RedisCoordinator
from botmesh_admin.coordination.runtime import backend_from_url, coordinator_from_url
from botmesh_admin.errors import ValidationError
from botmesh_admin.kv import connect
from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.runtime import use_kv
from tests.backends import unique_id


def test_fences_never_go_backwards_after_every_process_restarts(tmp_path: Path) -> None:
    """The fence counter lives in the Kv file: a new coordinator on a reopened file continues above it."""
    url = f"sqlite:///{tmp_path}/kv.sqlite3"
    before = []
    first = KvCoordinator(connect(url), "restart", 1000, "a", owns_kv=True)
    for i in range(20):
        turn = first.acquire_turn(f"chat:{i % 3}", 0)
        assert turn is not None
        before.append(turn.fence)
        turn.release()
    lead = first.try_lead("scheduler")
    assert lead is not None
    before.append(lead.fence)
    first.close()
    assert before == sorted(before) and len(set(before)) == len(before)

    again = KvCoordinator(connect(url), "restart", 1000, "a", owns_kv=True)
    turn = again.acquire_turn("chat:0", 0)
    lead2 = again.try_lead("scheduler")
    lock = again.acquire_lock_fenced("lock:x", 1000)
    assert turn is not None and lead2 is not None and lock is not None
    assert max(before) < turn.fence < lead2.fence < lock[1]
    again.close()


def test_chat_keys_never_appear_raw_in_the_kv() -> None:
    """Turn and lock records are keyed by the SHA-256 of the key; values name owners, not chats."""
    kv = MemoryKv("memory://")
    coordinator = KvCoordinator(kv, "layout", 1000, "r1")
    turn = coordinator.acquire_turn("whatsapp:+573001112233", 0)
    assert turn is not None
    waiter = KvCoordinator(kv, "layout", 1000, "r2")
    assert waiter.acquire_turn("whatsapp:+573001112233", 50) is None
    assert coordinator.acquire_lock_fenced("lock:+573001112233", 1000) is not None
    table = coordination_table("layout")
    assert table == "coordination/~coordinator/layout"
    entries = kv.scan(table, limit=100)
    assert "573001112233" not in json.dumps([[e.key, e.value] for e in entries])
    keys = {e.key.split("/")[0] for e in entries}
    assert keys == {"fence", "t", "k", "r"}
    holder = next(e for e in entries if e.key.endswith("/h")).value
    assert holder["holder"]["owner"] == coordinator.owner and holder["holder"]["fence"] == turn.fence
    coordinator.close()
    waiter.close()


def test_the_events_kept_are_bounded_and_newest_first() -> None:
    """Publishing more than EVENTS_KEPT events keeps the last EVENTS_KEPT, newest first."""
    backend = KvBackend(MemoryKv("memory://"), "events")
    for i in range(EVENTS_KEPT + 30):
        backend.publish(CoordinationEvent("handover", "scheduler", "r", "i", i, 1000 + i))
    events = backend.snapshot(10_000).events
    assert len(events) == EVENTS_KEPT
    assert [e.fence for e in events[:3]] == [EVENTS_KEPT + 29, EVENTS_KEPT + 28, EVENTS_KEPT + 27]
    assert events[-1].fence == 30


def test_a_bad_prefix_names_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        KvCoordinator(MemoryKv("memory://"), "Bad/Prefix")
    assert info.value.field == "prefix"


def test_coordinators_by_url(tmp_path: Path, redis_url: str) -> None:
    """kv:<kv url>, kv: (the process's Kv), memory: and redis:// give the matching coordinator."""
    prefix = unique_id("u")
    url = f"kv:sqlite:///{tmp_path}/kv.sqlite3"
    a = coordinator_from_url(url, prefix=prefix, lease_ms=1000, role="bot", replica_id="bot-a")
    b = coordinator_from_url(url, prefix=prefix, lease_ms=1000, role="bot", replica_id="bot-b")
    assert isinstance(a, KvCoordinator) and a.role == "bot"
    assert a.try_lead("provider:wa-1") is not None and b.try_lead("provider:wa-1") is None
    reader = backend_from_url(url, prefix)  # what the Replicas page reads: no replica of its own
    snap = reader.snapshot(3000)
    assert {r.replica_id for r in snap.replicas} == {"bot-a", "bot-b"}
    assert [(x.name, x.replica_id) for x in snap.leaders] == [("provider:wa-1", "bot-a")]
    reader.close()
    a.close()
    b.close()

    process_kv = MemoryKv("memory://")
    with use_kv(process_kv):
        c = coordinator_from_url("kv:", prefix=prefix, lease_ms=1000, role="web")
        assert isinstance(c, KvCoordinator) and c.backend.kv is process_kv
        c.close()
    m = coordinator_from_url("memory:", prefix=prefix, lease_ms=1000, role="web")
    assert isinstance(m, MemoryCoordinator)
    m.close()
    r = coordinator_from_url(redis_url, prefix=prefix, lease_ms=1000, role="web", replica_id="r")
    assert isinstance(r, RedisCoordinator)
    r.close()


def test_a_bots_replicas_are_read_under_its_prefix(tmp_path: Path) -> None:
    """backend_from_url(url, bot_prefix(tenant, bot)) sees that bot's replicas and no other's."""
    url = f"kv:sqlite:///{tmp_path}/kv.sqlite3"
    mine = coordinator_from_url(url, prefix=bot_prefix("acme", "tienda-bot"), lease_ms=1000, role="bot")
    other = coordinator_from_url(url, prefix=bot_prefix("acme", "otro-bot"), lease_ms=1000, role="bot")
    reader = backend_from_url(url, bot_prefix("acme", "tienda-bot"))
    assert [r.incarnation for r in reader.snapshot(3000).replicas] == [mine.incarnation]
    reader.close()
    mine.close()
    other.close()


@pytest.mark.parametrize(
    ("url", "prefix", "field"),
    [
        ("http://x", "p", "url"),
        ("kv:ftp://x", "p", "url"),
        ("memory", "p", "url"),
        ("kv:memory://", "Bad Prefix", "prefix"),
        ("memory:", "Bad Prefix", "prefix"),
    ],
)
def test_bad_urls_and_prefixes_name_the_field(url: str, prefix: str, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        coordinator_from_url(url, prefix=prefix, lease_ms=1000, role="web")
    assert info.value.field == field
    with pytest.raises(ValidationError) as info:
        backend_from_url(url, prefix)
    assert info.value.field == field


def test_fences_continue_above_what_redis_or_the_file_locked_beat_issued() -> None:
    """Moving a deployment from Redis (or the file-locked beat) to the Kv: fences keep growing."""
    from botmesh_admin.coordination.redis import FenceWatermark

    kv = MemoryKv("memory://")
    FenceWatermark(kv, "moved").raise_past(0, 65536)  # Redis reserved fences up to 65536
    FenceWatermark(kv, "scheduler-file").raise_past(0, 12)
    coordinator = KvCoordinator(kv, "moved", 1000, "a")
    lead = coordinator.try_lead("scheduler")
    assert lead is not None and lead.fence == 65537
    coordinator.close()


def test_concurrent_grants_on_different_keys_never_share_a_fence(tmp_path: Path) -> None:
    """Grants racing for the one fence counter (six connections to one SQLite file) all get distinct fences."""
    import threading

    url = f"sqlite:///{tmp_path}/kv.sqlite3"
    replicas = [KvCoordinator(connect(url), "race", 2000, f"r{i}", owns_kv=True) for i in range(6)]
    fences: list[int] = []
    lock = threading.Lock()

    def work(c: KvCoordinator, n: int) -> None:
        for i in range(15):
            turn = c.acquire_turn(f"chat:{n}:{i}", 5000)
            assert turn is not None
            with lock:
                fences.append(turn.fence)
            turn.release()

    threads = [threading.Thread(target=work, args=(c, n)) for n, c in enumerate(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(fences) == 90 and len(set(fences)) == 90
    for c in replicas:
        c.close()
