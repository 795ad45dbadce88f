"""Replicas run as real subprocesses by the coordination tests (SIGSTOP, SIGKILL).

``python -m tests.coordination.workers <command> <json args>``; each prints one
line per step (flushed) and reads ``go`` lines from stdin where it must wait.
Kept free of pytest and Django imports so it starts quickly. With a
``coordination_url`` in the args a replica coordinates through
``coordinator_from_url`` (``kv:<kv url>``: the Kv coordinator), else through
``redis_url``.
"""

from __future__ import annotations

import json
import sys
import time

from botmesh_admin.coordination.fencing import FenceGuard
from botmesh_admin.coordination.redis import RedisCoordinator
from botmesh_admin.kv import Put, connect


def say(*parts: object) -> None:
    print(*parts, flush=True)


def coordinator(args: dict, lease_ms: int, replica_id: str, kv: object = None):  # type: ignore[no-untyped-def]
    """The replica's coordinator: by ``coordination_url`` if given, else Redis with ``kv`` for fences."""
    if "coordination_url" in args:
        from botmesh_admin.coordination.runtime import coordinator_from_url

        url, prefix = args["coordination_url"], args["prefix"]
        return coordinator_from_url(url, prefix=prefix, lease_ms=lease_ms, role="worker", replica_id=replica_id)
    return RedisCoordinator(
        args["redis_url"], args["prefix"], lease_ms, replica_id, fence_kv=kv or connect(args["kv_url"])
    )


def lock_writer(args: dict) -> None:
    """Take a fenced lock, wait for ``go``, then try one fenced write with that fence."""
    kv = connect(args["kv_url"])
    replica = coordinator(args, 2000, "lock-child", kv)
    got = replica.acquire_lock_fenced("lock:job", args["ttl_ms"])
    assert got is not None
    say("ACQUIRED", got[1])
    sys.stdin.readline()
    try:
        FenceGuard(kv, args["table"]).commit("job", got[1], [Put("result", {"by": "child", "fence": got[1]})])
        say("WROTE")
    except Exception as exc:  # noqa: BLE001 (reported to the parent)
        say("REFUSED", type(exc).__name__)
    replica.close(release=False)


def leader_writer(args: dict) -> None:
    """Lead ``scheduler`` and keep writing with the leadership's fence until told to stop."""
    kv = connect(args["kv_url"])
    replica = coordinator(args, args["lease_ms"], "leader-child", kv)
    lease = replica.try_lead("scheduler")
    assert lease is not None
    say("LEADING", lease.fence)
    guard = FenceGuard(kv, args["table"])
    stop_at = time.monotonic() + args["run_s"]
    while time.monotonic() < stop_at:
        try:
            guard.commit("ticks", lease.fence, [Put("tick", {"fence": lease.fence, "t": time.time()})], lease=lease)
            say("WROTE", lease.fence)
        except Exception as exc:  # noqa: BLE001 (reported to the parent)
            say("REFUSED", type(exc).__name__)
            break
        time.sleep(0.02)
    replica.close(release=False)


def turn_holder(args: dict) -> None:
    """Take a turn and hold it (renewed) until killed."""
    replica = coordinator(args, args["lease_ms"], args["replica_id"])
    turn = replica.acquire_turn(args["key"], 0)
    assert turn is not None
    say("HOLDING", turn.fence, replica.owner)
    time.sleep(600)


def leader_holder(args: dict) -> None:
    """Lead ``scheduler`` and hold it (renewed) until killed."""
    replica = coordinator(args, args["lease_ms"], args["replica_id"])
    lease = replica.try_lead("scheduler")
    assert lease is not None
    say("LEADING", lease.fence, replica.owner)
    time.sleep(600)


if __name__ == "__main__":
    commands = {
        "lock_writer": lock_writer,
        "leader_writer": leader_writer,
        "turn_holder": turn_holder,
        "leader_holder": leader_holder,
    }
    commands[sys.argv[1]](json.loads(sys.argv[2]))
