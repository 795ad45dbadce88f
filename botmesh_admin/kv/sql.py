"""SqlKv: DurableKv in one SQL table, on SQLite (stdlib) or PostgreSQL (psycopg 3).

Both dialects share one table, created if missing::

    botmesh_kv(tbl, key, value, version, expires_at, PRIMARY KEY (tbl, key))

``key`` compares in byte order (PostgreSQL ``COLLATE "C"``, SQLite ``BINARY``),
``value`` is the JSON text of the value (text rather than ``jsonb``, so every
JSON value, ``"\\u0000"`` included, round-trips exactly) and ``expires_at`` is
epoch milliseconds or NULL.

- **PostgreSQL**: a commit is one round trip to the PL/pgSQL function
  ``botmesh_kv_commit_v2``, one transaction that takes a transaction-level
  advisory lock per (table, key) — absent keys included, so ``ABSENT``
  expectations are exact under concurrency — then row locks, checks every
  expectation and only then writes. A single ``Put``/``Delete`` of an existing
  key with ``ANY`` or a version is one ``UPDATE``/``DELETE … WHERE version = n``
  instead (the common compare-and-set, as cheap as hand-written SQL), and a
  single ``Add`` to an existing counter is one ``UPDATE … SET value = value +
  delta``. An ``Add`` never fails on a concurrent ``Add``: it waits for the
  row (or advisory) lock and adds to whatever was committed. Expiry uses the
  server's clock.
- **SQLite**: a commit is one ``BEGIN IMMEDIATE`` transaction (WAL mode,
  ``synchronous=FULL``, 30 s busy timeout). Expiry uses this host's clock.

Each thread (and each process) gets its own connection. Driver errors are
raised as ``StoreUnavailable``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, NoReturn, TypeVar
from urllib.parse import unquote, urlsplit

from botmesh_admin.errors import StoreUnavailable, ValidationError

from .base import ABSENT, ANY, MAX_COUNTER, Add, Check, ConflictError, Delete, Entry, Op, Put
from .encoding import dump_value, load_value, prefix_end, scan_start
from .validation import (
    added,
    expectation_holds,
    now_ms,
    validate_commit,
    validate_get_many,
    validate_import,
    validate_key,
    validate_scan,
    validate_sweep_limit,
    validate_table,
    validate_table_prefix,
)

Conn = TypeVar("Conn")


class _Slot:
    """One thread's connection; closing it is left to a finalizer (thread exit or ``close``)."""

    __slots__ = ("conn", "pid", "finalizer", "__weakref__")

    conn: Any
    pid: int
    finalizer: weakref.finalize


def _close_quietly(close: Callable[[Any], None], conn: Any) -> None:
    with contextlib.suppress(Exception):
        close(conn)


class ThreadConnections(Generic[Conn]):
    """Hand each thread (and each process) its own connection; close them all on ``close``.

    A connection made before a ``fork`` is abandoned in the child, never closed
    there, so the parent's session survives.
    """

    def __init__(self, open_conn: Callable[[], Conn], close_conn: Callable[[Conn], None]) -> None:
        self._open = open_conn
        self._close_conn = close_conn
        self._local = threading.local()
        self._slots: weakref.WeakSet[_Slot] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.closed = False

    def get(self) -> Conn:
        """Return this thread's connection, opening it first if needed."""
        if self.closed:
            raise StoreUnavailable("the Kv is closed")
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is not None:
            if slot.pid == os.getpid():
                return slot.conn
            slot.finalizer.detach()  # inherited through fork: belongs to the parent
        conn = self._open()
        slot = _Slot()
        slot.conn, slot.pid = conn, os.getpid()
        slot.finalizer = weakref.finalize(slot, _close_quietly, self._close_conn, conn)
        with self._lock:
            self._slots.add(slot)
        self._local.slot = slot
        return conn

    def discard(self) -> None:
        """Close this thread's connection (after a connection-level error)."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is not None:
            self._local.slot = None
            if slot.pid == os.getpid():
                slot.finalizer()

    def close(self) -> None:
        """Close every thread's connection; later calls raise ``StoreUnavailable``."""
        self.closed = True
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            if slot.pid == os.getpid():
                slot.finalizer()


def _refuse_add(ops: Sequence[Op], i: int, stored: str | bytes | None) -> NoReturn:
    """Raise the ``ValidationError`` of the ``Add`` at ``ops[i]`` that the server refused.

    ``stored`` is the JSON text of the stored integer (the sum left ``±MAX_COUNTER``),
    or ``None`` if the stored value is not an integer. ``added`` words the error,
    so SqlKv refuses exactly as MemoryKv does.
    """
    op = ops[i]
    assert isinstance(op, Add)
    added(_NOT_AN_INTEGER if stored is None else load_value(stored), op.delta, f"ops[{i}]")
    raise StoreUnavailable(f"the server refused ops[{i}] (an Add) for no reason MemoryKv knows")


_NOT_AN_INTEGER = "not an integer"  # stands for a stored value added() must refuse


def _kind(op: Op) -> str:
    """Name an op for the commit function: p put, d delete, c check, a add."""
    if isinstance(op, Put):
        return "p"
    if isinstance(op, Add):
        return "a"
    return "d" if isinstance(op, Delete) else "c"


def _expect_code(op: Op) -> int:
    """Encode an expectation for SQL: -1 any, 0 absent, n a version."""
    if isinstance(op.expect, int):
        return op.expect
    return -1 if op.expect is ANY else 0


# -- PostgreSQL ------------------------------------------------------------------------

# Epoch milliseconds on the server. statement_timestamp() is fixed for a statement,
# so a scan filters every row against the same instant.
_PG_NOW = "floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint"
_PG_SCHEMA_LOCK = 0x626F746D65736801  # "botmesh\x01": serialises concurrent schema creation
# The JSON text of an integer an Add may add to: at most 18 digits, so the cast to
# bigint and the sum (|delta| <= MAX_COUNTER) cannot overflow, yet every stored
# integer a delta can bring back within ±MAX_COUNTER (up to 2 * MAX_COUNTER) passes.
_PG_INTEGER = "'^-?[0-9]{1,18}$'"

# Schema creation is skipped when the table and the function exist, so a changed
# function body must get a new name (botmesh_kv_commit_v3, …), never an edit in place:
# a database made by an older release then gets the new function on first connect.
# The older function stays (v1 had no Add), for processes of that release still running.
_PG_DDL = (
    """
    CREATE TABLE IF NOT EXISTS botmesh_kv (
        tbl text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        value text NOT NULL,
        version bigint NOT NULL,
        expires_at bigint,
        PRIMARY KEY (tbl, key)
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS botmesh_kv_expires_at
        ON botmesh_kv (expires_at) WHERE expires_at IS NOT NULL
    """,
    f"""
    CREATE OR REPLACE FUNCTION botmesh_kv_commit_v2(
        p_tbl text, p_kinds text[], p_keys text[], p_values text[],
        p_expects bigint[], p_ttls bigint[], p_deltas bigint[])
    RETURNS TABLE (r_pos int, r_failure text, r_version bigint,
                   r_expires_at bigint, r_value text)
    LANGUAGE plpgsql AS $fn$
    -- p_kinds[i]: 'p' put, 'd' delete, 'c' check, 'a' add (p_deltas[i]);
    -- p_expects[i]: -1 any, 0 absent, n version.
    -- Returns one row per op (an add's r_value is the new sum), or a single row for
    -- the first failed op: r_failure 'conflict' (r_version: the current version) or
    -- 'add' (r_value: the stored integer's text, NULL if the value is no integer).
    DECLARE
        v_n int := cardinality(p_keys);
        v_lock bigint;
        v_now bigint;
        v_row record;
        v_present boolean[] := '{{}}';
        v_versions bigint[] := '{{}}';
        v_expires bigint[] := '{{}}';
        v_values text[] := '{{}}';
        v_sum bigint;
    BEGIN
        -- One advisory lock per key, absent keys included, always taken in the same
        -- order: concurrent commits on a key serialise and never deadlock. Only this
        -- function inserts rows, so an absent key stays absent while we hold its lock.
        IF v_n = 1 THEN
            PERFORM pg_advisory_xact_lock(hashtextextended(p_tbl || chr(31) || p_keys[1], 0));
        ELSE
            FOR v_lock IN
                SELECT DISTINCT hashtextextended(p_tbl || chr(31) || k, 0)
                FROM unnest(p_keys) AS k ORDER BY 1
            LOOP
                PERFORM pg_advisory_xact_lock(v_lock);
            END LOOP;
        END IF;
        v_now := floor(extract(epoch FROM clock_timestamp()) * 1000);
        FOR i IN 1 .. v_n LOOP
            -- The row lock keeps single-statement writers, drop() and sweep() off the
            -- row between this check and the write below.
            SELECT b.version, b.expires_at, b.value INTO v_row
                FROM botmesh_kv b WHERE b.tbl = p_tbl AND b.key = p_keys[i] FOR UPDATE;
            v_present[i] := FOUND;
            IF FOUND AND (v_row.expires_at IS NULL OR v_row.expires_at > v_now) THEN
                v_versions[i] := v_row.version;
                v_expires[i] := v_row.expires_at;
                v_values[i] := CASE WHEN p_kinds[i] = 'c' THEN v_row.value END;
            ELSE
                v_versions[i] := NULL;
                v_expires[i] := NULL;
                v_values[i] := NULL;
            END IF;
            IF p_kinds[i] = 'a' THEN
                -- An add has no expectation; it fails only on what it adds to.
                v_sum := NULL;
                IF v_versions[i] IS NULL THEN
                    v_sum := p_deltas[i];
                ELSIF v_row.value ~ {_PG_INTEGER} THEN
                    v_sum := v_row.value::bigint + p_deltas[i];
                END IF;
                IF v_sum IS NULL OR abs(v_sum) > {MAX_COUNTER} THEN
                    r_pos := i; r_failure := 'add';
                    r_value := CASE WHEN v_row.value ~ '^-?[0-9]+$' THEN v_row.value END;
                    RETURN NEXT;
                    RETURN;
                END IF;
                v_values[i] := v_sum::text;
            ELSIF (p_expects[i] = 0 AND v_versions[i] IS NOT NULL)
               OR (p_expects[i] > 0 AND v_versions[i] IS DISTINCT FROM p_expects[i]) THEN
                r_pos := i; r_failure := 'conflict'; r_version := v_versions[i];
                RETURN NEXT;
                RETURN;
            END IF;
        END LOOP;
        FOR i IN 1 .. v_n LOOP
            r_pos := i; r_failure := NULL; r_value := NULL;
            IF p_kinds[i] = 'p' OR p_kinds[i] = 'a' THEN
                r_version := coalesce(v_versions[i], 0) + 1;
                IF p_kinds[i] = 'p' THEN
                    r_expires_at := v_now + p_ttls[i];
                ELSE  -- an add keeps a live entry's expiry; a created counter has none
                    r_expires_at := v_expires[i];
                    r_value := v_values[i];
                END IF;
                IF v_present[i] THEN
                    UPDATE botmesh_kv b
                        SET value = coalesce(r_value, p_values[i]), version = r_version,
                            expires_at = r_expires_at
                        WHERE b.tbl = p_tbl AND b.key = p_keys[i];
                ELSE
                    INSERT INTO botmesh_kv (tbl, key, value, version, expires_at)
                        VALUES (p_tbl, p_keys[i], coalesce(r_value, p_values[i]), r_version,
                                r_expires_at);
                END IF;
            ELSIF p_kinds[i] = 'd' THEN
                r_version := NULL; r_expires_at := NULL;
                IF v_present[i] THEN
                    DELETE FROM botmesh_kv b WHERE b.tbl = p_tbl AND b.key = p_keys[i];
                END IF;
            ELSE
                r_version := v_versions[i]; r_expires_at := v_expires[i]; r_value := v_values[i];
            END IF;
            RETURN NEXT;
        END LOOP;
    END
    $fn$
    """,
)
_PG_SCHEMA_READY = (
    "SELECT to_regclass('botmesh_kv') IS NOT NULL AND to_regprocedure("
    "'botmesh_kv_commit_v2(text,text[],text[],text[],bigint[],bigint[],bigint[])') IS NOT NULL"
)
# The arrays go in binary (%b): psycopg's text format quotes and escapes every
# element with a regular expression, which for JSON values (full of quotes) cost
# more client CPU than the rest of the commit.
_PG_COMMIT = (
    "SELECT r_pos, r_failure, r_version, r_expires_at, r_value FROM botmesh_kv_commit_v2("
    "%s::text, %b::text[], %b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::bigint[])"
)
# Single-op fast paths: one statement that updates or deletes an existing live row.
# They never insert, so the function's "absent stays absent under the advisory
# lock" rule holds; and they lock the row, as the function does, before deciding.
_PG_LIVE = f"(expires_at IS NULL OR expires_at > {_PG_NOW})"
_PG_UPDATE = (
    f"UPDATE botmesh_kv SET value = %s, version = version + 1, expires_at = {_PG_NOW} + %s::bigint"
    f" WHERE tbl = %s AND key = %s AND {_PG_LIVE}"
)
_PG_UPDATE_ANY = _PG_UPDATE + " RETURNING version, expires_at"
_PG_UPDATE_VERSION = _PG_UPDATE + " AND version = %s::bigint RETURNING version, expires_at"
_PG_DELETE_ANY = "DELETE FROM botmesh_kv WHERE tbl = %s AND key = %s"
_PG_DELETE_VERSION = f"{_PG_DELETE_ANY} AND version = %s::bigint AND {_PG_LIVE}"
_PG_VERSION = f"SELECT version FROM botmesh_kv WHERE tbl = %s AND key = %s AND {_PG_LIVE}"
# An Add to an existing live integer. Under READ COMMITTED an UPDATE that finds the
# row changed by a concurrent writer waits for it, then re-evaluates this WHERE and
# SET on the committed row: concurrent adds queue on the row lock and none is lost
# or refused. Absent, expired, non-integer or out-of-range goes to the function,
# which creates the counter or names the refused op (CASE: the cast only on digits).
_PG_ADD = (
    "UPDATE botmesh_kv SET value = (value::bigint + %s::bigint)::text, version = version + 1"
    f" WHERE tbl = %s AND key = %s AND {_PG_LIVE} AND CASE WHEN value ~ {_PG_INTEGER}"
    f" THEN abs(value::bigint + %s::bigint) <= {MAX_COUNTER} ELSE false END"
    " RETURNING version, expires_at, value"
)
_PG_GET = (
    "SELECT value, version, expires_at FROM botmesh_kv WHERE tbl = %s AND key = %s"
    f" AND (expires_at IS NULL OR expires_at > {_PG_NOW})"
)
_PG_GET_MANY = (
    f"SELECT key, value, version, expires_at FROM botmesh_kv WHERE tbl = %s AND key = ANY(%b::text[]) AND {_PG_LIVE}"
)
# A materialised CTE: a LIMIT subquery inside the DELETE could be re-scanned per
# row and pick further victims each time, deleting more than ``limit`` rows.
_PG_SWEEP = (
    "WITH d AS MATERIALIZED (SELECT tbl, key FROM botmesh_kv"
    f" WHERE expires_at <= {_PG_NOW} LIMIT %s FOR UPDATE SKIP LOCKED)"
    " DELETE FROM botmesh_kv b USING d"
    f" WHERE b.tbl = d.tbl AND b.key = d.key AND b.expires_at <= {_PG_NOW}"
)


def _scan_sql(placeholder: str, now: str, inclusive: bool, bounded: bool) -> str:
    p = placeholder
    return (
        f"SELECT key, value, version, expires_at FROM botmesh_kv WHERE tbl = {p}"
        f" AND key {'>=' if inclusive else '>'} {p}"
        f"{f' AND key < {p}' if bounded else ''}"
        f" AND (expires_at IS NULL OR expires_at > {now}) ORDER BY key LIMIT {p}"
    )


def _tables_sql(placeholder: str, now: str, bounded: bool) -> str:
    p = placeholder
    return (
        f"SELECT tbl FROM botmesh_kv WHERE tbl >= {p}{f' AND tbl < {p}' if bounded else ''}"
        f" AND (expires_at IS NULL OR expires_at > {now}) GROUP BY tbl ORDER BY tbl"
    )


_PG_TABLES = {bnd: _tables_sql("%s", _PG_NOW, bnd) for bnd in (True, False)}
# Restores only (a stopped installation), but the advisory lock of commit() is
# still taken so a stray writer cannot interleave with an imported key.
_PG_IMPORT = (
    "WITH l AS (SELECT pg_advisory_xact_lock("
    "hashtextextended(%(tbl)s::text || chr(31) || %(key)s::text, 0)))"
    " INSERT INTO botmesh_kv (tbl, key, value, version, expires_at)"
    " SELECT %(tbl)s::text, %(key)s::text, %(value)s::text, %(version)s::bigint,"
    " %(expires_at)s::bigint FROM l"
    " ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value, version = EXCLUDED.version,"
    " expires_at = EXCLUDED.expires_at"
)
_IMPORT_SQLITE = (
    "INSERT INTO botmesh_kv (tbl, key, value, version, expires_at) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (tbl, key) DO UPDATE SET value = excluded.value, version = excluded.version,"
    " expires_at = excluded.expires_at"
)


def _import_rows(table: str, entries: Sequence[Entry]) -> list[tuple[Any, ...]]:
    now = now_ms()
    return [
        (table, e.key, dump_value(e.value), e.version, e.expires_at)
        for e in entries
        if e.expires_at is None or e.expires_at > now
    ]


_PG_SCAN = {(inc, bnd): _scan_sql("%s", _PG_NOW, inc, bnd) for inc in (True, False) for bnd in (True, False)}


class _Postgres:
    """PostgreSQL dialect: one autocommit round trip per call."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._psycopg = psycopg
        self._url = url
        self._schema_ready = False
        self._conns: ThreadConnections[psycopg.Connection[Any]] = ThreadConnections(
            self._connect, lambda conn: conn.close()
        )
        with self._errors():
            self._conns.get()

    def _connect(self) -> Any:
        options: dict[str, Any] = {}
        if "connect_timeout" not in self._url:
            options["connect_timeout"] = 10
        if "application_name" not in self._url:
            options["application_name"] = "botmesh-kv"  # visible in pg_stat_activity
        conn = self._psycopg.connect(self._url, autocommit=True, **options)
        if not self._schema_ready:
            self._ensure_schema(conn)
            self._schema_ready = True
        return conn

    @staticmethod
    def _ensure_schema(conn: Any) -> None:
        if conn.execute(_PG_SCHEMA_READY).fetchone()[0]:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_SCHEMA_LOCK,))
            for statement in _PG_DDL:
                conn.execute(statement)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except self._psycopg.Error as exc:
            if isinstance(exc, self._psycopg.OperationalError | self._psycopg.InterfaceError):
                self._conns.discard()  # the session may be gone; reconnect on next use
            raise StoreUnavailable(f"PostgreSQL Kv: {exc}") from exc

    def get(self, table: str, key: str) -> Entry | None:
        with self._errors():
            row = self._conns.get().execute(_PG_GET, (table, key)).fetchone()
        return None if row is None else Entry(key, load_value(row[0]), row[1], row[2])

    def get_many(self, table: str, keys: list[str]) -> list[Entry | None]:
        with self._errors():
            rows = self._conns.get().execute(_PG_GET_MANY, (table, list(dict.fromkeys(keys))))
            found = {k: Entry(k, load_value(v), ver, exp) for k, v, ver, exp in rows.fetchall()}
        return [found.get(key) for key in keys]

    def scan(self, table: str, start: str, inclusive: bool, end: str | None, limit: int) -> list[Entry]:
        params: tuple[Any, ...] = (table, start, end, limit) if end else (table, start, limit)
        with self._errors():
            rows = self._conns.get().execute(_PG_SCAN[inclusive, end is not None], params)
            return [Entry(k, load_value(v), ver, exp) for k, v, ver, exp in rows.fetchall()]

    def commit(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        if len(ops) == 1 and ops[0].expect is not ABSENT and not isinstance(ops[0], Check):
            with self._errors():
                done, result = self._commit_one(table, ops[0])
            if done:
                return [result]
        return self._commit_batch(table, ops)

    def _commit_one(self, table: str, op: Put | Delete | Add) -> tuple[bool, Entry | None]:
        """Try the one-statement path; return (applied, result). Raise ``ConflictError``."""
        conn = self._conns.get()
        if isinstance(op, Add):
            row = conn.execute(_PG_ADD, (op.delta, table, op.key, op.delta)).fetchone()
            if row is None:
                return False, None  # absent, expired or refused: the function decides
            return True, Entry(op.key, int(row[2]), row[0], row[1])
        if isinstance(op, Put):
            params: tuple[Any, ...] = (dump_value(op.value), op.ttl_ms, table, op.key)
            if op.expect is ANY:
                row = conn.execute(_PG_UPDATE_ANY, params).fetchone()
                if row is None:
                    return False, None  # absent or expired: creating it needs the function
                return True, Entry(op.key, op.value, row[0], row[1])
            row = conn.execute(_PG_UPDATE_VERSION, (*params, op.expect)).fetchone()
            if row is not None:
                return True, Entry(op.key, op.value, row[0], row[1])
        elif op.expect is ANY:
            conn.execute(_PG_DELETE_ANY, (table, op.key))
            return True, None
        elif conn.execute(_PG_DELETE_VERSION, (table, op.key, op.expect)).rowcount == 1:
            return True, None
        current = conn.execute(_PG_VERSION, (table, op.key)).fetchone()
        raise ConflictError(table, op.key, op.expect, current and current[0])

    def _commit_batch(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        kinds: list[str] = []
        keys: list[str] = []
        values: list[str | None] = []
        expects: list[int] = []
        ttls: list[int | None] = []
        deltas: list[int | None] = []
        for op in ops:
            keys.append(op.key)
            expects.append(_expect_code(op))
            values.append(dump_value(op.value) if isinstance(op, Put) else None)
            ttls.append(op.ttl_ms if isinstance(op, Put) else None)
            deltas.append(op.delta if isinstance(op, Add) else None)
            kinds.append(_kind(op))
        with self._errors():
            cursor = self._conns.get().execute(_PG_COMMIT, (table, kinds, keys, values, expects, ttls, deltas))
            rows = cursor.fetchall()
        position, failure, version, _, stored = rows[0]
        if failure == "conflict":
            op = ops[position - 1]
            raise ConflictError(table, op.key, op.expect, version)
        if failure == "add":
            _refuse_add(ops, position - 1, stored)
        results: list[Entry | None] = []
        for op, (_, _, version, expires_at, value) in zip(ops, rows, strict=True):
            if isinstance(op, Put):
                results.append(Entry(op.key, op.value, version, expires_at))
            elif isinstance(op, Add):
                results.append(Entry(op.key, int(value), version, expires_at))
            elif isinstance(op, Check) and version is not None:
                results.append(Entry(op.key, load_value(value), version, expires_at))
            else:
                results.append(None)
        return results

    def drop(self, table: str) -> None:
        with self._errors():
            self._conns.get().execute("DELETE FROM botmesh_kv WHERE tbl = %s", (table,))

    def sweep(self, limit: int) -> int:
        with self._errors():
            return self._conns.get().execute(_PG_SWEEP, (limit,)).rowcount

    def tables(self, start: str, end: str | None) -> list[str]:
        params = (start, end) if end else (start,)
        with self._errors():
            rows = self._conns.get().execute(_PG_TABLES[end is not None], params).fetchall()
        return [row[0] for row in rows]

    def import_entries(self, rows: list[tuple[Any, ...]]) -> None:
        names = ("tbl", "key", "value", "version", "expires_at")
        with self._errors():
            conn = self._conns.get()
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(_PG_IMPORT, [dict(zip(names, row, strict=True)) for row in rows])

    def ping(self) -> None:
        with self._errors():
            self._conns.get().execute("SELECT 1")

    def close(self) -> None:
        self._conns.close()


# -- SQLite ----------------------------------------------------------------------------

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


# -- the backend -----------------------------------------------------------------------


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


__all__ = ["SqlKv", "ThreadConnections"]
