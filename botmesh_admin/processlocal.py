"""Per-process singletons: built lazily, once per process, rebuilt after ``fork``.

A connection pool, a socket or an SQLite handle must not be shared between a
parent and the children it forks (Celery prefork, gunicorn): both would talk
over the same socket. ``ProcessLocal`` builds its value on the first ``get`` in
each process and builds a new one in a forked child; the inherited one is
dropped, not closed (closing it would end the parent's session too). Tests
swap the value for a block with ``use``.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")

_UNSET: object = object()

# Every ProcessLocal, so a forked child can give each a fresh lock: a lock another
# thread of the parent held at the fork stays held for good in the child.
_instances: weakref.WeakSet[ProcessLocal[object]] = weakref.WeakSet()


class ProcessLocal(Generic[T]):
    """One value per process, built by ``factory()`` on the first ``get``.

    Thread-safe: concurrent first ``get`` calls build the value once. ``close``
    (optional) is called with a value ``reset`` drops in the process that built it.
    """

    def __init__(self, factory: Callable[[], T], *, close: Callable[[T], None] | None = None) -> None:
        """Remember ``factory`` (and ``close``); nothing is built until ``get``."""
        self._factory = factory
        self._close = close
        self._lock = threading.Lock()
        self._value: object = _UNSET
        self._pid: int | None = None
        self._override: object = _UNSET
        _instances.add(self)  # type: ignore[arg-type]

    def get(self) -> T:
        """Return the ``use`` override, or this process's value (building it on first use)."""
        override = self._override
        if override is not _UNSET:
            return override  # type: ignore[return-value]
        pid = os.getpid()
        value = self._value
        if value is not _UNSET and self._pid == pid:
            return value  # type: ignore[return-value]
        with self._lock:
            if self._value is _UNSET or self._pid != pid:
                # Set the pid last: another thread's fast path must never see the new
                # pid beside the old (inherited) value.
                self._value = self._factory()
                self._pid = pid
            return self._value  # type: ignore[return-value]

    @contextmanager
    def use(self, value: T) -> Iterator[T]:
        """Make ``get`` return ``value`` (in every thread) for the duration of the block."""
        previous, self._override = self._override, value
        try:
            yield value
        finally:
            self._override = previous

    def reset(self) -> None:
        """Drop this process's value (closing it with ``close``); the next ``get`` builds a new one."""
        with self._lock:
            value, pid = self._value, self._pid
            self._value, self._pid = _UNSET, None
        if value is not _UNSET and pid == os.getpid() and self._close is not None:
            self._close(value)  # type: ignore[arg-type]

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    for local in list(_instances):
        local._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["ProcessLocal"]
