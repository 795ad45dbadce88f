"""The one store-fixture factory every package's conftest uses.

A package store has a reference implementation in memory and one over the
DurableKv; its contract tests run over the memory store and over the Kv store
on every Kv backend. The kinds are spelled alike for every package:
``memory`` and ``kv-<backend>`` (``kv-memory``, ``kv-sqlite``, ``kv-postgresql``, …),
so ``-k memory`` or ``-k kv-sqlite`` selects the same slice everywhere.

    plugin_store = store_fixture("plugin_store", memory=MemoryPluginStore, kv=KvPluginStore)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from botmesh_admin.kv import DurableKv
from tests import backends

S = TypeVar("S")

SERVER_BACKENDS = ("postgresql", "redis", "redis-cluster")
"""The Kv backends that need a server: their kinds are marked ``services`` (``-m "not services"``)."""

STORE_KINDS: list[Any] = [
    "memory",
    *(
        pytest.param(f"kv-{name}", marks=pytest.mark.services) if name in SERVER_BACKENDS else f"kv-{name}"
        for name in backends.KV_BACKENDS
    ),
]
"""Every kind of package store: the memory store, then the Kv store on each Kv backend (pytest params)."""


def kind_name(kind: Any) -> str:
    """Return the name of a kind of ``STORE_KINDS`` (a string or a ``pytest.param`` of one)."""
    return kind if isinstance(kind, str) else str(kind.values[0])


def open_store(
    kind: str, request: pytest.FixtureRequest, *, memory: Callable[[], S], kv: Callable[[DurableKv], S]
) -> S:
    """Return a fresh store of ``kind``: ``memory()``, or ``kv(<a fresh DurableKv of the backend>)``.

    The Kv is closed when the test ends; a backend whose server is missing skips the test.
    """
    if kind == "memory":
        return memory()
    if not kind.startswith("kv-"):
        raise ValueError(f"unknown store kind {kind!r}; one of {', '.join(STORE_KINDS)}")
    return kv(backends.open_kv(kind.removeprefix("kv-"), request))


def store_fixture(
    name: str, *, memory: Callable[[], S], kv: Callable[[DurableKv], S], kinds: list[Any] | None = None
) -> Any:
    """Return a pytest fixture ``name`` giving a fresh store of each of ``kinds`` (default ``STORE_KINDS``) in turn.

    Assign it in a conftest under the same name (``plugin_store = store_fixture("plugin_store", …)``);
    tests use a tenant unique to them (``tenant_id``), since PostgreSQL and Redis are shared.
    """

    def fixture(request: pytest.FixtureRequest) -> S:
        return open_store(request.param, request, memory=memory, kv=kv)

    fixture.__name__ = name
    fixture.__doc__ = f"A fresh store of each kind in turn ({', '.join(map(kind_name, kinds or STORE_KINDS))})."
    return pytest.fixture(params=kinds or STORE_KINDS, name=name)(fixture)


__all__ = ["SERVER_BACKENDS", "STORE_KINDS", "kind_name", "open_store", "store_fixture"]
