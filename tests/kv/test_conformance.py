"""The DurableKv contract (ARCHITECTURE §4), run against every backend.

Every test takes the ``kv`` fixture (memory, file, sqlite, postgresql, redis,
redis-cluster) and works in fresh uuid-named tables.
"""

from __future__ import annotations

import multiprocessing
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from botmesh_admin.errors import BadType, StoreUnavailable, ValidationError, bounded
from botmesh_admin.kv import (
    ABSENT,
    ANY,
    MAX_COUNTER,
    Add,
    Check,
    ConflictError,
    Delete,
    DurableKv,
    Entry,
    Op,
    Put,
    connect,
)
from botmesh_admin.kv.base import EntryImport, ScanFollow, TableListing, commit_groups
from botmesh_admin.kv.file import FileKv
from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.redis import table_keys as redis_table_keys
from botmesh_admin.kv.sql import SqlKv
from botmesh_admin.kv.validation import MAX_GET_MANY, now_ms

from .conftest import SERVICE_BACKENDS, SHARED_BACKENDS, backend_params, new_table
from .workers import add_ones, add_ones_by_url, increment, increment_by_url, snapshot_value

REPO = Path(__file__).resolve().parents[2]

# Code point order, which is also UTF-8 byte order.
ORDERED_KEYS = ["a", "a/b", "ab", "abc", "b", "z", "é", "ö", "中", "中文", "😀"]


def keys_of(entries: list[Entry]) -> list[str]:
    return [e.key for e in entries]


def run_threads(target: Any, count: int, timeout_s: float = 120) -> list[BaseException]:
    """Run ``target(n)`` in ``count`` threads (n = 0..count-1); return what they raised.

    Fails the test if a thread is still running after ``timeout_s`` seconds (a deadlock).
    """
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            target(n)
        except BaseException as exc:  # surfaced to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert not any(thread.is_alive() for thread in threads), "a thread waited forever"
    return errors


def sleep_past(expires_at: int) -> None:
    """Sleep until ``expires_at`` (epoch ms, from the backend's clock on this host) has passed."""
    time.sleep(max(0, expires_at - now_ms()) / 1000 + 0.02)


# -- basic contract -----------------------------------------------------------------------


def test_kv_satisfies_the_protocol(kv: DurableKv) -> None:
    """Every backend is a DurableKv and answers ping."""
    assert isinstance(kv, DurableKv)
    kv.ping()


def test_put_then_get_returns_the_value_at_version_1(kv: DurableKv, table: str) -> None:
    """A first Put creates version 1; get returns the same JSON."""
    value = {"name": "Zoë", "tags": ["a", "b"], "n": 1, "x": 1.5, "ok": True, "none": None}
    (entry,) = kv.commit(table, [Put("k", value)])
    assert entry == Entry("k", value, 1, None)
    assert kv.get(table, "k") == Entry("k", value, 1, None)
    assert kv.get(table, "missing") is None


def test_versions_grow_by_one_per_write(kv: DurableKv, table: str) -> None:
    """Each Put of a key adds one to its version."""
    for version in range(1, 6):
        (entry,) = kv.commit(table, [Put("k", version)])
        assert entry.version == version
    assert kv.get(table, "k") == Entry("k", 5, 5, None)


def test_cas_with_stale_version_conflicts_and_names_key_and_current_version(kv: DurableKv, table: str) -> None:
    """A compare-and-set with an old version raises ConflictError and writes nothing."""
    kv.commit(table, [Put("k", "one")])
    kv.commit(table, [Put("k", "two", expect=1)])
    with pytest.raises(ConflictError) as info:
        kv.commit(table, [Put("k", "three", expect=1)])
    err = info.value
    assert (err.key, err.current_version, err.table) == ("k", 2, table)
    assert "'k'" in str(err) and "version 2" in str(err)
    assert err.status == 409 and err.to_json()["current_version"] == 2
    assert kv.get(table, "k") == Entry("k", "two", 2, None)


def test_absent_expectation(kv: DurableKv, table: str) -> None:
    """ABSENT holds only for a missing key; a version expectation fails on a missing key."""
    kv.commit(table, [Put("k", 1, expect=ABSENT)])
    with pytest.raises(ConflictError) as info:
        kv.commit(table, [Put("k", 2, expect=ABSENT)])
    assert info.value.current_version == 1
    with pytest.raises(ConflictError) as info:
        kv.commit(table, [Put("other", 2, expect=1)])
    assert info.value.key == "other" and info.value.current_version is None


def test_batch_is_all_or_nothing(kv: DurableKv, table: str) -> None:
    """When any expectation fails, no op of the batch is applied; the first failed key is named."""
    kv.commit(table, [Put("a", 1), Put("b", 1)])
    with pytest.raises(ConflictError) as info:
        kv.commit(
            table,
            [Put("a", 2, expect=1), Delete("b"), Put("c", 1), Put("d", 1, expect=7), Check("e", 9)],
        )
    assert info.value.key == "d"
    assert kv.scan(table) == [Entry("a", 1, 1, None), Entry("b", 1, 1, None)]


def test_batch_applies_every_op_and_returns_one_result_per_op(kv: DurableKv, table: str) -> None:
    """A successful batch returns the entry after each op (None for Delete)."""
    kv.commit(table, [Put("a", "x"), Put("b", "y")])
    results = kv.commit(table, [Put("a", "x2", expect=1), Delete("b", expect=1), Check("d", ABSENT), Put("c", [])])
    assert results == [Entry("a", "x2", 2, None), None, None, Entry("c", [], 1, None)]
    assert kv.scan(table) == [Entry("a", "x2", 2, None), Entry("c", [], 1, None)]


def test_check_guards_a_batch_without_writing(kv: DurableKv, table: str) -> None:
    """Check returns the checked entry, fails the batch on mismatch and never bumps a version."""
    kv.commit(table, [Put("guard", {"v": 1})])
    results = kv.commit(table, [Check("guard", 1), Put("x", 1)])
    assert results[0] == Entry("guard", {"v": 1}, 1, None)
    with pytest.raises(ConflictError) as info:
        kv.commit(table, [Check("guard", ABSENT), Put("y", 1)])
    assert info.value.key == "guard" and info.value.current_version == 1
    assert kv.get(table, "y") is None
    assert kv.commit(table, [Check("guard", ANY)])[0] == Entry("guard", {"v": 1}, 1, None)
    assert kv.commit(table, [Check("nothing", ANY)]) == [None]
    assert kv.get(table, "guard").version == 1


def test_delete(kv: DurableKv, table: str) -> None:
    """Delete removes a key; with a version it is a compare-and-delete; absent + ANY is a no-op."""
    kv.commit(table, [Put("k", 1)])
    with pytest.raises(ConflictError):
        kv.commit(table, [Delete("k", expect=2)])
    assert kv.commit(table, [Delete("k", expect=1)]) == [None]
    assert kv.get(table, "k") is None and kv.scan(table) == []
    assert kv.commit(table, [Delete("k")]) == [None]
    with pytest.raises(ConflictError):
        kv.commit(table, [Delete("k", expect=1)])


def test_recreate_after_delete_starts_at_version_1(kv: DurableKv, table: str) -> None:
    """A key deleted and written again starts a new life at version 1."""
    kv.commit(table, [Put("k", 1)])
    kv.commit(table, [Put("k", 2)])
    kv.commit(table, [Delete("k")])
    (entry,) = kv.commit(table, [Put("k", 3, expect=ABSENT)])
    assert entry.version == 1
    assert kv.get(table, "k") == Entry("k", 3, 1, None)


def test_tables_are_independent(kv: DurableKv) -> None:
    """The same key in two tables is two entries."""
    one, two = new_table(), new_table()
    kv.commit(one, [Put("k", 1)])
    assert kv.get(two, "k") is None
    kv.commit(two, [Put("k", 2, expect=ABSENT)])
    assert kv.get(one, "k") == Entry("k", 1, 1, None)
    assert kv.scan(two) == [Entry("k", 2, 1, None)]


def test_one_mib_value_round_trips(kv: DurableKv, table: str) -> None:
    """A 1 MiB value (with non-ASCII text) comes back unchanged from get and scan."""
    value = {"blob": "x" * (1024 * 1024), "text": "zoë 中文 😀", "list": list(range(1000))}
    kv.commit(table, [Put("big", value)])
    assert kv.get(table, "big").value == value
    assert kv.scan(table)[0].value == value


def test_a_value_over_16_mib_as_json_is_refused_and_nothing_is_written(kv: DurableKv, table: str) -> None:
    """The limit counts the stored form: 3 MiB of control characters are 18 MiB of ``\\u0001`` escapes."""
    from botmesh_admin.kv.validation import MAX_VALUE_BYTES

    for value in ("x" * (MAX_VALUE_BYTES - 1), {"escaped": "\u0001" * (3 * 1024 * 1024)}):
        with pytest.raises(ValidationError) as caught:
            kv.commit(table, [Put("small", 1), Put("big", value)])
        assert caught.value.field == "ops[1].value" and "16 MiB" in caught.value.message
    with pytest.raises(ValidationError) as caught:  # Python itself cannot write it as JSON text
        kv.commit(table, [Put("small", 1), Put("big", {"n": [1, -(10**5000)]})])
    assert caught.value.field == "ops[1].value.n[1]" and "4000 digits" in caught.value.message
    assert kv.scan(table) == []


def test_values_of_builtin_subclasses_and_huge_integers_are_stored_as_json(kv: DurableKv, table: str) -> None:
    """What the plain-value fast path of ``validate_value`` leaves to the full check is still accepted.

    An ``IntEnum`` member, a ``str`` subclass and an integer past 2**64 are JSON (an
    int, a string, a number): they are written and read back as those.
    """
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    kv.commit(table, [Put("v", {"level": Level.HIGH, "name": Name("zoë"), "huge": [3**50], Name("key"): True})])
    assert kv.get(table, "v").value == {"level": 3, "name": "zoë", "huge": [3**50], "key": True}


def test_json_edge_values_round_trip(kv: DurableKv, table: str) -> None:
    """NUL and escapes in strings, big ints, floats and nesting round-trip exactly."""
    value = {
        "nul": "a\u0000b",
        "escapes": '"\\\n\t',
        "big": 2**70,
        "neg": -(2**63),
        "float": 0.1,
        "tiny": 5e-324,
        "deep": [[[[{"k": [None]}]]]],
        "": "empty key",
    }
    kv.commit(table, [Put("v", value), Put("s", "plain"), Put("n", None), Put("f", False)])
    assert kv.get(table, "v").value == value
    assert [e.value for e in kv.scan(table)] == [False, None, "plain", value]


# -- Add: conflict-free counters ----------------------------------------------------------


def test_add_to_an_absent_key_creates_the_counter_at_version_1(kv: DurableKv, table: str) -> None:
    """An absent key counts as 0: the first Add stores the delta at version 1, with no TTL."""
    assert kv.commit(table, [Add("c", 5)]) == [Entry("c", 5, 1, None)]
    assert kv.get(table, "c") == Entry("c", 5, 1, None)
    assert kv.commit(table, [Add("negative", -3)]) == [Entry("negative", -3, 1, None)]


def test_add_sums_into_an_existing_integer_and_grows_the_version_by_one(kv: DurableKv, table: str) -> None:
    """Every Add writes value + delta at version + 1, whoever wrote the integer before."""
    kv.commit(table, [Put("c", 10)])
    assert kv.commit(table, [Add("c", 5)]) == [Entry("c", 15, 2, None)]
    assert kv.commit(table, [Add("c", 0)]) == [Entry("c", 15, 3, None)]
    (entry,) = kv.commit(table, [Add("c", 1)])
    assert entry == Entry("c", 16, 4, None) == kv.get(table, "c")
    (entry,) = kv.commit(table, [Put("c", 100, expect=4)])  # a compare-and-set continues from it
    assert entry.version == 5


def test_add_with_negative_deltas_goes_below_zero_and_a_counter_at_zero_stays(kv: DurableKv, table: str) -> None:
    """A negative delta subtracts; a counter back at 0 is still an entry (not deleted)."""
    kv.commit(table, [Add("c", 2)])
    assert kv.commit(table, [Add("c", -2)]) == [Entry("c", 0, 2, None)]
    assert kv.get(table, "c") == Entry("c", 0, 2, None)
    assert keys_of(kv.scan(table)) == ["c"]
    assert kv.commit(table, [Add("c", -7)]) == [Entry("c", -7, 3, None)]
    with pytest.raises(ConflictError):
        kv.commit(table, [Check("c", ABSENT)])


def test_add_keeps_an_existing_expiry_and_a_counter_it_creates_has_none(kv: DurableKv, table: str) -> None:
    """Add leaves a live entry's expires_at as it was; after expiry it starts a new counter."""
    put, put_short = kv.commit(table, [Put("ttl", 1, ttl_ms=60_000), Put("short", 1, ttl_ms=300)])
    assert put is not None and put_short is not None
    (entry,) = kv.commit(table, [Add("ttl", 2)])
    assert entry == Entry("ttl", 3, 2, put.expires_at) == kv.get(table, "ttl")
    (short,) = kv.commit(table, [Add("short", 1), Check("other", ANY)])[:1]
    assert short == Entry("short", 2, 2, put_short.expires_at)
    sleep_past(short.expires_at)
    (entry,) = kv.commit(table, [Add("short", 5)])
    assert entry == Entry("short", 5, 1, None) == kv.get(table, "short")
    assert keys_of(kv.scan(table)) == ["short", "ttl"]


def test_add_next_to_a_failing_expectation_applies_nothing(kv: DurableKv, table: str) -> None:
    """An Add never conflicts itself, but a failed Check or Put in its batch undoes it."""
    kv.commit(table, [Add("c", 1), Put("guard", "g")])
    with pytest.raises(ConflictError) as info:
        kv.commit(table, [Add("c", 1), Add("new", 1), Check("guard", 7)])
    assert (info.value.key, info.value.current_version) == ("guard", 1)
    with pytest.raises(ConflictError) as info:
        kv.commit(table, [Put("other", 1, expect=ABSENT), Put("guard", "h", expect=ABSENT), Add("c", 1)])
    assert info.value.key == "guard"
    assert kv.scan(table) == [Entry("c", 1, 1, None), Entry("guard", "g", 1, None)]


NOT_INTEGERS = [
    pytest.param("7", id="str"),
    pytest.param(1.5, id="float"),
    pytest.param(1.0, id="integral-float"),
    pytest.param(1e16, id="float-in-exponent-form"),
    pytest.param(True, id="bool"),
    pytest.param([1], id="list"),
    pytest.param({"n": 1}, id="dict"),
]


@pytest.mark.parametrize("value", NOT_INTEGERS)
def test_add_to_a_value_that_is_not_an_integer_is_refused_and_applies_nothing(
    kv: DurableKv, table: str, value: object
) -> None:
    """ValidationError names the Add's op; the batch, single or not, leaves everything as it was."""
    kv.commit(table, [Put("k", value)])
    for ops, field in (
        ([Add("k", 1)], "ops[0]"),
        ([Put("other", 1), Add("fine", 1), Add("k", 1)], "ops[2]"),
    ):
        with pytest.raises(ValidationError) as info:
            kv.commit(table, ops)
        assert info.value.field == field and "not an integer" in info.value.message
        assert info.value.status == 422
    assert kv.scan(table) == [Entry("k", value, 1, None)]


def test_add_to_a_stored_null_is_refused(kv: DurableKv, table: str, backend: str) -> None:
    """A stored JSON null is a value that is not an integer, not an absent key."""
    kv.commit(table, [Put("k", None)])
    with pytest.raises(ValidationError) as info:
        kv.commit(table, [Add("k", 1)])
    assert info.value.field == "ops[0]" and "not an integer" in info.value.message
    assert kv.get(table, "k") == Entry("k", None, 1, None)


def test_add_beyond_max_counter_is_refused_and_applies_nothing(kv: DurableKv, table: str) -> None:
    """The sum must stay within ±MAX_COUNTER (2**53 - 1); reaching either bound is fine."""
    assert kv.commit(table, [Add("hi", MAX_COUNTER), Add("lo", -MAX_COUNTER)]) == [
        Entry("hi", MAX_COUNTER, 1, None),
        Entry("lo", -MAX_COUNTER, 1, None),
    ]
    for ops, field in (
        ([Add("hi", 1)], "ops[0]"),
        ([Add("other", 1), Add("lo", -1)], "ops[1]"),
        ([Add("lo", MAX_COUNTER), Add("hi", MAX_COUNTER)], "ops[1]"),
    ):
        with pytest.raises(ValidationError) as info:
            kv.commit(table, ops)
        assert info.value.field == field and str(MAX_COUNTER) in info.value.message
    assert kv.scan(table) == [Entry("hi", MAX_COUNTER, 1, None), Entry("lo", -MAX_COUNTER, 1, None)]
    assert kv.commit(table, [Add("hi", -MAX_COUNTER)]) == [Entry("hi", 0, 2, None)]


# Stored integers around the bounds, beyond 2**53 (inexact as doubles, as in Lua),
# and around the 10**8 split RedisKv's script uses for exact sums.
STORED_INTEGERS = [
    0, 1, -1, 99_999_999, 100_000_000, -100_000_001, MAX_COUNTER, -MAX_COUNTER,
    MAX_COUNTER + 1, 2**53 + 1, -(2**53) - 3, 2 * MAX_COUNTER, 2 * MAX_COUNTER + 1,
    10**16 + 12_345_678, -(10**16) - 1, 10**17, 2**63, -(2**64), 10**30,
]  # fmt: skip
DELTAS = [1, -1, -2, 99_999_999, -100_000_000, MAX_COUNTER, -MAX_COUNTER, -(10**15) - 7]


def test_add_sums_exactly_at_every_magnitude(kv: DurableKv, table: str) -> None:
    """Add computes stored + delta exactly, refusing exactly the sums outside ±MAX_COUNTER.

    Each pair runs twice: alone (PostgreSQL's one-statement path) and next to
    another op (its commit function), so both agree with MemoryKv.
    """
    pairs = [(stored, delta) for stored in STORED_INTEGERS for delta in DELTAS]
    kv.commit(table, [Put(f"{kind}{i}", s) for i, (s, _) in enumerate(pairs) for kind in "ab"])
    wrong = []
    for i, (stored, delta) in enumerate(pairs):
        total = stored + delta
        for ops in ([Add(f"a{i}", delta)], [Add(f"b{i}", delta), Check("other", ANY)]):
            try:
                got: object = kv.commit(table, ops)[0].value
            except ValidationError:
                got = "refused"
            if got != (total if abs(total) <= MAX_COUNTER else "refused"):
                wrong.append((stored, delta, len(ops), got))
    assert not wrong


def test_a_check_expecting_the_version_before_an_add_conflicts(kv: DurableKv, table: str) -> None:
    """Add bumps the version, so a reader's compare-and-set on the counter sees the change."""
    kv.commit(table, [Put("c", 1)])
    kv.commit(table, [Add("c", 1)])
    with pytest.raises(ConflictError) as info:
        kv.commit(table, [Check("c", 1), Put("derived", "x")])
    assert (info.value.key, info.value.current_version) == ("c", 2)
    with pytest.raises(ConflictError):
        kv.commit(table, [Put("c", 0, expect=1)])
    assert kv.commit(table, [Check("c", 2)]) == [Entry("c", 2, 2, None)]
    assert kv.get(table, "derived") is None


def test_adds_and_writes_of_other_keys_apply_in_one_batch(kv: DurableKv, table: str) -> None:
    """A record write and its counters commit together; each Add returns the written entry."""
    kv.commit(table, [Put("old", 1), Add("count/a", 4)])
    results = kv.commit(
        table,
        [
            Put("rec", {"n": 1}, expect=ABSENT),
            Add("count/a", -1),
            Delete("old", expect=1),
            Add("count/b", 1),
            Check("missing", ABSENT),
        ],
    )
    assert results == [
        Entry("rec", {"n": 1}, 1, None),
        Entry("count/a", 3, 2, None),
        None,
        Entry("count/b", 1, 1, None),
        None,
    ]
    assert kv.scan(table) == [
        Entry("count/a", 3, 2, None),
        Entry("count/b", 1, 1, None),
        results[0],
    ]


def _large_batch(n: int) -> tuple[list[Op], list[Op]]:
    """Return (setup, batch): ``n`` keys in five groups, one op kind each, on keys in every state.

    Every fifth key of the setup expires at once (``ttl_ms=1``), so the batch also
    meets expired rows: they read as absent (version restarts at 1, an Add starts
    at its delta, a Check finds nothing).
    """
    setup: list[Op] = []
    batch: list[Op] = []
    for i in range(n):
        key = f"k/{i:04d}"
        expired = i % 5 == 0
        if i % 7:  # every seventh key is absent before the batch
            setup.append(Put(key, i, ttl_ms=1 if expired else None))
        live = i % 7 and not expired
        group = i % 5 if i % 10 < 5 else (i + 2) % 5  # the kinds interleave
        if group == 0:
            batch.append(Put(key, {"n": i}, expect=1 if live else ABSENT, ttl_ms=60_000 if i % 2 else None))
        elif group == 1:
            batch.append(Delete(key, expect=1 if live else ANY))
        elif group == 2:
            batch.append(Check(key, 1 if live else ABSENT))
        elif group == 3:
            batch.append(Add(key, i))
        else:
            batch.append(Put(key, [i], expect=ANY))
    return setup, batch


def _shape(entry: Entry | None) -> tuple[Any, ...] | None:
    """An entry with its expiry reduced to 'has one' (each backend reads its own clock)."""
    return None if entry is None else (entry.key, entry.value, entry.version, entry.expires_at is not None)


def test_a_large_mixed_batch_applies_like_memory_kv(kv: DurableKv, table: str) -> None:
    """400 puts, deletes, checks and adds on live, expired and absent keys return and store what MemoryKv does.

    Batches this size are what a campaign's answers and an index rebuild commit;
    PostgreSQL applies them with set-based statements, not op by op.
    """
    setup, batch = _large_batch(400)
    reference = MemoryKv()
    for store in (kv, reference):
        store.commit(table, setup)
    time.sleep(0.05)  # the ttl_ms=1 entries have expired on every backend
    expected = reference.commit(table, batch)
    assert [_shape(e) for e in kv.commit(table, batch)] == [_shape(e) for e in expected]
    assert [_shape(e) for e in kv.scan(table, limit=1000)] == [_shape(e) for e in reference.scan(table, limit=1000)]


def test_a_large_batch_names_its_first_failing_key_and_writes_nothing(kv: DurableKv, table: str) -> None:
    """Two expectations fail late in a 300-op batch: the earlier one (in op order) is named, nothing applies."""
    kv.commit(table, [Put(f"k/{i:03d}", i) for i in range(300)])
    ops: list[Op] = [Put(f"k/{i:03d}", -i, expect=1) for i in range(300)]
    ops[290] = Put("k/290", 0, expect=ABSENT)  # fails: present
    ops[250] = Delete("k/250", expect=2)  # fails first: at version 1
    ops[10] = Add("k/010", 5)
    ops.append(Add("counter", 1))
    with pytest.raises(ConflictError) as info:
        kv.commit(table, ops)
    assert (info.value.key, info.value.current_version) == ("k/250", 1)
    assert kv.scan(table, limit=1000) == [Entry(f"k/{i:03d}", i, 1, None) for i in range(300)]


def test_overlapping_batches_from_8_threads_in_any_key_order_lose_no_add(kv: DurableKv, table: str) -> None:
    """8 threads x 15 batches of Adds to the same 20 counters, each batch in its own key order: every Add counts.

    Batches that share keys in different orders must neither deadlock nor
    conflict nor lose an update (PostgreSQL locks a batch's keys in one order).
    """
    keys = [f"c/{i:02d}" for i in range(20)]

    def run(seed: int) -> None:
        order = random.Random(seed)
        for n in range(15):
            ops: list[Op] = [Add(key, 1) for key in order.sample(keys, len(keys))]
            kv.commit(table, [*ops, Put(f"w/{seed}/{n}", n, expect=ABSENT)])

    assert not run_threads(run, 8)
    assert [(e.key, e.value, e.version) for e in kv.scan(table, prefix="c/")] == [(k, 120, 120) for k in keys]
    assert len(kv.scan(table, prefix="w/", limit=200)) == 120


def test_add_continues_an_imported_counter(kv: DurableKv, table: str) -> None:
    """A counter restored from a backup keeps its value and version; Adds continue from them."""
    kv.import_entries(table, [Entry("c", 41, 7, None)])
    assert kv.commit(table, [Add("c", 1)]) == [Entry("c", 42, 8, None)]


# -- get_many -----------------------------------------------------------------------------


def test_get_many_returns_each_live_entry_or_none_in_the_order_asked(kv: DurableKv, table: str) -> None:
    """Keys come back in the caller's order; missing keys are None; a key may repeat."""
    kv.commit(table, [Put("a", 1), Put("b", {"x": [2]}), Add("c", 3)])
    kv.commit(table, [Put("a", "again", expect=1), Delete("b")])
    a, c = Entry("a", "again", 2, None), Entry("c", 3, 1, None)
    assert kv.get_many(table, ["c", "missing", "a", "b", "c", "中"]) == [c, None, a, None, c, None]
    assert kv.get_many(table, ("a",)) == [a]
    assert kv.get_many(table, []) == []
    assert kv.get_many(new_table(), ["a"]) == [None]


def test_get_many_leaves_out_expired_entries(kv: DurableKv, table: str) -> None:
    """An expired entry is None, as for get."""
    kv.commit(table, [Put("live", 1), Put("long", 2, ttl_ms=600_000)])
    (short,) = kv.commit(table, [Put("short", 3, ttl_ms=200)])
    assert [e and e.value for e in kv.get_many(table, ["short", "live", "long"])] == [3, 1, 2]
    sleep_past(short.expires_at)
    got = kv.get_many(table, ["short", "live", "long"])
    assert got == [None, Entry("live", 1, 1, None), kv.get(table, "long")]


def test_get_many_takes_up_to_max_get_many_keys(kv: DurableKv, table: str) -> None:
    """1,000 keys are answered in one call; 1,001 are refused naming ``keys``."""
    kv.commit(table, [Put(f"k{i:04d}", i) for i in range(0, MAX_GET_MANY, 7)])
    keys = [f"k{i:04d}" for i in reversed(range(MAX_GET_MANY))]
    got = kv.get_many(table, keys)
    assert [e and e.value for e in got] == [i if i % 7 == 0 else None for i in reversed(range(MAX_GET_MANY))]
    with pytest.raises(ValidationError) as info:
        kv.get_many(table, [*keys, "one-more"])
    assert info.value.field == "keys"


def test_get_many_validates_its_arguments(kv: DurableKv, table: str) -> None:
    """A bad table, a bad key (named by position) or a string instead of a list is refused."""
    cases: list[tuple[Any, str]] = [
        (lambda: kv.get_many("a{b}", ["k"]), "table"),
        (lambda: kv.get_many(table, ["ok", ""]), "keys[1]"),
        (lambda: kv.get_many(table, ["ok", "x\n"]), "keys[1]"),
        (lambda: kv.get_many(table, [7]), "keys[0]"),
        (lambda: kv.get_many(table, "abc"), "keys"),
        (lambda: kv.get_many(table, None), "keys"),
    ]
    for call, field in cases:
        with pytest.raises(ValidationError) as info:
            call()
        assert info.value.field == field


# -- scans --------------------------------------------------------------------------------


@pytest.fixture
def ordered_table(kv: DurableKv, table: str) -> str:
    shuffled = ORDERED_KEYS[:]
    random.Random(7).shuffle(shuffled)
    kv.commit(table, [Put(key, i) for i, key in enumerate(shuffled[:6])])
    kv.commit(table, [Put(key, i) for i, key in enumerate(shuffled[6:])])
    return table


def test_scan_orders_by_byte_order(kv: DurableKv, ordered_table: str) -> None:
    """Keys come back in UTF-8 byte order: z < é < ö < 中 < 😀."""
    assert keys_of(kv.scan(ordered_table)) == ORDERED_KEYS


def test_scan_prefix(kv: DurableKv, ordered_table: str) -> None:
    """Only keys starting with the prefix are returned."""
    assert keys_of(kv.scan(ordered_table, prefix="a")) == ["a", "a/b", "ab", "abc"]
    assert keys_of(kv.scan(ordered_table, prefix="ab")) == ["ab", "abc"]
    assert keys_of(kv.scan(ordered_table, prefix="中")) == ["中", "中文"]
    assert keys_of(kv.scan(ordered_table, prefix="😀")) == ["😀"]
    assert kv.scan(ordered_table, prefix="c") == []
    assert kv.scan(ordered_table, prefix="abcd") == []


def test_scan_after_is_exclusive(kv: DurableKv, ordered_table: str) -> None:
    """``after`` skips keys up to and including itself, whether or not it exists."""
    assert keys_of(kv.scan(ordered_table, after="é")) == ["ö", "中", "中文", "😀"]
    assert keys_of(kv.scan(ordered_table, after="c")) == ["z", "é", "ö", "中", "中文", "😀"]
    assert keys_of(kv.scan(ordered_table, prefix="a", after="a/b")) == ["ab", "abc"]
    assert keys_of(kv.scan(ordered_table, prefix="ab", after="a")) == ["ab", "abc"]
    assert keys_of(kv.scan(ordered_table, prefix="a", after="b")) == []
    assert kv.scan(ordered_table, after="😀") == []


def test_scan_pages_with_limit_and_after(kv: DurableKv, ordered_table: str) -> None:
    """Paging with ``limit`` and the last key as ``after`` visits every key once, in order."""
    for limit in (1, 3, 4):
        seen: list[str] = []
        after = None
        while True:
            page = kv.scan(ordered_table, after=after, limit=limit)
            assert len(page) <= limit
            if not page:
                break
            seen += keys_of(page)
            after = page[-1].key
        assert seen == ORDERED_KEYS
    assert keys_of(kv.scan(ordered_table, prefix="a", limit=2)) == ["a", "a/b"]


def test_scan_of_unknown_table_is_empty(kv: DurableKv, table: str) -> None:
    assert kv.scan(table) == []
    assert kv.get(table, "k") is None


# -- TTL, sweep, drop ---------------------------------------------------------------------


def test_ttl_sets_expires_at_in_epoch_ms(kv: DurableKv, table: str) -> None:
    """A Put with ttl_ms reports expires_at ≈ now + ttl_ms; a later Put without TTL clears it."""
    before = now_ms()
    (entry,) = kv.commit(table, [Put("k", 1, ttl_ms=60_000)])
    assert before + 60_000 - 1000 <= entry.expires_at <= now_ms() + 60_000 + 1000
    assert kv.get(table, "k") == entry
    (entry,) = kv.commit(table, [Put("k", 2, expect=1)])
    assert entry.expires_at is None and kv.get(table, "k").expires_at is None


def test_expired_entries_are_invisible(kv: DurableKv, table: str) -> None:
    """After its TTL an entry is gone for get, scan, ABSENT and versions (re-create is version 1)."""
    kv.commit(table, [Put("a", 1), Put("b", 1, ttl_ms=400), Put("c", 1, ttl_ms=400), Put("d", 1)])
    (entry,) = kv.commit(table, [Put("c", 2, expect=1, ttl_ms=400)])
    assert keys_of(kv.scan(table)) == ["a", "b", "c", "d"]
    sleep_past(entry.expires_at)
    assert kv.get(table, "b") is None
    assert keys_of(kv.scan(table)) == ["a", "d"]
    assert keys_of(kv.scan(table, limit=1)) == ["a"]
    assert keys_of(kv.scan(table, after="a", limit=1)) == ["d"]
    assert kv.commit(table, [Check("c", ABSENT)]) == [None]
    with pytest.raises(ConflictError) as info:
        kv.commit(table, [Put("c", 3, expect=2)])
    assert info.value.current_version is None
    (entry,) = kv.commit(table, [Put("c", 3, expect=ABSENT)])
    assert entry.version == 1 and entry.expires_at is None
    assert keys_of(kv.scan(table)) == ["a", "c", "d"]


def test_scan_skips_expired_entries_and_still_fills_the_limit(kv: DurableKv, table: str) -> None:
    """Many expired keys before the live ones do not shorten a page."""
    *_, last = kv.commit(table, [Put(f"a{i:02}", i, ttl_ms=100) for i in range(30)])
    kv.commit(table, [Put(f"b{i:02}", i) for i in range(5)])
    sleep_past(last.expires_at)
    assert keys_of(kv.scan(table, limit=3)) == ["b00", "b01", "b02"]
    assert keys_of(kv.scan(table, prefix="a")) == []
    assert keys_of(kv.scan(table, after="b02", limit=10)) == ["b03", "b04"]


def test_scan_follow_returns_each_entry_with_the_record_it_names(kv: DurableKv, table: str) -> None:
    """scan_follow is a scan whose entries come with the live entry their ``pk`` names, or None."""
    assert isinstance(kv, ScanFollow)
    kv.commit(
        table,
        [
            Put("c/1", {"name": "Ana"}),
            Put("c/2", {"name": "Ben"}),
            Put("c/gone", {"name": "x"}, ttl_ms=100),
            Put("x/a/1", {"pk": "c/2", "extra": 1}),
            Put("x/a/2", {"pk": "c/1"}),
            Put("x/a/3", {"pk": "c/missing"}),
            Put("x/a/4", {"pk": 5}),
            Put("x/a/5", "c/1"),
            Put("x/a/6", {"pk": "c/gone"}),
            Put("x/a/7", {"other": "c/1"}, ttl_ms=100),
            Put("x/b/1", {"pk": "c/1"}),
        ],
    )
    sleep_past(kv.get(table, "c/gone").expires_at)  # type: ignore[union-attr]
    pairs = kv.scan_follow(table, prefix="x/a/")
    assert [(e.key, t.key if t else None) for e, t in pairs] == [
        ("x/a/1", "c/2"),
        ("x/a/2", "c/1"),
        ("x/a/3", None),
        ("x/a/4", None),
        ("x/a/5", None),
        ("x/a/6", None),
    ]
    first, target = pairs[0]
    assert first.value == {"pk": "c/2", "extra": 1} and first.version == 1
    assert target == kv.get(table, "c/2")
    assert [(e.key, t.key if t else None) for e, t in kv.scan_follow(table, prefix="x/a/", after="x/a/1", limit=1)] == [
        ("x/a/2", "c/1")
    ]
    kv.commit(table, [Put("c/1", {"name": "Ana B."}), Put("x/a/8", {"ref": "c/1"})])
    assert [t.value if t else None for _, t in kv.scan_follow(table, prefix="x/a/8", field="ref")] == [
        {"name": "Ana B."}
    ]
    assert kv.scan_follow(new_table(), prefix="x/") == []


def test_scan_follow_follows_entries_whose_values_hold_a_nul(kv: DurableKv, table: str) -> None:
    """A NUL is a valid character of a JSON string: an entry holding one is followed like any other."""
    assert isinstance(kv, ScanFollow)
    kv.commit(
        table,
        [
            Put("c/1", {"name": "Ana\x00"}),
            Put("x/a/1", {"pk": "c/1", "payload": "before\x00after"}),
            Put("x/a/2", {"pk": "c/none"}),
        ],
    )
    pairs = kv.scan_follow(table, prefix="x/a/")
    assert [(e.value, t.value if t else None) for e, t in pairs] == [
        ({"pk": "c/1", "payload": "before\x00after"}, {"name": "Ana\x00"}),
        ({"pk": "c/none"}, None),
    ]


def test_scan_follow_validates_like_scan(kv: DurableKv, table: str) -> None:
    """A bad limit (above 1,000: a get_many's bound) or field is refused before the backend."""
    assert isinstance(kv, ScanFollow)
    with pytest.raises(ValidationError) as info:
        kv.scan_follow(table, limit=1001)
    assert info.value.field == "limit"
    with pytest.raises(ValidationError) as info:
        kv.scan_follow(table, field="a.b")
    assert info.value.field == "field"
    with pytest.raises(ValidationError):
        kv.scan_follow(table, limit=0)


def test_sweep_reclaims_expired_entries(kv: DurableKv, table: str) -> None:
    """sweep removes expired entries (others' too, on shared servers) and keeps live ones."""
    *_, last, _ = kv.commit(table, [Put(f"x{i}", i, ttl_ms=100) for i in range(5)] + [Put("live", 1)])
    kv.commit(table, [Put("long", 1, ttl_ms=600_000)])
    sleep_past(last.expires_at)
    assert kv.sweep(limit=2) <= 2
    assert kv.sweep() >= 0  # shared servers: other workers' sweeps may have taken ours
    assert keys_of(kv.scan(table)) == ["live", "long"]
    assert kv.get(table, "x1") is None
    (entry,) = kv.commit(table, [Put("x1", "again", expect=ABSENT)])
    assert entry.version == 1


def test_sweep_counts_exactly_on_a_private_store(tmp_path: Path) -> None:
    """On a store no one else uses, sweep returns exactly the number of expired entries."""
    for url in ("memory://", f"file://{tmp_path}/kv.json", f"sqlite:///{tmp_path}/kv.db"):
        kv = connect(url)
        table = new_table()
        *_, last, _ = kv.commit(table, [Put(f"x{i}", i, ttl_ms=50) for i in range(4)] + [Put("live", 0)])
        sleep_past(last.expires_at)
        assert kv.sweep(limit=3) == 3, url
        assert kv.sweep() == 1, url
        assert kv.sweep() == 0, url
        assert keys_of(kv.scan(table)) == ["live"], url
        kv.close()


def stored_keys(kv: Any, table: str) -> list[str]:
    """Return the keys physically stored for ``table``, expired or not (below the contract)."""
    if isinstance(kv, SqlKv):
        with psycopg.connect(kv.url) as conn:
            rows = conn.execute("SELECT key FROM botmesh_kv WHERE tbl = %s ORDER BY key", (table,))
            return [key for (key,) in rows]
    index, _, entry_prefix = redis_table_keys(table)
    client = kv._client  # the test peeks at RedisKv's own client (standalone or cluster)
    members = [m.decode() for m in client.zrange(index, 0, -1)]
    hashes = [m for m in members if client.exists(entry_prefix + m.encode())]
    assert hashes == members, "every index member has its entry"
    return members


@pytest.mark.parametrize("backend", backend_params(SERVICE_BACKENDS))
def test_sweep_physically_removes_expired_entries(kv: DurableKv, table: str) -> None:
    """On the shared servers, expired rows / hashes and index members are really gone."""
    *_, last, _ = kv.commit(table, [Put(f"x{i}", i, ttl_ms=300) for i in range(5)] + [Put("live", 1)])
    assert stored_keys(kv, table) == ["live", "x0", "x1", "x2", "x3", "x4"]
    sleep_past(last.expires_at)
    for _ in range(100):  # other workers may be adding expiring entries meanwhile
        if not kv.sweep(limit=10_000):
            break
    assert stored_keys(kv, table) == ["live"]


def test_drop_removes_the_whole_table_only(kv: DurableKv, table: str) -> None:
    """drop deletes every entry (TTL ones too) of one table; other tables stay."""
    other = new_table()
    kv.commit(table, [Put(f"k{i}", i) for i in range(20)] + [Put("t", 1, ttl_ms=60_000)])
    kv.commit(other, [Put("k1", "keep")])
    kv.drop(table)
    assert kv.scan(table) == [] and kv.get(table, "k1") is None
    assert kv.get(other, "k1") == Entry("k1", "keep", 1, None)
    (entry,) = kv.commit(table, [Put("k1", 1, expect=ABSENT)])
    assert entry.version == 1
    kv.drop(new_table())  # dropping an unknown table is fine


# -- validation (item 8): bad input raises and writes nothing -----------------------------

DEEP: Any = "leaf"
for _ in range(70):
    DEEP = [DEEP]

BAD_OPS = [
    pytest.param(Put("", 1), "ops[1].key", id="empty-key"),
    pytest.param(Put("k" * 513, 1), "ops[1].key", id="key-over-512-bytes"),
    pytest.param(Put("é" * 257, 1), "ops[1].key", id="key-over-512-utf8-bytes"),
    pytest.param(Put("a\nb", 1), "ops[1].key", id="newline-in-key"),
    pytest.param(Put("a\x00b", 1), "ops[1].key", id="nul-in-key"),
    pytest.param(Put("a\x85", 1), "ops[1].key", id="c1-control-in-key"),
    pytest.param(Put(7, 1), "ops[1].key", id="int-key"),  # type: ignore[arg-type]
    pytest.param(Put("k", float("nan")), "ops[1].value", id="nan"),
    pytest.param(Put("k", {"x": [1, float("inf")]}), "ops[1].value.x[1]", id="infinity"),
    pytest.param(Put("k", b"bytes"), "ops[1].value", id="bytes"),
    pytest.param(Put("k", {1, 2}), "ops[1].value", id="set"),
    pytest.param(Put("k", (1, 2)), "ops[1].value", id="tuple"),
    pytest.param(Put("k", {"when": object()}), "ops[1].value.when", id="object"),
    pytest.param(Put("k", DEEP), "ops[1].value" + "[0]" * 64, id="depth-over-64"),
    pytest.param(Put("k", {1: "x"}), "ops[1].value", id="non-str-dict-key"),
    pytest.param(Put("k", "\ud800"), "ops[1].value", id="lone-surrogate"),
    # Refused past the plain-value fast path (``validate_value``): each names its path as before.
    pytest.param(Put("k", {"a": [{"b\ud800": 1}]}), "ops[1].value.a[0]", id="lone-surrogate-in-nested-key"),
    pytest.param(
        Put("k", {"ok": "zoë", "x": [2**64, float("-inf")]}), "ops[1].value.x[1]", id="infinity-after-big-int"
    ),
    pytest.param(Put("k", 1, ttl_ms=0), "ops[1].ttl_ms", id="ttl-zero"),
    pytest.param(Put("k", 1, ttl_ms=-5), "ops[1].ttl_ms", id="ttl-negative"),
    pytest.param(Put("k", 1, ttl_ms=1.5), "ops[1].ttl_ms", id="ttl-float"),  # type: ignore[arg-type]
    pytest.param(Put("k", 1, ttl_ms=True), "ops[1].ttl_ms", id="ttl-bool"),
    pytest.param(Put("k", 1, ttl_ms="10"), "ops[1].ttl_ms", id="ttl-str"),  # type: ignore[arg-type]
    pytest.param(Put("k", 1, ttl_ms=10**20), "ops[1].ttl_ms", id="ttl-huge"),
    pytest.param(Put("k", 1, expect=0), "ops[1].expect", id="expect-zero"),
    pytest.param(Put("k", 1, expect=2**63), "ops[1].expect", id="expect-huge"),
    pytest.param(Put("k", 1, expect="1"), "ops[1].expect", id="expect-str"),  # type: ignore[arg-type]
    pytest.param(Delete("k", expect=True), "ops[1].expect", id="expect-bool"),
    pytest.param(Put("good", 2), "ops[1].key", id="duplicate-key"),
    pytest.param(("put", "k", 1), "ops[1]", id="not-an-op"),
    pytest.param(Add("k", True), "ops[1].delta", id="add-bool"),
    pytest.param(Add("k", 1.0), "ops[1].delta", id="add-float"),  # type: ignore[arg-type]
    pytest.param(Add("k", "1"), "ops[1].delta", id="add-str"),  # type: ignore[arg-type]
    pytest.param(Add("k", None), "ops[1].delta", id="add-none"),  # type: ignore[arg-type]
    pytest.param(Add("k", MAX_COUNTER + 1), "ops[1].delta", id="add-over-max-counter"),
    pytest.param(Add("k", -MAX_COUNTER - 1), "ops[1].delta", id="add-under-minus-max-counter"),
    pytest.param(Add("good", 1), "ops[1].key", id="add-duplicate-key"),
    pytest.param(Add("", 1), "ops[1].key", id="add-empty-key"),
]


@pytest.mark.parametrize(("bad_op", "field"), BAD_OPS)
def test_bad_op_raises_validation_error_naming_the_field_and_writes_nothing(
    kv: DurableKv, table: str, bad_op: Any, field: str
) -> None:
    """A batch with one bad op raises ValidationError for that op's field; nothing is written.

    The path is cut to 200 characters with an ellipsis (``errors.bounded``): the
    depth-over-64 path is longer."""
    with pytest.raises(ValidationError) as info:
        kv.commit(table, [Put("good", 1), bad_op])
    assert info.value.field == bounded(field) and str(info.value).startswith(f"{bounded(field)}: ")
    assert info.value.field.startswith("ops[1]")
    assert info.value.status == 422
    assert kv.get(table, "good") is None
    assert kv.scan(table) == []


@pytest.mark.parametrize(
    "bad_table",
    ["", "t" * 513, "a\tb", "a\x7fb", "a{b}", None],
    ids=["empty", "too-long", "tab", "del", "braces", "none"],
)
def test_bad_table_name_is_refused_everywhere(kv: DurableKv, bad_table: Any) -> None:
    """A bad table name fails every call with field ``table``."""
    calls = [
        lambda: kv.commit(bad_table, [Put("k", 1)]),
        lambda: kv.get(bad_table, "k"),
        lambda: kv.scan(bad_table),
        lambda: kv.drop(bad_table),
    ]
    for call in calls:
        with pytest.raises(ValidationError) as info:
            call()
        assert info.value.field == "table"


def test_bad_read_arguments(kv: DurableKv, table: str) -> None:
    """get and scan validate key, prefix, after and limit, naming the argument."""
    cases = [
        (lambda: kv.get(table, ""), "key"),
        (lambda: kv.get(table, "x\n"), "key"),
        (lambda: kv.scan(table, prefix="a\x01"), "prefix"),
        (lambda: kv.scan(table, prefix=None), "prefix"),
        (lambda: kv.scan(table, after=""), "after"),
        (lambda: kv.scan(table, limit=0), "limit"),
        (lambda: kv.scan(table, limit=10_001), "limit"),
        (lambda: kv.scan(table, limit="5"), "limit"),
        (lambda: kv.commit(table, []), "ops"),
        (lambda: kv.commit(table, "ops"), "ops"),
    ]
    for call, field in cases:
        with pytest.raises(ValidationError) as info:
            call()
        assert info.value.field == field


def test_type_errors_are_also_type_errors(kv: DurableKv, table: str) -> None:
    """A wrong type raises BadType, which plain callers can catch as TypeError."""
    with pytest.raises(TypeError):
        kv.commit(table, [Put("k", b"raw")])
    with pytest.raises(BadType):
        kv.get(table, 5)  # type: ignore[arg-type]


# -- concurrency --------------------------------------------------------------------------


def test_concurrent_cas_increments_from_8_threads_are_exact(kv: DurableKv, table: str) -> None:
    """8 threads x 25 read-CAS-retry increments end at exactly 200, version 200."""
    assert not run_threads(lambda n: increment(kv, table, "counter", 25), 8)
    assert kv.get(table, "counter") == Entry("counter", 200, 200, None)


@pytest.mark.slow
@pytest.mark.parametrize("backend", backend_params(SHARED_BACKENDS))
def test_concurrent_cas_increments_from_4_processes_are_exact(kv: DurableKv, kv_url: str, table: str) -> None:
    """4 processes, each connected by URL, x 25 CAS increments end at exactly 100."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        pool.starmap(increment_by_url, [(kv_url, table, "counter", 25)] * 4)
    assert kv.get(table, "counter") == Entry("counter", 100, 100, None)


def test_concurrent_adds_from_8_threads_never_conflict(kv: DurableKv, table: str) -> None:
    """8 threads x 200 Adds of +1 to one counter, no reads, no retries: exactly 1600."""
    assert not run_threads(lambda n: add_ones(kv, table, "counter", 200), 8)  # a ConflictError would be a bug
    assert kv.get(table, "counter") == Entry("counter", 1600, 1600, None)


@pytest.mark.slow
@pytest.mark.parametrize("backend", backend_params(SHARED_BACKENDS))
def test_concurrent_adds_from_4_processes_never_conflict(kv: DurableKv, kv_url: str, table: str) -> None:
    """4 processes, each connected by URL, x 200 Adds of +1 end at exactly 800."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        pool.starmap(add_ones_by_url, [(kv_url, table, "counter", 200)] * 4)
    assert kv.get(table, "counter") == Entry("counter", 800, 800, None)


# -- group commit (CommitGroups where the backend has it, else one by one) -----------------


def test_commit_groups_apply_each_group_whole_and_independently(kv: DurableKv, table: str) -> None:
    """A failed group writes nothing; the others apply, shared counters get the sum of those that applied."""
    kv.commit(table, [Put("a", "old"), Put("d", "gone"), Add("n", 5), Put("epoch", 1)])
    outcome = commit_groups(
        kv,
        table,
        [
            [Put("b", 1, ABSENT), Add("n", 1), Check("epoch", 1)],
            [Put("a", "lost", 7), Add("n", 100), Check("epoch", 1), Put("c", "lost")],
            [],
            [Delete("d", 1), Add("n", 10), Check("epoch", 1), Add("m", -2)],
        ],
    )
    assert [type(error).__name__ if error else None for error in outcome] == [None, "ConflictError", None, None]
    conflict = outcome[1]
    assert isinstance(conflict, ConflictError) and (conflict.key, conflict.current_version) == ("a", 1)
    assert {e.key: (e.value, e.version) for e in kv.scan(table)} == {
        "a": ("old", 1),
        "b": (1, 1),
        "epoch": (1, 1),
        "m": (-2, 1),
        "n": (16, 3),  # two groups added: its version grows by two, as two commits would
    }


def test_commit_groups_refused_add_fails_its_group_alone_and_names_the_op(kv: DurableKv, table: str) -> None:
    """An Add leaving ±MAX_COUNTER fails its own group (a ValidationError naming the op); the others apply."""
    kv.commit(table, [Add("n", MAX_COUNTER - 1), Put("text", "x")])
    outcome = commit_groups(
        kv, table, [[Put("a", 1), Add("n", 1)], [Put("b", 1), Add("n", 1)], [Put("c", 1), Add("text", 1)]]
    )
    assert outcome[0] is None
    assert isinstance(outcome[1], ValidationError) and str(outcome[1]).startswith("ops[1]: ")
    assert isinstance(outcome[2], ValidationError) and "not an integer" in str(outcome[2])
    assert {e.key: e.value for e in kv.scan(table)} == {"a": 1, "n": MAX_COUNTER, "text": "x"}


def test_commit_groups_refuses_a_key_two_groups_write_and_writes_nothing(kv: DurableKv, table: str) -> None:
    """A key in two groups must be only added to, or only checked, in both: else a ValidationError names it."""
    for groups in (
        [[Put("a", 1)], [Put("b", 1), Put("a", 2)]],
        [[Add("a", 1)], [Put("b", 1), Check("a", ABSENT)]],
        [[Check("a", ABSENT)], [Delete("a")]],
    ):
        with pytest.raises(ValidationError) as info:
            commit_groups(kv, table, groups)  # type: ignore[arg-type]
        assert info.value.field is not None and info.value.field.startswith("groups[1].ops[")
        assert "'a'" in str(info.value)
    with pytest.raises(ValidationError) as bad:
        commit_groups(kv, table, [[Put("a", 1)], [Put("b", 1), Put("b", 2)]])
    assert bad.value.field == "groups[1].ops[1].key"
    assert kv.scan(table) == []


def test_commit_groups_from_4_threads_over_shared_keys_never_deadlock_and_count_exactly(
    kv: DurableKv, table: str
) -> None:
    """4 threads commit 5-group calls over 12 shared keys in random orders, with shared counters and a checked key.

    Every group writes its key blind (``ANY``), so every group applies: the
    counters end at the number of groups, whatever the interleaving, and no call
    waits on another forever (PostgreSQL takes every lock of a call up front, in
    one order).
    """
    kv.commit(table, [Put("epoch", 1)])
    calls = 15

    def run(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(calls):
            keys = rng.sample([f"k{i}" for i in range(12)], 5)
            groups = [[Put(k, seed), Add("all", 1), Add(f"by/{seed % 2}", 1), Check("epoch", 1)] for k in keys]
            assert commit_groups(kv, table, groups) == [None] * 5

    assert not run_threads(run, 4)
    values = {e.key: e.value for e in kv.scan(table, prefix="", limit=100)}
    assert (values["all"], values["by/0"], values["by/1"]) == (4 * calls * 5, 2 * calls * 5, 2 * calls * 5)
    assert kv.get(table, "all") == Entry("all", 300, 300, None)


# -- PostgreSQL: Add under row locks, and the commit function's upgrade --------------------


@pytest.mark.services
@pytest.mark.parametrize("batch", [False, True], ids=["one-statement", "commit-function"])
def test_postgres_add_waits_for_a_locked_counter_and_adds_to_what_was_committed(
    postgres_url: str, table: str, batch: bool
) -> None:
    """An Add on a row another transaction holds waits for it, then sums its committed value.

    The other transaction plays a concurrent writer (an Add in flight); READ
    COMMITTED re-reads the row after the wait, so no serialization error, no
    ConflictError and no lost update, on both the single-op and the batch path.
    """
    kv = connect(postgres_url)
    kv.commit(table, [Add("c", 1)])
    done: list[object] = []
    ops = [Add("c", 10), Put("side", 1)] if batch else [Add("c", 10)]
    with psycopg.connect(postgres_url) as other:
        other.execute(
            "UPDATE botmesh_kv SET value = '100', version = version + 1 WHERE tbl = %s AND key = 'c'",
            (table,),
        )
        adder = threading.Thread(target=lambda: done.append(kv.commit(table, ops)[0]))
        adder.start()
        adder.join(0.5)
        assert adder.is_alive(), "the Add did not wait for the row lock"
        other.commit()
    adder.join(10)
    assert done == [Entry("c", 110, 3, None)]
    kv.close()


@pytest.mark.services
def test_postgres_database_of_an_older_release_gets_the_new_commit_function(
    postgres_url: str,
) -> None:
    """A database with botmesh_kv and the commit functions v1 to v3 gets v4 on first connect.

    Schema creation is skipped when the function exists, so the check must name
    the current function; v1 to v3 stay for processes of the older releases.
    """
    name = f"kv_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = f"{postgres_url.rsplit('/', 1)[0]}/{name}"
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                'CREATE TABLE botmesh_kv (tbl text COLLATE "C" NOT NULL, key text COLLATE "C"'
                " NOT NULL, value text NOT NULL, version bigint NOT NULL, expires_at bigint,"
                " PRIMARY KEY (tbl, key))"
            )
            conn.execute(
                "CREATE FUNCTION botmesh_kv_commit_v1(p_tbl text, p_kinds text[], p_keys text[],"
                " p_values text[], p_expects bigint[], p_ttls bigint[]) RETURNS TABLE (r_pos int,"
                " r_conflict boolean, r_version bigint, r_expires_at bigint, r_value text)"
                " LANGUAGE sql AS 'SELECT 1, false, 1::bigint, NULL::bigint, NULL::text'"
            )
            conn.execute(
                "CREATE FUNCTION botmesh_kv_commit_v2(p_tbl text, p_kinds text[], p_keys text[],"
                " p_values text[], p_expects bigint[], p_ttls bigint[], p_deltas bigint[])"
                " RETURNS TABLE (r_pos int, r_failure text, r_version bigint, r_expires_at bigint,"
                " r_value text) LANGUAGE sql AS 'SELECT 1, NULL::text, 1::bigint, NULL::bigint, NULL::text'"
            )
            conn.execute(
                "CREATE FUNCTION botmesh_kv_commit_v3(p_tbl text, p_kinds text[], p_keys text[],"
                " p_values text[], p_expects bigint[], p_ttls bigint[], p_deltas bigint[])"
                " RETURNS TABLE (r_pos int, r_failure text, r_version bigint, r_expires_at bigint,"
                " r_value text) LANGUAGE sql AS 'SELECT 1, NULL::text, 1::bigint, NULL::bigint, NULL::text'"
            )
            conn.execute("INSERT INTO botmesh_kv VALUES ('t', 'c', '41', 7, NULL)")
        kv = connect(url)
        assert kv.commit("t", [Add("c", 1), Add("d", 1)]) == [
            Entry("c", 42, 8, None),
            Entry("d", 1, 1, None),
        ]
        kv.close()
        with psycopg.connect(url) as conn:
            functions = conn.execute(
                "SELECT proname FROM pg_proc WHERE proname LIKE 'botmesh_kv_commit_%' ORDER BY 1"
            ).fetchall()
        assert functions == [
            ("botmesh_kv_commit_v1",),
            ("botmesh_kv_commit_v2",),
            ("botmesh_kv_commit_v3",),
            ("botmesh_kv_commit_v4",),
        ]
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# -- hypothesis: every backend behaves like MemoryKv --------------------------------------

KEYS = st.sampled_from(["a", "ab", "a/b", "b", "z", "é", "ö", "中", "😀", "~"])
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=6,
)
# Mostly small deltas (counters that meet each other), sometimes one that nears a bound.
DELTAS_DRAWN = st.integers(-3, 3) | st.sampled_from([MAX_COUNTER, -MAX_COUNTER, 2**52, -(2**52)])
OP_SPECS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put-ttl", "delete", "check", "add", "add"]),
        KEYS,
        JSON | DELTAS_DRAWN,  # integer values give the adds counters to add to
        st.sampled_from(["any", "absent", "current", "current", "stale"]),
        DELTAS_DRAWN,
    ),
    min_size=1,
    max_size=4,
    unique_by=lambda spec: spec[1],
)


def comparable(result: Entry | None) -> tuple[object, ...] | None:
    """Entry fields compared with the model (clocks differ, so only whether a TTL is set)."""
    if result is None:
        return None
    return (result.key, result.value, result.version, result.expires_at is not None)


class KvAgainstModel(RuleBasedStateMachine):
    """Drive a backend and MemoryKv with the same calls; every answer must match."""

    store: DurableKv

    def __init__(self) -> None:
        super().__init__()
        self.model = MemoryKv()
        self.table = new_table("model")

    def _expect(self, key: str, kind: str) -> object:
        current = self.model.get(self.table, key)
        if kind == "any":
            return ANY
        if kind == "absent":
            return ABSENT
        if kind == "current":
            return current.version if current else ABSENT
        return current.version + 1 if current else 1

    def _op(self, kind: str, key: str, value: object, expect_kind: str, delta: int) -> Op:
        expect = self._expect(key, expect_kind)
        current = self.model.get(self.table, key)
        if kind == "add" and current is not None and current.value is None:
            kind = "check"  # refused on every backend (test_add_to_a_stored_null_is_refused)
        if kind == "add":
            return Add(key, delta)
        if kind == "put":
            return Put(key, value, expect=expect)
        if kind == "put-ttl":
            return Put(key, value, expect=expect, ttl_ms=3_600_000)
        if kind == "delete":
            return Delete(key, expect=expect)
        return Check(key, expect)

    @rule(drawn=st.lists(OP_SPECS, min_size=1, max_size=3))
    def commit_groups(self, drawn: list[list[tuple[str, str, object, str, int]]]) -> None:
        """Groups (a key in two only added to, or only checked) answer as MemoryKv's one-by-one commits."""
        groups: list[list[Op]] = []
        first: dict[str, tuple[type, int]] = {}
        for specs in drawn:
            ops: list[Op] = []
            for spec in specs:
                op = self._op(*spec)
                kind = type(op) if isinstance(op, (Add, Check)) else Put
                seen = first.setdefault(op.key, (kind, len(groups)))
                if seen[1] == len(groups) or (kind is not Put and seen[0] is kind):
                    ops.append(op)
            groups.append(ops)

        def outcome(error: Exception | None) -> object:
            if isinstance(error, ConflictError):
                return ("conflict", error.key, error.current_version)
            return None if error is None else (type(error).__name__, str(error))

        expected = [outcome(e) for e in commit_groups(self.model, self.table, groups)]
        assert [outcome(e) for e in commit_groups(self.store, self.table, groups)] == expected

    @rule(specs=OP_SPECS)
    def commit(self, specs: list[tuple[str, str, object, str, int]]) -> None:
        ops = [self._op(*spec) for spec in specs]
        try:
            expected = [comparable(r) for r in self.model.commit(self.table, ops)]
        except ConflictError as err:
            with pytest.raises(ConflictError) as info:
                self.store.commit(self.table, ops)
            assert (info.value.key, info.value.current_version) == (err.key, err.current_version)
        except ValidationError as refused:  # an Add on a non-integer, or out of range
            with pytest.raises(ValidationError) as caught:
                self.store.commit(self.table, ops)
            assert str(caught.value) == str(refused)
        else:
            assert [comparable(r) for r in self.store.commit(self.table, ops)] == expected

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        assert comparable(self.store.get(self.table, key)) == comparable(self.model.get(self.table, key))

    @rule(keys=st.lists(KEYS, max_size=6))
    def get_many(self, keys: list[str]) -> None:
        got = self.store.get_many(self.table, keys)
        assert [comparable(e) for e in got] == [comparable(e) for e in self.model.get_many(self.table, keys)]

    @rule(
        prefix=st.sampled_from(["", "", "a", "中", "z", "x"]),
        after=st.none() | KEYS,
        limit=st.integers(1, 5),
    )
    def scan(self, prefix: str, after: str | None, limit: int) -> None:
        got = self.store.scan(self.table, prefix=prefix, after=after, limit=limit)
        want = self.model.scan(self.table, prefix=prefix, after=after, limit=limit)
        assert [comparable(e) for e in got] == [comparable(e) for e in want]

    @precondition(lambda self: bool(self.model.scan(self.table, limit=1)))
    @rule()
    def drop(self) -> None:
        self.store.drop(self.table)
        self.model.drop(self.table)

    def teardown(self) -> None:
        got = self.store.scan(self.table, limit=100)
        assert [comparable(e) for e in got] == [comparable(e) for e in self.model.scan(self.table, limit=100)]
        self.store.drop(self.table)


def test_backend_matches_the_memory_model(kv: DurableKv) -> None:
    """Random commits (Adds too), group commits, gets, get_manys, scans and drops answer like MemoryKv."""
    machine = type("Machine", (KvAgainstModel,), {"store": kv})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=25,
            stateful_step_count=20,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# -- FileKv specifics ---------------------------------------------------------------------


def test_file_kv_survives_reopen(tmp_path: Path) -> None:
    """A FileKv reopened on the same file sees every committed entry, versions and TTLs."""
    url = f"file://{tmp_path}/data/kv.json"
    kv = connect(url)
    kv.commit("t", [Put("a", {"x": "é"}), Put("b", 1, ttl_ms=60_000), Put("gone", 1, ttl_ms=50)])
    kv.commit("t", [Put("a", {"x": "ö"}, expect=1)])
    kv.commit("u", [Put("z", None)])
    expected = kv.scan("t")
    time.sleep(0.1)
    kv.close()
    reopened = connect(url)
    assert reopened.scan("t") == [e for e in expected if e.key != "gone"]
    assert reopened.get("t", "a") == Entry("a", {"x": "ö"}, 2, None)
    assert reopened.get("u", "z") == Entry("z", None, 1, None)
    reopened.close()


def test_file_kv_refuses_a_second_opener(tmp_path: Path) -> None:
    """While one FileKv holds the file, another (any process) gets a clear StoreUnavailable."""
    url = f"file://{tmp_path}/kv.json"
    first = connect(url)
    with pytest.raises(StoreUnavailable, match="already open by another FileKv"):
        connect(url)
    first.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        first.get("t", "k")
    connect(url).close()  # the lock is free again


def test_file_kv_ignores_a_leftover_temp_file(tmp_path: Path) -> None:
    """A half-written temporary snapshot from a crash is never loaded."""
    path = tmp_path / "kv.json"
    kv = FileKv(f"file://{path}")
    kv.commit("t", [Put("k", 1)])
    kv.close()
    (tmp_path / ".kv.json.tmp").write_text('{"format": "botmesh-kv/1", "tables": {"t": [["k", 2')
    kv = FileKv(f"file://{path}")
    assert kv.get("t", "k") == Entry("k", 1, 1, None)
    kv.close()


def test_file_kv_rejects_a_corrupt_snapshot(tmp_path: Path) -> None:
    """A snapshot that is not FileKv JSON is an error, never an empty store."""
    path = tmp_path / "kv.json"
    path.write_text("not json")
    with pytest.raises(StoreUnavailable, match="not a FileKv snapshot"):
        FileKv(f"file://{path}")
    with pytest.raises(ValidationError):
        FileKv("file://relative/kv.json")


def test_file_kv_failed_write_keeps_nothing_of_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the snapshot cannot be written, commit raises StoreUnavailable and memory rolls back."""
    kv = FileKv(f"file://{tmp_path}/kv.json")
    kv.commit("t", [Put("k", 1)])

    def disk_full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("botmesh_admin.kv.file.os.replace", disk_full)
    with pytest.raises(StoreUnavailable, match="No space left"):
        kv.commit("t", [Put("k", 2, expect=1), Put("new", 1)])
    assert kv.scan("t") == [Entry("k", 1, 1, None)]
    monkeypatch.undo()
    assert kv.commit("t", [Put("k", 2, expect=1)])[0].version == 2
    kv.close()


@pytest.mark.slow
def test_file_kv_killed_mid_write_leaves_old_or_new_snapshot(tmp_path: Path) -> None:
    """SIGKILL at random moments while writing ~2 MB snapshots never corrupts the file.

    After each kill the file loads, and holds either the last acknowledged write
    or the one in flight; the next writer continues from it.
    """
    url = f"file://{tmp_path}/kv.json"
    size = 2 * 1024 * 1024
    rng = random.Random()
    done = 0
    for _ in range(5):
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.kv.workers", url, str(done), str(size)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        first = writer.stdout.readline()  # at least one write landed
        assert first.strip(), "the writer died before its first write"
        time.sleep(rng.uniform(0.0, 0.15))
        writer.kill()
        acknowledged = [int(line) for line in [first, *writer.stdout.read().split()]]
        writer.wait()
        kv = FileKv(url)
        entry = kv.get("crash", "doc")
        kv.close()
        assert entry is not None
        n = entry.value["n"]
        assert n in (acknowledged[-1], acknowledged[-1] + 1)
        assert entry.value == snapshot_value(n, size)
        assert entry.version == n
        done = n
    assert done >= 5


# -- optional capabilities for backups: tables() and import_entries() ----------------------


def test_backend_lists_tables_and_imports_entries(kv: DurableKv) -> None:
    """Every shipped backend has the two capabilities backups need."""
    assert isinstance(kv, TableListing) and isinstance(kv, EntryImport)


def test_tables_lists_tables_with_live_entries_in_name_order(kv: DurableKv) -> None:
    """tables(prefix) names every table under the prefix that holds an entry, by byte order."""
    root = new_table("list")
    names = [f"{root}/b", f"{root}/a/x", f"{root}/a", f"{root}/é", f"{root}/Z"]
    for name in names:
        kv.commit(name, [Put("k", name)])
    assert kv.tables(f"{root}/") == sorted(names)
    assert kv.tables(f"{root}/a") == [f"{root}/a", f"{root}/a/x"]
    assert kv.tables(f"{root}/nothing") == []
    assert set(sorted(names)) <= set(kv.tables())


def test_tables_leaves_out_emptied_dropped_and_expired_tables(kv: DurableKv) -> None:
    """A table whose entries were deleted, dropped or have all expired is not listed."""
    root = new_table("gone")
    kv.commit(f"{root}/deleted", [Put("k", 1)])
    kv.commit(f"{root}/deleted", [Delete("k")])
    kv.commit(f"{root}/dropped", [Put("k", 1), Put("j", 2)])
    kv.drop(f"{root}/dropped")
    (entry,) = kv.commit(f"{root}/expired", [Put("k", 1, ttl_ms=50)])
    kv.commit(f"{root}/kept", [Put("k", 1), Put("t", 2, ttl_ms=50)])
    assert entry.expires_at is not None
    sleep_past(entry.expires_at)
    assert kv.tables(f"{root}/") == [f"{root}/kept"]


def test_tables_prefix_is_literal_not_a_pattern(kv: DurableKv) -> None:
    """Glob characters in the prefix match only themselves (Redis SCAN patterns are escaped)."""
    root = new_table("glob")
    for name in (f"{root}/a*", f"{root}/ab", f"{root}/a?c", f"{root}/[a]", f"{root}/a\\b"):
        kv.commit(name, [Put("k", 1)])
    assert kv.tables(f"{root}/a*") == [f"{root}/a*"]
    assert kv.tables(f"{root}/a?") == [f"{root}/a?c"]
    assert kv.tables(f"{root}/[") == [f"{root}/[a]"]
    assert kv.tables(f"{root}/a\\") == [f"{root}/a\\b"]


def test_tables_refuses_a_bad_prefix(kv: DurableKv) -> None:
    """The prefix follows the table-name rules."""
    with pytest.raises(ValidationError, match="prefix"):
        kv.tables("has{brace")
    with pytest.raises(BadType):
        kv.tables(None)  # type: ignore[arg-type]


def test_import_entries_keeps_values_versions_and_expiry(kv: DurableKv, table: str) -> None:
    """Imported entries read back exactly, and compare-and-set continues from their versions."""
    later = now_ms() + 3_600_000
    entries = [Entry("b", {"n": [1, 2]}, 7, None), Entry("a", "x", 1, later), Entry("c", None, 42, None)]
    assert kv.import_entries(table, entries) == 3
    assert kv.scan(table) == sorted(entries, key=lambda e: e.key)
    (after,) = kv.commit(table, [Put("b", "next", expect=7)])
    assert after.version == 8
    with pytest.raises(ConflictError):
        kv.commit(table, [Put("c", 1, expect=ABSENT)])
    assert table in kv.tables(table)


def test_import_entries_overwrites_keys_and_skips_expired_entries(kv: DurableKv, table: str) -> None:
    """An imported key replaces the stored one; an entry already expired is not stored."""
    kv.commit(table, [Put("a", "old"), Put("keep", "me")])
    stored = kv.import_entries(table, [Entry("a", "new", 5, None), Entry("dead", 1, 1, now_ms() - 1)])
    assert stored == 1
    assert kv.scan(table) == [Entry("a", "new", 5, None), Entry("keep", "me", 1, None)]
    assert kv.get(table, "dead") is None


def test_import_entries_validates_before_writing(kv: DurableKv, table: str) -> None:
    """A bad entry raises ValidationError naming it, and nothing of the batch is stored."""
    with pytest.raises(ValidationError, match=r"entries\[1\]\.version"):
        kv.import_entries(table, [Entry("a", 1, 1, None), Entry("b", 1, 0, None)])
    with pytest.raises(ValidationError, match=r"entries\[0\]\.value"):
        kv.import_entries(table, [Entry("a", float("nan"), 1, None)])
    assert kv.scan(table) == []


def test_exported_tables_import_into_another_backend_unchanged(kv: DurableKv) -> None:
    """tables() + scan() on one backend and import_entries() on another copy every entry."""
    root = new_table("copy")
    kv.commit(f"{root}/one", [Put(f"k{i:03d}", {"i": i}) for i in range(150)])
    kv.commit(f"{root}/one", [Put("k000", "again", expect=1)])
    kv.commit(f"{root}/two", [Put("t", [True], ttl_ms=3_600_000)])
    copy = MemoryKv()
    for name in kv.tables(f"{root}/"):
        entries, after = [], None
        while page := kv.scan(name, after=after, limit=64):
            entries += page
            after = page[-1].key
        copy.import_entries(name, entries)
    for name in (f"{root}/one", f"{root}/two"):
        assert copy.scan(name, limit=1000) == kv.scan(name, limit=1000)
    assert copy.get(f"{root}/one", "k000") == Entry("k000", "again", 2, None)


def test_merged_scan_merges_index_ranges_by_suffix_with_their_records(kv: DurableKv, table: str) -> None:
    """``merged_scan`` (``ScanMerge`` natively on SQL, scans elsewhere): first entries of several ranges, by suffix."""
    from botmesh_admin.kv.indexes import merged_scan

    kv.commit(
        table,
        [
            Put("c/1", {"n": 1}),
            Put("c/2", {"n": 2}),
            Put("c/3", {"n": 3}, ttl_ms=100),
            Put("x/l/open/05/c1", {"pk": "c/1"}),
            Put("x/l/open/20/c2", {"pk": "c/2"}),
            Put("x/l/pending/10/c3", {"pk": "c/3"}),
            Put("x/l/pending/30/cx", {"pk": "c/none"}),
            Put("x/l/resolved/01/c9", {"pk": 9}),
            Put("x/l/resolved/20/c1", {"pk": "c/1"}, ttl_ms=100),
            Put("x/l/resolvedX/00/c1", {"pk": "c/1"}),  # under no prefix (the prefixes end in "/")
        ],
    )
    sleep_past(kv.get(table, "c/3").expires_at)  # type: ignore[union-attr]
    prefixes = ["x/l/open/", "x/l/pending/", "x/l/resolved/"]

    def page(after: str | None = None, limit: int = 10) -> list[tuple[str, str | None]]:
        return [(e.key, t.key if t else None) for e, t in merged_scan(kv, table, prefixes, after, limit)]

    assert page() == [
        ("x/l/resolved/01/c9", None),
        ("x/l/open/05/c1", "c/1"),
        ("x/l/pending/10/c3", None),
        ("x/l/open/20/c2", "c/2"),
        ("x/l/pending/30/cx", None),
    ]
    assert page(limit=2) == [("x/l/resolved/01/c9", None), ("x/l/open/05/c1", "c/1")]
    assert page(after="05/c1", limit=2) == [("x/l/pending/10/c3", None), ("x/l/open/20/c2", "c/2")]
    assert page(after="30/cx") == []
    [(entry, record)] = merged_scan(kv, table, ["x/l/open/"], "05/c1", 5)
    assert entry == kv.get(table, "x/l/open/20/c2") and record == kv.get(table, "c/2")
    # Equal suffixes in two ranges: by key.
    kv.commit(table, [Put("x/l/pending/20/c2", {"pk": "c/2"})])
    assert page(after="10/c3", limit=2) == [("x/l/open/20/c2", "c/2"), ("x/l/pending/20/c2", "c/2")]
    assert merged_scan(kv, new_table(), prefixes, None, 10) == []


def test_merged_scan_agrees_with_separate_scans_on_random_ranges(kv: DurableKv, table: str) -> None:
    """Random entries in five ranges: every page of the merge is the sorted union's page, and pages chain."""
    from botmesh_admin.kv.indexes import merged_scan

    rng = random.Random(16)
    prefixes = [f"x/m/{name}/" for name in ("a", "b", "c", "d", "é")]
    ops: list[Any] = [Put(f"r/{i}", {"i": i}) for i in range(40)]
    for n in range(120):
        prefix = rng.choice(prefixes)
        suffix = f"{rng.randrange(50):03}/{n}"
        ops.append(Put(prefix + suffix, {"pk": f"r/{rng.randrange(60)}"}))
    kv.commit(table, ops)
    union = sorted((e.key[len(p) :], e.key) for p in prefixes for e in kv.scan(table, prefix=p, limit=1000))
    assert len(union) == 120
    after, seen = None, []
    while True:
        rows = merged_scan(kv, table, prefixes, after, 7)
        if not rows:
            break
        for entry, record in rows:
            target = entry.value["pk"]
            assert record == kv.get(table, target)
        seen += [e.key for e, _ in rows]
        last = rows[-1][0].key
        after = next(s for s, k in union if k == last)
    assert seen == [k for _, k in union]


@pytest.mark.parametrize(
    ("prefixes", "after", "limit", "field", "message"),
    [
        ([], None, 10, "pk", "prefixes"),
        (["x/a/", "x/a/b/"], None, 10, "pk", "prefixes"),
        (["x/a/", "x/a/"], None, 10, "pk", "prefixes"),
        (["x/a/", ""], None, 10, "pk", "prefixes"),
        ("x/a/", None, 10, "pk", "prefixes"),
        ([f"x/{i}/" for i in range(65)], None, 10, "pk", "prefixes"),
        (["x/a/"], 5, 10, "pk", "after"),
        (["x/a/"], None, 1001, "pk", "limit"),
        (["x/a/"], None, 10, "p.k", "field"),
    ],
)
def test_merged_scan_refuses_bad_arguments_naming_them(
    kv: DurableKv, table: str, prefixes: Any, after: Any, limit: int, field: str, message: str
) -> None:
    from botmesh_admin.kv.indexes import merged_scan

    with pytest.raises(ValidationError) as info:
        merged_scan(kv, table, prefixes, after, limit, field)
    assert info.value.field == message


def test_merged_scan_follows_entries_whose_values_hold_a_nul(kv: DurableKv, table: str) -> None:
    """PostgreSQL's json cannot read a NUL: such a page is merged by scans, with the same answer."""
    from botmesh_admin.kv.indexes import merged_scan

    kv.commit(
        table,
        [
            Put("c/1", {"name": "Ana\x00"}),
            Put("x/a/2", {"pk": "c/1", "payload": "before\x00after"}),
            Put("x/b/1", {"pk": "c/none"}),
        ],
    )
    rows = merged_scan(kv, table, ["x/a/", "x/b/"], None, 5)
    assert [(e.value, t.value if t else None) for e, t in rows] == [
        ({"pk": "c/none"}, None),
        ({"pk": "c/1", "payload": "before\x00after"}, {"name": "Ana\x00"}),
    ]


@pytest.mark.services
def test_postgres_kv_plans_its_statements_generically(postgres_url: str, table: str) -> None:
    """Each connection plans generically, prepared at first use (see ``_Postgres._connect``): a table
    ANALYZE has not sampled is estimated at one row, and a plan made for its name read the whole table per
    followed entry (bench/scale.py: 4.3 s for a page of a new 10,000-conversation tenant beside a 1,000,000
    one, 1 ms with a generic plan)."""
    kv = connect(postgres_url)
    kv.commit(table, [Put("c/1", {"n": 1}), Put("x/a/1", {"pk": "c/1"})])
    conn = kv._db._conns.get()  # type: ignore[attr-defined]
    assert conn.execute("SHOW plan_cache_mode").fetchone()[0] == "force_generic_plan"
    assert conn.prepare_threshold == 0
    assert [t.key if t else None for _, t in kv.scan_follow(table, prefix="x/a/")] == ["c/1"]
    assert [e.key if e else None for e in kv.get_many(table, ["c/1", "c/2"])] == ["c/1", None]


@pytest.mark.parametrize("backend", backend_params(["file", "sqlite", "postgresql", "redis", "redis-cluster"]))
def test_close_while_other_threads_use_the_kv_stops_them_with_store_unavailable(kv_url: str, table: str) -> None:
    """``close`` from one thread while three others commit and scan: each of them gets ``StoreUnavailable``.

    Run in a subprocess, 40 rounds: before the use lock (``ThreadConnections.using``)
    closing a SQLite connection under a running statement crashed the
    interpreter (a segfault took an xdist worker down in CI), and redis-py's
    ``close`` left the other threads an ``AttributeError``, or one waiting for
    its reply until the socket timeout (30 s; ``RedisCalls`` now waits for them).
    """
    code = "import sys; from tests.kv.workers import close_while_in_use as run; run(sys.argv[1], sys.argv[2], 40)"
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code, kv_url, table],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_close_waits_for_a_connection_in_use_and_leaves_one_held_too_long_to_its_owner(tmp_path: Path) -> None:
    """``ThreadConnections.close`` closes a connection only while no thread uses it.

    A thread inside ``using()`` holds its connection: ``close`` waits for the
    block to end (here 0.2 s) before closing it. One held past ``close_wait_s``
    is left open and marked; its owner closes it on its next ``get``, which
    raises ``StoreUnavailable``.
    """
    from botmesh_admin.kv.sql.connections import ThreadConnections

    closed: list[str] = []
    conns: ThreadConnections[str] = ThreadConnections(lambda: threading.current_thread().name, closed.append)
    inside, release = threading.Event(), threading.Event()
    outcome: list[str] = []

    def hold(seconds: float) -> None:
        with conns.using():
            conns.get()
            inside.set()
            release.wait(seconds)
        try:
            conns.get()
        except StoreUnavailable:
            outcome.append("refused")

    user = threading.Thread(target=hold, args=(0.2,), name="short")
    user.start()
    inside.wait(5)
    started = time.monotonic()
    conns.close()
    assert time.monotonic() - started >= 0.15  # close waited for the block
    assert closed == ["short"]
    user.join(5)
    assert outcome == ["refused"]

    closed.clear()
    outcome.clear()
    inside.clear()
    conns = ThreadConnections(lambda: threading.current_thread().name, closed.append)
    conns.close_wait_s = 0.05
    user = threading.Thread(target=hold, args=(5.0,), name="long")
    user.start()
    inside.wait(5)
    conns.close()
    assert closed == []  # still in use: left to its owner
    release.set()
    user.join(5)
    assert outcome == ["refused"]
    assert closed == ["long"]  # by its owner, on the get that raised
