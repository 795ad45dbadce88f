"""Fixtures for the coordination tests: coordinators of every backend, sharing one namespace.

``kv-*`` are ``KvCoordinator`` over a DurableKv: in-process (``memory://``) and
the two that coordinate processes (an SQLite file, PostgreSQL). Each
coordinator of a Kv deployment opens its own connection, as separate
processes would.

Every deployment but Redis runs on a fake clock (``Deployment.clock``): its
leases live in the coordinator's own arithmetic (the memory hub's monotonic ms,
the Kv records' ``expires_ms``), so a test moves them with ``advance`` instead
of sleeping. Redis expires leases on its server's clock, which no test can move:
there ``clock`` is None and ``elapse`` sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from botmesh_admin.clock import FakeClock, use_clock
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
        # None on Redis: its leases expire in the server's real time.
        self.clock: FakeClock | None = None if name.startswith("redis") else FakeClock()

    def elapse(self, ms: int) -> None:
        """Let ``ms`` of lease time pass: advance the fake clock, or (Redis) sleep that long."""
        if self.clock is not None:
            self.clock.advance(ms)
        else:
            time.sleep(ms / 1000)

    def queued(self, coordinator: Coordinator, key: str) -> int:
        """Return how many tickets wait in the queue of turn ``key`` (live or not), read from the shared state."""
        backend = coordinator._backend
        if self.name == "memory":
            state = backend._keys.get(("t", key))  # type: ignore[attr-defined]
            return 0 if state is None else len(state.queue)
        if self.name.startswith("kv-"):
            from botmesh_admin.coordination.kv import hashed

            entry = backend.kv.get(backend.table, f"t/{hashed(key)}/q")  # type: ignore[attr-defined]
            return 0 if entry is None else len(entry.value["tickets"])
        return int(backend.client.zcard(backend._turn_keys(key)[0][0]))  # type: ignore[attr-defined]

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
    with ExitStack() as stack:
        if dep.clock is not None:
            stack.enter_context(use_clock(dep.clock))  # before the first coordinator, until the last is closed
        yield dep
        dep.close()
