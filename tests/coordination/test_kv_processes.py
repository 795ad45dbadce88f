"""KvCoordinator across real processes (SQLite file, PostgreSQL): SIGKILL and SIGSTOP of a holder.

The children are ``tests/coordination/workers.py`` replicas coordinating
through ``coordinator_from_url("kv:…")``; the test process is the other
replica. Leases are 1.5 s, every wait is bounded, and each child is
resumed and killed in ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from botmesh_admin.coordination import FenceGuard
from botmesh_admin.coordination.runtime import coordinator_from_url
from botmesh_admin.kv import Put, connect
from tests.backends import unique_id

from .test_fencing import _line

ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 1500
"""Long enough that a renewal (every 500 ms) delayed by a loaded 2-core CI machine — an fsync of the
SQLite file behind other tests' writes — does not lapse the lease; a CI run lost one at 800 ms."""

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_kv_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A Kv several processes share."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/kv.sqlite3"
    return request.getfixturevalue("postgres_url")


@contextmanager
def child(command: str, args: dict, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """Run a workers.py replica; resume (if frozen) and kill it at the end, also on failure."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.coordination.workers", command, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env or {**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=10)


def test_a_killed_turn_holders_turn_passes_to_another_process_after_the_lease(shared_kv_url: str) -> None:
    """SIGKILL the holder: another process gets the turn once lease_ms has passed, with a higher fence.

    The child uses ``kv:`` without Django settings: the Kv of its ``BOTMESH_KV_URL``.
    """
    prefix = unique_id("k")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"PYTHONPATH": str(ROOT), "BOTMESH_KV_URL": shared_kv_url})
    args = {"coordination_url": "kv:", "prefix": prefix, "lease_ms": LEASE_MS, "replica_id": "r-7", "key": "chat:k"}
    with child("turn_holder", args, env) as proc:
        word, fence, old_owner = _line(proc)
        assert word == "HOLDING"
        other = coordinator_from_url(f"kv:{shared_kv_url}", prefix=prefix, lease_ms=LEASE_MS, role="web")
        try:
            time.sleep(LEASE_MS * 1.5 / 1000)
            assert other.acquire_turn("chat:k", 0) is None  # renewed: still held after more than a lease
            proc.kill()
            proc.wait(timeout=10)
            killed_at = time.monotonic()
            turn = other.acquire_turn("chat:k", LEASE_MS + 3000)
            waited = time.monotonic() - killed_at
            assert turn is not None and turn.fence > int(fence) and turn.previous_holder == old_owner
            assert 0.3 <= waited <= LEASE_MS / 1000 + 1.0
        finally:
            other.close()


def test_a_killed_leader_is_succeeded_by_another_process_after_the_lease(shared_kv_url: str) -> None:
    """SIGKILL the leader: another process leads within lease_ms + 1 s, and the handover is recorded."""
    prefix = unique_id("k")
    url = f"kv:{shared_kv_url}"
    args = {"coordination_url": url, "prefix": prefix, "lease_ms": LEASE_MS, "replica_id": "leader-1"}
    with child("leader_holder", args) as proc:
        word, fence, old_owner = _line(proc)
        assert word == "LEADING"
        other = coordinator_from_url(url, prefix=prefix, lease_ms=LEASE_MS, role="web", replica_id="follower")
        try:
            assert other.try_lead("scheduler") is None
            proc.kill()
            proc.wait(timeout=10)
            killed_at = time.monotonic()
            lease = other.try_lead("scheduler")
            while lease is None and time.monotonic() - killed_at < LEASE_MS / 1000 + 3:
                time.sleep(0.02)
                lease = other.try_lead("scheduler")
            took = time.monotonic() - killed_at
            assert lease is not None and lease.fence > int(fence) and lease.previous_holder == old_owner
            assert took <= LEASE_MS / 1000 + 1.0
            snap = other.snapshot()
            assert [(x.name, x.replica_id) for x in snap.leaders] == [("scheduler", "follower")]
            assert [(e.kind, e.previous) for e in snap.events][:1] == [("handover", old_owner)]
            assert snap.events[0].detail.startswith("previous holder's lease expired (no renewal for ")
        finally:
            other.close()


def test_a_frozen_leader_steps_down_and_writes_nothing_after_a_takeover(shared_kv_url: str) -> None:
    """SIGSTOP the leader past its lease; another process leads and writes; on SIGCONT the leader's write
    is refused: it finds its own lease lost (the local deadline passed while it was frozen)."""
    prefix, table = unique_id("k"), f"coordination/{unique_id()}/data"
    url = f"kv:{shared_kv_url}"
    kv = connect(shared_kv_url)
    args = {"coordination_url": url, "prefix": prefix, "kv_url": shared_kv_url, "table": table}
    with child("leader_writer", {**args, "lease_ms": 600, "run_s": 20}) as proc:
        word, fence = _line(proc)
        assert word == "LEADING" and _line(proc)[0] == "WROTE"
        os.kill(proc.pid, signal.SIGSTOP)
        other = coordinator_from_url(url, prefix=prefix, lease_ms=600, role="web", replica_id="successor")
        try:
            deadline = time.monotonic() + 5
            lease = other.try_lead("scheduler")
            while lease is None and time.monotonic() < deadline:
                time.sleep(0.05)
                lease = other.try_lead("scheduler")
            assert lease is not None and lease.fence > int(fence)
            FenceGuard(kv, table).commit("ticks", lease.fence, [Put("tick", {"fence": lease.fence})], lease=lease)
            os.kill(proc.pid, signal.SIGCONT)
            lines = []
            while not lines or lines[-1][0] != "REFUSED":
                lines.append(_line(proc))
            assert lines[-1] == ["REFUSED", "LeaseLost"]
            assert len(lines) <= 2  # at most a write that was already past its checks when frozen
            assert kv.get(table, "tick").value == {"fence": lease.fence}
        finally:
            other.close()
            kv.close()


def test_a_frozen_lock_holders_fenced_write_is_refused_after_a_takeover(shared_kv_url: str) -> None:
    """SIGSTOP a fenced-lock holder past its TTL; another process takes the lock and writes; the
    holder's write on SIGCONT is refused by the fence (StaleFence) and changes nothing."""
    prefix, table = unique_id("k"), f"coordination/{unique_id()}/data"
    url = f"kv:{shared_kv_url}"
    kv = connect(shared_kv_url)
    args = {"coordination_url": url, "prefix": prefix, "kv_url": shared_kv_url, "table": table, "ttl_ms": 400}
    with child("lock_writer", args) as proc:
        word, fence = _line(proc)
        assert word == "ACQUIRED"
        os.kill(proc.pid, signal.SIGSTOP)
        other = coordinator_from_url(url, prefix=prefix, lease_ms=2000, role="web", replica_id="parent")
        try:
            deadline = time.monotonic() + 5
            got = other.acquire_lock_fenced("lock:job", 5000)
            while got is None and time.monotonic() < deadline:
                time.sleep(0.05)
                got = other.acquire_lock_fenced("lock:job", 5000)
            assert got is not None and got[1] > int(fence)
            FenceGuard(kv, table).commit("job", got[1], [Put("result", {"by": "parent", "fence": got[1]})])
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write("go\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            assert _line(proc) == ["REFUSED", "StaleFence"]
            assert kv.get(table, "result").value == {"by": "parent", "fence": got[1]}
        finally:
            other.close()
            kv.close()
