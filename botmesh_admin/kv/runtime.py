"""The process-wide DurableKv chosen by ``BOTMESH_KV_URL``.

Opened lazily on first use and reopened after a ``fork`` (Celery prefork
children must not share a parent's sockets). Tests swap it with ``use_kv``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .base import DurableKv

_lock = threading.Lock()
_kv: DurableKv | None = None
_pid: int | None = None
_override: DurableKv | None = None


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
