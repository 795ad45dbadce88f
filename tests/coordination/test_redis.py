"""RedisCoordinator specifics: fences survive a Redis restart; keys of one coordination key share a slot."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh_admin.coordination.redis import RedisBackend, RedisCoordinator
from botmesh_admin.errors import ValidationError
from botmesh_admin.kv import connect
from tests import services
from tests.backends import unique_id


class ThrowawayRedis:
    """A Redis server of our own (no persistence), which a test may restart."""

    def __init__(self, directory: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[ThrowawayRedis]:
    if not shutil.which("redis-server"):
        if services.REQUIRE:
            pytest.fail("BOTMESH_REQUIRE_SERVICES=1 but redis-server is not on the PATH")
        pytest.skip("redis-server is not on the PATH")
    server = ThrowawayRedis(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.mark.services
def test_fences_never_go_backwards_after_redis_restarts_empty(throwaway_redis: ThrowawayRedis, tmp_path: Path) -> None:
    """Kill Redis (no persistence) and start it again: new grants carry higher fences than before."""
    kv = connect(f"sqlite:///{tmp_path}/kv.sqlite3")
    coordinator = RedisCoordinator(throwaway_redis.url, "restart", 1000, "a", fence_kv=kv)
    coordinator.backend._fence_block = 50
    before = []
    for i in range(120):
        turn = coordinator.acquire_turn(f"chat:{i % 7}", 0)
        assert turn is not None
        before.append(turn.fence)
        turn.release()
    assert before == sorted(before)
    throwaway_redis.stop()
    throwaway_redis.start()
    assert coordinator.backend.client.exists("{restart}:fence") == 0  # Redis really is empty
    after = coordinator.acquire_turn("chat:0", 0)
    assert after is not None and after.fence > max(before)
    lead = coordinator.try_lead("scheduler")
    lock = coordinator.acquire_lock_fenced("lock:x", 1000)
    assert lead is not None and lock is not None and max(before) < after.fence < lead.fence < lock[1]
    coordinator.close(release=False)
    kv.close()


@pytest.mark.services
def test_the_durable_mark_is_raised_before_fences_pass_it(redis_url: str) -> None:
    """Every fence handed out is at or below the high-water mark in the Kv at that moment."""
    from botmesh_admin.kv.memory import MemoryKv

    kv = MemoryKv("memory://")
    backend = RedisBackend(redis_url, unique_id("c"), fence_kv=kv, fence_block=10)
    for _ in range(55):
        fence = backend.next_fence()
        assert fence <= backend.watermark.read()
    assert backend.watermark.read() == 60
    backend.close()


def test_keys_of_one_coordination_key_share_a_hash_slot() -> None:
    """Every Redis key a turn, leadership or lock touches hashes to one slot, braces in keys included."""
    from redis.crc import key_slot

    backend = RedisBackend.__new__(RedisBackend)
    backend.prefix = "p"
    for key in ("chat:1", "tg:{12}x}", "}{", "wa:ñandú"):
        turn_keys, wake = backend._turn_keys(key)
        slots = {key_slot(k.encode()) for k in [*turn_keys, wake + "7|a/b"]}
        assert len(slots) == 1, key
        assert len({key_slot(k.encode()) for k in backend._lock_keys(key)}) == 1
    assert len({key_slot(k.encode()) for k in backend._lead_keys("provider:wa-1")}) == 1


def test_bad_prefix_and_url_are_refused() -> None:
    """Configuration errors name the field."""
    with pytest.raises(ValidationError) as info:
        RedisBackend("redis://127.0.0.1:1/0", "Bad{Prefix}")
    assert info.value.field == "prefix"
    with pytest.raises(ValidationError) as info:
        RedisBackend("http://example.com", "ok")
    assert info.value.field == "url"
