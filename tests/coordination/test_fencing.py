"""Fenced writes: FenceGuard on every Kv backend, and paused holders as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from botmesh_admin.coordination import FenceGuard, LeaseLost, StaleFence
from botmesh_admin.coordination.memory import MemoryCoordinationHub, MemoryCoordinator
from botmesh_admin.coordination.redis import RedisCoordinator
from botmesh_admin.kv import ConflictError, Put, connect
from tests.backends import unique_id

ROOT = Path(__file__).resolve().parents[2]


def test_fenced_writes_refuse_an_older_fence(any_kv, tenant_id: str) -> None:
    """A write with fence 5 after fence 7 wrote is refused and changes nothing; 7 again is fine."""
    guard = FenceGuard(any_kv, f"coordination/{tenant_id}/data")
    guard.commit("job", 7, [Put("state", "seven")])
    with pytest.raises(StaleFence) as info:
        guard.commit("job", 5, [Put("state", "five")])
    assert info.value.current_version == 7
    assert any_kv.get(guard.table, "state").value == "seven"
    guard.commit("job", 7, [Put("state", "seven again")])
    guard.commit("job", 9, [Put("state", "nine")])
    assert guard.highest("job") == 9 and any_kv.get(guard.table, "state").value == "nine"
    guard.commit("other", 1)  # resources are independent


def test_fenced_write_keeps_the_callers_own_expectations(any_kv, tenant_id: str) -> None:
    """A failed expectation of the caller's ops is a ConflictError and nothing is written."""
    guard = FenceGuard(any_kv, f"coordination/{tenant_id}/data")
    guard.commit("job", 1, [Put("x", 1)])
    with pytest.raises(ConflictError):
        guard.commit("job", 2, [Put("x", 2, expect=99)])
    assert guard.highest("job") == 1


def test_concurrent_fenced_writers_end_with_the_highest_fence(any_kv, tenant_id: str) -> None:
    """Racing writers: the store ends at the highest fence; no lower fence wrote after it."""
    guard = FenceGuard(any_kv, f"coordination/{tenant_id}/data")
    accepted: list[tuple[int, int]] = []
    lock = threading.Lock()

    def write(fence: int) -> None:
        try:
            (entry,) = guard.commit("job", fence, [Put("v", fence)])
            with lock:
                accepted.append((entry.version, fence))
        except StaleFence:
            pass

    threads = [threading.Thread(target=write, args=(f,)) for f in range(1, 13)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert any_kv.get(guard.table, "v").value == 12 == guard.highest("job")
    in_commit_order = [fence for _, fence in sorted(accepted)]
    assert in_commit_order == sorted(in_commit_order)  # no lower fence wrote after a higher one


def test_an_invalid_lease_cannot_write() -> None:
    """The guard checks the lease's local validity before touching the store."""
    from botmesh_admin.kv.memory import MemoryKv

    hub = MemoryCoordinationHub()
    coordinator = MemoryCoordinator(hub, "a", lease_ms=500)
    lease = coordinator.try_lead("scheduler")
    assert lease is not None
    guard = FenceGuard(MemoryKv("memory://"), "coordination/system/data")
    guard.commit("job", lease.fence, lease=lease)
    lease.release()
    with pytest.raises(LeaseLost):
        guard.commit("job", lease.fence, lease=lease)
    coordinator.close()


def _spawn(command: str, args: dict) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.coordination.workers", command, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _line(proc: subprocess.Popen[str], timeout_s: float = 20) -> list[str]:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0]:
        proc.kill()
        raise AssertionError(f"no answer from the child (exit {proc.poll()})")
    return box[0].split()


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_kv_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A Kv several processes share."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/kv.sqlite3"
    return request.getfixturevalue("postgres_url")


@pytest.mark.services
def test_a_lock_holder_paused_past_its_ttl_cannot_write_after_a_takeover(redis_url: str, shared_kv_url: str) -> None:
    """SIGSTOP the holder past its TTL; another takes the lock and writes; the holder's write is refused."""
    prefix, table = unique_id("c"), f"coordination/{unique_id()}/data"
    kv = connect(shared_kv_url)
    child = _spawn(
        "lock_writer",
        {"redis_url": redis_url, "prefix": prefix, "kv_url": shared_kv_url, "table": table, "ttl_ms": 400},
    )
    try:
        word, fence = _line(child)
        assert word == "ACQUIRED"
        os.kill(child.pid, signal.SIGSTOP)
        parent = RedisCoordinator(redis_url, prefix, 2000, "parent", fence_kv=kv)
        deadline = time.monotonic() + 5
        got = parent.acquire_lock_fenced("lock:job", 5000)
        while got is None and time.monotonic() < deadline:
            time.sleep(0.05)
            got = parent.acquire_lock_fenced("lock:job", 5000)
        assert got is not None and got[1] > int(fence)
        FenceGuard(kv, table).commit("job", got[1], [Put("result", {"by": "parent", "fence": got[1]})])
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("go\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        assert _line(child) == ["REFUSED", "StaleFence"]
        assert kv.get(table, "result").value == {"by": "parent", "fence": got[1]}
        parent.close()
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(timeout=10)
        kv.close()


@pytest.mark.services
def test_a_frozen_leader_stops_writing_when_it_wakes_up(redis_url: str, tmp_path: Path) -> None:
    """A leader frozen (SIGSTOP) past its lease finds its leadership lost and writes nothing more."""
    prefix, table = unique_id("c"), f"coordination/{unique_id()}/data"
    kv_url = f"sqlite:///{tmp_path}/kv.sqlite3"
    kv = connect(kv_url)
    child = _spawn(
        "leader_writer",
        {"redis_url": redis_url, "prefix": prefix, "kv_url": kv_url, "table": table, "lease_ms": 600, "run_s": 20},
    )
    try:
        word, fence = _line(child)
        assert word == "LEADING"
        assert _line(child)[0] == "WROTE"
        os.kill(child.pid, signal.SIGSTOP)
        parent = RedisCoordinator(redis_url, prefix, 600, "parent", fence_kv=kv)
        deadline = time.monotonic() + 5
        lease = parent.try_lead("scheduler")
        while lease is None and time.monotonic() < deadline:
            time.sleep(0.05)
            lease = parent.try_lead("scheduler")
        assert lease is not None and lease.fence > int(fence)
        FenceGuard(kv, table).commit("ticks", lease.fence, [Put("tick", {"fence": lease.fence})], lease=lease)
        os.kill(child.pid, signal.SIGCONT)
        lines = []
        while True:
            line = _line(child)
            lines.append(line)
            if line[0] == "REFUSED":
                break
        assert lines[-1] == ["REFUSED", "LeaseLost"]
        assert len(lines) <= 2  # at most a write that was already past its checks when frozen
        assert kv.get(table, "tick").value == {"fence": lease.fence}
        parent.close()
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(timeout=10)
        kv.close()


@pytest.mark.services
def test_a_killed_replica_restarted_with_the_same_id_waits_for_its_old_turn(redis_url: str, tmp_path: Path) -> None:
    """SIGKILL a holder; a new process with the same replica_id gets the turn only after lease_ms."""
    prefix = unique_id("c")
    kv_url = f"sqlite:///{tmp_path}/kv.sqlite3"
    child = _spawn(
        "turn_holder",
        {
            "redis_url": redis_url,
            "prefix": prefix,
            "kv_url": kv_url,
            "lease_ms": 800,
            "replica_id": "replica-7",
            "key": "chat:k",
        },
    )
    try:
        word, fence, old_owner = _line(child)
        assert word == "HOLDING"
        child.kill()
        child.wait(timeout=10)
        killed_at = time.monotonic()
        successor = RedisCoordinator(redis_url, prefix, 800, "replica-7", fence_kv=connect(kv_url))
        assert successor.owner != old_owner
        assert successor.acquire_turn("chat:k", 0) is None
        turn = successor.acquire_turn("chat:k", 5000)
        assert turn is not None and turn.fence > int(fence) and turn.previous_holder == old_owner
        assert time.monotonic() - killed_at >= 0.3  # not handed over at once: the lease had to lapse
        successor.close()
    finally:
        child.kill()
        child.wait(timeout=10)
