"""The PostgreSQL dialect of SqlKv (psycopg 3).

A commit is one round trip to the PL/pgSQL function ``botmesh_kv_commit_v4``,
one transaction that takes a transaction-level advisory lock per (table, key) —
absent keys included, so ``ABSENT`` expectations are exact under concurrency;
shared for a key that is only checked, so commits that check one key (an index
epoch) do not queue behind each other — then row locks, checks every
expectation and only then writes, each step one set-based statement over the
whole batch (unnest of the op arrays; the writes are one ``INSERT … ON
CONFLICT`` and one ``DELETE``), so a commit of n keys costs a handful of
statements, not 2n. ``commit_groups`` hands the same function several
independent groups (a batch's one commit per conversation): one round trip, one
transaction and one WAL flush for all, each group still all or nothing, every
lock of the call taken up front in one order (two calls never deadlock). A single
``Put``/``Delete`` of an existing key with ``ANY`` or a version is one
``UPDATE``/``DELETE … WHERE version = n`` instead (the common compare-and-set,
as cheap as hand-written SQL), and a single ``Add`` to an existing counter is one
``UPDATE … SET value = value + delta``. An ``Add`` never fails on a concurrent
``Add``: it waits for the row (or advisory) lock and adds to whatever was
committed. Expiry uses the server's clock.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from botmesh_admin.errors import StoreUnavailable, ValidationError

from ..base import ABSENT, ANY, MAX_COUNTER, Add, Check, ConflictError, Delete, Entry, Op, Put
from ..encoding import dump_value, load_value
from ..validation import added, follow_key
from .connections import (
    _NOT_AN_INTEGER,
    ThreadConnections,
    _followed,
    _scan_follow_sql,
    _scan_merge_sql,
    _scan_sql,
    _tables_sql,
)


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


# Epoch milliseconds on the server. statement_timestamp() is fixed for a statement,
# so a scan filters every row against the same instant.
_PG_NOW = "floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint"
_PG_SCHEMA_LOCK = 0x626F746D65736801  # "botmesh\x01": serialises concurrent schema creation
# The JSON text of an integer an Add may add to: at most 18 digits, so the cast to
# bigint and the sum (|delta| <= MAX_COUNTER) cannot overflow, yet every stored
# integer a delta can bring back within ±MAX_COUNTER (up to 2 * MAX_COUNTER) passes.
_PG_INTEGER = "'^-?[0-9]{1,18}$'"

# Schema creation is skipped when the table and the function exist, so a changed
# function body must get a new name (botmesh_kv_commit_v5, …), never an edit in place:
# a database made by an older release then gets the new function on first connect.
# The older functions stay (v1 had no Add, v2 looped op by op, v3 took one group and
# locked checked keys exclusively), for processes of that release still running; a
# fresh database gets only v4 (an older process that meets it creates its own
# function, its schema check names it). Their locks are the same advisory locks, so
# processes of two releases still serialise on a key.
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
    CREATE OR REPLACE FUNCTION botmesh_kv_commit_v4(
        p_tbl text, p_groups int[], p_kinds text[], p_keys text[], p_values text[],
        p_expects bigint[], p_ttls bigint[], p_deltas bigint[])
    RETURNS TABLE (r_pos int, r_failure text, r_version bigint,
                   r_expires_at bigint, r_value text)
    LANGUAGE plpgsql AS $fn$
    -- Commits one or more groups of ops in one transaction, each group all or
    -- nothing. p_groups[i]: op i's group; p_kinds[i]: 'p' put, 'd' delete,
    -- 'c' check, 'a' add (p_deltas[i]); p_expects[i]: -1 any, 0 absent, n version.
    -- Within a group a key appears at most once; a key in several groups is only
    -- added to, or only checked, in each (the caller's rule), so the groups'
    -- writes are disjoint and their order does not matter: a key added to by
    -- several groups is written once, with the sum of the groups that hold (its
    -- version grows by their number, as if they were committed one by one).
    -- Returns one row per op, in order: r_failure 'conflict' on an op whose
    -- expectation failed (r_version: the current version), 'group' on the other
    -- ops of its group, 'add' on an add whose sum is refused (r_value: the stored
    -- integer's text, NULL if no integer; the sum is the running one of committing
    -- the groups one by one; in a group that holds otherwise, nothing at all is
    -- written and the caller redoes the groups one by one, so later groups see it fail),
    -- NULL on an op that was applied (an add's r_value: the new sum, a check's:
    -- the stored value). Set-based: a constant number of statements whatever the
    -- number of ops and groups (v3: one group; v2 ran two statements per op).
    DECLARE
        v_now bigint;
        v_failures text[];
        v_versions bigint[];
        v_expires bigint[];
        v_values text[];
        v_refused boolean;
    BEGIN
        -- One advisory lock per key, absent keys included, all taken up front in the
        -- same order: concurrent commits on a key serialise and never deadlock. Only
        -- this function inserts rows, so an absent key stays absent while we hold its
        -- lock. A key every op only checks takes it shared: commits that check one
        -- key (an index epoch) run side by side, a writer of the key waits for them.
        PERFORM CASE WHEN l.shared THEN pg_advisory_xact_lock_shared(l.h)
                     ELSE pg_advisory_xact_lock(l.h) END FROM (
            SELECT hashtextextended(p_tbl || chr(31) || u.k, 0) AS h, bool_and(u.kind = 'c') AS shared
            FROM unnest(p_keys, p_kinds) AS u(k, kind) GROUP BY 1 ORDER BY 1) AS l;
        v_now := floor(extract(epoch FROM clock_timestamp()) * 1000);
        -- Every op's outcome in one statement. The row locks keep single-statement
        -- writers, drop() and sweep() off the rows between this check and the writes
        -- below (FOR SHARE on a checked row: checks do not queue behind each other); a
        -- row another transaction holds is waited for and read as it committed (READ
        -- COMMITTED), so an Add sums that. A blind delete reads nothing: its DELETE
        -- locks the row.
        WITH o AS MATERIALIZED (
            SELECT u.*, b.version AS lv, b.expires_at AS lexp, b.value AS lval,
                   u.kind <> 'a' AND ((u.expect = 0 AND b.version IS NOT NULL)
                       OR (u.expect > 0 AND b.version IS DISTINCT FROM u.expect)) AS conflict,
                   -- what an add adds to: 0 if absent, NULL if no integer (the cast only on digits)
                   CASE WHEN u.kind <> 'a' THEN NULL
                        WHEN b.version IS NULL THEN 0
                        WHEN b.value ~ {_PG_INTEGER} THEN b.value::bigint END AS base
            FROM unnest(p_groups, p_kinds, p_keys, p_expects, p_ttls, p_deltas)
                     WITH ORDINALITY AS u(grp, kind, key, expect, ttl, delta, pos)
            -- one index lookup per op (a join over the whole key list can be planned
            -- as a nested loop over it: quadratic in the batch)
            LEFT JOIN LATERAL (SELECT x.value, x.version, x.expires_at FROM botmesh_kv x
                               WHERE x.tbl = p_tbl AND x.key = u.key AND u.kind <> 'c'
                                 AND NOT (u.kind = 'd' AND u.expect = -1) FOR UPDATE) AS w ON true
            LEFT JOIN LATERAL (SELECT x.value, x.version, x.expires_at FROM botmesh_kv x
                               WHERE x.tbl = p_tbl AND x.key = u.key AND u.kind = 'c' FOR SHARE) AS c ON true
            -- b: the live entry (an expired row reads as absent)
            CROSS JOIN LATERAL (
                SELECT CASE WHEN live THEN r.version END AS version,
                       CASE WHEN live THEN r.expires_at END AS expires_at,
                       CASE WHEN live THEN r.value END AS value
                FROM (SELECT coalesce(w.version, c.version) AS version,
                             coalesce(w.expires_at, c.expires_at) AS expires_at,
                             coalesce(w.value, c.value) AS value) AS r
                CROSS JOIN LATERAL (SELECT r.version IS NOT NULL
                                    AND (r.expires_at IS NULL OR r.expires_at > v_now) AS live) AS t
            ) AS b
        ), g AS (
            SELECT o.grp, bool_or(o.conflict) AS failed FROM o GROUP BY o.grp
        ), r AS (
            -- each add's running sum, as committing the groups one by one would meet it:
            -- the groups before it that hold, then its own delta
            SELECT o.pos, o.base + coalesce(sum(o.delta) FILTER (WHERE NOT g.failed)
                                                OVER (PARTITION BY o.key ORDER BY o.grp), 0)
                          + CASE WHEN g.failed THEN o.delta ELSE 0 END AS running
            FROM o JOIN g ON g.grp = o.grp WHERE o.kind = 'a'
        ), s AS (
            -- a counter's sum over the groups that hold, and their number
            SELECT o.key, min(o.base) + sum(o.delta) AS total, count(*) AS n
            FROM o JOIN g ON g.grp = o.grp WHERE o.kind = 'a' AND NOT g.failed GROUP BY o.key
        )
        SELECT array_agg(f.failure ORDER BY o.pos),
               array_agg(CASE WHEN f.failure IS NOT NULL OR o.kind = 'c' THEN o.lv
                              WHEN o.kind = 'd' THEN NULL
                              WHEN o.kind = 'a' THEN coalesce(o.lv, 0) + s.n
                              ELSE coalesce(o.lv, 0) + 1 END ORDER BY o.pos),
               array_agg(CASE WHEN f.failure IS NOT NULL OR o.kind = 'd' THEN NULL
                              WHEN o.kind = 'p' THEN v_now + o.ttl
                              ELSE o.lexp END ORDER BY o.pos),
               array_agg(CASE WHEN f.failure = 'add' AND r.running IS NOT NULL THEN (r.running - o.delta)::text
                              WHEN f.failure = 'add' AND o.lval ~ '^-?[0-9]+$' THEN o.lval
                              WHEN f.failure IS NOT NULL THEN NULL
                              WHEN o.kind = 'a' THEN s.total::text
                              WHEN o.kind = 'c' THEN o.lval END ORDER BY o.pos),
               bool_or(f.failure = 'add' AND NOT g.failed)
            INTO v_failures, v_versions, v_expires, v_values, v_refused
            FROM o JOIN g ON g.grp = o.grp LEFT JOIN s ON o.kind = 'a' AND s.key = o.key
            LEFT JOIN r ON r.pos = o.pos
            CROSS JOIN LATERAL (
                -- the first failed op of a group is the error its commit raises
                SELECT CASE WHEN o.conflict THEN 'conflict'
                            WHEN o.kind = 'a' AND (r.running IS NULL OR abs(r.running) > {MAX_COUNTER})
                            THEN 'add'
                            WHEN g.failed THEN 'group' END AS failure
            ) AS f;
        IF v_refused IS NOT TRUE THEN  -- (bool_or over NULLs is NULL)
            IF 'p' = ANY(p_kinds) OR 'a' = ANY(p_kinds) THEN
                -- An expired row is overwritten in place (its version restarts at 1); a
                -- key added to by several groups is one row (DISTINCT ON).
                INSERT INTO botmesh_kv AS b (tbl, key, value, version, expires_at)
                    SELECT DISTINCT ON (u.key) p_tbl, u.key, coalesce(u.sum, u.value), u.version, u.expires_at
                    FROM unnest(p_kinds, p_keys, p_values, v_values, v_versions, v_expires, v_failures)
                             AS u(kind, key, value, sum, version, expires_at, failure)
                    WHERE (u.kind = 'p' OR u.kind = 'a') AND u.failure IS NULL
                    ORDER BY u.key
                    ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value,
                        version = EXCLUDED.version, expires_at = EXCLUDED.expires_at;
            END IF;
            IF 'd' = ANY(p_kinds) THEN
                -- = ANY(ARRAY(…)): one index search per key whatever the plan's row estimates
                DELETE FROM botmesh_kv b WHERE b.tbl = p_tbl AND b.key = ANY(ARRAY(
                    SELECT u.key FROM unnest(p_kinds, p_keys, v_failures) AS u(kind, key, failure)
                    WHERE u.kind = 'd' AND u.failure IS NULL));
            END IF;
        END IF;
        RETURN QUERY SELECT u.pos::int, u.failure, u.version, u.expires_at, u.value
            FROM unnest(v_failures, v_versions, v_expires, v_values)
                     WITH ORDINALITY AS u(failure, version, expires_at, value, pos)
            ORDER BY u.pos;
    END
    $fn$
    """,
)
_PG_SCHEMA_READY = (
    "SELECT to_regclass('botmesh_kv') IS NOT NULL AND to_regprocedure("
    "'botmesh_kv_commit_v4(text,int[],text[],text[],text[],bigint[],bigint[],bigint[])') IS NOT NULL"
)
# The arrays go in binary (%b): psycopg's text format quotes and escapes every
# element with a regular expression, which for JSON values (full of quotes) cost
# more client CPU than the rest of the commit.
_PG_COMMIT = (
    "SELECT r_pos, r_failure, r_version, r_expires_at, r_value FROM botmesh_kv_commit_v4("
    "%s::text, %b::int[], %b::text[], %b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::bigint[])"
)
# commit_groups reads only the ops that failed their own check (a conflict, a refused
# add): a flush sends hundreds of ops and needs no row of the others, so they are
# neither sent back nor decoded.
_PG_COMMIT_FAILURES = (
    "SELECT r_pos, r_failure, r_version, r_value FROM botmesh_kv_commit_v4("
    "%s::text, %b::int[], %b::text[], %b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::bigint[])"
    " WHERE r_failure IN ('conflict', 'add')"
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

_PG_SCAN = {(inc, bnd): _scan_sql("%s", _PG_NOW, inc, bnd) for inc in (True, False) for bnd in (True, False)}
# The field's key when it holds a JSON string (a number or an object names no key).
_PG_TARGET = "CASE WHEN json_typeof(i.value::json -> %s) = 'string' THEN i.value::json ->> %s END"
_PG_SCAN_FOLLOW = {
    (inc, bnd): _scan_follow_sql("%s", _PG_NOW, inc, bnd, _PG_TARGET) for inc in (True, False) for bnd in (True, False)
}


@functools.cache
def _pg_scan_merge(inclusive: bool, ranges: int) -> str:
    return _scan_merge_sql("%s", _PG_NOW, inclusive, ranges, _PG_TARGET)


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
        # Generic plans, prepared at first use. Every statement names its table (``tbl = $1``), and a
        # table that ANALYZE has not sampled yet (a new tenant's, until autovacuum catches up on a
        # table of millions of rows) is estimated at one row: a plan made for its values (a custom
        # plan, what an unprepared statement always gets) then reads the whole table instead of
        # looking up its keys (``key = ANY`` as a filter; a scan_follow that read every record of
        # the table per entry: 4.3 s for one page of a 10,000-conversation tenant beside a
        # 1,000,000 one). A generic plan estimates ``tbl = $1`` from the column's distinct count
        # and keeps every key condition in the index lookup.
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.prepare_threshold = 0
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
            with self._conns.using():
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

    def scan_follow(
        self, table: str, start: str, inclusive: bool, end: str | None, limit: int, field: str
    ) -> list[tuple[Entry, Entry | None]]:
        scan: tuple[Any, ...] = (table, start, end, limit) if end else (table, start, limit)
        try:
            with self._errors():
                rows = self._conns.get().execute(
                    _PG_SCAN_FOLLOW[inclusive, end is not None], (*scan, table, field, field)
                )
                return _followed(rows.fetchall())
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, self._psycopg.errors.UntranslatableCharacter):
                raise
        # An entry of the page holds a "\u0000" (valid JSON, which PostgreSQL's json operators cannot
        # turn into text): the same page in two round trips, the keys followed here.
        entries = self.scan(table, start, inclusive, end, limit)
        keys = [follow_key(e.value, field) for e in entries]
        wanted = [k for k in keys if k is not None and "\x00" not in k]
        found = {e.key: e for e in self.get_many(table, wanted) if e is not None} if wanted else {}
        return [(e, None if k is None else found.get(k)) for e, k in zip(entries, keys, strict=True)]

    def scan_merge(
        self, table: str, ranges: Sequence[tuple[str, str, str]], inclusive: bool, limit: int, field: str
    ) -> list[tuple[Entry, Entry | None]] | None:
        """Return the merged ranges (``ScanMerge``) in one statement; ``None`` where it cannot serve them.

        ``ranges``: ``(prefix, start, end)`` each. ``None`` when an entry of the
        page holds a ``"\\u0000"`` (as in ``scan_follow``): the caller merges by scans.
        """
        params: list[Any] = []
        for prefix, start, end in ranges:
            params += [len(prefix), table, start, end, limit]
        params += [limit, table, field, field]
        try:
            with self._errors():
                rows = self._conns.get().execute(_pg_scan_merge(inclusive, len(ranges)), params)
                return _followed(rows.fetchall())
        except StoreUnavailable as exc:
            if not isinstance(exc.__cause__, self._psycopg.errors.UntranslatableCharacter):
                raise
        return None

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

    def _call(self, table: str, groups: Sequence[int], ops: Sequence[Op], query: str = _PG_COMMIT) -> list[Any]:
        """Run the commit function over ``ops`` (op i in group ``groups[i]``); return the rows ``query`` selects.

        ``_PG_COMMIT``: one row per op, in order; ``_PG_COMMIT_FAILURES``: ``(pos, failure, version, value)``
        of the ops that failed their own check only (``pos`` counts from 1).
        """
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
            params = (table, list(groups), kinds, keys, values, expects, ttls, deltas)
            return self._conns.get().execute(query, params).fetchall()

    def _commit_batch(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        rows = self._call(table, [0] * len(ops), ops)
        for i, (_, failure, version, _, stored) in enumerate(rows):
            if failure == "conflict":
                raise ConflictError(table, ops[i].key, ops[i].expect, version)
            if failure == "add":
                _refuse_add(ops, i, stored)
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

    def commit_groups(self, table: str, groups: Sequence[Sequence[Op]]) -> list[Exception | None]:
        """Apply validated independent groups in one call of the commit function (one transaction).

        A refused ``Add`` (its sum over the groups leaves ``±MAX_COUNTER``) makes
        the call write nothing; the groups are then committed one by one, so the
        error falls on the group whose own commit meets it, as ``commit`` would.
        """
        ids = [n for n, ops in enumerate(groups) for _ in ops]
        flat = [op for ops in groups for op in ops]
        if not flat:
            return [None] * len(groups)
        rows = self._call(table, ids, flat, _PG_COMMIT_FAILURES)
        failures = {pos - 1: (failure, version, value) for pos, failure, version, value in rows}
        conflicted = {ids[i] for i, (failure, _, _) in failures.items() if failure == "conflict"}
        if any(failure == "add" and ids[i] not in conflicted for i, (failure, _, _) in failures.items()):
            return [self._one_of(table, ops) for ops in groups]  # nothing was written: name the group
        out: list[Exception | None] = []
        at = 0
        for ops in groups:
            failed = next(((j, failures[at + j]) for j in range(len(ops)) if at + j in failures), None)
            at += len(ops)
            if failed is None:
                out.append(None)
            elif failed[1][0] == "conflict":
                out.append(ConflictError(table, ops[failed[0]].key, ops[failed[0]].expect, failed[1][1]))
            else:
                try:
                    _refuse_add(ops, failed[0], failed[1][2])
                except (ValidationError, StoreUnavailable) as exc:
                    out.append(exc)
        return out

    def _one_of(self, table: str, ops: Sequence[Op]) -> Exception | None:
        """Commit one group alone; return ``None`` or the error its commit raised."""
        try:
            if ops:
                self.commit(table, ops)
        except Exception as exc:  # noqa: BLE001 - each group's own outcome, as commit_groups reports it
            return exc
        return None

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
