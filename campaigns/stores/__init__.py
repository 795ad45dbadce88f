"""Store implementations of the campaigns package: base (contract), memory (reference), kv.

``default_stores()`` returns the ``(CampaignStore, SlotStore)`` pair services and
selectors use: the Kv stores over the process-wide DurableKv (``BOTMESH_KV_URL``).
Tests swap them with ``use_stores``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .base import CampaignStore, SlotStore

_lock = threading.Lock()
_override: tuple[CampaignStore, SlotStore] | None = None
_cached: tuple[object, tuple[CampaignStore, SlotStore]] | None = None


def default_stores() -> tuple[CampaignStore, SlotStore]:
    """Return the campaign and slot stores over the configured DurableKv (or the ``use_stores`` override)."""
    global _cached
    if _override is not None:
        return _override
    from botmesh_admin.kv.runtime import default_kv

    from .kv import KvCampaignStore, KvSlotStore

    kv = default_kv()
    with _lock:
        if _cached is None or _cached[0] is not kv:
            _cached = (kv, (KvCampaignStore(kv), KvSlotStore(kv)))
        return _cached[1]


@contextmanager
def use_stores(campaigns: CampaignStore, slots: SlotStore) -> Iterator[tuple[CampaignStore, SlotStore]]:
    """Make these stores the default for the duration of the block (tests)."""
    global _override
    previous, _override = _override, (campaigns, slots)
    try:
        yield _override
    finally:
        _override = previous
