"""Store implementations of the deployments package: base (contract), memory (reference), kv.

``default_store()`` is the store services and selectors use: a ``KvDeploymentStore``
over the process-wide DurableKv (``BOTMESH_KV_URL``). Tests swap it with ``use_store``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from botmesh_admin.kv.base import DurableKv
from botmesh_admin.kv.runtime import DefaultStore

from .base import DeploymentStore


def _kv_store(kv: DurableKv) -> DeploymentStore:
    from .kv import KvDeploymentStore

    return KvDeploymentStore(kv)


_default: DefaultStore[DeploymentStore] = DefaultStore(_kv_store)


def default_store() -> DeploymentStore:
    """Return the deployment store over the configured DurableKv (or the ``use_store`` override)."""
    return _default.get()


def use_store(store: DeploymentStore) -> AbstractContextManager[DeploymentStore]:
    """Make ``store`` the default for the duration of the block (tests)."""
    return _default.use(store)
