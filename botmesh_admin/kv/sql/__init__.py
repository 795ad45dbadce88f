"""SqlKv: DurableKv in one SQL table, on SQLite (stdlib) or PostgreSQL (psycopg 3).

Both dialects share one table, created if missing::

    botmesh_kv(tbl, key, value, version, expires_at, PRIMARY KEY (tbl, key))

``key`` compares in byte order (PostgreSQL ``COLLATE "C"``, SQLite ``BINARY``),
``value`` is the JSON text of the value (text rather than ``jsonb``, so every
JSON value, ``"\\u0000"`` included, round-trips exactly) and ``expires_at`` is
epoch milliseconds or NULL.

The package is split as Django splits ``db/backends``:

- ``postgresql.py``: the PostgreSQL dialect (one round trip per commit, the server's clock);
- ``sqlite.py``: the SQLite dialect (``BEGIN IMMEDIATE``, this host's clock);
- ``connections.py``: one connection per thread and process (``ThreadConnections``)
  and the SQL text both dialects build from one template;
- this module: ``SqlKv``, which validates every call and hands it to its dialect.

Each thread (and each process) gets its own connection. Driver errors are
raised as ``StoreUnavailable``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from botmesh_admin.errors import ValidationError

from ..base import Entry, Op
from ..encoding import dump_value, prefix_end, scan_start
from ..validation import (
    now_ms,
    validate_commit,
    validate_get_many,
    validate_groups,
    validate_import,
    validate_key,
    validate_scan,
    validate_scan_follow,
    validate_scan_merge,
    validate_sweep_limit,
    validate_table,
    validate_table_prefix,
)
from .connections import ThreadConnections
from .postgresql import _Postgres
from .sqlite import _Sqlite, sqlite_path_from_url


def _import_rows(table: str, entries: Sequence[Entry]) -> list[tuple[Any, ...]]:
    now = now_ms()
    return [
        (table, e.key, dump_value(e.value), e.version, e.expires_at)
        for e in entries
        if e.expires_at is None or e.expires_at > now
    ]


class SqlKv:
    """DurableKv over SQLite (``sqlite:///path``) or PostgreSQL (``postgresql://…``).

    Raise ``ValidationError`` (field ``url``) for another scheme and
    ``StoreUnavailable`` if the database cannot be opened.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        scheme = urlsplit(url).scheme.lower()
        if scheme == "sqlite":
            self._db: _Sqlite | _Postgres = _Sqlite(url)
        elif scheme in ("postgresql", "postgres"):
            self._db = _Postgres(url)
        else:
            raise ValidationError("url", f"SqlKv needs sqlite:// or postgresql://, not {scheme!r}")

    def __repr__(self) -> str:
        return f"<SqlKv {type(self._db).__name__.strip('_').lower()}>"

    def get(self, table: str, key: str) -> Entry | None:
        """Return the live entry at ``key`` in ``table``, or ``None`` if absent or expired."""
        validate_table(table)
        validate_key(key)
        return self._db.get(table, key)

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Entry]:
        """Return up to ``limit`` live entries with ``prefix``, by byte order, after ``after``."""
        validate_scan(table, prefix, after, limit)
        start, inclusive = scan_start(prefix, after)
        return self._db.scan(table, start, inclusive, prefix_end(prefix), limit)

    def scan_follow(
        self, table: str, prefix: str = "", after: str | None = None, limit: int = 100, *, field: str = "pk"
    ) -> list[tuple[Entry, Entry | None]]:
        """Return a scan's entries with the live entry each one's ``field`` names: one statement (``ScanFollow``)."""
        validate_scan_follow(table, prefix, after, limit, field)
        start, inclusive = scan_start(prefix, after)
        return self._db.scan_follow(table, start, inclusive, prefix_end(prefix), limit, field)

    def scan_merge(
        self,
        table: str,
        prefixes: Sequence[str],
        after: str | None = None,
        limit: int = 100,
        *,
        field: str = "pk",
    ) -> list[tuple[Entry, Entry | None]]:
        """Return several prefixes' scans merged by suffix, with targets: one statement (``ScanMerge``)."""
        found = validate_scan_merge(table, prefixes, after, limit, field)
        ranges = [(p, p if after is None else p + after, prefix_end(p)) for p in found]
        rows = None
        if all(end is not None for _, _, end in ranges):
            rows = self._db.scan_merge(table, ranges, after is None, limit, field)  # type: ignore[arg-type]
        if rows is None:  # a prefix without an end, or a "\u0000" PostgreSQL's json cannot read
            from ..indexes import merge_by_scans

            rows = merge_by_scans(self, table, found, after, limit, field)
        return rows

    def get_many(self, table: str, keys: Sequence[str]) -> list[Entry | None]:
        """Return the live entry (or ``None``) of each of ``keys``, in order, from one query."""
        keys = validate_get_many(table, keys)
        return self._db.get_many(table, keys) if keys else []

    def commit(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        """Apply ``ops`` in one transaction; raise ``ConflictError`` if an expectation fails.

        Raise ``ValidationError`` naming the op if an ``Add`` meets a stored value
        that is not an integer or would leave ``±MAX_COUNTER``; nothing is written.
        """
        validate_commit(table, ops)
        return self._db.commit(table, ops)

    def commit_groups(self, table: str, groups: Sequence[Sequence[Op]]) -> list[Exception | None]:
        """Apply independent groups of ops in one transaction (``CommitGroups``); per group ``None`` or its error.

        PostgreSQL: one call of the commit function for every group, one
        durable flush for all. SQLite: one by one (its writers serialise on the
        database lock anyway).
        """
        groups = validate_groups(table, groups)
        many = getattr(self._db, "commit_groups", None)
        if many is not None:
            return many(table, groups)
        out: list[Exception | None] = []
        for ops in groups:
            try:
                if ops:
                    self._db.commit(table, ops)
            except Exception as exc:  # noqa: BLE001 - each group's own outcome (CommitGroups)
                out.append(exc)
            else:
                out.append(None)
        return out

    def drop(self, table: str) -> None:
        """Delete every entry of ``table``."""
        validate_table(table)
        self._db.drop(table)

    def sweep(self, limit: int = 1000) -> int:
        """Delete up to ``limit`` expired rows of any table; return how many."""
        return self._db.sweep(validate_sweep_limit(limit))

    def tables(self, prefix: str = "") -> list[str]:
        """Return the tables starting with ``prefix`` that hold a live entry, by name."""
        validate_table_prefix(prefix)
        return self._db.tables(prefix, prefix_end(prefix))

    def import_entries(self, table: str, entries: Sequence[Entry]) -> int:
        """Store ``entries`` as given (restore) in one transaction; return how many were live."""
        rows = _import_rows(table, validate_import(table, entries))
        if rows:
            self._db.import_entries(rows)
        return len(rows)

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` if the database cannot be reached."""
        self._db.ping()

    def close(self) -> None:
        """Close every thread's connection; later calls raise ``StoreUnavailable``."""
        self._db.close()


__all__ = ["SqlKv", "ThreadConnections", "sqlite_path_from_url"]
