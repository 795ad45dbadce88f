"""The DurableKv backends every contract test runs over.

``open_kv(name, request)`` returns a fresh DurableKv of one backend; PostgreSQL
and Redis are shared by every xdist worker, so callers must use table names (or
tenant ids) unique to the test — ``unique_id()`` gives one.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from botmesh_admin.kv import DurableKv, Entry, connect
from botmesh_admin.kv.memory import MemoryKv

KV_BACKENDS = ["memory", "file", "sqlite", "postgresql", "redis", "redis-cluster"]


def unique_id(prefix: str = "t") -> str:
    """Return an id valid as a tenant id and unique across workers (``t-3f2a9c1b0d``)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def kv_url(name: str, request: pytest.FixtureRequest) -> str:
    """Return the URL of backend ``name`` (files under the test's tmp_path; servers from the env)."""
    if name == "memory":
        return "memory://"
    if name in ("file", "sqlite"):
        tmp = request.getfixturevalue("tmp_path")
        return f"file://{tmp}/kv.json" if name == "file" else f"sqlite:///{tmp}/kv.sqlite3"
    if name == "postgresql":
        return request.getfixturevalue("postgres_url")
    if name == "redis":
        return request.getfixturevalue("redis_url")
    if name == "redis-cluster":
        return request.getfixturevalue("redis_cluster_url")
    raise ValueError(name)


def open_kv(name: str, request: pytest.FixtureRequest) -> DurableKv:
    """Connect to backend ``name`` and close it when the test ends."""
    kv = connect(kv_url(name, request))
    request.addfinalizer(kv.close)
    return kv


class CountingKv(MemoryKv):
    """A MemoryKv that counts the entries its reads return or look up (what a page read touches).

    Set ``touched = 0``, run one read, and compare ``touched`` with the page size:
    a read that stays O(page) touches about one page of entries however many the table holds.
    """

    touched = 0

    def get(self, table: str, key: str) -> Entry | None:
        self.touched += 1
        return super().get(table, key)

    def get_many(self, table: str, keys: Any) -> list[Entry | None]:
        self.touched += len(keys)
        return super().get_many(table, keys)

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Entry]:
        page = super().scan(table, prefix, after, limit)
        self.touched += max(1, len(page))
        return page

    def scan_follow(
        self, table: str, prefix: str = "", after: str | None = None, limit: int = 100, *, field: str = "pk"
    ) -> list[tuple[Entry, Entry | None]]:
        pairs = super().scan_follow(table, prefix, after, limit, field=field)
        self.touched += max(1, len(pairs)) + sum(1 for _, target in pairs if target is not None)
        return pairs
