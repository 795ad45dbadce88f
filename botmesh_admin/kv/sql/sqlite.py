"""The SQLite dialect of SqlKv (the stdlib ``sqlite3``).

A commit is one ``BEGIN IMMEDIATE`` transaction (WAL mode, ``synchronous=FULL``,
30 s busy timeout). Expiry uses this host's clock.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from botmesh_admin.errors import StoreUnavailable, ValidationError

from ..base import Add, Check, ConflictError, Delete, Entry, Op, Put
from ..encoding import dump_value, load_value
from ..validation import added, expectation_holds, now_ms
from .connections import (
    _NOT_AN_INTEGER,
    ThreadConnections,
    _followed,
    _scan_follow_sql,
    _scan_merge_sql,
    _scan_sql,
    _tables_sql,
)

_IMPORT_SQLITE = (
    "INSERT INTO botmesh_kv (tbl, key, value, version, expires_at) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (tbl, key) DO UPDATE SET value = excluded.value, version = excluded.version,"
    " expires_at = excluded.expires_at"
)


_SQLITE_DDL = (
    """
    CREATE TABLE IF NOT EXISTS botmesh_kv (
        tbl TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        version INTEGER NOT NULL,
        expires_at INTEGER,
        PRIMARY KEY (tbl, key)
    ) WITHOUT ROWID
    """,
    """
    CREATE INDEX IF NOT EXISTS botmesh_kv_expires_at
        ON botmesh_kv (expires_at) WHERE expires_at IS NOT NULL
    """,
)
_SQLITE_SCAN = {(inc, bnd): _scan_sql("?", "?", inc, bnd) for inc in (True, False) for bnd in (True, False)}
# The field's key when it holds a JSON string (a number or an object names no key).
_SQLITE_TARGET = "CASE WHEN json_type(i.value, ?) = 'text' THEN json_extract(i.value, ?) END"
_SQLITE_SCAN_FOLLOW = {
    (inc, bnd): _scan_follow_sql("?", "?", inc, bnd, _SQLITE_TARGET) for inc in (True, False) for bnd in (True, False)
}


@functools.cache
def _sqlite_scan_merge(inclusive: bool, ranges: int) -> str:
    return _scan_merge_sql("?", "?", inclusive, ranges, _SQLITE_TARGET)


_SQLITE_GET_MANY = (
    "SELECT key, value, version, expires_at FROM botmesh_kv WHERE tbl = ?"
    " AND key IN (SELECT value FROM json_each(?)) AND (expires_at IS NULL OR expires_at > ?)"
)
_SQLITE_ROW = "SELECT version, expires_at FROM botmesh_kv WHERE tbl = ? AND key = ?"
_SQLITE_ROW_VALUE = "SELECT version, expires_at, value FROM botmesh_kv WHERE tbl = ? AND key = ?"


def sqlite_path_from_url(url: str) -> str:
    """Return the database path of ``sqlite:///relative.db`` or ``sqlite:////abs/path.db``.

    Raise ``ValidationError`` (field ``url``) for an empty path or ``:memory:``
    (use ``memory://``: each thread would get a different in-memory database).
    """
    parts = urlsplit(url)
    path = unquote(parts.path)[1:]
    if parts.netloc or not path or path == ":memory:":
        raise ValidationError("url", f"use sqlite:///relative.db or sqlite:////absolute/path.db, not {url!r}")
    return path


class _Sqlite:
    """SQLite dialect: WAL, ``BEGIN IMMEDIATE`` commits, the host's clock."""

    def __init__(self, url: str) -> None:
        import sqlite3

        self._sqlite3 = sqlite3
        self._path = sqlite_path_from_url(url)
        self._schema_ready = False
        self._conns: ThreadConnections[sqlite3.Connection] = ThreadConnections(self._connect, lambda conn: conn.close())
        with self._errors():
            self._conns.get()

    def _connect(self) -> Any:
        # check_same_thread=False only so a finalizer may close it from another
        # thread; ThreadConnections never shares a connection between threads.
        conn = self._sqlite3.connect(self._path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA synchronous=FULL")
        if not self._schema_ready:
            conn.execute("PRAGMA journal_mode=WAL")
            for statement in _SQLITE_DDL:
                conn.execute(statement)
            self._schema_ready = True
        return conn

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            with self._conns.using():
                yield
        except self._sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite Kv {self._path}: {exc}") from exc

    def get(self, table: str, key: str) -> Entry | None:
        with self._errors():
            row = (
                self._conns.get()
                .execute(
                    "SELECT value, version, expires_at FROM botmesh_kv WHERE tbl = ? AND key = ?"
                    " AND (expires_at IS NULL OR expires_at > ?)",
                    (table, key, now_ms()),
                )
                .fetchone()
            )
        return None if row is None else Entry(key, load_value(row[0]), row[1], row[2])

    def get_many(self, table: str, keys: list[str]) -> list[Entry | None]:
        # The keys go as one JSON array (json_each): one statement, one parameter.
        params = (table, dump_value(list(dict.fromkeys(keys))), now_ms())
        with self._errors():
            rows = self._conns.get().execute(_SQLITE_GET_MANY, params).fetchall()
        found = {k: Entry(k, load_value(v), ver, exp) for k, v, ver, exp in rows}
        return [found.get(key) for key in keys]

    def scan(self, table: str, start: str, inclusive: bool, end: str | None, limit: int) -> list[Entry]:
        now = now_ms()
        params = (table, start, end, now, limit) if end else (table, start, now, limit)
        with self._errors():
            rows = self._conns.get().execute(_SQLITE_SCAN[inclusive, end is not None], params)
            return [Entry(k, load_value(v), ver, exp) for k, v, ver, exp in rows.fetchall()]

    def scan_follow(
        self, table: str, start: str, inclusive: bool, end: str | None, limit: int, field: str
    ) -> list[tuple[Entry, Entry | None]]:
        now = now_ms()
        scan = (table, start, end, now, limit) if end else (table, start, now, limit)
        path = f'$."{field}"'  # field: letters, digits and underscores (validated)
        with self._errors():
            rows = self._conns.get().execute(
                _SQLITE_SCAN_FOLLOW[inclusive, end is not None], (*scan, table, path, path, now)
            )
            return _followed(rows.fetchall())

    def scan_merge(
        self, table: str, ranges: Sequence[tuple[str, str, str]], inclusive: bool, limit: int, field: str
    ) -> list[tuple[Entry, Entry | None]] | None:
        """Return the merged ranges (``ScanMerge``) in one statement; ``ranges``: ``(prefix, start, end)``."""
        now = now_ms()
        params: list[Any] = []
        for prefix, start, end in ranges:
            params += [len(prefix), table, start, end, now, limit]
        path = f'$."{field}"'  # field: letters, digits and underscores (validated)
        params += [limit, table, path, path, now]
        with self._errors():
            rows = self._conns.get().execute(_sqlite_scan_merge(inclusive, len(ranges)), params)
            return _followed(rows.fetchall())

    def commit(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        with self._errors():
            conn = self._conns.get()
            conn.execute("BEGIN IMMEDIATE")
            try:
                results = self._apply(conn, table, ops)
            except BaseException:
                with contextlib.suppress(self._sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return results

    @staticmethod
    def _apply(conn: Any, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        now = now_ms()
        current: list[tuple[bool, Entry | None]] = []  # (row present, live entry)
        sums: dict[int, int] = {}  # op index -> the counter after an Add
        for i, op in enumerate(ops):
            read = isinstance(op, Check | Add)
            row = conn.execute(_SQLITE_ROW_VALUE if read else _SQLITE_ROW, (table, op.key))
            row = row.fetchone()
            live = None
            if row is not None and (row[1] is None or row[1] > now):
                live = Entry(op.key, load_value(row[2]) if read else None, row[0], row[1])
            current.append((row is not None, live))
            if isinstance(op, Add):
                # BEGIN IMMEDIATE holds the write lock, so no concurrent add can slip in.
                stored = live.value if live else 0  # an absent counter counts as 0
                if stored is None:  # JSON null is no integer (added() reads None as absent)
                    stored = _NOT_AN_INTEGER
                sums[i] = added(stored, op.delta, f"ops[{i}]")
            elif not expectation_holds(live, op.expect):
                raise ConflictError(table, op.key, op.expect, live.version if live else None)
        results: list[Entry | None] = []
        for i, (op, (present, live)) in enumerate(zip(ops, current, strict=True)):
            if isinstance(op, Put | Add):
                version = live.version + 1 if live else 1
                if isinstance(op, Add):  # a live counter keeps its expiry; a new one has none
                    entry = Entry(op.key, sums[i], version, live.expires_at if live else None)
                else:
                    expires_at = None if op.ttl_ms is None else now + op.ttl_ms
                    entry = Entry(op.key, op.value, version, expires_at)
                conn.execute(
                    "UPDATE botmesh_kv SET value = ?, version = ?, expires_at = ? WHERE tbl = ? AND key = ?"
                    if present
                    else "INSERT INTO botmesh_kv (value, version, expires_at, tbl, key) VALUES (?, ?, ?, ?, ?)",
                    (dump_value(entry.value), entry.version, entry.expires_at, table, op.key),
                )
                results.append(entry)
            elif isinstance(op, Delete):
                if present:
                    conn.execute("DELETE FROM botmesh_kv WHERE tbl = ? AND key = ?", (table, op.key))
                results.append(None)
            else:
                results.append(live)
        return results

    def drop(self, table: str) -> None:
        with self._errors():
            self._conns.get().execute("DELETE FROM botmesh_kv WHERE tbl = ?", (table,))

    def tables(self, start: str, end: str | None) -> list[str]:
        params = (start, end, now_ms()) if end else (start, now_ms())
        with self._errors():
            rows = self._conns.get().execute(_tables_sql("?", "?", end is not None), params)
            return [row[0] for row in rows.fetchall()]

    def import_entries(self, rows: list[tuple[Any, ...]]) -> None:
        with self._errors():
            conn = self._conns.get()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(_IMPORT_SQLITE, rows)
            except BaseException:
                with contextlib.suppress(self._sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def sweep(self, limit: int) -> int:
        with self._errors():
            cursor = self._conns.get().execute(
                "DELETE FROM botmesh_kv WHERE (tbl, key) IN (SELECT tbl, key FROM botmesh_kv"
                " WHERE expires_at <= ? LIMIT ?)",
                (now_ms(), limit),
            )
            return cursor.rowcount

    def ping(self) -> None:
        with self._errors():
            self._conns.get().execute("SELECT 1")

    def close(self) -> None:
        self._conns.close()
