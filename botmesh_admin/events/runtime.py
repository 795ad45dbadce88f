"""The process-wide EventJournal chosen by ``BOTMESH_JOURNAL_URL``.

Opened lazily on first use and reopened after a ``fork`` (Celery prefork
children must not share a parent's sockets or SQLite handles). Tests swap it
with ``use_journal``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .base import EventJournal

_lock = threading.Lock()
_journal: EventJournal | None = None
_pid: int | None = None
_override: EventJournal | None = None


def default_journal() -> EventJournal:
    """Return the configured journal (``settings.BOTMESH_JOURNAL_URL``), connecting on first use."""
    global _journal, _pid
    if _override is not None:
        return _override
    with _lock:
        if _journal is None or _pid != os.getpid():
            from django.conf import settings

            from . import connect_journal

            _journal = connect_journal(settings.BOTMESH_JOURNAL_URL)
            _pid = os.getpid()
        return _journal


@contextmanager
def use_journal(journal: EventJournal) -> Iterator[EventJournal]:
    """Make ``journal`` the default for the duration of the block (tests, tools)."""
    global _override
    previous, _override = _override, journal
    try:
        yield journal
    finally:
        _override = previous
