"""The process-wide DurableKv chosen by ``BOTMESH_KV_URL``.

Opened lazily on first use and reopened after a ``fork`` (Celery prefork
children must not share a parent's sockets). Tests swap it with ``use_kv``.
``DefaultStore`` holds a package's store over that DurableKv (``crm.stores``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from .base import DurableKv

_lock = threading.Lock()
_kv: DurableKv | None = None
_pid: int | None = None
_override: DurableKv | None = None

S = TypeVar("S")


def default_kv() -> DurableKv:
    """Return the configured DurableKv (``settings.BOTMESH_KV_URL``), connecting on first use."""
    global _kv, _pid
    if _override is not None:
        return _override
    with _lock:
        if _kv is None or _pid != os.getpid():
            from django.conf import settings

            from . import connect

            _kv = connect(settings.BOTMESH_KV_URL)
            _pid = os.getpid()
        return _kv


@contextmanager
def use_kv(kv: DurableKv) -> Iterator[DurableKv]:
    """Make ``kv`` the default for the duration of the block (tests, management commands)."""
    global _override
    previous, _override = _override, kv
    try:
        yield kv
    finally:
        _override = previous


class DefaultStore(Generic[S]):
    """The store a package's services and selectors use: built over ``default_kv()``.

    The store is built once per DurableKv and rebuilt when ``default_kv()`` answers
    another one (after ``use_kv`` or a fork); ``use`` swaps it for a block (tests).
    """

    def __init__(self, build: Callable[[DurableKv], S]) -> None:
        """Build the store with ``build(kv)``, lazily, on first ``get``."""
        self._build = build
        self._lock = threading.Lock()
        self._override: S | None = None
        self._cached: tuple[DurableKv, S] | None = None

    def get(self) -> S:
        """Return the ``use`` override, or the store over the current ``default_kv()``."""
        if self._override is not None:
            return self._override
        kv = default_kv()
        with self._lock:
            if self._cached is None or self._cached[0] is not kv:
                self._cached = (kv, self._build(kv))
            return self._cached[1]

    @contextmanager
    def use(self, store: S) -> Iterator[S]:
        """Make ``store`` the one ``get`` returns for the duration of the block."""
        previous, self._override = self._override, store
        try:
            yield store
        finally:
            self._override = previous
