"""The ``kv`` fixture: one DurableKv per backend, fresh for every test.

URLs come from ``tests.backends`` (the suite-wide service plumbing). PostgreSQL
and Redis are shared by every xdist worker, so tests never flush them: each
test uses its own uuid-named tables (fixture ``table``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from botmesh_admin.kv import DurableKv, connect
from tests import backends

SERVICE_BACKENDS = ("postgresql", "redis", "redis-cluster")
SHARED_BACKENDS = ("sqlite", "postgresql", "redis", "redis-cluster")
"""Backends several processes can open at once."""


def backend_params(names: list[str] | tuple[str, ...]) -> list[object]:
    """Return pytest params for ``names``, marking those that need a server."""
    return [pytest.param(name, marks=pytest.mark.services) if name in SERVICE_BACKENDS else name for name in names]


@pytest.fixture(params=backend_params(backends.KV_BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    """Name of the backend under test."""
    return request.param


@pytest.fixture
def kv_url(backend: str, request: pytest.FixtureRequest) -> str:
    """URL of a fresh store of ``backend`` (skips, or fails, when its server is missing)."""
    return backends.kv_url(backend, request)


@pytest.fixture
def kv(kv_url: str) -> Iterator[DurableKv]:
    """A connected DurableKv of every backend, closed after the test."""
    store = connect(kv_url)
    yield store
    store.close()


def new_table(label: str = "t") -> str:
    """Return a table name no other test (or xdist worker) uses."""
    return f"test/{label}/{uuid.uuid4().hex}"


@pytest.fixture
def table() -> str:
    """A fresh table name."""
    return new_table()
