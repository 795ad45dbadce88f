"""botmesh kernel: coordination of replicas (ARCHITECTURE §8) and durable scheduled jobs (§9).

``RedisCoordinator(url, prefix, lease_ms=15000, replica_id=None)`` and
``KvCoordinator(kv, prefix, lease_ms=15000, replica_id=None)`` (over a shared
DurableKv: the embedded default, PostgreSQL-only installations) across
processes, ``MemoryCoordinator(hub, replica_id)`` over a
``MemoryCoordinationHub`` in one process; all implement ``base.Coordinator``.
``runtime.coordinator_from_url`` picks one by URL. ``FenceGuard`` makes a Kv write
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
    "KvCoordinator",
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
    if name == "KvCoordinator":
        from .kv import KvCoordinator

        return KvCoordinator
    if name == "FenceGuard":
        from .fencing import FenceGuard

        return FenceGuard
    raise AttributeError(name)
