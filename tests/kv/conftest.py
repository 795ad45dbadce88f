"""The ``kv`` fixture: one DurableKv per backend, fresh for every test.

PostgreSQL and Redis are shared by every xdist worker, so tests never flush
them: each test uses its own uuid-named tables (fixture ``table``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh_admin.kv import DurableKv, connect

LOCAL_BACKENDS = ("memory", "file", "sqlite")
SERVICE_BACKENDS = ("postgresql", "redis", "redis-cluster")
BACKENDS = LOCAL_BACKENDS + SERVICE_BACKENDS
SHARED_BACKENDS = ("sqlite", "postgresql", "redis", "redis-cluster")
"""Backends several processes can open at once."""


def backend_params(names: tuple[str, ...]) -> list[object]:
    """Return pytest params for ``names``, marking those that need a server."""
    return [
        pytest.param(name, marks=pytest.mark.services) if name in SERVICE_BACKENDS else name
        for name in names
    ]


def url_for(backend: str, request: pytest.FixtureRequest, directory: Path) -> str:
    """Return the URL of ``backend``; a server-backed one skips (or fails) when absent."""
    if backend == "memory":
        return "memory://"
    if backend == "file":
        return f"file://{directory}/kv.json"
    if backend == "sqlite":
        return f"sqlite:///{directory}/kv.db"
    fixture = {
        "postgresql": "postgres_url",
        "redis": "redis_url",
        "redis-cluster": "redis_cluster_url",
    }[backend]
    return request.getfixturevalue(fixture)


@pytest.fixture(params=backend_params(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    """Name of the backend under test."""
    return request.param


@pytest.fixture
def kv_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of a fresh store of ``backend``."""
    return url_for(backend, request, tmp_path)


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
