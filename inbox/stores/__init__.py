"""Store implementations of the inbox package: base (contract), memory (reference), kv.

``default_store()`` is the store services and selectors use: a ``KvInboxStore``
over the process-wide DurableKv (``BOTMESH_KV_URL``). Tests swap it with ``use_store``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from botmesh_admin.kv.base import DurableKv
from botmesh_admin.kv.runtime import DefaultStore

from .base import InboxStore


def _kv_store(kv: DurableKv) -> InboxStore:
    from .kv import KvInboxStore

    return KvInboxStore(kv)


_default: DefaultStore[InboxStore] = DefaultStore(_kv_store)


def default_store() -> InboxStore:
    """Return the inbox store over the configured DurableKv (or the ``use_store`` override)."""
    return _default.get()


def use_store(store: InboxStore) -> AbstractContextManager[InboxStore]:
    """Make ``store`` the default for the duration of the block (tests)."""
    return _default.use(store)
