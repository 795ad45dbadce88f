"""The event journal: durable inbound, outbox and scheduled work (ARCHITECTURE §6).

``connect_journal(url)`` picks the backend by URL scheme:

=========================  ==============================================================
``memory://``              MemoryEventJournal (reference; one process)
``file:///path.json``      FileEventJournal (one process; atomic snapshots)
``sqlite:///path``         SqlEventJournal on SQLite (the embedded default; shared by the
                           web, worker and beat processes)
``postgresql://…``         SqlEventJournal on PostgreSQL (psycopg 3)
``redis://…``              RedisEventJournal on a standalone Redis
=========================  ==============================================================

``?namespace=name`` (SQL and Redis) keeps several journals apart on one server.
Drivers are imported lazily. ``EventWorker`` (``worker.py``) drains a journal;
``default_journal()`` is the process-wide one (``settings.BOTMESH_JOURNAL_URL``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from botmesh_admin.errors import ValidationError

from .base import Clock, Envelope, EventJournal, EventRecord, RetryPolicy, StaleLeaseError
from .runtime import default_journal, use_journal

SCHEMES = ("memory", "file", "sqlite", "postgresql", "postgres", "redis", "rediss")


def connect_journal(url: str, *, policy: RetryPolicy | None = None, clock: Clock | None = None) -> EventJournal:
    """Return an EventJournal for ``url``; raise ``ValidationError`` (field ``url``) for an unknown scheme.

    ``policy`` sets retries and dead-lettering; ``clock`` (epoch ms) stamps
    ``created_at`` and ``replay`` times (the wall clock by default).
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValidationError("url", f"not a journal URL: {url!r}")
    scheme = urlsplit(url).scheme.lower()
    if scheme == "memory":
        from .memory import MemoryEventJournal

        return MemoryEventJournal(url, policy=policy, clock=clock)
    if scheme == "file":
        from .file import FileEventJournal

        return FileEventJournal(url, policy=policy, clock=clock)
    if scheme in ("sqlite", "postgresql", "postgres"):
        from .sql import SqlEventJournal

        return SqlEventJournal(url, policy=policy, clock=clock)
    if scheme in ("redis", "rediss"):
        from .redis import RedisEventJournal

        return RedisEventJournal(url, policy=policy, clock=clock)
    raise ValidationError("url", f"unknown journal scheme {scheme!r}; use one of {', '.join(SCHEMES)}")


__all__ = [
    "Envelope",
    "EventJournal",
    "EventRecord",
    "RetryPolicy",
    "StaleLeaseError",
    "connect_journal",
    "default_journal",
    "use_journal",
]
