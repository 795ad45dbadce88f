"""The process-wide coordinator, chosen by ``BOTMESH_COORDINATION_URL``; coordinators by URL.

Coordination URLs (``coordinator_from_url``, ``backend_from_url``):

=========================  ===================================================================
``redis://…``, ``rediss://…``, ``redis+cluster://…``   ``RedisCoordinator``
``kv:``                    ``KvCoordinator`` over this process's Kv (``BOTMESH_KV_URL``, ``default_kv()``)
``kv:<kv url>``            ``KvCoordinator`` over that Kv (``kv:sqlite:///path``, ``kv:postgresql://…``)
``memory:``                ``MemoryCoordinator`` over this process's hub (one process only)
=========================  ===================================================================

Settings (read when first needed, never at import): ``BOTMESH_COORDINATION_URL``
(default: ``REDIS_URL`` when set, else ``kv:``; ``config.py`` validates it),
``BOTMESH_COORDINATION_PREFIX`` (default ``botmesh``) and
``BOTMESH_COORDINATION_LEASE_MS`` (default 15000). Re-created after a ``fork``
(Celery prefork children must not share the parent's sockets or threads). Tests
swap it with ``use_coordinator``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from botmesh_admin.errors import ValidationError
from botmesh_admin.processlocal import ProcessLocal

from .core import Backend, Coordinator
from .memory import MemoryCoordinationHub, MemoryCoordinator

log = logging.getLogger("botmesh.coordination")

DEFAULT_PREFIX = "botmesh"
DEFAULT_LEASE_MS = 15000

_hub: MemoryCoordinationHub | None = None
_role = "web"  # the role of the first ``default_coordinator`` call of a process


REDIS_SCHEMES = ("redis://", "rediss://", "redis+cluster://")


def coordination_settings() -> tuple[str | None, str, int]:
    """Return ``(redis_url, prefix, lease_ms)`` from the Django settings."""
    from django.conf import settings

    return (
        getattr(settings, "BOTMESH_REDIS_URL", None),
        getattr(settings, "BOTMESH_COORDINATION_PREFIX", DEFAULT_PREFIX),
        int(getattr(settings, "BOTMESH_COORDINATION_LEASE_MS", DEFAULT_LEASE_MS)),
    )


def coordination_url() -> str:
    """Return ``settings.BOTMESH_COORDINATION_URL``, defaulting to the Redis URL if set, else ``kv:``."""
    from django.conf import settings

    url = getattr(settings, "BOTMESH_COORDINATION_URL", None)
    if url:
        return str(url)
    return getattr(settings, "BOTMESH_REDIS_URL", None) or "kv:"


def _django_ready() -> bool:
    from django.conf import settings

    return bool(settings.configured or os.environ.get("DJANGO_SETTINGS_MODULE"))


def _process_kv() -> tuple[object, bool]:
    """Return ``(kv, owned)``: ``default_kv()`` in a Django process, else a connection to ``BOTMESH_KV_URL``.

    A bot process need not load the admin's Django settings; it reads the same
    variable (``config.load``, so a bad value fails with the one-line error).
    """
    from botmesh_admin.kv import connect
    from botmesh_admin.kv.runtime import default_kv

    if _django_ready():
        return default_kv(), False
    from botmesh_admin import config

    return connect(config.load().kv_url), True


def _kv_of(url: str) -> tuple[object, bool]:
    """Return ``(kv, owned)`` for a ``kv:`` URL: the process's Kv (not owned) or a new connection."""
    from botmesh_admin.kv import connect

    inner = url[len("kv:") :]
    if not inner:
        return _process_kv()
    try:
        return connect(inner), True
    except ValidationError as exc:
        raise ValidationError("url", f"kv:<kv url>: {exc.problem}") from None


def coordinator_from_url(
    url: str, *, prefix: str, lease_ms: int = DEFAULT_LEASE_MS, role: str = "web", replica_id: str | None = None
) -> Coordinator:
    """Return a new coordinator for ``url`` (see the module docstring) as ``replica_id`` in ``role``.

    The caller owns it: ``close()`` releases its leases (and the Kv connection a
    ``kv:<kv url>`` opened). Raise ``ValidationError`` naming ``url``, ``prefix``,
    ``lease_ms`` or ``replica_id``; ``StoreUnavailable`` when the service is down.
    """
    scheme = _scheme(url)
    if scheme == "redis":
        from .redis import RedisCoordinator

        # The fence high-water mark lives in the process's Kv (read lazily in a Django process).
        fence_kv = None if _django_ready() else _process_kv()[0]
        return RedisCoordinator(url, prefix, lease_ms, replica_id, role=role, fence_kv=fence_kv)  # type: ignore[arg-type]
    if scheme == "kv":
        from .kv import KvCoordinator

        kv, owned = _kv_of(url)
        try:
            return KvCoordinator(kv, prefix, lease_ms, replica_id, role=role, owns_kv=owned)  # type: ignore[arg-type]
        except BaseException:
            if owned:
                kv.close()  # type: ignore[attr-defined]
            raise
    from .kv import coordination_table

    coordination_table(prefix)  # the same prefix rule on every backend
    # The hub has no prefix: one namespace per process (tests, a single-process run).
    return MemoryCoordinator(process_hub(), replica_id, lease_ms=lease_ms, role=role)


def backend_from_url(url: str, prefix: str) -> Backend:
    """Return the shared state behind ``url`` for ``prefix``, to read (``snapshot(live_ms)``) without registering.

    The Replicas page reads a bot's replicas with
    ``backend_from_url(url, bot_prefix(tenant, bot)).snapshot(live_ms)``; call
    ``close()`` when done. Raise ``ValidationError`` naming ``url`` or ``prefix``.
    """
    scheme = _scheme(url)
    if scheme == "redis":
        from .redis import RedisBackend

        return RedisBackend(url, prefix)
    from .kv import KvBackend, coordination_table

    if scheme == "kv":
        kv, owned = _kv_of(url)
        return KvBackend(kv, prefix, owns_kv=owned)  # type: ignore[arg-type]
    coordination_table(prefix)
    return process_hub()


def _scheme(url: object) -> str:
    if not isinstance(url, str):
        raise ValidationError("url", "must be a string")
    if url.lower().startswith(REDIS_SCHEMES):
        return "redis"
    if url.startswith("kv:"):
        return "kv"
    if url == "memory:":
        return "memory"
    raise ValidationError("url", "expected redis://…, rediss://…, kv:, kv:<kv url> or memory:")


def process_hub() -> MemoryCoordinationHub:
    """Return this process's coordination hub (the embedded default)."""
    global _hub
    if _hub is None:
        _hub = MemoryCoordinationHub()
    return _hub


def _build_coordinator() -> Coordinator:
    _, prefix, lease_ms = coordination_settings()
    return coordinator_from_url(coordination_url(), prefix=prefix, lease_ms=lease_ms, role=_role)


_coordinator: ProcessLocal[Coordinator] = ProcessLocal(_build_coordinator, close=lambda c: c.close())


def default_coordinator(role: str = "web") -> Coordinator:
    """Return this process's coordinator, creating it (as ``role``) on first use (after a fork: anew)."""
    global _role
    _role = role
    return _coordinator.get()


def shutdown() -> None:
    """Close this process's coordinator, releasing its leases (worker/beat shutdown)."""
    _coordinator.reset()


@contextmanager
def use_coordinator(coordinator: Coordinator) -> Iterator[Coordinator]:
    """Make ``coordinator`` the default for the duration of the block (tests)."""
    with _coordinator.use(coordinator):
        yield coordinator
