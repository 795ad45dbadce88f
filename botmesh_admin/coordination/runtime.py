"""The process-wide coordinator: Redis when ``REDIS_URL`` is set, else an in-process hub.

Settings (read when first needed, never at import): ``BOTMESH_REDIS_URL``,
``BOTMESH_COORDINATION_PREFIX`` (default ``botmesh``) and
``BOTMESH_COORDINATION_LEASE_MS`` (default 15000). Re-created after a ``fork``
(Celery prefork children must not share the parent's sockets or threads). Tests
swap it with ``use_coordinator``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .core import Coordinator
from .memory import MemoryCoordinationHub, MemoryCoordinator

log = logging.getLogger("botmesh.coordination")

DEFAULT_PREFIX = "botmesh"
DEFAULT_LEASE_MS = 15000

_lock = threading.Lock()
_coordinator: Coordinator | None = None
_pid: int | None = None
_override: Coordinator | None = None
_hub: MemoryCoordinationHub | None = None


def coordination_settings() -> tuple[str | None, str, int]:
    """Return ``(redis_url, prefix, lease_ms)`` from the Django settings."""
    from django.conf import settings

    return (
        getattr(settings, "BOTMESH_REDIS_URL", None),
        getattr(settings, "BOTMESH_COORDINATION_PREFIX", DEFAULT_PREFIX),
        int(getattr(settings, "BOTMESH_COORDINATION_LEASE_MS", DEFAULT_LEASE_MS)),
    )


def process_hub() -> MemoryCoordinationHub:
    """Return this process's coordination hub (the embedded default)."""
    global _hub
    if _hub is None:
        _hub = MemoryCoordinationHub()
    return _hub


def default_coordinator(role: str = "web") -> Coordinator:
    """Return this process's coordinator, creating it (as ``role``) on first use."""
    global _coordinator, _pid
    if _override is not None:
        return _override
    with _lock:
        if _coordinator is None or _pid != os.getpid():
            redis_url, prefix, lease_ms = coordination_settings()
            if redis_url:
                from .redis import RedisCoordinator

                _coordinator = RedisCoordinator(redis_url, prefix, lease_ms, role=role)
            else:
                _coordinator = MemoryCoordinator(process_hub(), lease_ms=lease_ms, role=role)
                _start_presence(_coordinator)
            _pid = os.getpid()
        return _coordinator


_presence_stop: threading.Event | None = None
_presence_kv: object = None


def _start_presence(coordinator: Coordinator) -> None:
    """Publish this process's presence in the Kv every ``lease_ms / 3`` (embedded default; see
    ``services.presence_publish``) until ``shutdown()``."""
    from botmesh_admin.kv.runtime import default_kv

    global _presence_stop, _presence_kv
    stop = _presence_stop = threading.Event()
    kv = _presence_kv = default_kv()  # the process's Kv now: a Kv swapped in later (a test's) is not written to

    def run() -> None:
        from .services import presence_publish

        failed_at = 0.0
        while not stop.is_set():
            try:
                presence_publish(coordinator, store_kv=kv)
            except Exception as exc:  # noqa: BLE001 - the page is informational; retried next tick
                if time.monotonic() - failed_at > 60:
                    failed_at = time.monotonic()
                    log.warning("could not publish this process's presence: %s", type(exc).__name__)
            stop.wait(coordinator.lease_ms / 3000)

    threading.Thread(target=run, name="coordination-presence", daemon=True).start()


def shutdown() -> None:
    """Close this process's coordinator, releasing its leases (worker/beat shutdown)."""
    global _coordinator
    with _lock:
        if _coordinator is not None and _pid == os.getpid():
            if _presence_stop is not None:
                _presence_stop.set()
                try:
                    from .services import presence_withdraw

                    presence_withdraw(_coordinator, store_kv=_presence_kv)
                except Exception:  # noqa: BLE001 - its TTL removes it anyway
                    log.warning("could not withdraw this process's presence")
            _coordinator.close()
        _coordinator = None


@contextmanager
def use_coordinator(coordinator: Coordinator) -> Iterator[Coordinator]:
    """Make ``coordinator`` the default for the duration of the block (tests)."""
    global _override
    previous, _override = _override, coordinator
    try:
        yield coordinator
    finally:
        _override = previous
