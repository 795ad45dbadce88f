"""Fixtures of the campaigns tests: the stores over memory and over every Kv backend."""

from __future__ import annotations

import pytest

from campaigns.stores.base import CampaignStore, SlotStore
from campaigns.stores.kv import KvCampaignStore, KvSlotStore
from campaigns.stores.memory import MemoryCampaignStore, MemorySlotStore
from tests import backends

STORES = ["memory-store", *(f"kv-{name}" for name in backends.KV_BACKENDS)]


def open_stores(name: str, request: pytest.FixtureRequest) -> tuple[CampaignStore, SlotStore]:
    """Return fresh stores: the reference memory stores, or the Kv stores on one backend."""
    if name == "memory-store":
        return MemoryCampaignStore(), MemorySlotStore()
    kv = backends.open_kv(name.removeprefix("kv-"), request)
    return KvCampaignStore(kv), KvSlotStore(kv)


@pytest.fixture(params=STORES)
def stores(request: pytest.FixtureRequest) -> tuple[CampaignStore, SlotStore]:
    """A fresh (CampaignStore, SlotStore) pair of each implementation in turn (use ``tenant_id``)."""
    return open_stores(request.param, request)


@pytest.fixture
def slot_store(stores: tuple[CampaignStore, SlotStore]) -> SlotStore:
    return stores[1]


@pytest.fixture
def campaign_store(stores: tuple[CampaignStore, SlotStore]) -> CampaignStore:
    return stores[0]
