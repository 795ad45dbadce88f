"""Fixtures of the crm tests: the ContactStore over memory and over every Kv backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from crm import selectors
from crm.stores import use_store
from crm.stores.base import ContactStore
from crm.stores.kv import KvContactStore
from crm.stores.memory import MemoryContactStore
from tests.stores import store_fixture

contact_store = store_fixture("contact_store", memory=MemoryContactStore, kv=KvContactStore)


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
