"""The storage kernel: the DurableKv contract, its backends and tenant-kv.

``connect(url)`` picks the backend by URL scheme (cachelib/limits style):

=========================  ===========================================
``memory://``              MemoryKv (reference; one process)
``file:///path/kv.json``   FileKv (one process; atomic snapshots)
``sqlite:///path.db``      SqlKv on SQLite
``postgresql://…``         SqlKv on PostgreSQL (psycopg 3)
``redis://…``              RedisKv on a standalone Redis
``redis+cluster://h:p,…``  RedisKv on Redis Cluster
=========================  ===========================================

Drivers are imported lazily, only when their scheme is used.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from botmesh_admin.errors import ValidationError

from .base import (
    ABSENT,
    ANY,
    MAX_COUNTER,
    Add,
    Check,
    ConflictError,
    Delete,
    DurableKv,
    Entry,
    Expect,
    Op,
    Put,
)
from .tenant import TenantKv, validate_id

SCHEMES = ("memory", "file", "sqlite", "postgresql", "postgres", "redis", "rediss", "redis+cluster")


def connect(url: str) -> DurableKv:
    """Return a DurableKv for ``url``; raise ``ValidationError`` (field ``url``) for an unknown scheme."""
    if not isinstance(url, str) or "://" not in url:
        raise ValidationError("url", f"not a Kv URL: {url!r}")
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        from .memory import MemoryKv

        return MemoryKv(url)
    if scheme == "file":
        from .file import FileKv

        return FileKv(url)
    if scheme in ("sqlite", "postgresql", "postgres"):
        from .sql import SqlKv

        return SqlKv(url)
    if scheme in ("redis", "rediss", "redis+cluster"):
        from .redis import RedisKv

        return RedisKv(url)
    raise ValidationError("url", f"unknown Kv scheme {scheme!r}; use one of {', '.join(SCHEMES)}")


__all__ = [
    "ABSENT",
    "ANY",
    "MAX_COUNTER",
    "Add",
    "Check",
    "ConflictError",
    "Delete",
    "DurableKv",
    "Entry",
    "Expect",
    "Op",
    "Put",
    "TenantKv",
    "connect",
    "validate_id",
]
