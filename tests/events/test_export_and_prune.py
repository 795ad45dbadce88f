"""Journal capabilities for backups and retention, on every backend.

``export_records`` / ``fencing_counter`` / ``import_records`` copy a journal
exactly (a restore must not change a state, an attempt count or a token, and
must never hand out a token twice); ``prune`` forgets old ``done`` records and
nothing else (a dead letter waits for a person).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from botmesh_admin.errors import Conflict, ValidationError
from botmesh_admin.events import EventJournal, RetryPolicy, connect_journal
from botmesh_admin.events.base import EventRecord, RecordExport, RecordPruning

from .conftest import FakeClock, url_for
from .test_conformance import LEASE, env

DAY_MS = 24 * 3600 * 1000


def every_state(journal: EventJournal, clock: FakeClock) -> dict[str, EventRecord]:
    """Leave records in every state and return them by idempotency key.

    ``done``, ``dead`` (three failed attempts), ``retried`` (pending after one
    failure), ``held`` (leased now), ``waiting`` and ``outbox`` (pending).
    """
    channels = {"done": None, "dead": "dlq", "retried": "retry", "held": "held",
                "waiting": None, "outbox": "outbox"}  # fmt: skip
    for key, channel in channels.items():
        journal.append(env(key, channel=channel, payload={"key": key, "text": "¿sí?"}))
        clock.advance(1)
    r = journal.claim(clock.now, LEASE)
    journal.ack(r.id, clock.advance(1), r.fencing_token)
    for _ in range(3):  # the fixture policy allows three attempts
        r = journal.claim(clock.advance(120_000), LEASE, channel="dlq")
        journal.fail(r.id, clock.advance(1), r.fencing_token, "boom")
    r = journal.claim(clock.now, LEASE, channel="retry")
    journal.fail(r.id, clock.advance(1), r.fencing_token, "try again")
    journal.claim(clock.now, LEASE, channel="held")
    out = {r.idempotency_key: r for r in journal.export_records()}
    assert [out[k].state for k in channels] == ["done", "dead", "pending", "leased", "pending", "pending"]
    return out


def copy_all(source: EventJournal, target: EventJournal, page: int = 2) -> int:
    records: list[EventRecord] = []
    after = None
    while batch := source.export_records(after=after, limit=page):
        records += batch
        after = batch[-1].id
    return target.import_records(records, fencing_counter=source.fencing_counter())


@pytest.fixture
def other_journal(backend: str, request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock, policy: RetryPolicy):
    """A second, empty journal of the same backend (the restore target)."""
    (tmp_path / "other").mkdir()
    j = connect_journal(url_for(backend, request, tmp_path / "other"), clock=clock, policy=policy)
    yield j
    j.close()


def test_backend_exports_imports_and_prunes(journal: EventJournal) -> None:
    assert isinstance(journal, RecordExport) and isinstance(journal, RecordPruning)


def test_export_pages_every_record_by_ascending_id(journal: EventJournal, clock: FakeClock) -> None:
    """Every tenant and state comes out, ascending by id, in pages chained by ``after``."""
    ids = [journal.append(env(f"k{i}", tenant=("acme", "other")[i % 2])).id for i in range(7)]
    pages, after = [], None
    while page := journal.export_records(after=after, limit=3):
        pages.append([r.id for r in page])
        after = page[-1].id
    assert [len(p) for p in pages] == [3, 3, 1]
    assert sum(pages, []) == sorted(ids)
    assert journal.export_records(after=max(ids)) == []


def test_fencing_counter_is_the_highest_token_handed_out(journal: EventJournal, clock: FakeClock) -> None:
    assert journal.fencing_counter() == 0
    journal.append(env("a"))
    journal.append(env("b"))
    journal.claim(clock.now, LEASE)
    second = journal.claim(clock.now, LEASE)
    assert journal.fencing_counter() == second.fencing_token


def test_import_restores_every_record_exactly(
    journal: EventJournal, other_journal: EventJournal, clock: FakeClock
) -> None:
    """States, attempts, tokens, times, errors, payloads and counts come back unchanged."""
    every_state(journal, clock)
    assert copy_all(journal, other_journal) == 6
    assert other_journal.export_records() == journal.export_records()
    assert other_journal.counts("acme") == journal.counts("acme")
    assert other_journal.list(tenant="acme", state="dead") == journal.list(tenant="acme", state="dead")
    assert other_journal.fencing_counter() == journal.fencing_counter()


def test_a_restored_journal_keeps_working_and_never_reuses_a_token(
    journal: EventJournal, other_journal: EventJournal, clock: FakeClock
) -> None:
    """Idempotency keys, the lease in flight and the fencing counter carry over."""
    states = every_state(journal, clock)
    copy_all(journal, other_journal)
    highest = journal.fencing_counter()
    # A redelivery of an event the backup holds is still recognised.
    assert other_journal.append(env("done", payload={"other": 1})) == states["done"]
    # The lease held at backup time can still be settled by its holder...
    leased = states["held"]
    assert other_journal.ack(leased.id, clock.now, leased.fencing_token).state == "done"
    # ...and the next claim gets a token above every token the old journal handed out.
    replayed = other_journal.replay(states["dead"].id)
    assert replayed.fencing_token > highest
    claimed = other_journal.claim(clock.advance(LEASE * 100), LEASE)
    assert claimed is not None and claimed.fencing_token > replayed.fencing_token


def test_import_raises_the_counter_to_the_given_value(other_journal: EventJournal, clock: FakeClock) -> None:
    """A backup's counter may exceed its tokens (records pruned): the restore keeps it."""
    assert other_journal.import_records([], fencing_counter=500) == 0
    other_journal.append(env("x"))
    assert other_journal.claim(clock.now, LEASE).fencing_token == 501


def test_import_replaces_a_record_with_the_same_id(journal: EventJournal, clock: FakeClock) -> None:
    record = journal.append(env("k"))
    changed = dataclasses.replace(record, state="done", attempts=1, fencing_token=3, last_error="")
    assert journal.import_records([changed]) == 1
    assert journal.get(record.id) == changed
    assert journal.counts("acme") == {("done", None): 1}
    assert journal.claim(clock.now, LEASE) is None


def test_import_refuses_an_idempotency_key_owned_by_another_record(journal: EventJournal) -> None:
    first = journal.append(env("same"))
    clash = dataclasses.replace(first, id="ev_other")
    with pytest.raises(Conflict, match="idempotency"):
        journal.import_records([clash])
    assert journal.export_records() == [first]


def test_import_validates_every_record_naming_the_field(journal: EventJournal) -> None:
    good = EventRecord(
        id="ev_1", type="inbox.message", channel=None, tenant="acme", payload={}, idempotency_key="k",
        created_at=1, available_at=1,
    )  # fmt: skip
    for bad, field in (
        (dataclasses.replace(good, state="gone"), r"records\[1\]\.state"),
        (dataclasses.replace(good, tenant="Not A Tenant"), r"records\[1\]\.tenant"),
        (dataclasses.replace(good, fencing_token=-1), r"records\[1\]\.fencing_token"),
        (dataclasses.replace(good, state="leased"), r"records\[1\]\.leased_until"),
    ):
        with pytest.raises(ValidationError, match=field):
            journal.import_records([dataclasses.replace(good, id="ev_0", idempotency_key="j"), bad])
    assert journal.export_records() == []


def test_prune_deletes_only_done_records_older_than_the_cutoff(journal: EventJournal, clock: FakeClock) -> None:
    """Pending, leased and dead records stay, whatever their age; so do recent done ones."""
    states = every_state(journal, clock)
    clock.advance(8 * DAY_MS)
    recent = journal.claim(clock.now, LEASE)  # "waiting", done now
    assert recent is not None and recent.idempotency_key == "waiting"
    journal.ack(recent.id, clock.now, recent.fencing_token)
    before = clock.now - 7 * DAY_MS
    assert journal.prune(before) == 1
    assert journal.get(states["done"].id) is None
    left = {r.idempotency_key: r.state for r in journal.export_records()}
    assert left == {"dead": "dead", "retried": "pending", "held": "leased", "waiting": "done",
                    "outbox": "pending"}  # fmt: skip
    assert journal.counts("acme")[("done", None)] == 1
    assert journal.prune(before) == 0


def test_prune_respects_the_limit_oldest_first(journal: EventJournal, clock: FakeClock) -> None:
    done = []
    for i in range(5):
        journal.append(env(f"k{i}"))
        r = journal.claim(clock.now, LEASE)
        done.append(journal.ack(r.id, clock.advance(10), r.fencing_token))
    assert journal.prune(clock.now + 1, limit=2) == 2
    assert [r.id for r in journal.export_records()] == sorted(r.id for r in done[2:])
    assert journal.prune(clock.now + 1, limit=10) == 3


def test_a_pruned_key_is_a_new_event_and_counts_follow(journal: EventJournal, clock: FakeClock) -> None:
    """After retention the idempotency key is free again; counts drop the pruned record."""
    first = journal.append(env("k"))
    r = journal.claim(clock.now, LEASE)
    journal.ack(r.id, clock.now, r.fencing_token)
    assert journal.counts("acme") == {("done", None): 1}
    journal.prune(clock.now + 1)
    assert journal.counts("acme") == {}
    assert journal.list(tenant="acme") == []
    second = journal.append(env("k"))
    assert second.id != first.id and second.state == "pending"


def test_a_replayed_record_is_not_pruned_while_pending(journal: EventJournal, clock: FakeClock) -> None:
    journal.append(env("k"))
    r = journal.claim(clock.now, LEASE)
    journal.ack(r.id, clock.now, r.fencing_token)
    journal.replay(r.id)
    assert journal.prune(clock.now + DAY_MS) == 0
    assert journal.get(r.id).state == "pending"


def test_prune_refuses_bad_arguments(journal: EventJournal) -> None:
    with pytest.raises(ValidationError, match="before"):
        journal.prune(-1)
    with pytest.raises(ValidationError, match="limit"):
        journal.prune(0, limit=0)


def test_file_journal_keeps_imports_and_prunes_across_a_restart(
    tmp_path: Path, clock: FakeClock, policy: RetryPolicy, open_journal: Callable[..., EventJournal]
) -> None:
    url = f"file://{tmp_path}/j.json"
    j = connect_journal(url, clock=clock, policy=policy)
    rec = j.append(env("a"))
    j.import_records([dataclasses.replace(rec, id="ev_z", idempotency_key="z", fencing_token=9)])
    j.close()
    j = connect_journal(url, clock=clock, policy=policy)
    assert j.fencing_counter() == 9 and j.get("ev_z") is not None
    j.close()
