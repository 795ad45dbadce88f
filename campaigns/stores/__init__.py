"""Store implementations of the campaigns package: base (contract), memory (reference), kv.

``default_stores()`` returns the ``(CampaignStore, SlotStore)`` pair services and
selectors use: the Kv stores over the process-wide DurableKv (``BOTMESH_KV_URL``).
Tests swap them with ``use_stores``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from botmesh_admin.kv.base import DurableKv
from botmesh_admin.kv.runtime import DefaultStore

from .base import CampaignStore, SlotStore


def _kv_stores(kv: DurableKv) -> tuple[CampaignStore, SlotStore]:
    from .kv import KvCampaignStore, KvSlotStore

    return KvCampaignStore(kv), KvSlotStore(kv)


_default: DefaultStore[tuple[CampaignStore, SlotStore]] = DefaultStore(_kv_stores)


def default_stores() -> tuple[CampaignStore, SlotStore]:
    """Return the campaign and slot stores over the configured DurableKv (or the ``use_stores`` override)."""
    return _default.get()


def use_stores(campaigns: CampaignStore, slots: SlotStore) -> AbstractContextManager[tuple[CampaignStore, SlotStore]]:
    """Make these stores the default for the duration of the block (tests)."""
    return _default.use((campaigns, slots))
