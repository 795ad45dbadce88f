"""The process-wide DurableKv chosen by ``BOTMESH_KV_URL``.

Opened lazily on first use and reopened after a ``fork`` (Celery prefork
children must not share a parent's sockets): a ``ProcessLocal``. Tests swap it
with ``use_kv``.
``DefaultStore`` holds a package's store over that DurableKv (``crm.stores``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from botmesh_admin.processlocal import ProcessLocal

from .base import DurableKv

S = TypeVar("S")


def _connect() -> DurableKv:
    from django.conf import settings

    from . import connect

    return connect(settings.BOTMESH_KV_URL)


_kv: ProcessLocal[DurableKv] = ProcessLocal(_connect)


def default_kv() -> DurableKv:
    """Return the configured DurableKv (``settings.BOTMESH_KV_URL``), connecting on first use."""
    return _kv.get()


@contextmanager
def use_kv(kv: DurableKv) -> Iterator[DurableKv]:
    """Make ``kv`` the default for the duration of the block (tests, management commands)."""
    with _kv.use(kv):
        yield kv


class _Built(Generic[S]):
    """The store built over one DurableKv (of this process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.over: tuple[DurableKv, S] | None = None


class DefaultStore(Generic[S]):
    """The store a package's services and selectors use: built over ``default_kv()``.

    ``ProcessLocal`` semantics: built lazily, once per process (a forked child
    builds its own) and per DurableKv (rebuilt when ``default_kv()`` answers
    another one, after ``use_kv``); thread-safe; ``use`` swaps it for a block
    (tests), ``reset`` drops it.
    """

    def __init__(self, build: Callable[[DurableKv], S]) -> None:
        """Build the store with ``build(kv)``, lazily, on first ``get``."""
        self._build = build
        self._override: S | None = None
        self._built: ProcessLocal[_Built[S]] = ProcessLocal(_Built)

    def get(self) -> S:
        """Return the ``use`` override, or the store over the current ``default_kv()``."""
        if self._override is not None:
            return self._override
        kv = default_kv()
        built = self._built.get()
        over = built.over
        if over is not None and over[0] is kv:
            return over[1]
        with built.lock:
            if built.over is None or built.over[0] is not kv:
                built.over = (kv, self._build(kv))
            return built.over[1]

    @contextmanager
    def use(self, store: S) -> Iterator[S]:
        """Make ``store`` the one ``get`` returns for the duration of the block."""
        previous, self._override = self._override, store
        try:
            yield store
        finally:
            self._override = previous

    def reset(self) -> None:
        """Drop the store built in this process; the next ``get`` builds it again."""
        self._built.reset()
