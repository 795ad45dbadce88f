"""Store implementations of the inbox package: base (contract), memory (reference), kv.

``default_store()`` is the store services and selectors use: a ``KvInboxStore``
over the process-wide DurableKv (``BOTMESH_KV_URL``). Tests swap it with ``use_store``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .base import InboxStore

_lock = threading.Lock()
_override: InboxStore | None = None
_cached: tuple[object, InboxStore] | None = None


def default_store() -> InboxStore:
    """Return the inbox store over the configured DurableKv (or the ``use_store`` override)."""
    global _cached
    if _override is not None:
        return _override
    from botmesh_admin.kv.runtime import default_kv

    from .kv import KvInboxStore

    kv = default_kv()
    with _lock:
        if _cached is None or _cached[0] is not kv:
            _cached = (kv, KvInboxStore(kv))
        return _cached[1]


@contextmanager
def use_store(store: InboxStore) -> Iterator[InboxStore]:
    """Make ``store`` the default for the duration of the block (tests)."""
    global _override
    previous, _override = _override, store
    try:
        yield store
    finally:
        _override = previous
