"""A SQLite or PostgreSQL journal for the packages' tests of the real worker over a SQL journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import journals

SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.services)]


def sql_journal_url(backend: str, request: pytest.FixtureRequest, directory: Path) -> str:
    """Return a fresh journal URL of ``backend`` (``sqlite`` in ``directory``, or a namespace on PostgreSQL)."""
    if backend == "sqlite":
        return f"sqlite:///{directory}/journal.sqlite3"
    url = journals.with_namespace(request.getfixturevalue("postgres_url"))
    request.addfinalizer(lambda: journals.drop(url))
    return url
