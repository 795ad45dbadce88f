"""Fixtures of the hub tests: the PluginStore over memory and over every Kv backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from botmesh_admin.demo import fixtures_dir
from hub.domain import RuntimeInfo
from hub.stores import use_store
from hub.stores.base import PluginStore
from hub.stores.kv import KvPluginStore
from hub.stores.memory import MemoryPluginStore
from tests.stores import store_fixture
from tests.tenants import World, bearer, world

__all__ = ["World", "bearer", "world"]  # re-exported: pytest finds the fixture here, the tests import World from here

RUNTIME = RuntimeInfo.from_json(json.loads((fixtures_dir() / "hub" / "runtime.json").read_text()))
"""The fixture runtime, 1.6.2 with the eight permissions (the shipped default is a copy of it)."""


plugin_store = store_fixture("plugin_store", memory=MemoryPluginStore, kv=KvPluginStore)


@pytest.fixture
def hub(plugin_store: PluginStore) -> Iterator[PluginStore]:
    """``plugin_store`` as the hub's store (``use_store``) for the test; the runtime is the shipped 1.6.2."""
    with use_store(plugin_store):
        yield plugin_store


@pytest.fixture(scope="session")
def hub_fixtures() -> Path:
    """``fixtures/hub`` (read-only)."""
    return fixtures_dir() / "hub"


@pytest.fixture(scope="session")
def order_status(hub_fixtures: Path) -> bytes:
    """order-status 1.4.0 (four permissions)."""
    return (hub_fixtures / "valid" / "order-status.json").read_bytes()


@pytest.fixture(scope="session")
def order_status_more(hub_fixtures: Path) -> bytes:
    """order-status 1.5.0: 1.4.0's permissions plus contacts:write."""
    return (hub_fixtures / "valid" / "order-status-1.5.0-more-perms.json").read_bytes()
