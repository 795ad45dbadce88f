"""SqlEventJournal: the journal in one SQL table, on SQLite (stdlib) or PostgreSQL (psycopg 3).

Table ``botmesh_events`` (``botmesh_events_<namespace>`` with ``?namespace=`` in
the URL, used by tests to stay apart on a shared server), one row per record;
``channel`` is ``''`` for the default channel so it can be indexed and compared
with ``=``. A partial index ``(channel, available_at, id) WHERE state IN
('pending','leased')`` serves ``claim``: a leased record's ``available_at`` is
its ``leased_until``, so a ready record and an expired lease are one range scan.
Every filter of ``list`` within a tenant (state, channel, both, neither) has an
index ending in ``id``, so a page is one index range read newest first.

``counts`` reads ``<table>_counts``: one row per ``(tenant, channel, slot)``
with a counter column per state, moved by the same statement that changes a
record's state (below), so the journal page's counts cost O(channels), never a
scan of the tenant's records. A state change is one row update (-1 in the old
state's column, +1 in the new one's) in one of ``COUNT_SLOTS`` slots chosen per
statement, so concurrent writers of one tenant and channel rarely wait for the
same counter row; ``counts`` sums the slots. The counters are rebuilt from the
records (under a lock that holds writers off) when the schema is set up and
finds them missing or made for another incarnation of the records table (an
upgrade from a version without them, a restore that recreated the table): the
row of tenant ``''`` (no tenant id is empty) holds in ``done`` the table's OID
(PostgreSQL) or 1 (SQLite).

- **PostgreSQL**: every call is one autocommit statement. ``claim`` is one
  ``UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED)`` that takes its token from
  the sequence ``botmesh_events_fence`` (``nextval`` never repeats, also after a
  server restart). ``ack``/``fail``/``release`` are one ``UPDATE … WHERE id = …
  AND fencing_token = …``: the token check and the change are one statement.
  Each state change carries its counter upsert in a ``WITH`` clause of that
  statement (no trigger: a ``pg_dump --table`` of the journal would carry a
  trigger without its function). The upsert takes its counter rows in key
  order, so two statements never wait for each other's counters in a cycle.
- **SQLite** (the embedded default: web, worker and beat are separate processes
  sharing one file): WAL, ``synchronous=FULL`` (``?synchronous=normal`` trades
  durability across a power loss — not across a process crash — for speed); ``claim`` and ``replay`` are one
  ``BEGIN IMMEDIATE`` transaction that bumps the counter row and updates the
  record; the other changes are single statements. Triggers keep the counts
  (the database file is backed up whole, triggers included).

Each thread (and each process) gets its own connection; driver errors are raised
as ``StoreUnavailable``.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import random
import re
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from botmesh_admin.errors import Conflict, NotFound, StoreUnavailable, ValidationError
from botmesh_admin.kv.sql import ThreadConnections, sqlite_path_from_url

from .base import (
    STATES,
    Clock,
    Envelope,
    EventRecord,
    RetryPolicy,
    StaleLeaseError,
    clip_error,
    first_of_keys,
    lease_expired_error,
    not_replayable,
    now_ms,
    validate_batch_limit,
    validate_channel,
    validate_envelope,
    validate_envelopes,
    validate_erase_args,
    validate_event_id,
    validate_export_args,
    validate_imported,
    validate_lease,
    validate_list_args,
    validate_prune_args,
    validate_settlements,
    validate_time,
    validate_token,
)

NAMESPACE_RE = re.compile(r"^[a-z0-9_]{1,40}$")
COLS = (
    "id, type, channel, tenant, payload, idempotency_key, created_at, state, attempts,"
    " available_at, leased_until, fencing_token, last_error"
)
_FIELDS = tuple(c.strip() for c in COLS.split(","))
_SCHEMA_LOCK = 0x626F746D65736802  # "botmesh\x02": serialises concurrent schema creation
COUNT_SLOTS = 16
"""Counter rows per (tenant, channel) on PostgreSQL (SQLite serialises its writers: one)."""
APPEND_ROUNDS = 3
"""Insert-then-read rounds of an append: a key found taken but gone when read (pruned or erased in between)
is inserted again; a second round settles it unless the key is removed again meanwhile."""


def split_namespace(url: str) -> tuple[str, str]:
    """Return ``(url without ?namespace=, table name)``; raise ``ValidationError`` for a bad one."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    namespace = [v for k, v in query if k == "namespace"]
    rest = [(k, v) for k, v in query if k != "namespace"]
    table = "botmesh_events"
    if namespace:
        if not NAMESPACE_RE.match(namespace[-1]):
            raise ValidationError("url", "namespace must be 1-40 characters of a-z, 0-9, '_'")
        table = f"botmesh_events_{namespace[-1]}"
    base = url.split("?", 1)[0]
    return (f"{base}?{urlencode(rest, quote_via=quote)}" if rest else base), table


def _named(sql: str) -> str:
    """Turn ``:name`` placeholders into psycopg's ``%(name)s`` (``::type`` casts untouched)."""
    return re.sub(r"(?<![:\w]):([a-z_]+)", r"%(\1)s", sql)


def _record(row: Sequence[Any]) -> EventRecord:
    return EventRecord(
        id=row[0],
        type=row[1],
        channel=row[2] or None,
        tenant=row[3],
        payload=json.loads(row[4]),
        idempotency_key=row[5],
        created_at=row[6],
        state=row[7],
        attempts=row[8],
        available_at=row[9],
        leased_until=row[10],
        fencing_token=row[11],
        last_error=row[12],
    )


def _statements(t: str, pg: bool) -> dict[str, str]:
    """Return the SQL of every operation on table ``t`` for one dialect (``:name`` placeholders)."""
    greatest = "GREATEST" if pg else "max"
    big = "bigint" if pg else "INTEGER"
    if pg:
        backoff = (
            "floor(LEAST(:cap::bigint, :base::bigint << LEAST(GREATEST(attempts - 1, 0), 40)::int)"
            " * :factor::float8)::bigint"
        )
    else:
        backoff = "CAST(min(:cap, :base << min(max(attempts - 1, 0), 40)) * :factor AS INTEGER)"
    lease_check = "id = :id AND state = 'leased' AND fencing_token = :token"
    sql = {
        "insert": f"INSERT INTO {t} ({COLS}) VALUES (:id, :type, :channel, :tenant, :payload,"
        " :idempotency_key, :created_at, 'pending', 0, :now, NULL, 0, NULL)"
        f" ON CONFLICT (tenant, idempotency_key) DO NOTHING RETURNING {COLS}",
        "by_key": f"SELECT {COLS} FROM {t} WHERE tenant = :tenant AND idempotency_key = :idempotency_key",
        "get": f"SELECT {COLS} FROM {t} WHERE id = :id",
        "ack": f"UPDATE {t} SET state = 'done', leased_until = NULL, available_at = :now"
        f" WHERE {lease_check} AND leased_until > :now RETURNING {COLS}",
        "fail": f"UPDATE {t} SET"
        " state = CASE WHEN attempts >= :max THEN 'dead' ELSE 'pending' END,"
        f" available_at = CASE WHEN attempts >= :max THEN :now ELSE :now + {backoff} END,"
        " leased_until = NULL, last_error = :error"
        f" WHERE {lease_check} AND leased_until > :now RETURNING {COLS}",
        "extend": f"UPDATE {t} SET leased_until = :till, available_at = :till"
        f" WHERE {lease_check} AND leased_until > :now RETURNING {COLS}",
        "release": f"UPDATE {t} SET state = 'pending', attempts = {greatest}(attempts - 1, 0),"
        f" leased_until = NULL, available_at = :now WHERE {lease_check} RETURNING {COLS}",
        "counts": f"SELECT channel, {', '.join(f'CAST(sum({s}) AS {big})' for s in STATES)}"
        f" FROM {t}_counts WHERE tenant = :tenant GROUP BY channel",
        "export": f"SELECT {COLS} FROM {t} WHERE id > :after ORDER BY id LIMIT :limit",
        "import": f"INSERT INTO {t} ({COLS}) VALUES (:id, :type, :channel, :tenant, :payload,"
        " :idempotency_key, :created_at, :state, :attempts, :available_at, :leased_until,"
        " :fencing_token, :last_error) ON CONFLICT (id) DO UPDATE SET"
        + ",".join(f" {c.strip()} = excluded.{c.strip()}" for c in COLS.split(",")[1:]),
        # The partial index on done records keeps this a range scan, oldest first.
        "prune": f"DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE state = 'done'"
        " AND available_at < :before ORDER BY available_at LIMIT :limit)",
        # The (tenant, idempotency_key) unique index makes this a range scan of the tenant.
        "erase": f"DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE tenant = :tenant LIMIT :limit)",
        "erase_counts": f"DELETE FROM {t}_counts WHERE tenant = :tenant",
    }
    # What a claim writes into the chosen row: a lease, or the DLQ when an expired
    # lease was the record's last attempt (the worker died on it max_attempts times).
    last = "e.state = 'leased' AND e.attempts >= :max"
    claim_set = (
        f"fencing_token = {{token}},"
        f" state = CASE WHEN {last} THEN 'dead' ELSE 'leased' END,"
        f" attempts = CASE WHEN {last} THEN e.attempts ELSE e.attempts + 1 END,"
        f" leased_until = CASE WHEN {last} THEN NULL ELSE :until END,"
        f" available_at = CASE WHEN {last} THEN :now ELSE :until END,"
        f" last_error = CASE WHEN {last} THEN :lease_error ELSE e.last_error END"
    )
    ready = (
        f"SELECT id FROM {t} WHERE channel = :channel AND state IN ('pending', 'leased')"
        " AND available_at <= :now ORDER BY available_at, id LIMIT 1"
    )
    ecols = ", ".join(f"e.{c.strip()}" for c in COLS.split(","))

    def alone(rows: str) -> str:
        """Keep of ``rows`` (ready rows with id, state, attempts, available_at) what one claim_many may lease.

        A record attempted before (attempts > 0, not an expired last attempt) is
        claimed alone: first of the live rows, and ``:fresh_only`` 0 (no earlier
        statement of this claim leased any), it is kept by itself with the dead
        letters before it; else the batch ends before it. ``n`` numbers the kept
        rows 1.. in claim order (a prefix of the ready rows).
        """
        live = "CASE WHEN s.state = 'leased' AND s.attempts >= :max THEN 0 ELSE 1 END"
        return (
            "SELECT * FROM (SELECT w.*, MIN(CASE WHEN w.live = 1 AND w.attempts > 0 THEN w.n END) OVER () AS cut,"
            " MIN(CASE WHEN w.live = 1 THEN w.n END) OVER () AS first_live FROM ("
            f"SELECT s.*, row_number() OVER (ORDER BY s.available_at, s.id) AS n, {live} AS live FROM ({rows}) s) w) x"
            " WHERE x.cut IS NULL OR x.n < x.cut OR (x.n = x.cut AND x.cut = x.first_live AND :fresh_only = 0)"
        )

    if pg:
        pg_set = claim_set.format(token=f"nextval('{t}_fence')")
        # ``c.state`` is the state the row had when it was locked: the claim's old state.
        # The candidate is chosen once, in a MATERIALIZED CTE: as a sub-select in the
        # UPDATE's FROM the planner may rescan it (a nested loop), and each rescan of a
        # LIMIT 1 ... SKIP LOCKED query may lock another row — the claim then leased two
        # records, or failed on the counters' upsert ("ON CONFLICT DO UPDATE command
        # cannot affect row a second time"), seen under two Celery workers on jobs.run.
        sql["claim"] = _counted(
            t,
            f"UPDATE {t} e SET {pg_set} FROM c WHERE e.id = c.id RETURNING {ecols}, c.state AS old_state",
            first=f"c AS MATERIALIZED ({ready.replace('SELECT id', 'SELECT id, state', 1)} FOR UPDATE SKIP LOCKED)",
        )
        sql["replay"] = _counted(
            t,
            f"UPDATE {t} e SET state = 'pending', attempts = 0, leased_until = NULL,"
            f" available_at = :now, fencing_token = nextval('{t}_fence')"
            f" FROM (SELECT id, state FROM {t} WHERE id = :id FOR UPDATE) o"
            f" WHERE e.id = o.id AND o.state IN ('dead', 'done') RETURNING {ecols}, o.state AS old_state",
        )
        sql["insert"] = _counted(t, sql["insert"] + ", NULL::text AS old_state")
        # append_many: the batch as arrays, one INSERT (and its counters) in one statement.
        sql["insert_many"] = _counted(
            t,
            f"INSERT INTO {t} ({COLS}) SELECT n.id, n.type, n.channel, n.tenant, n.payload,"
            " n.idempotency_key, n.created_at, 'pending', 0, n.available_at, NULL, 0, NULL"
            " FROM unnest(:ids::text[], :types::text[], :channels::text[], :tenants::text[],"
            " :payloads::text[], :keys::text[], :created::bigint[], :nows::bigint[]) WITH ORDINALITY"
            " AS n(id, type, channel, tenant, payload, idempotency_key, created_at, available_at, ord)"
            f" ORDER BY n.ord ON CONFLICT (tenant, idempotency_key) DO NOTHING RETURNING {COLS},"
            " NULL::text AS old_state",
            rows="many",
        )
        # claim_many: the claim above with LIMIT :limit. The tokens are drawn in claim order in
        # ``k`` (nextval over the rows sorted by an OFFSET-0 sub-select: the projection runs in its
        # order), so a batch's tokens grow as one record's claims after another's would; ``ready_at``
        # (the row's available_at when chosen) gives back the claim order RETURNING does not keep.
        sql["claim_many"] = _counted(
            t,
            f"UPDATE {t} e SET {claim_set.format(token='k.token')} FROM k WHERE e.id = k.id"
            f" RETURNING {ecols}, k.state AS old_state, k.available_at AS ready_at",
            first="c AS MATERIALIZED ("
            + ready.replace("SELECT id", "SELECT id, state, attempts, available_at", 1).replace(
                "LIMIT 1", "LIMIT :limit"
            )
            + f" FOR UPDATE SKIP LOCKED), k AS MATERIALIZED (SELECT id, state, available_at, nextval('{t}_fence')"
            f" AS token FROM (SELECT * FROM ({alone('SELECT * FROM c')}) a ORDER BY available_at, id OFFSET 0) o)",
            result=f"{COLS}, ready_at",
            rows="many",
        )
        # ack_many / fail_many: the claims as arrays joined to their rows; the token check is
        # each row's condition in the one UPDATE.
        settle_many = (
            f" FROM unnest(:ids::text[], :tokens::bigint[], :factors::float8[], :errors::text[])"
            " AS s(id, token, factor, error)"
            " WHERE e.id = s.id AND e.state = 'leased' AND e.fencing_token = s.token AND e.leased_until > :now"
            f" RETURNING {ecols}, 'leased'::text AS old_state"
        )
        many_backoff = backoff.replace("attempts", "e.attempts").replace(":factor::float8", "s.factor")
        sql["ack_many"] = _counted(
            t,
            f"UPDATE {t} e SET state = 'done', leased_until = NULL, available_at = :now{settle_many}",
            rows="many",
        )
        sql["fail_many"] = _counted(
            t,
            f"UPDATE {t} e SET state = CASE WHEN e.attempts >= :max THEN 'dead' ELSE 'pending' END,"
            f" available_at = CASE WHEN e.attempts >= :max THEN :now ELSE :now + {many_backoff} END,"
            f" leased_until = NULL, last_error = s.error{settle_many}",
            rows="many",
        )
        sql["by_keys"] = (
            f"SELECT {COLS} FROM {t} WHERE (tenant, idempotency_key) IN"
            " (SELECT * FROM unnest(:tenants::text[], :keys::text[]))"
        )
        for name in ("ack", "fail", "release"):  # only a leased record passes the lease check
            sql[name] = _counted(t, sql[name] + ", 'leased'::text AS old_state")
        sql["prune"] = _counted(
            t,
            sql["prune"] + " RETURNING tenant, channel, NULL::text AS state, state AS old_state",
            result="count(*)",
            rows="many",
        )
        sql["erase"] = _counted(
            t,
            sql["erase"] + " RETURNING tenant, channel, NULL::text AS state, state AS old_state",
            result="count(*)",
            rows="many",
        )
    else:
        sql["ready"] = ready
        sql["bump"] = f"UPDATE {t}_fence SET value = value + 1 WHERE one = 1 RETURNING value"
        sql["claim"] = f"UPDATE {t} AS e SET {claim_set.format(token=':token')} WHERE e.id = :id RETURNING {COLS}"
        # claim_many: the ready rows numbered in claim order get tokens :base + 1, :base + 2, …; the
        # same transaction then moves the counter past the last one (``fence_add``).
        sql["fence_value"] = f"SELECT value FROM {t}_fence WHERE one = 1"
        sql["fence_add"] = f"UPDATE {t}_fence SET value = value + :count WHERE one = 1"
        ready_many = ready.replace("SELECT id", "SELECT id, state, attempts, available_at", 1)
        ready_many = ready_many.replace("LIMIT 1", "LIMIT :limit")
        sql["claim_many"] = (
            f"UPDATE {t} AS e SET {claim_set.format(token=':base + c.n')}"
            f" FROM (SELECT id AS cid, n FROM ({alone(ready_many)}))"
            f" AS c WHERE e.id = c.cid RETURNING {COLS}"
        )
        # SQLite's RETURNING names only the updated table's columns: the joined ones are named apart.
        settle_many = (
            " FROM (SELECT value ->> 0 AS sid, value ->> 1 AS stoken, value ->> 2 AS sfactor,"
            " value ->> 3 AS serror FROM json_each(:items)) AS s"
            " WHERE e.id = s.sid AND e.state = 'leased' AND e.fencing_token = s.stoken AND e.leased_until > :now"
            f" RETURNING {COLS}"
        )
        many_backoff = backoff.replace("attempts", "e.attempts").replace(":factor", "s.sfactor")
        sql["ack_many"] = f"UPDATE {t} AS e SET state = 'done', leased_until = NULL, available_at = :now{settle_many}"
        sql["fail_many"] = (
            f"UPDATE {t} AS e SET state = CASE WHEN e.attempts >= :max THEN 'dead' ELSE 'pending' END,"
            f" available_at = CASE WHEN e.attempts >= :max THEN :now ELSE :now + {many_backoff} END,"
            f" leased_until = NULL, last_error = s.serror{settle_many}"
        )
        sql["replay"] = (
            f"UPDATE {t} SET state = 'pending', attempts = 0, leased_until = NULL,"
            " available_at = :now, fencing_token = :token"
            f" WHERE id = :id AND state IN ('dead', 'done') RETURNING {COLS}"
        )
    if pg:
        sql = {name: _named(text) for name, text in sql.items()}
    return sql


def _counted(t: str, change: str, *, result: str = COLS, rows: str = "one", first: str = "") -> str:
    """Return PostgreSQL ``change`` with the upsert of the counters it moves, as one statement.

    ``change`` returns its rows' ``tenant``, ``channel``, new ``state`` (NULL
    for a delete) and ``old_state`` (NULL for an insert); the statement
    answers ``SELECT <result> FROM`` those rows. A changed row adds -1 to its
    old state's counter and +1 to its new one's in slot ``:slot``. ``rows``
    ``"one"``: ``change`` touches at most one record (one counter row, no
    aggregation); ``"many"``: the rows are summed per ``(tenant, channel)`` and
    written in key order, a fixed lock order. ``first`` is a CTE (``name AS (...)``)
    that ``change`` reads, evaluated before it.
    """
    if rows == "one":
        deltas = ", ".join(
            f"(state IS NOT DISTINCT FROM '{s}')::int - (old_state IS NOT DISTINCT FROM '{s}')::int" for s in STATES
        )
        source = f"SELECT tenant, channel, :slot::int, {deltas} FROM u"
        source += " WHERE old_state IS DISTINCT FROM state"
    else:
        deltas = ", ".join(
            f"count(*) FILTER (WHERE state = '{s}') - count(*) FILTER (WHERE old_state = '{s}')" for s in STATES
        )
        source = f"SELECT tenant, channel, :slot::int, {deltas} FROM u"
        source += " WHERE old_state IS DISTINCT FROM state GROUP BY tenant, channel"
        source += " ORDER BY tenant, channel"
    added = ", ".join(f"{s} = k.{s} + excluded.{s}" for s in STATES)
    return (
        f"WITH {first + ', ' if first else ''}u AS ({change}),"
        f" moved AS (INSERT INTO {t}_counts AS k (tenant, channel, slot, {', '.join(STATES)})"
        f" {source} ON CONFLICT (tenant, channel, slot) DO UPDATE SET {added})"
        f" SELECT {result} FROM u"
    )


def _ddl(t: str, pg: bool) -> list[str]:
    text = 'text COLLATE "C"' if pg else "TEXT"
    big = "bigint" if pg else "INTEGER"
    ddl = [
        f"""CREATE TABLE IF NOT EXISTS {t} (
            id {text} PRIMARY KEY,
            type {text} NOT NULL,
            channel {text} NOT NULL,
            tenant {text} NOT NULL,
            payload {text} NOT NULL,
            idempotency_key {text} NOT NULL,
            created_at {big} NOT NULL,
            state {text} NOT NULL,
            attempts {big} NOT NULL,
            available_at {big} NOT NULL,
            leased_until {big},
            fencing_token {big} NOT NULL,
            last_error {text},
            UNIQUE (tenant, idempotency_key))""",
        f"CREATE INDEX IF NOT EXISTS {t}_ready ON {t} (channel, available_at, id) WHERE state IN ('pending', 'leased')",
        f"CREATE INDEX IF NOT EXISTS {t}_tenant_state ON {t} (tenant, state, id)",
        f"CREATE INDEX IF NOT EXISTS {t}_tenant_id ON {t} (tenant, id)",
        f"CREATE INDEX IF NOT EXISTS {t}_tenant_channel ON {t} (tenant, channel, id)",
        f"CREATE INDEX IF NOT EXISTS {t}_tenant_state_channel ON {t} (tenant, state, channel, id)",
        f"CREATE INDEX IF NOT EXISTS {t}_done ON {t} (available_at) WHERE state = 'done'",
        f"""CREATE TABLE IF NOT EXISTS {t}_counts (
            tenant {text} NOT NULL,
            channel {text} NOT NULL,
            slot {big} NOT NULL,
            {" ".join(f"{s} {big} NOT NULL DEFAULT 0," for s in STATES)}
            PRIMARY KEY (tenant, channel, slot))""",
    ]
    if pg:
        ddl.insert(0, f"CREATE SEQUENCE IF NOT EXISTS {t}_fence")
    else:
        ddl += [
            f"CREATE TABLE IF NOT EXISTS {t}_fence (one INTEGER PRIMARY KEY CHECK (one = 1), value INTEGER NOT NULL)",
            f"INSERT OR IGNORE INTO {t}_fence (one, value) VALUES (1, 0)",
            *_sqlite_count_triggers(t),
        ]
    return ddl


def _sqlite_count_triggers(t: str) -> list[str]:
    """Return the triggers that keep ``<t>_counts`` on SQLite (insert, delete, a moved record)."""

    def add(tenant: str, channel: str, deltas: list[str]) -> str:
        columns = ", ".join(STATES)
        added = ", ".join(f"{s} = {s} + excluded.{s}" for s in STATES)
        return (
            f"INSERT INTO {t}_counts (tenant, channel, slot, {columns})"
            f" VALUES ({tenant}, {channel}, 0, {', '.join(deltas)})"
            f" ON CONFLICT (tenant, channel, slot) DO UPDATE SET {added};"
        )

    def one(row: str, sign: int) -> str:
        deltas = [f"{sign} * ({row}.state = '{s}')" for s in STATES]
        return add(f"{row}.tenant", f"{row}.channel", deltas)

    same = "old.tenant IS new.tenant AND old.channel IS new.channel"
    deltas = [f"(new.state = '{s}') - (old.state = '{s}')" for s in STATES]
    state_moved = add("new.tenant", "new.channel", deltas)
    return [
        f"CREATE TRIGGER IF NOT EXISTS {t}_count_insert AFTER INSERT ON {t} BEGIN {one('new', 1)} END",
        f"CREATE TRIGGER IF NOT EXISTS {t}_count_delete AFTER DELETE ON {t} BEGIN {one('old', -1)} END",
        f"CREATE TRIGGER IF NOT EXISTS {t}_count_state AFTER UPDATE OF state ON {t}"
        f" WHEN {same} AND old.state IS NOT new.state BEGIN {state_moved} END",
        # Only an import replaces a record by one of another tenant or channel.
        f"CREATE TRIGGER IF NOT EXISTS {t}_count_moved AFTER UPDATE OF tenant, channel ON {t}"
        f" WHEN NOT ({same}) BEGIN {one('old', -1)} {one('new', 1)} END",
    ]


def _rebuild_counts(t: str, source: int) -> list[str]:
    """Return the statements that recount ``<t>_counts`` from the records and mark it ``source``.

    Run by the schema set-up, inside its transaction, after taking a lock that
    keeps writers off the records table until it commits.
    """
    columns = ", ".join(STATES)
    per_state = ", ".join(f"sum(CASE WHEN state = '{s}' THEN 1 ELSE 0 END)" for s in STATES)
    return [
        f"DELETE FROM {t}_counts",
        f"INSERT INTO {t}_counts (tenant, channel, slot, {columns})"
        f" SELECT tenant, channel, 0, {per_state} FROM {t} GROUP BY tenant, channel",
        f"INSERT INTO {t}_counts (tenant, channel, slot, done) VALUES ('', '', 0, {int(source)})",
    ]


_COUNTS_SOURCE = "SELECT done FROM {t}_counts WHERE tenant = '' AND channel = '' AND slot = 0"


class _Postgres:
    pg = True

    def __init__(self, url: str, table: str) -> None:
        import psycopg

        self._psycopg = psycopg
        self._url = url
        self._table = table
        self._schema_ready = False
        self._conns: ThreadConnections[Any] = ThreadConnections(self._connect, lambda c: c.close())

    def _connect(self) -> Any:
        options: dict[str, Any] = {} if "connect_timeout" in self._url else {"connect_timeout": 10}
        conn = self._psycopg.connect(self._url, autocommit=True, prepare_threshold=0, **options)
        if not self._schema_ready:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                self._set_up(conn)
            self._schema_ready = True
        return conn

    def _set_up(self, conn: Any) -> None:
        """Create what is missing (idempotent); recount the counters made for another table."""
        t = self._table
        for statement in _ddl(t, pg=True):
            conn.execute(statement)
        oid = int(conn.execute(f"SELECT '{t}'::regclass::oid::bigint").fetchone()[0])
        source = conn.execute(_COUNTS_SOURCE.format(t=t)).fetchone()
        if source is None or source[0] != oid:
            # SHARE blocks every writer (and waits for those in flight) until commit.
            conn.execute(f"LOCK TABLE {t} IN SHARE MODE")
            for statement in _rebuild_counts(t, oid):
                conn.execute(statement)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        try:
            with self._conns.using():
                yield
        except self._psycopg.errors.UniqueViolation as exc:
            raise Conflict("event id is taken by another record") from exc
        except self._psycopg.Error as exc:
            if isinstance(exc, self._psycopg.OperationalError | self._psycopg.InterfaceError):
                self._conns.discard()
            raise StoreUnavailable(f"PostgreSQL journal: {exc}") from exc

    def run(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self.errors():
            return self._conns.get().execute(sql, params).fetchall()

    def connection(self) -> Any:
        """Return this thread's connection (call inside ``errors()``)."""
        return self._conns.get()

    def close(self) -> None:
        self._conns.close()


class _Sqlite:
    pg = False

    def __init__(self, url: str, table: str) -> None:
        import sqlite3

        self._sqlite3 = sqlite3
        self._path = sqlite_path_from_url(url)
        query = dict(parse_qsl(urlsplit(url).query))
        self._synchronous = query.get("synchronous", "full").upper()
        if self._synchronous not in ("FULL", "NORMAL"):
            raise ValidationError("url", "synchronous must be full or normal")
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(os.path.abspath(self._path)), exist_ok=True)
        self._table = table
        self._schema_ready = False
        self._conns: ThreadConnections[Any] = ThreadConnections(self._connect, lambda c: c.close())

    def _connect(self) -> Any:
        conn = self._sqlite3.connect(self._path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        if not self._schema_ready:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("BEGIN IMMEDIATE")  # the write lock: no writer until COMMIT
            for statement in _ddl(self._table, pg=False):
                conn.execute(statement)
            if conn.execute(_COUNTS_SOURCE.format(t=self._table)).fetchone() is None:
                for statement in _rebuild_counts(self._table, 1):
                    conn.execute(statement)
            conn.execute("COMMIT")
            self._schema_ready = True
        return conn

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        try:
            with self._conns.using():
                yield
        except self._sqlite3.IntegrityError as exc:
            raise Conflict("event id is taken by another record") from exc
        except self._sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite journal {self._path}: {exc}") from exc

    def run(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self.errors():
            return self._conns.get().execute(sql, params).fetchall()

    def connection(self) -> Any:
        """Return this thread's connection (call inside ``errors()``)."""
        return self._conns.get()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Any]:
        """Run the block in one ``BEGIN IMMEDIATE`` transaction (the database write lock)."""
        with self.errors():
            conn = self._conns.get()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(self._sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        self._conns.close()


class _NotReplayed(Exception):
    """Internal: the record is not dead or done (rolls the replay transaction back)."""


class SqlEventJournal:
    """EventJournal over SQLite (``sqlite:///path``) or PostgreSQL (``postgresql://…``).

    Raise ``ValidationError`` (field ``url``) for another scheme or a bad
    ``namespace`` and ``StoreUnavailable`` when the database cannot be reached.
    """

    def __init__(self, url: str, *, policy: RetryPolicy | None = None, clock: Clock | None = None) -> None:
        self.url = url
        self.policy = policy or RetryPolicy()
        self.clock: Clock = clock or now_ms
        conn_url, self.table = split_namespace(url)
        scheme = urlsplit(url).scheme.lower()
        if scheme == "sqlite":
            self._db: _Sqlite | _Postgres = _Sqlite(conn_url, self.table)
        elif scheme in ("postgresql", "postgres"):
            self._db = _Postgres(conn_url, self.table)
        else:
            raise ValidationError("url", f"SqlEventJournal needs sqlite:// or postgresql://, not {scheme!r}")
        self._sql = _statements(self.table, self._db.pg)
        self.ping()

    def __repr__(self) -> str:
        return f"<SqlEventJournal {'postgresql' if self._db.pg else 'sqlite'} {self.table}>"

    def _one(self, name: str, **params: Any) -> EventRecord | None:
        if self._db.pg:
            params["slot"] = random.randrange(COUNT_SLOTS)  # the counter rows this change moves
        rows = self._db.run(self._sql[name], params)
        return _record(rows[0]) if rows else None

    def append(self, envelope: Envelope) -> EventRecord:
        """Store ``envelope`` as a ``pending`` record, or return the tenant's record with its key."""
        record = validate_envelope(envelope, self.clock())
        params = {
            "id": record.id,
            "type": record.type,
            "channel": record.channel or "",
            "tenant": record.tenant,
            "payload": json.dumps(record.payload, ensure_ascii=False, separators=(",", ":")),
            "idempotency_key": record.idempotency_key,
            "created_at": record.created_at,
            "now": record.available_at,
        }
        for _ in range(APPEND_ROUNDS):
            stored = self._one("insert", **params)
            if stored is None:
                stored = self._one("by_key", tenant=record.tenant, idempotency_key=record.idempotency_key)
            if stored is not None:
                return stored
        raise StoreUnavailable("journal append did not settle (idempotency key contended)")

    def append_many(self, envelopes: Sequence[Envelope]) -> builtins.list[EventRecord]:
        """Store every envelope (or answer its key's record) in one commit.

        PostgreSQL: one ``INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING``
        statement with its counters, then one read of the keys stored before.
        SQLite: one ``BEGIN IMMEDIATE`` transaction of single-row inserts.
        """
        firsts, where = first_of_keys(validate_envelopes(envelopes, self.clock()))
        if not firsts:
            return []
        if isinstance(self._db, _Postgres):
            stored = self._append_many_pg(firsts)
        else:
            stored = self._append_many_sqlite(self._db, firsts)
        return [stored[i] for i in where]

    def _append_many_pg(self, firsts: builtins.list[EventRecord]) -> builtins.list[EventRecord]:
        found: dict[tuple[str, str], EventRecord] = {}
        todo = firsts
        for _ in range(APPEND_ROUNDS):
            params: dict[str, Any] = {
                "ids": [r.id for r in todo],
                "types": [r.type for r in todo],
                "channels": [r.channel or "" for r in todo],
                "tenants": [r.tenant for r in todo],
                "payloads": [json.dumps(r.payload, ensure_ascii=False, separators=(",", ":")) for r in todo],
                "keys": [r.idempotency_key for r in todo],
                "created": [r.created_at for r in todo],
                "nows": [r.available_at for r in todo],
                "slot": random.randrange(COUNT_SLOTS),
            }
            rows = self._db.run(self._sql["insert_many"], params)
            for row in rows:
                record = _record(row)
                found[(record.tenant, record.idempotency_key)] = record
            rest = [r for r in todo if (r.tenant, r.idempotency_key) not in found]
            if rest:
                keys = {"tenants": [r.tenant for r in rest], "keys": [r.idempotency_key for r in rest]}
                for row in self._db.run(self._sql["by_keys"], keys):
                    record = _record(row)
                    found[(record.tenant, record.idempotency_key)] = record
            todo = [r for r in todo if (r.tenant, r.idempotency_key) not in found]
            if not todo:
                return [found[(r.tenant, r.idempotency_key)] for r in firsts]
        raise StoreUnavailable("journal append did not settle (idempotency key contended)")

    def _append_many_sqlite(self, db: _Sqlite, firsts: builtins.list[EventRecord]) -> builtins.list[EventRecord]:
        stored: builtins.list[EventRecord] = []
        with db.transaction() as conn:
            for r in firsts:
                row = conn.execute(
                    self._sql["insert"],
                    {
                        "id": r.id, "type": r.type, "channel": r.channel or "", "tenant": r.tenant,
                        "payload": json.dumps(r.payload, ensure_ascii=False, separators=(",", ":")),
                        "idempotency_key": r.idempotency_key, "created_at": r.created_at, "now": r.available_at,
                    },
                ).fetchone()  # fmt: skip
                if row is None:  # the key is stored: the write lock keeps it there until COMMIT
                    row = conn.execute(
                        self._sql["by_key"], {"tenant": r.tenant, "idempotency_key": r.idempotency_key}
                    ).fetchone()
                stored.append(_record(row))
        return stored

    def get(self, event_id: str) -> EventRecord | None:
        """Return the record ``event_id``, or ``None``."""
        return self._one("get", id=validate_event_id(event_id))

    def claim(self, now: int, lease_ms: int, channel: str | None = None) -> EventRecord | None:
        """Lease the oldest ready record of ``channel`` until ``now + lease_ms``."""
        validate_lease(now, lease_ms)
        params: dict[str, Any] = {
            "channel": validate_channel(channel, "channel") or "",
            "now": now,
            "until": now + lease_ms,
            "max": self.policy.max_attempts,
            "lease_error": lease_expired_error(self.policy.max_attempts),
        }
        # Not a contended retry (kv.cas's CONTENDED_ATTEMPTS bounds compare-and-set misses): no
        # statement here loses a race — SKIP LOCKED passes over locked rows, the SQLite write lock
        # serialises. A round that did not lease dead-lettered an expired last lease, so every round
        # makes progress and the rounds are bounded by those records; a bound would answer "nothing
        # ready" while records are ready.
        while True:
            record = self._claim_once(params)
            if record is None or record.state == "leased":
                return record
            # An expired last lease went to the DLQ: try the next record.

    def _claim_once(self, params: dict[str, Any]) -> EventRecord | None:
        if isinstance(self._db, _Postgres):
            return self._one("claim", **params)
        with self._db.transaction() as conn:
            row = conn.execute(self._sql["ready"], params).fetchone()
            if row is None:
                return None
            token = conn.execute(self._sql["bump"]).fetchone()[0]
            rows = conn.execute(self._sql["claim"], {**params, "id": row[0], "token": token})
            return _record(rows.fetchone())

    def claim_many(
        self,
        now: int,
        lease_ms: int,
        channel: str | None = None,
        limit: int = 100,
        *,
        dead_lettered: builtins.list[EventRecord] | None = None,
    ) -> builtins.list[EventRecord]:
        """Lease up to ``limit`` oldest ready records of ``channel``, oldest first, in one statement.

        PostgreSQL: the ``claim`` statement with ``LIMIT`` (one ``nextval`` per
        row, in claim order). SQLite: one ``BEGIN IMMEDIATE`` transaction (the
        write lock) — read the counter, lease the ready rows numbered from it
        in one ``UPDATE``, move the counter past them.
        A statement that dead-lettered expired last attempts is followed by
        another for the places they took.
        """
        validate_lease(now, lease_ms)
        want = validate_batch_limit(limit)
        params: dict[str, Any] = {
            "channel": validate_channel(channel, "channel") or "",
            "now": now,
            "until": now + lease_ms,
            "max": self.policy.max_attempts,
            "lease_error": lease_expired_error(self.policy.max_attempts),
        }
        claimed: builtins.list[EventRecord] = []
        while len(claimed) < want:
            # A record attempted before is claimed alone (base.claim_many): once this claim leased one, it
            # takes no more; once it leased any, a later statement leases no retried one.
            fresh_only = 1 if claimed and want > 1 else 0
            rows = self._claim_many_once({**params, "limit": want - len(claimed), "fresh_only": fresh_only})
            leased = [r for r in rows if r.state == "leased"]
            claimed += leased
            if dead_lettered is not None:
                dead_lettered += [r for r in rows if r.state == "dead"]
            if len(leased) == len(rows) or any(r.attempts > 1 for r in leased):  # no more ready, or one alone
                break
        return claimed

    def _claim_many_once(self, params: dict[str, Any]) -> builtins.list[EventRecord]:
        if isinstance(self._db, _Postgres):
            rows = self._db.run(self._sql["claim_many"], {**params, "slot": random.randrange(COUNT_SLOTS)})
            rows.sort(key=lambda row: (row[13], row[0]))  # ready_at, id: the claim order
            return [_record(row) for row in rows]
        with self._db.transaction() as conn:
            base = conn.execute(self._sql["fence_value"]).fetchone()[0]
            rows = conn.execute(self._sql["claim_many"], {**params, "base": base}).fetchall()
            conn.execute(self._sql["fence_add"], {"count": len(rows)})
        records = [_record(row) for row in rows]
        records.sort(key=lambda r: r.fencing_token)  # tokens were numbered in claim order
        return records

    def ack_many(self, now: int, claims: Sequence[tuple[str, int]]) -> builtins.list[EventRecord | None]:
        """``ack`` every live claim in one ``UPDATE``; ``None`` for a refused one."""
        items = validate_settlements(now, claims, "claims", errors=False)
        return self._settle_many("ack_many", now, items, [0.0] * len(items))

    def fail_many(self, now: int, failures: Sequence[tuple[str, int, str]]) -> builtins.list[EventRecord | None]:
        """``fail`` every live claim in one ``UPDATE`` (each its own jitter); ``None`` for a refused one."""
        items = validate_settlements(now, failures, "failures", errors=True)
        factors = [self.policy.jitter_factor() for _ in items]
        p = self.policy
        return self._settle_many(
            "fail_many", now, items, factors, max=p.max_attempts, cap=p.max_delay_ms, base=p.base_delay_ms
        )

    def _settle_many(
        self,
        name: str,
        now: int,
        items: builtins.list[tuple[str, int, str]],
        factors: builtins.list[float],
        **params: Any,
    ) -> builtins.list[EventRecord | None]:
        if not items:
            return []
        params["now"] = now
        if self._db.pg:
            params["ids"] = [i[0] for i in items]
            params["tokens"] = [i[1] for i in items]
            params["factors"] = factors
            params["errors"] = [i[2] for i in items]
            params["slot"] = random.randrange(COUNT_SLOTS)
        else:
            params["items"] = json.dumps(
                [
                    [event_id, token, factor, error]
                    for (event_id, token, error), factor in zip(items, factors, strict=True)
                ]
            )
        by_id = {record.id: record for record in map(_record, self._db.run(self._sql[name], params))}
        return [by_id.get(event_id) for event_id, _, _ in items]

    def _settle(self, name: str, event_id: str, now: int, fencing_token: int, **params: Any) -> EventRecord:
        validate_event_id(event_id)
        validate_time(now, "now")
        validate_token(fencing_token)
        record = self._one(name, id=event_id, now=now, token=fencing_token, **params)
        if record is not None:
            return record
        current = self.get(event_id)
        if current is None:
            raise NotFound(f"event {event_id!r} not found")
        expired = current.state == "leased" and current.fencing_token == fencing_token
        raise StaleLeaseError(event_id, fencing_token, "expired" if expired else "superseded")

    def ack(self, event_id: str, now: int, fencing_token: int) -> EventRecord:
        """Mark the leased record ``done`` if ``fencing_token`` is its live lease."""
        return self._settle("ack", event_id, now, fencing_token)

    def fail(self, event_id: str, now: int, fencing_token: int, error: str) -> EventRecord:
        """Retry the record after the backoff, or dead-letter it after ``max_attempts``."""
        p = self.policy
        return self._settle(
            "fail", event_id, now, fencing_token,
            max=p.max_attempts, cap=p.max_delay_ms, base=p.base_delay_ms,
            factor=p.jitter_factor(), error=clip_error(error),
        )  # fmt: skip

    def extend(self, event_id: str, now: int, fencing_token: int, lease_ms: int) -> EventRecord:
        """Renew the live lease ``fencing_token`` until ``now + lease_ms``."""
        validate_lease(now, lease_ms)
        return self._settle("extend", event_id, now, fencing_token, till=now + lease_ms)

    def release(self, event_id: str, now: int, fencing_token: int) -> EventRecord:
        """Give the lease back without spending an attempt."""
        return self._settle("release", event_id, now, fencing_token)

    def replay(self, event_id: str) -> EventRecord:
        """Put a ``dead`` or ``done`` record back to ``pending`` with a fresh token."""
        validate_event_id(event_id)
        params = {"id": event_id, "now": self.clock()}
        record = (
            self._one("replay", **params) if isinstance(self._db, _Postgres) else self._replay_sqlite(self._db, params)
        )
        if record is not None:
            return record
        current = self.get(event_id)
        if current is None:
            raise NotFound(f"event {event_id!r} not found")
        raise not_replayable(current)

    def _replay_sqlite(self, db: _Sqlite, params: dict[str, Any]) -> EventRecord | None:
        try:
            with db.transaction() as conn:
                token = conn.execute(self._sql["bump"]).fetchone()[0]
                row = conn.execute(self._sql["replay"], {**params, "token": token}).fetchone()
                if row is None:
                    raise _NotReplayed  # roll back: only a replay spends a token
                return _record(row)
        except _NotReplayed:
            return None

    def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        channel: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> list[EventRecord]:
        """Return up to ``limit`` records, newest id first, ids below ``after``."""
        validate_list_args(tenant, state, channel, limit, after)
        where: list[str] = []
        params: dict[str, Any] = {"limit": limit}
        for column, value in (("tenant", tenant), ("state", state), ("channel", channel)):
            if value is not None:
                where.append(f"{column} = :{column}")
                params[column] = value
        if after is not None:
            where.append("id < :after")
            params["after"] = after
        sql = f"SELECT {COLS} FROM {self.table}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT :limit"
        if self._db.pg:
            sql = _named(sql)
        return [_record(row) for row in self._db.run(sql, params)]

    def counts(self, tenant: str) -> dict[tuple[str, str | None], int]:
        """Return ``{(state, channel): n}`` for ``tenant``: its counter rows summed, O(groups)."""
        validate_list_args(tenant, None, None, 1, None)
        out: dict[tuple[str, str | None], int] = {}
        for channel, *per_state in self._db.run(self._sql["counts"], {"tenant": tenant}):
            for state, n in zip(STATES, per_state, strict=True):
                if n:
                    out[(state, channel or None)] = int(n)
        return out

    # -- optional capabilities: export/import (backups), prune (retention) -------------

    def export_records(self, *, after: str | None = None, limit: int = 1000) -> builtins.list[EventRecord]:
        """Return up to ``limit`` records of every tenant, ascending by id, ids above ``after``."""
        validate_export_args(after, limit)
        rows = self._db.run(self._sql["export"], {"after": after or "", "limit": limit})
        return [_record(row) for row in rows]

    def fencing_counter(self) -> int:
        """Return the highest fencing token handed out so far."""
        if self._db.pg:
            sql = f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {self.table}_fence"
        else:
            sql = f"SELECT value FROM {self.table}_fence WHERE one = 1"
        return int(self._db.run(sql, {})[0][0])

    def import_records(self, records: Sequence[EventRecord], *, fencing_counter: int = 0) -> int:
        """Store ``records`` as given (restore) in one transaction; raise the fencing counter."""
        records = validate_imported(records, fencing_counter)
        fence = max([fencing_counter, *(r.fencing_token for r in records)])
        rows = [
            {
                **{name: getattr(r, name) for name in _FIELDS},
                "channel": r.channel or "",
                "payload": json.dumps(r.payload, ensure_ascii=False, separators=(",", ":")),
            }
            for r in records
        ]
        try:
            self._import_rows(rows, fence)
        except Conflict:
            raise Conflict(
                "an imported record's (tenant, idempotency_key) or id is already used by another"
                " event: restore into an empty journal"
            ) from None
        return len(rows)

    def _import_rows(self, rows: builtins.list[dict[str, Any]], fence: int) -> None:
        t = self.table
        if isinstance(self._db, _Postgres):
            with self._db.errors():
                conn = self._db.connection()
                with conn.transaction(), conn.cursor() as cursor:
                    if rows:
                        self._import_pg(cursor, rows)
                    if fence > 0:
                        # setval(.., true): the next nextval() answers fence + 1.
                        cursor.execute(
                            f"SELECT setval('{t}_fence', GREATEST(%s::bigint, CASE WHEN is_called"
                            f" THEN last_value ELSE 0 END), true) FROM {t}_fence",
                            (fence,),
                        )
        else:
            with self._db.transaction() as conn:
                conn.executemany(self._sql["import"], rows)
                conn.execute(f"UPDATE {t}_fence SET value = max(value, ?) WHERE one = 1", (fence,))

    def _import_pg(self, cursor: Any, rows: builtins.list[dict[str, Any]]) -> None:
        """Upsert ``rows`` and move the counters from the replaced records' groups to theirs."""
        t = self.table
        by_id = {row["id"]: row for row in rows}  # a repeated id: the last one stays
        cursor.execute(f"SELECT tenant, state, channel FROM {t} WHERE id = ANY(%s) FOR UPDATE", (list(by_id),))
        moved: dict[tuple[str, str], list[int]] = {}
        for tenant, state, channel in cursor.fetchall():
            moved.setdefault((tenant, channel), [0] * len(STATES))[STATES.index(state)] -= 1
        for row in by_id.values():
            group = moved.setdefault((row["tenant"], row["channel"]), [0] * len(STATES))
            group[STATES.index(row["state"])] += 1
        cursor.executemany(self._sql["import"], rows)
        # Last, in key order: the same lock order as every other statement.
        added = ", ".join(f"{s} = k.{s} + excluded.{s}" for s in STATES)
        cursor.executemany(
            f"INSERT INTO {t}_counts AS k (tenant, channel, slot, {', '.join(STATES)})"
            f" VALUES (%s, %s, 0, {', '.join(['%s'] * len(STATES))})"
            f" ON CONFLICT (tenant, channel, slot) DO UPDATE SET {added}",
            [(*group, *deltas) for group, deltas in sorted(moved.items()) if any(deltas)],
        )

    def prune(self, before: int, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` records done before ``before``, oldest first; return how many."""
        validate_prune_args(before, limit)
        params: dict[str, Any] = {"before": before, "limit": limit}
        if self._db.pg:
            params["slot"] = random.randrange(COUNT_SLOTS)
            return int(self._db.run(self._sql["prune"], params)[0][0])
        with self._db.errors():
            return int(self._db.connection().execute(self._sql["prune"], params).rowcount)

    def erase_tenant(self, tenant: str, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` records of ``tenant`` (any state); return how many.

        Once none is left, the tenant's count rows go too (nothing of it stays).
        """
        validate_erase_args(tenant, limit)
        params: dict[str, Any] = {"tenant": tenant, "limit": limit}
        if self._db.pg:
            params["slot"] = random.randrange(COUNT_SLOTS)
            gone = int(self._db.run(self._sql["erase"], params)[0][0])
        else:
            with self._db.errors():
                gone = int(self._db.connection().execute(self._sql["erase"], params).rowcount)
        if gone < limit:
            with self._db.errors():
                self._db.connection().execute(self._sql["erase_counts"], {"tenant": tenant})
        return gone

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` if the database cannot be reached."""
        self._db.run("SELECT 1", {})

    def close(self) -> None:
        """Close every thread's connection; later calls raise ``StoreUnavailable``."""
        self._db.close()
