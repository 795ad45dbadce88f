"""botmesh kernel: coordination of replicas (ARCHITECTURE §8) and durable scheduled jobs (§9).

``RedisCoordinator(url, prefix, lease_ms=15000, replica_id=None)`` in production,
``MemoryCoordinator(hub, replica_id)`` over a ``MemoryCoordinationHub`` in one
process; both implement ``base.Coordinator``. ``FenceGuard`` makes a Kv write
conditional on a lease's fence. Backends are imported lazily.
"""

from __future__ import annotations

from typing import Any

from .base import (
    EVENT_KINDS,
    CoordinationEvent,
    CoordinationSnapshot,
    Coordinator,
    LeaderStatus,
    LeaseHandle,
    LeaseLost,
    ReplicaStatus,
    StaleFence,
    bot_prefix,
)

__all__ = [
    "EVENT_KINDS",
    "CoordinationEvent",
    "CoordinationSnapshot",
    "Coordinator",
    "FenceGuard",
    "LeaderStatus",
    "LeaseHandle",
    "LeaseLost",
    "MemoryCoordinationHub",
    "MemoryCoordinator",
    "RedisCoordinator",
    "ReplicaStatus",
    "StaleFence",
    "bot_prefix",
]


def __getattr__(name: str) -> Any:
    if name in ("MemoryCoordinationHub", "MemoryCoordinator"):
        from . import memory

        return getattr(memory, name)
    if name == "RedisCoordinator":
        from .redis import RedisCoordinator

        return RedisCoordinator
    if name == "FenceGuard":
        from .fencing import FenceGuard

        return FenceGuard
    raise AttributeError(name)
