"""Store implementations of the campaigns package: base (contract), memory (reference), kv.

``default_store()`` returns the ``CampaignStores`` pair (``campaigns``, ``slots``)
services and selectors use: the Kv stores over the process-wide DurableKv
(``BOTMESH_KV_URL``). Tests swap the pair with ``use_store``. The package's two stores
travel as one value so that every app's ``stores`` offers the same two functions.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import NamedTuple

from botmesh_admin.kv.base import DurableKv
from botmesh_admin.kv.runtime import DefaultStore

from .base import CampaignStore, SlotStore


class CampaignStores(NamedTuple):
    """The campaigns package's two stores; unpacks as ``campaigns, slots``."""

    campaigns: CampaignStore
    slots: SlotStore


def _kv_stores(kv: DurableKv) -> CampaignStores:
    from .kv import KvCampaignStore, KvSlotStore

    return CampaignStores(KvCampaignStore(kv), KvSlotStore(kv))


_default: DefaultStore[CampaignStores] = DefaultStore(_kv_stores)


def default_store() -> CampaignStores:
    """Return the campaign and slot stores over the configured DurableKv (or the ``use_store`` override)."""
    return _default.get()


def use_store(stores: CampaignStores) -> AbstractContextManager[CampaignStores]:
    """Make ``stores`` (a ``CampaignStores`` pair) the default for the duration of the block (tests)."""
    return _default.use(stores)
