"""The journal page's reads (issue 16, item 5): every filter pages newest first, counts stay exact.

``list`` within a tenant by state, channel, both or neither must read one
index range per page on the server backends, and ``counts`` must come from
counters kept with every change, not from a scan; these tests check the
answers against the definition (a full export of the records) on every
backend, and the server-specific upkeep: counters rebuilt for a journal that
had records before them (an upgrade) or whose records table was recreated (a
restore), Redis channel sets built for an older journal, and query plans that
read an index in order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from botmesh_admin.events import EventJournal, EventRecord
from botmesh_admin.events.base import STATES
from botmesh_admin.events.redis import RedisEventJournal
from botmesh_admin.events.sql import COUNT_SLOTS, SqlEventJournal

from .conftest import FakeClock, backend_params
from .test_conformance import LEASE, env

CHANNELS = (None, "inbound", "outbox")
FILTER_CHANNELS = (None, "", "inbound", "outbox")
SQL_ONLY = pytest.mark.parametrize("backend", backend_params(("sqlite", "postgresql")))


def everything(journal: EventJournal) -> list[EventRecord]:
    """Return every record (the definition the indexed reads are checked against)."""
    return journal.export_records(limit=10_000)  # type: ignore[attr-defined, no-any-return]


def expected_ids(records: list[EventRecord], tenant: str, state: str | None, channel: str | None) -> list[str]:
    """Return the ids ``list`` must give for these filters, newest first (``channel=""``: none)."""
    return sorted(
        (
            r.id
            for r in records
            if r.tenant == tenant
            and (state is None or r.state == state)
            and (channel is None or r.channel == (channel or None))
        ),
        reverse=True,
    )


def expected_counts(journal: EventJournal, tenant: str) -> dict[tuple[str, str | None], int]:
    return dict(Counter((r.state, r.channel) for r in everything(journal) if r.tenant == tenant))


def pages(journal: EventJournal, limit: int, **filters: Any) -> list[list[str]]:
    """Return the ids of every page of ``list`` with ``filters``, following the cursor."""
    out: list[list[str]] = []
    after = None
    while True:
        page = journal.list(limit=limit, after=after, **filters)
        if not page:
            return out
        out.append([r.id for r in page])
        after = page[-1].id


def fill(journal: EventJournal, clock: FakeClock) -> None:
    """Records of two tenants on three channels in every state, each reached by its transitions."""
    for i in range(4):  # dead letters: each the only ready record of its channel while it fails
        channel = CHANNELS[i % 3]
        journal.append(env(f"d{i}", tenant="acme" if i % 2 else "beta", channel=channel))
        for _ in range(3):  # the policy's three attempts
            record = journal.claim(clock.now, LEASE, channel=channel)
            assert record is not None and record.id.startswith("ev_")
            journal.fail(record.id, clock.now, record.fencing_token, "boom")
            clock.advance(60_000)
    for i in range(36):
        journal.append(env(f"k{i}", tenant="acme" if i % 4 else "beta", channel=CHANNELS[i % 3]))
        clock.advance(1)
    for i in range(14):
        record = journal.claim(clock.now, LEASE, channel=CHANNELS[i % 3])
        assert record is not None
        if i % 7 == 0:
            pass  # stays leased
        elif i % 3 == 0:
            journal.ack(record.id, clock.now, record.fencing_token)
        else:
            journal.fail(record.id, clock.now, record.fencing_token, "retry later")
        clock.advance(1)


def test_every_filter_pages_newest_first_and_its_cursor_continues(journal: EventJournal, clock: FakeClock) -> None:
    fill(journal, clock)
    records = everything(journal)
    assert {r.state for r in records} == set(STATES)
    for tenant in ("acme", "beta"):
        for state in (None, *STATES):
            for channel in FILTER_CHANNELS:
                want = expected_ids(records, tenant, state, channel)
                got = pages(journal, 4, tenant=tenant, state=state, channel=channel)
                assert [i for page in got for i in page] == want, (tenant, state, channel)
                assert all(len(page) == 4 for page in got[:-1])


def test_counts_follow_every_change(journal: EventJournal, clock: FakeClock) -> None:
    def agree() -> None:
        for tenant in ("acme", "beta", "nobody"):
            assert journal.counts(tenant) == expected_counts(journal, tenant)

    fill(journal, clock)
    agree()
    dead = journal.list(tenant="acme", state="dead", limit=1)[0]
    journal.replay(dead.id)
    agree()
    record = journal.claim(clock.now, LEASE, channel=dead.channel)
    assert record is not None
    journal.release(record.id, clock.now, record.fencing_token)
    agree()
    clock.advance(LEASE + 1)
    assert journal.prune(clock.now) > 0  # type: ignore[attr-defined]
    agree()
    assert ("done", None) not in journal.counts("acme")


def test_an_import_moves_the_counts_of_the_records_it_replaces(journal: EventJournal, clock: FakeClock) -> None:
    fill(journal, clock)
    records = everything(journal)
    replaced = [
        EventRecord(**{**r.__dict__, "state": "dead", "leased_until": None, "channel": "outbox"}) for r in records[:5]
    ]
    journal.import_records(replaced)  # type: ignore[attr-defined]
    for tenant in ("acme", "beta"):
        assert journal.counts(tenant) == expected_counts(journal, tenant)


# -- the SQL journal ---------------------------------------------------------------------------


@pytest.fixture
def sql_journal(journal: EventJournal) -> SqlEventJournal:
    """The test's journal on SQLite or PostgreSQL (tests using it parametrize ``backend``)."""
    assert isinstance(journal, SqlEventJournal)
    return journal


def run_sql(journal: SqlEventJournal, sql: str) -> list[tuple[Any, ...]]:
    """Run one statement on the journal's own connection; return its rows (none for a change)."""
    with journal._db.errors():
        cursor = journal._db.connection().execute(sql)
        return list(cursor.fetchall()) if cursor.description else []


@SQL_ONLY
def test_counts_are_rebuilt_for_a_journal_from_before_the_counters(
    sql_journal: SqlEventJournal, clock: FakeClock, open_journal: Callable[..., EventJournal]
) -> None:
    """An installation upgraded from a version without ``<table>_counts`` gets exact counts."""
    fill(sql_journal, clock)
    want = expected_counts(sql_journal, "acme")
    t = sql_journal.table
    run_sql(sql_journal, f"DROP TABLE {t}_counts")
    for trigger in ("insert", "delete", "state", "moved"):
        if not sql_journal._db.pg:
            run_sql(sql_journal, f"DROP TRIGGER {t}_count_{trigger}")
    upgraded = open_journal()
    assert upgraded.counts("acme") == want
    upgraded.append(env("after-upgrade"))
    assert upgraded.counts("acme") == expected_counts(upgraded, "acme")


@SQL_ONLY
def test_counts_made_for_another_incarnation_of_the_table_are_rebuilt(
    sql_journal: SqlEventJournal, clock: FakeClock, open_journal: Callable[..., EventJournal]
) -> None:
    """A restore that recreates the records table (``pg_restore --clean``) leaves stale counters."""
    if not sql_journal._db.pg:
        pytest.skip("SQLite is restored as a whole file, counters included")
    fill(sql_journal, clock)
    t = sql_journal.table
    run_sql(sql_journal, f"UPDATE {t}_counts SET done = done + 7 WHERE tenant = 'acme'")
    run_sql(sql_journal, f"UPDATE {t}_counts SET done = 1 WHERE tenant = ''")  # another table's OID
    assert open_journal().counts("acme") == expected_counts(sql_journal, "acme")


@SQL_ONLY
def test_the_counts_read_touches_counter_rows_not_records(sql_journal: SqlEventJournal, clock: FakeClock) -> None:
    fill(sql_journal, clock)
    t = sql_journal.table
    rows = run_sql(sql_journal, f"SELECT count(*) FROM {t}_counts WHERE tenant = 'acme'")[0][0]
    assert rows <= len(CHANNELS) * (COUNT_SLOTS if sql_journal._db.pg else 1)


@SQL_ONLY
@pytest.mark.parametrize(
    ("where", "index", "columns"),
    [
        ("tenant = 'acme'", "tenant_id", "tenant, id"),
        ("tenant = 'acme' AND state = 'dead'", "tenant_state", "tenant, state, id"),
        ("tenant = 'acme' AND channel = 'outbox'", "tenant_channel", "tenant, channel, id"),
        (
            "tenant = 'acme' AND state = 'dead' AND channel = ''",
            "tenant_state_channel",
            "tenant, state, channel, id",
        ),
    ],
)
def test_each_list_filter_has_an_index_that_reads_the_page_in_id_order(
    sql_journal: SqlEventJournal, clock: FakeClock, where: str, index: str, columns: str
) -> None:
    """The filter's columns then ``id``: a page is the first ``limit`` entries of one index range.

    SQLite's plan must use it without a sort; PostgreSQL's planner may prefer
    another plan for a test-sized table, so there the index itself is checked.
    """
    fill(sql_journal, clock)
    t = sql_journal.table
    if sql_journal._db.pg:
        defs = [r[0] for r in run_sql(sql_journal, f"SELECT indexdef FROM pg_indexes WHERE tablename = '{t}'")]
        assert any(d.endswith(f"({columns})") for d in defs), defs
        return
    query = f"SELECT id FROM {t} WHERE {where} AND id < 'ev_~' ORDER BY id DESC LIMIT 51"
    plan = " ".join(str(r[-1]) for r in run_sql(sql_journal, "EXPLAIN QUERY PLAN " + query))
    assert f"INDEX {t}_{index} " in plan and "TEMP B-TREE" not in plan, plan


# -- the Redis journal -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", backend_params(("redis",)))
def test_redis_channel_sets_of_an_older_journal_are_built_by_prune(
    journal: EventJournal, clock: FakeClock, open_journal: Callable[..., EventJournal]
) -> None:
    """Records from before ``P:ic``/``P:isc`` list right at once, and by those sets once built."""
    assert isinstance(journal, RedisEventJournal)
    fill(journal, clock)
    client, p = journal._client, journal.prefix
    old = [*client.scan_iter(match=f"{p}:ic:*"), *client.scan_iter(match=f"{p}:isc:*")]
    client.delete(*old)  # as a journal written before the channel sets (marker included)
    older = open_journal()
    assert isinstance(older, RedisEventJournal)
    assert not older._channel_sets_built()
    want = expected_ids(everything(older), "acme", None, "outbox")
    assert [i for page in pages(older, 5, tenant="acme", channel="outbox") for i in page] == want
    older.append(env("meanwhile", channel="outbox"))
    clock.advance(1)
    assert older.prune(0) == 0 and older._channel_sets_built()  # the hourly prune builds them
    assert older.build_indexes() == 0
    records = everything(older)
    for state in (None, *STATES):
        for channel in FILTER_CHANNELS[1:]:
            got = pages(older, 3, tenant="acme", state=state, channel=channel)
            assert [i for page in got for i in page] == expected_ids(records, "acme", state, channel)


@pytest.mark.parametrize("backend", backend_params(("redis",)))
def test_redis_channel_sets_build_in_batches_and_resume(
    journal: EventJournal, clock: FakeClock, open_journal: Callable[..., EventJournal]
) -> None:
    assert isinstance(journal, RedisEventJournal)
    fill(journal, clock)
    client, p = journal._client, journal.prefix
    client.delete(*client.scan_iter(match=f"{p}:ic:*"), *client.scan_iter(match=f"{p}:isc:*"))
    older = open_journal()
    assert isinstance(older, RedisEventJournal)
    assert older._run("build", 7) == 7 and not older._channel_sets_built()  # a killed build...
    assert older.build_indexes(batch=7) == 40 - 7  # ...resumes where it stopped
    records = everything(older)
    got = pages(older, 4, tenant="beta", state="dead", channel="")
    assert [i for page in got for i in page] == expected_ids(records, "beta", "dead", "")
