"""A per-process cache of one value per (Kv, table): a bounded LRU, thread-safe.

What a table's writers check on every commit — the index states
(``kv.indexes``), a package's definitions (the CRM's segment membership) —
is read once per process and kept here; the commit checks the cached
version, and a writer whose commit failed on it ``forget``s the table and
reads it again. Keys are the Kv object's identity and the table name, so two
Kv connections (tests, a restore) never share an entry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from .base import DurableKv

V = TypeVar("V")


class TableCache(Generic[V]):
    """At most ``size`` values, the least recently used dropped first."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._size = size
        self._items: OrderedDict[tuple[int, str], V] = OrderedDict()

    def get(self, kv: DurableKv, table: str) -> V | None:
        """Return the cached value of ``table`` in ``kv``, or ``None``."""
        key = (id(kv), table)
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def load(self, kv: DurableKv, table: str, read: Callable[[], V]) -> V:
        """Return the cached value, or ``read()`` (outside the lock) and cache it."""
        found = self.get(kv, table)
        if found is not None:
            return found
        value = read()
        self.put(kv, table, value)
        return value

    def put(self, kv: DurableKv, table: str, value: V) -> None:
        """Cache ``value`` for ``table`` in ``kv``."""
        with self._lock:
            self._items[(id(kv), table)] = value
            self._items.move_to_end((id(kv), table))
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def forget(self, kv: DurableKv, table: str) -> None:
        """Drop the cached value of ``table`` in ``kv`` (it moved: read it again)."""
        with self._lock:
            self._items.pop((id(kv), table), None)


__all__ = ["TableCache"]
