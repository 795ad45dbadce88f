"""The process-wide EventJournal chosen by ``BOTMESH_JOURNAL_URL``.

Opened lazily on first use and reopened after a ``fork`` (Celery prefork
children must not share a parent's sockets or SQLite handles): a
``ProcessLocal``. Tests swap it with ``use_journal``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botmesh_admin.processlocal import ProcessLocal

from .base import EventJournal


def _connect() -> EventJournal:
    from django.conf import settings

    from . import connect_journal

    return connect_journal(settings.BOTMESH_JOURNAL_URL)


_journal: ProcessLocal[EventJournal] = ProcessLocal(_connect)


def default_journal() -> EventJournal:
    """Return the configured journal (``settings.BOTMESH_JOURNAL_URL``), connecting on first use."""
    return _journal.get()


@contextmanager
def use_journal(journal: EventJournal) -> Iterator[EventJournal]:
    """Make ``journal`` the default for the duration of the block (tests, tools)."""
    with _journal.use(journal):
        yield journal
