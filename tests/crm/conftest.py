"""Fixtures of the crm tests: the ContactStore over memory and over every Kv backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crm import selectors
from crm.stores import use_store
from crm.stores.base import ContactStore
from crm.stores.kv import KvContactStore
from crm.stores.memory import MemoryContactStore
from tests import backends

STORES = ["memory-store", *(f"kv-{name}" for name in backends.KV_BACKENDS)]


def open_store(name: str, request: pytest.FixtureRequest) -> ContactStore:
    """Return a fresh store: the reference memory store, or the Kv store on one backend."""
    if name == "memory-store":
        return MemoryContactStore()
    return KvContactStore(backends.open_kv(name.removeprefix("kv-"), request))


@pytest.fixture(params=STORES)
def contact_store(request: pytest.FixtureRequest) -> ContactStore:
    """A fresh ContactStore of each implementation in turn (use the ``tenant_id`` fixture)."""
    return open_store(request.param, request)


@pytest.fixture
def crm(contact_store: ContactStore, tenant_id: str) -> Iterator[str]:
    """Make ``contact_store`` the services' store; yield a fresh tenant id (region CO)."""
    selectors._regions[tenant_id] = ("CO", float("inf"))
    with use_store(contact_store):
        yield tenant_id
    selectors.tenant_region_forget(tenant_id)


@pytest.fixture
def memory_crm(tenant_id: str) -> Iterator[str]:
    """Like ``crm`` but only over the memory store (for behaviour that no backend changes)."""
    selectors._regions[tenant_id] = ("CO", float("inf"))
    with use_store(MemoryContactStore()):
        yield tenant_id
    selectors.tenant_region_forget(tenant_id)
