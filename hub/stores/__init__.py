"""Store implementations of the hub package: base (contract), memory (reference), kv.

``default_store()`` is the store services and selectors use: a ``KvPluginStore``
over the process-wide DurableKv (``BOTMESH_KV_URL``). Tests swap it with ``use_store``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from botmesh_admin.kv.base import DurableKv
from botmesh_admin.kv.runtime import DefaultStore

from .base import PluginStore


def _kv_store(kv: DurableKv) -> PluginStore:
    from .kv import KvPluginStore

    return KvPluginStore(kv)


_default: DefaultStore[PluginStore] = DefaultStore(_kv_store)


def default_store() -> PluginStore:
    """Return the plugin store over the configured DurableKv (or the ``use_store`` override)."""
    return _default.get()


def use_store(store: PluginStore) -> AbstractContextManager[PluginStore]:
    """Make ``store`` the default for the duration of the block (tests)."""
    return _default.use(store)
