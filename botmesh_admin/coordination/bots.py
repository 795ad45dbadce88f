"""Where the admin reads a bot's coordination state: one backend per bot prefix.

Every replica of bot ``b`` in tenant ``t`` coordinates under
``base.bot_prefix(t, b)`` on the deployment's coordination service; the
Replicas page reads the same keys through a ``core.Backend`` opened for that
prefix. The URL is ``runtime.coordination_url()`` (``BOTMESH_COORDINATION_URL``,
else the Redis URL, else ``kv:``, the DurableKv of the embedded default), opened
with ``runtime.backend_from_url(url, prefix)``; ``memory:`` gets an in-process
``MemoryCoordinationHub`` per prefix (only replicas in this process show).
Backends are cached per ``(url, prefix)``, at most ``CACHED_BACKENDS``, the
least recently used closed first. Tests swap the factory with ``use_bot_backends``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .core import Backend
from .memory import MemoryCoordinationHub

CACHED_BACKENDS = 64

BackendFactory = Callable[[str], Backend]

_lock = threading.Lock()
_cache: OrderedDict[tuple[str, str], Backend] = OrderedDict()
_hubs: dict[str, MemoryCoordinationHub] = {}
_override: BackendFactory | None = None


def coordination_url() -> str:
    """Return the coordination URL bots' replicas use (``runtime.coordination_url``)."""
    from .runtime import coordination_url as url

    return url()


def backend_label(url: str) -> str:
    """Return how the page names the coordination service behind ``url`` (no credentials)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "memory":
        return "this process's hub (memory:, no other process)"
    return {
        "redis": "Redis",
        "rediss": "Redis",
        "redis+cluster": "Redis Cluster",
        "kv": "the Kv",
        "memory": "memory",
    }.get(scheme, scheme)


def process_bot_hub(prefix: str) -> MemoryCoordinationHub:
    """Return this process's hub for ``prefix`` (``memory:``)."""
    with _lock:
        hub = _hubs.get(prefix)
        if hub is None:
            hub = _hubs[prefix] = MemoryCoordinationHub()
        return hub


def _open(url: str, prefix: str) -> Backend:
    from .runtime import backend_from_url

    if url == "memory:":  # the process hub is one prefix's: keep bots apart
        return process_bot_hub(prefix)
    return backend_from_url(url, prefix)


def bot_backend(prefix: str) -> Backend:
    """Return the backend of the bot prefix ``prefix`` (cached; see the module docstring)."""
    if _override is not None:
        return _override(prefix)
    url = coordination_url()
    ident = (url, prefix)
    with _lock:
        backend = _cache.get(ident)
        if backend is not None:
            _cache.move_to_end(ident)
            return backend
    backend = _open(url, prefix)
    with _lock:
        _cache[ident] = backend
        evicted = [_cache.popitem(last=False)[1] for _ in range(max(0, len(_cache) - CACHED_BACKENDS))]
    for old in evicted:
        old.close()
    return backend


@contextmanager
def use_bot_backends(factory: BackendFactory) -> Iterator[BackendFactory]:
    """Read every bot prefix through ``factory(prefix)`` for the duration of the block (tests)."""
    global _override
    previous, _override = _override, factory
    try:
        yield factory
    finally:
        _override = previous
