"""Fixtures of the campaigns tests: the stores over memory and over every Kv backend."""

from __future__ import annotations

import pytest

from botmesh_admin.kv import DurableKv
from campaigns.stores.base import CampaignStore, SlotStore
from campaigns.stores.kv import KvCampaignStore, KvSlotStore
from campaigns.stores.memory import MemoryCampaignStore, MemorySlotStore
from tests.stores import store_fixture


def _memory_stores() -> tuple[CampaignStore, SlotStore]:
    return MemoryCampaignStore(), MemorySlotStore()


def _kv_stores(kv: DurableKv) -> tuple[CampaignStore, SlotStore]:
    return KvCampaignStore(kv), KvSlotStore(kv)


stores = store_fixture("stores", memory=_memory_stores, kv=_kv_stores)
"""A fresh (CampaignStore, SlotStore) pair of each kind in turn (use ``tenant_id``)."""


@pytest.fixture
def slot_store(stores: tuple[CampaignStore, SlotStore]) -> SlotStore:
    return stores[1]


@pytest.fixture
def campaign_store(stores: tuple[CampaignStore, SlotStore]) -> CampaignStore:
    return stores[0]


# --------------------------------------------------------------------------- a tenant with a CRM and campaigns


@pytest.fixture
def world(tenant_id: str, db):
    """Memory CRM + campaign stores for ``tenant_id`` (region CO); yield the tenant id."""
    from campaigns.stores import CampaignStores
    from campaigns.stores import use_store as use_campaign_store
    from crm import selectors as crm_selectors
    from crm.stores import use_store as use_contact_store
    from crm.stores.memory import MemoryContactStore

    crm_selectors._regions[tenant_id] = ("CO", float("inf"))
    with (
        use_contact_store(MemoryContactStore()),
        use_campaign_store(CampaignStores(MemoryCampaignStore(), MemorySlotStore())),
    ):
        yield tenant_id
    crm_selectors.tenant_region_forget(tenant_id)


@pytest.fixture
def fake():
    """A running FakeProviderServer (WhatsApp + Telegram send APIs)."""
    from botmesh_admin.channels.testing import FakeProviderServer

    with FakeProviderServer() as server:
        yield server


def make_contacts(
    tenant: str,
    n: int,
    *,
    channel: str = "whatsapp",
    consent: str = "granted",
    tags: tuple[str, ...] = ("promo",),
    start: int = 0,
) -> list:
    """Create ``n`` contacts with one identity on ``channel`` and that consent; return them."""
    from crm.services import contact_create

    out = []
    for i in range(start, start + n):
        address = f"+5730{i:08d}" if channel == "whatsapp" else str(700_000_000 + i)
        out.append(
            contact_create(
                tenant,
                identities=[{"channel": channel, "address": address}],
                name=f"Cliente {i}",
                tags=tags,
                consent={channel: consent} if consent else None,
                source="test",
            )
        )
    return out
