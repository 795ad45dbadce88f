"""Secondary indexes inside the Kv (``botmesh_admin.kv.indexes``), over every backend.

The index contents are always compared with what a scan of the records
defines: ``IndexedTable.check`` recomputes every entry and counter.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from botmesh_admin.errors import ValidationError
from botmesh_admin.kv import ABSENT, Delete, Put
from botmesh_admin.kv.indexes import (
    CountIndex,
    Desc,
    IndexedTable,
    IndexNotBuilt,
    RecordChange,
    RecordType,
    decode,
    encode,
)
from botmesh_admin.kv.memory import MemoryKv
from tests.kv.conftest import SHARED_BACKENDS, backend_params
from tests.kv.index_workers import TICKET, churn, churn_by_url, random_ticket, ticket_write, tickets

INDEXES = [i.name for i in TICKET.indexes]


def no_drift(layout, table: str) -> dict[str, dict[str, int]]:
    """Return the drift of every index of the tickets that has any."""
    report = {name: layout.check(table, name) for name in INDEXES}
    return {name: r for name, r in report.items() if any(r.values())}


def expected_counts(records: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Return tickets per status, computed from the records themselves."""
    counts: dict[str, int] = {}
    for r in records.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


# -- the encoding -----------------------------------------------------------------

scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**19) + 1, max_value=10**19 - 1),
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=12),
)


def _rank(value: object) -> tuple[int, object]:
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, int):
        return (2, value)
    return (3, [ord(c) for c in value])  # type: ignore[union-attr]


@given(st.lists(st.lists(scalar, min_size=1, max_size=3), min_size=2, max_size=30))
@settings(max_examples=300, deadline=None)
def test_encoding_preserves_tuple_order(rows: list[list[object]]) -> None:
    """Sorting encoded keys sorts the tuples: None < bools < ints < strings, component-wise."""
    by_key = sorted(rows, key=encode)
    by_value = sorted(rows, key=lambda r: [_rank(v) for v in r])
    assert [[_rank(v) for v in r] for r in by_key] == [[_rank(v) for v in r] for r in by_value]


def test_encoding_keeps_components_apart() -> None:
    """A string holding the terminator or escape never runs into the next component."""
    assert encode(["a", "b"]) != encode(["a b"])
    assert encode(["a!", "b"]) < encode(["a!!"]) or encode(["a!", "b"]) != encode(["a!!"])
    assert sorted([encode(["a"]), encode(["a", 1]), encode(["a b"]), encode(["a!"])]) == [
        encode(["a"]),
        encode(["a", 1]),
        encode(["a b"]),
        encode(["a!"]),
    ]


@given(st.lists(scalar, max_size=4))
@settings(max_examples=300, deadline=None)
def test_decode_gives_back_the_encoded_values(values: list[object]) -> None:
    """``decode`` inverts ``encode``, types included (a count_prefix group names its values)."""
    got = decode(encode(values))
    assert [(type(v), v) for v in got] == [(type(v), v) for v in values]


def test_decode_refuses_what_encode_never_writes() -> None:
    """A truncated or foreign text is a ``ValueError``, never a wrong value."""
    for bad in ["s", "sabc", "4123 ", "x ", "1", "s!x ", "2s "]:
        with pytest.raises(ValueError):
            decode(bad)


def test_encoding_refuses_floats_and_huge_integers() -> None:
    """Only None, booleans, integers within ±10**19 and strings can be key components."""
    with pytest.raises(ValidationError):
        encode([1.5])
    with pytest.raises(ValidationError):
        encode([10**19])


# -- upkeep over every backend ---------------------------------------------------------


def test_value_index_lists_by_status_newest_first(kv, table) -> None:
    """A page of one status is one scan, newest ``at`` first, with the payload covering the row."""
    layout = tickets(kv)
    for i, (status, at) in enumerate([("open", 5), ("open", 9), ("resolved", 7), ("open", 1)]):
        rec = {"status": status, "at": at, "tags": [], "owner": None, "weight": 1}
        assert ticket_write(layout, table, f"t/{i}", rec)
    page = layout.scan(table, "by_status", ["open"], limit=10)
    assert [(e.value["pk"], e.value["at"]) for e in page] == [("t/1", 9), ("t/0", 5), ("t/3", 1)]
    second = layout.scan(table, "by_status", ["open"], after=page[0].key, limit=10)
    assert [e.value["pk"] for e in second] == ["t/0", "t/3"]
    assert [e.value["status"] for e in layout.fetch(table, page) if e] == ["open"] * 3


def test_updates_move_entries_and_counters(kv, table) -> None:
    """Changing a record's status moves its entry and both counters in the same commit."""
    layout = tickets(kv)
    rec = {"status": "open", "at": 3, "tags": ["vip", "es"], "owner": "ana", "weight": 2}
    assert ticket_write(layout, table, "t/a", rec)
    assert layout.count(table, "n_status", [["open"], ["resolved"]]) == [1, 0]
    assert layout.count(table, "n_tag", [["vip"], ["es"], ["lead"]]) == [1, 1, 0]
    assert ticket_write(layout, table, "t/a", dict(rec, status="resolved", tags=["es"], weight=5))
    assert layout.count(table, "n_status", [["open"], ["resolved"]]) == [0, 1]
    assert layout.count(table, "n_tag", [["vip"], ["es"]]) == [0, 1]
    assert layout.count(table, "sum_weight", [["ana"]]) == [5]
    assert [e.value["pk"] for e in layout.scan(table, "by_tag", ["es"])] == ["t/a"]
    assert layout.scan(table, "by_tag", ["vip"]) == []
    assert ticket_write(layout, table, "t/a", None)
    assert layout.count(table, "n_status", [["resolved"]]) == [0]
    assert layout.scan(table, "owned", ["ana"]) == []
    assert no_drift(layout, table) == {}


def test_text_prefix_finds_entries_by_the_start_of_a_string(kv, table) -> None:
    """A search by prefix is one scan: ``lu`` finds ``luis`` and not ``ana``."""
    layout = tickets(kv)
    for i, owner in enumerate(["ana", "luis", "lucia"]):
        rec = {"status": "open", "at": i, "tags": [], "owner": owner, "weight": 0}
        assert ticket_write(layout, table, f"t/{i}", rec)
    found = layout.scan(table, "owned", (), text_prefix="lu")
    assert sorted(e.value["pk"] for e in found) == ["t/1", "t/2"]
    assert layout.scan(table, "owned", (), text_prefix="luisa") == []


def test_where_leaves_records_out(kv, table) -> None:
    """A record the index's ``where`` refuses has no entry; one that starts matching gets one."""
    layout = tickets(kv)
    rec = {"status": "open", "at": 3, "tags": [], "owner": None, "weight": 0}
    assert ticket_write(layout, table, "t/a", rec)
    assert layout.scan(table, "owned", [None]) == []
    assert ticket_write(layout, table, "t/a", dict(rec, owner="luis"))
    assert [e.value["pk"] for e in layout.scan(table, "owned", ["luis"])] == ["t/a"]


def test_a_fresh_table_is_built_on_its_first_write(kv, table) -> None:
    """New installations never need the reindex command: the first write marks every index built."""
    layout = tickets(kv)
    assert layout.count(table, "n_status", [["open"]]) == [0]  # empty: readable, nothing to build
    assert ticket_write(layout, table, "t/1", random_ticket(random.Random(1)))
    assert {layout.state(table, name) for name in INDEXES} == {"built"}


def test_a_table_written_before_the_index_is_built_online(kv, table) -> None:
    """Reads refuse an unbuilt index; ``build`` indexes existing records and reads then agree."""
    rng = random.Random(7)
    records = {f"t/{i:04d}": random_ticket(rng) for i in range(230)}
    for key, value in records.items():  # the records, written without any index upkeep
        kv.commit(table, [Put(key, value)])
    layout = tickets(kv)
    with pytest.raises(IndexNotBuilt) as caught:
        layout.count(table, "n_status", [["open"]])
    assert "botmesh_reindex" in str(caught.value)
    seen: list[int] = []
    for name in INDEXES:
        layout.build(table, name, batch=50, progress=seen.append)
    assert seen[-1] == 230
    want = expected_counts(records)
    assert layout.count(table, "n_status", [[s] for s in sorted(want)]) == [want[s] for s in sorted(want)]
    assert no_drift(layout, table) == {}


def test_a_build_resumes_where_a_killed_one_stopped(kv, table) -> None:
    """The cursor commits with each batch: a second build continues, and counts stay exact."""
    rng = random.Random(3)
    records = {f"t/{i:04d}": random_ticket(rng) for i in range(120)}
    for key, value in records.items():
        kv.commit(table, [Put(key, value)])
    layout = tickets(kv)

    class Killed(Exception):
        pass

    def die(done: int) -> None:
        if done >= 40:
            raise Killed

    with pytest.raises(Killed):
        layout.build(table, "n_status", batch=20, progress=die)
    assert layout.state(table, "n_status") == "building"
    assert layout.build(table, "n_status", batch=20) == 80
    assert layout.check(table, "n_status") == {"missing": 0, "extra": 0, "wrong": 0}


def test_a_build_under_concurrent_writers_leaves_no_drift(kv, table) -> None:
    """Writers keep writing while the index builds; the result equals the records' definition."""
    rng = random.Random(11)
    for i in range(300):
        kv.commit(table, [Put(f"t/{i:04d}", random_ticket(rng))])
    stop = threading.Event()

    def writer(seed: int) -> None:
        local = random.Random(seed)
        layout = tickets(kv)
        while not stop.is_set():
            key = f"t/{local.randrange(330):04d}"
            ticket_write(layout, table, key, None if local.random() < 0.2 else random_ticket(local))

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    try:
        layout = tickets(kv)
        for name in INDEXES:
            layout.build(table, name, batch=25)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert no_drift(layout, table) == {}


def test_rebuild_repairs_a_drifting_index(kv, table) -> None:
    """An entry lost by hand is reported as missing; a rebuild restores it."""
    layout = tickets(kv)
    churn(kv, table, seed=5, writes=120)
    victim = layout.scan(table, "by_status", ["open"], limit=1)
    assert victim
    kv.commit(table, [Put(victim[0].key, {"pk": "t/ghost"})])
    assert layout.check(table, "by_status") == {"missing": 0, "extra": 0, "wrong": 1}
    orphan = "x/by_status/sopen 40000000000000000001 t/nobody"
    lost = layout.scan(table, "by_status", ["resolved"], limit=1)
    assert lost
    kv.commit(table, [Put(orphan, {"pk": "t/nobody"}), Delete(lost[0].key)])
    assert layout.check(table, "by_status") == {"missing": 1, "extra": 1, "wrong": 1}
    layout.build(table, "by_status", rebuild=True, batch=40)
    assert no_drift(layout, table) == {}


def test_erasure_drops_indexes_with_the_records(kv, table) -> None:
    """After ``drop`` the table is empty, and the next write builds its indexes again."""
    layout = tickets(kv)
    churn(kv, table, seed=9, writes=40)
    kv.drop(table)
    assert layout.count(table, "n_status", [["open"]]) == [0]
    rec = {"status": "open", "at": 1, "tags": [], "owner": None, "weight": 1}
    assert ticket_write(layout, table, "t/x", rec)  # a cached "built" from before is re-checked
    assert layout.count(table, "n_status", [["open"]]) == [1]
    assert no_drift(layout, table) == {}


def test_a_stale_writer_over_a_recreated_record_keeps_the_index_exact(kv, table) -> None:
    """ABA: a writer read version 1 of a record that was then deleted and created again (version 1).

    Its compare-and-set still succeeds (the versions match), but the index
    follows what was really replaced, not the stale value the writer read.
    """
    from botmesh_admin.kv.indexes import RecordChange

    layout = tickets(kv)
    first = {"status": "open", "at": 1, "tags": ["vip"], "owner": "ana", "weight": 1}
    assert ticket_write(layout, table, "t/a", first)
    stale = kv.get(table, "t/a")
    assert ticket_write(layout, table, "t/a", None)
    assert ticket_write(layout, table, "t/a", dict(first, status="pending", tags=["es"]))
    assert kv.get(table, "t/a").version == stale.version  # the ABA the Kv cannot see
    last = dict(first, status="resolved")
    layout.commit(table, [Put("t/a", last, stale.version)], [RecordChange(TICKET, "t/a", stale.value, last)])
    assert layout.count(table, "n_status", [["open"], ["pending"], ["resolved"]]) == [0, 0, 1]
    assert no_drift(layout, table) == {}


class _CountingKv:
    """Passes every call to ``kv`` and keeps the ops of each commit."""

    def __init__(self, kv) -> None:
        self.kv, self.commits = kv, []

    def commit(self, table, ops):
        self.commits.append(list(ops))
        return self.kv.commit(table, ops)

    def __getattr__(self, name):
        return getattr(self.kv, name)


def test_a_write_with_every_index_built_checks_one_state_entry(kv, table) -> None:
    """Issue 16, item 7: the hot path proves the table's six index states with one ``Check`` (the epoch)."""
    from botmesh_admin.kv import Check

    counting = _CountingKv(kv)
    layout = tickets(counting)  # type: ignore[arg-type]
    rng = random.Random(4)
    assert ticket_write(layout, table, "t/1", random_ticket(rng))  # the first write marks them built
    counting.commits.clear()
    assert ticket_write(layout, table, "t/2", random_ticket(rng))
    assert ticket_write(layout, table, "t/1", random_ticket(rng))
    for ops in counting.commits:
        state_ops = [op for op in ops if op.key.startswith("x/") and "/" not in op.key[2:]]
        assert [(type(op), op.key) for op in state_ops] == [(Check, "x/~epoch")]
    assert no_drift(layout, table) == {}


def test_a_rebuild_moves_the_epoch_so_cached_writers_read_the_states_again(kv, table) -> None:
    """A writer that cached "all built" before a rebuild began neither skips nor doubles an entry."""
    rng = random.Random(8)
    writer = tickets(kv)
    for i in range(30):
        assert ticket_write(writer, table, f"t/{i:02d}", random_ticket(rng))
    other = tickets(kv)  # another process: its own reads, the same state cache is per Kv and table
    other.build(table, "n_status", rebuild=True, batch=10)
    for i in range(0, 40, 3):
        assert ticket_write(writer, table, f"t/{i:02d}", random_ticket(rng))
    assert no_drift(writer, table) == {}


TWIN = RecordType("twin", "w/", (CountIndex("n_twin", fields=("status",)),))


def test_after_erasure_a_first_write_of_another_type_leaves_no_stale_built_state(kv, table) -> None:
    """ABA over ``drop``: the re-created epoch restarts at the version a writer cached before.

    The first write after an erasure marks every index of a type without
    records as built, so that version means "built" again and the cached
    writer's counts stay exact.
    """
    layout = IndexedTable(kv, (TICKET, TWIN))
    rec = {"status": "open", "at": 1, "tags": [], "owner": None, "weight": 1}
    layout.commit(table, [Put("t/a", rec, ABSENT)], [RecordChange(TICKET, "t/a", None, rec)])
    kv.drop(table)
    twin = IndexedTable(kv, (TICKET, TWIN))
    twin.commit(table, [Put("w/a", {"status": "x"}, ABSENT)], [RecordChange(TWIN, "w/a", None, {"status": "x"})])
    layout.commit(table, [Put("t/b", rec, ABSENT)], [RecordChange(TICKET, "t/b", None, rec)])
    assert layout.count(table, "n_status", [["open"]]) == [1]
    assert {n: layout.check(table, n) for n in [*INDEXES, "n_twin"]} == {
        n: {"missing": 0, "extra": 0, "wrong": 0} for n in [*INDEXES, "n_twin"]
    }


def test_a_first_record_of_one_type_never_marks_another_types_unbuilt_index_built(kv, table) -> None:
    """One commit writes the first record of a type and a record of a type whose indexes are not built.

    The first type's index is marked built in that commit; the other's, half
    built, was cached as built too, so reads answered from it and its build
    then counted records twice.
    """
    rng = random.Random(5)
    records = {f"t/{i:04d}": random_ticket(rng) for i in range(20)}
    for key, value in records.items():  # written before the indexes existed
        kv.commit(table, [Put(key, value)])
    layout = IndexedTable(kv, (TICKET, TWIN))

    class Killed(Exception):
        pass

    def die(done: int) -> None:
        if done >= 7:
            raise Killed

    for name in INDEXES:  # each build killed after its first batch: "building"
        with pytest.raises(Killed):
            layout.build(table, name, batch=7, progress=die)
    assert {layout.state(table, name) for name in INDEXES} == {"building"}
    new = random_ticket(rng)
    layout.commit(
        table,
        [Put("t/new", new, ABSENT), Put("w/a", {"status": "x"}, ABSENT)],
        [RecordChange(TICKET, "t/new", None, new), RecordChange(TWIN, "w/a", None, {"status": "x"})],
    )
    records["t/new"] = new
    assert layout.count(table, "n_twin", [["x"]]) == [1]
    with pytest.raises(IndexNotBuilt):
        layout.count(table, "n_status", [["open"]])
    for name in INDEXES:
        layout.build(table, name, batch=7)
    want = expected_counts(records)
    assert layout.count(table, "n_status", [[s] for s in sorted(want)]) == [want[s] for s in sorted(want)]
    assert no_drift(layout, table) == {}


def test_eight_threads_writing_one_table_leave_no_drift(kv, table) -> None:
    """Concurrent writers of overlapping records: every counter still equals the records'."""
    threads = [threading.Thread(target=churn, args=(kv, table, s, 60)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert no_drift(tickets(kv), table) == {}


@pytest.mark.slow
@pytest.mark.parametrize("shared", backend_params(SHARED_BACKENDS))
def test_four_processes_writing_one_table_leave_no_drift(shared, request, table) -> None:
    """Four processes churn the same tickets; the check finds zero drift afterwards."""
    from tests import backends

    url = backends.kv_url(shared, request)
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        applied = pool.starmap(churn_by_url, [(url, table, s, 80) for s in range(4)])
    assert sum(applied) > 0
    kv = backends.open_kv(shared, request)
    assert no_drift(tickets(kv), table) == {}


# -- the model, with TTLs and erasure ------------------------------------------------------


class IndexMachine(RuleBasedStateMachine):
    """Random writes, deletes, expiries and erasures; indexes always equal the records."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000
        self.kv = MemoryKv(clock=lambda: self.now)
        self.layout = tickets(self.kv)
        self.table = "test/machine"
        self.records: dict[str, dict[str, Any]] = {}

    @rule(key=st.integers(0, 12), seed=st.integers(0, 10**6))
    def put(self, key: int, seed: int) -> None:
        value = random_ticket(random.Random(seed))
        assert ticket_write(self.layout, self.table, f"t/{key:02d}", value)
        self.records[f"t/{key:02d}"] = value

    @rule(key=st.integers(0, 12))
    def delete(self, key: int) -> None:
        assert ticket_write(self.layout, self.table, f"t/{key:02d}", None)
        self.records.pop(f"t/{key:02d}", None)

    @rule()
    def erase(self) -> None:
        self.kv.drop(self.table)
        self.records.clear()

    @rule(ms=st.integers(1, 5000))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @invariant()
    def counts_match_records(self) -> None:
        want = expected_counts(self.records)
        got = self.layout.count(self.table, "n_status", [[s] for s in ("open", "pending", "resolved")])
        assert got == [want.get(s, 0) for s in ("open", "pending", "resolved")]
        listed = sorted(
            e.value["pk"]
            for s in ("open", "pending", "resolved")
            for e in self.layout.scan(self.table, "by_status", [s], limit=100)
        )
        assert listed == sorted(self.records)

    @invariant()
    def check_finds_no_drift(self) -> None:
        assert no_drift(self.layout, self.table) == {}


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_a_read_racing_the_tables_first_write_uses_the_index_it_built(kv, table) -> None:
    """A read finds no index state, and before it looks for records the table's first write lands (records
    and states in one commit): it reads the states again and answers, never "not built yet"."""
    layout = tickets(kv)

    class FirstWriteMidRead:
        """The Kv the reader sees: the writer's first commit lands right before the reader's record scan."""

        def __init__(self) -> None:
            self.pending = True

        def __getattr__(self, name: str) -> Any:
            return getattr(kv, name)

        def scan(self, *args: Any, **kw: Any) -> Any:
            if self.pending:
                self.pending = False
                assert ticket_write(layout, table, "t/1", dict(random_ticket(random.Random(2)), status="open"))
            return kv.scan(*args, **kw)

    reader = tickets(FirstWriteMidRead())  # type: ignore[arg-type]
    assert reader.count(table, "n_status", [["open"]]) == [1]


# -- generations and declared reads ------------------------------------------------------


def test_a_new_generation_reads_as_stale_until_rebuilt(kv, table) -> None:
    """An index whose entries changed shape refuses reads until ``build`` rebuilds it; writers keep it."""
    from dataclasses import replace

    from botmesh_admin.kv.indexes import ValueIndex, forget_cached_states

    churn(kv, table, seed=11, writes=80)
    old_layout = tickets(kv)
    assert old_layout.state(table, "by_status") == "built"
    by_status = ValueIndex(
        "by_status",
        fields=("status", Desc("at")),
        payload=lambda r: {"status": r["status"], "at": r["at"], "owner": r["owner"]},
        generation=2,
    )
    ticket2 = replace(TICKET, indexes=tuple(by_status if i.name == "by_status" else i for i in TICKET.indexes))
    forget_cached_states(kv, table)  # as a process of the new release, started after the upgrade
    layout = IndexedTable(kv, (ticket2,))
    assert layout.state(table, "by_status") == "stale"
    with pytest.raises(IndexNotBuilt) as caught:
        layout.scan(table, "by_status", ["open"])
    assert "botmesh_reindex" in str(caught.value)
    assert layout.count(table, "n_status", [["open"]])[0] >= 0  # the other indexes still answer
    rec = {"status": "open", "at": 42, "tags": [], "owner": "ana", "weight": 1}
    current = kv.get(table, "t/new")
    assert current is None
    layout.commit(table, [Put("t/new", rec, ABSENT)], [RecordChange(ticket2, "t/new", None, rec)])
    assert layout.build(table, "by_status", batch=20) > 0
    assert layout.state(table, "by_status") == "built"
    entries = layout.scan(table, "by_status", ["open"], limit=1000)
    assert entries and all("owner" in e.value for e in entries)
    assert any(e.value["pk"] == "t/new" for e in entries)
    assert layout.check(table, "by_status") == {"missing": 0, "extra": 0, "wrong": 0}
    forget_cached_states(kv, table)
    assert old_layout.state(table, "by_status") == "stale"  # an older release no longer reads it


def test_a_change_of_fields_an_index_does_not_read_moves_nothing() -> None:
    """``reads`` declared: a change elsewhere in the record computes and writes no entry of it."""
    from botmesh_admin.kv.indexes import BUILT, ValueIndex, _State, upkeep_ops

    calls: list[str] = []

    def keys(r):
        calls.append(r["owner"])
        return [(r["owner"],)]

    record = RecordType(
        "ticket",
        "t/",
        (
            ValueIndex("by_owner", keys=keys, reads=("owner",)),
            CountIndex("n_status", fields=("status",), reads=("status",)),
        ),
    )
    states = {"by_owner": _State(BUILT, 1), "n_status": _State(BUILT, 1)}
    old = {"owner": "ana", "status": "open", "at": 1}
    assert upkeep_ops([RecordChange(record, "t/1", old, dict(old, at=2))], states) == []
    assert calls == []
    moved = upkeep_ops([RecordChange(record, "t/1", old, dict(old, owner="luis", status="resolved"))], states)
    assert sorted(op.key for op in moved) == sorted(
        ["x/by_owner/sana t/1", "x/by_owner/sluis t/1", "x/n_status/sopen ", "x/n_status/sresolved "]
    )
    with pytest.raises(ValueError, match="generation"):
        RecordType("bad", "b/", (ValueIndex("v", ("a",), generation=0),))
    with pytest.raises(ValueError, match="reads"):
        RecordType("bad", "b/", (ValueIndex("v", ("a",), reads="a"),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="readable_from"):
        RecordType("bad", "b/", (ValueIndex("v", ("a",), generation=2, readable_from=2),))


def _write(layout: IndexedTable, record: RecordType, table: str, key: str, value: dict[str, Any] | None) -> bool:
    """Put (or delete) ``key`` as ``record`` by read + compare-and-set; False on a lost race."""
    from botmesh_admin.kv import ConflictError, Delete

    current = layout.kv.get(table, key)
    if value is None and current is None:
        return True
    expect = ABSENT if current is None else current.version
    op = Delete(key, expect) if value is None else Put(key, value, expect)
    try:
        layout.commit(table, [op], [RecordChange(record, key, None if current is None else current.value, value)])
    except ConflictError:
        return False
    return True


def test_a_readable_generation_is_upgraded_in_place_and_answers_throughout(kv, table) -> None:
    """Generation 2 adds a payload field and drops resolved tickets; readers never wait, writers race it."""
    from dataclasses import replace

    from botmesh_admin.kv.indexes import ValueIndex, forget_cached_states

    churn(kv, table, seed=21, writes=200)
    by_status = ValueIndex(
        "by_status",
        fields=("status", Desc("at")),
        where=lambda r: r["status"] != "resolved",  # readers of generation 2 never scan resolved tickets
        payload=lambda r: {"status": r["status"], "at": r["at"], "owner": r["owner"]},
        reads=("status", "at", "owner"),
        generation=2,
        readable_from=1,
    )
    ticket2 = replace(TICKET, indexes=tuple(by_status if i.name == "by_status" else i for i in TICKET.indexes))
    forget_cached_states(kv, table)
    layout = IndexedTable(kv, (ticket2,))
    assert layout.state(table, "by_status") == "stale"
    assert layout.scan(table, "by_status", ["open"], limit=5) is not None  # readable while stale
    stop = threading.Event()

    def writer(seed: int) -> None:
        local = random.Random(seed)
        mine = IndexedTable(kv, (ticket2,))
        while not stop.is_set():
            key = f"t/{local.randrange(70)}"
            _write(mine, ticket2, table, key, None if local.random() < 0.2 else random_ticket(local))

    states: list[str | None] = []
    checked: list[int] = []

    def progress(done: int) -> None:  # a reader between batches: answers, whatever the phase
        states.append(layout.state(table, "by_status"))
        for e in layout.scan(table, "by_status", ["open"], limit=1000):
            assert e.value["status"] == "open"

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    try:
        layout.build(table, "by_status", batch=10, progress=progress, swept=checked.append)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert "upgrading" in states
    assert checked and checked == sorted(checked)  # the second phase reports the entries it checked
    assert layout.state(table, "by_status") == "built"
    assert layout.check(table, "by_status") == {"missing": 0, "extra": 0, "wrong": 0}
    assert layout.scan(table, "by_status", ["resolved"], limit=10) == []
    assert all("owner" in e.value for e in layout.scan(table, "by_status", ["open"], limit=1000))
    assert no_drift(layout, table) == {}


def test_an_upgrade_towards_another_generation_is_rebuilt_and_unreadable_meanwhile(kv, table) -> None:
    """A table left upgrading by another release reads as stale (no reads) and ``build`` clears it."""
    from botmesh_admin.kv.indexes import forget_cached_states, state_key

    churn(kv, table, seed=22, writes=60)
    elsewhere = {"state": "upgrading", "from": 1, "generation": 3, "phase": "records"}  # a later release's upgrade
    kv.commit(table, [Put(state_key("by_status"), elsewhere)])
    forget_cached_states(kv, table)
    layout = tickets(kv)
    assert layout.state(table, "by_status") == "stale"
    with pytest.raises(IndexNotBuilt):
        layout.scan(table, "by_status", ["open"])
    layout.build(table, "by_status", batch=20)
    assert layout.state(table, "by_status") == "built"
    assert no_drift(layout, table) == {}
