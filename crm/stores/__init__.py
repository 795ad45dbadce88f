"""Store implementations of the crm package: base (contract), memory (reference), kv.

``default_store()`` is the store services and selectors use: a ``KvContactStore``
over the process-wide DurableKv (``BOTMESH_KV_URL``). Tests swap it with ``use_store``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from botmesh_admin.kv.base import DurableKv
from botmesh_admin.kv.runtime import DefaultStore

from .base import ContactStore


def _kv_store(kv: DurableKv) -> ContactStore:
    from .kv import KvContactStore

    return KvContactStore(kv)


_default: DefaultStore[ContactStore] = DefaultStore(_kv_store)


def default_store() -> ContactStore:
    """Return the CRM store over the configured DurableKv (or the ``use_store`` override)."""
    return _default.get()


def use_store(store: ContactStore) -> AbstractContextManager[ContactStore]:
    """Make ``store`` the default for the duration of the block (tests)."""
    return _default.use(store)
