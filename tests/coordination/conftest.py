"""Fixtures for the coordination tests: coordinators of every backend, sharing one namespace.

``kv-*`` are ``KvCoordinator`` over a DurableKv: in-process (``memory://``) and
the two that coordinate processes (an SQLite file, PostgreSQL). Each
coordinator of a Kv deployment opens its own connection, as separate
processes would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from botmesh_admin.coordination.core import Coordinator
from botmesh_admin.coordination.memory import MemoryCoordinationHub, MemoryCoordinator
from botmesh_admin.kv import DurableKv
from botmesh_admin.kv.memory import MemoryKv
from tests.backends import kv_url, unique_id

COORDINATION_BACKENDS = ["memory", "redis", "redis-cluster", "kv-memory", "kv-sqlite", "kv-postgresql"]
LEASE_MS = 1500

MakeCoordinator = Callable[..., Coordinator]


class Deployment:
    """Coordinators of one backend that see each other (one hub, or one Redis prefix)."""

    def __init__(self, name: str, request: pytest.FixtureRequest) -> None:
        self.name = name
        self.prefix = unique_id("c")
        self.hub = MemoryCoordinationHub()
        self.fence_kv: DurableKv = MemoryKv("memory://")
        self.url = ""
        if name == "redis":
            self.url = request.getfixturevalue("redis_url")
        elif name == "redis-cluster":
            self.url = request.getfixturevalue("redis_cluster_url")
        elif name.startswith("kv-"):
            self.url = kv_url(name[3:], request)
        self.shared_kv: DurableKv | None = self.fence_kv if name == "kv-memory" else None
        self.made: list[Coordinator] = []

    def make(self, replica_id: str | None = None, lease_ms: int = LEASE_MS, role: str = "web") -> Coordinator:
        if self.name == "memory":
            coordinator: Coordinator = MemoryCoordinator(self.hub, replica_id, lease_ms=lease_ms, role=role)
        elif self.name.startswith("kv-"):
            from botmesh_admin.coordination.kv import KvCoordinator
            from botmesh_admin.kv import connect

            # memory:// is one Kv per connection: its coordinators share one; the others connect each.
            owned = self.shared_kv is None
            kv = connect(self.url) if owned else self.shared_kv
            coordinator = KvCoordinator(kv, self.prefix, lease_ms, replica_id, role=role, owns_kv=owned)
        else:
            from botmesh_admin.coordination.redis import RedisCoordinator

            coordinator = RedisCoordinator(
                self.url, self.prefix, lease_ms, replica_id, role=role, fence_kv=self.fence_kv
            )
        self.made.append(coordinator)
        return coordinator

    def lock_ttl_ms(self, coordinator: Coordinator, key: str) -> int | None:
        return coordinator._backend.lock_ttl_ms(key)  # type: ignore[attr-defined]

    def close(self) -> None:
        for coordinator in self.made:
            coordinator.close(release=False)


@pytest.fixture(params=COORDINATION_BACKENDS)
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """A fresh namespace on each coordination backend in turn."""
    dep = Deployment(request.param, request)
    yield dep
    dep.close()
