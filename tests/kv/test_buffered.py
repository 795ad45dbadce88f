"""BufferedKv: buffered commits over a real Kv, flushed as one merged commit per group (issue 21, item 2)."""

from __future__ import annotations

import pytest

from botmesh_admin.kv import ABSENT, Add, Check, ConflictError, Delete, DurableKv, Put
from botmesh_admin.kv.base import ScanMerge
from botmesh_admin.kv.buffered import BufferedKv
from botmesh_admin.kv.validation import MAX_GET_MANY
from tests import backends


@pytest.fixture
def table() -> str:
    return f"test/{backends.unique_id()}/buffered"


def test_buffered_commits_are_seen_by_the_batch_and_flushed_as_one_commit(any_kv: DurableKv, table: str) -> None:
    any_kv.commit(table, [Put("a", 1), Put("gone", 0), Add("n", 5)])
    kv = BufferedKv(any_kv)
    a = kv.get(table, "a")
    assert a is not None
    kv.commit(table, [Put("a", 2, a.version), Put("b", "new", ABSENT), Add("n", 1)])
    kv.commit(table, [Put("a", 3, a.version + 1), Delete("gone"), Put("tmp", 1, ABSENT), Add("n", 2)])
    kv.commit(table, [Delete("tmp", 1), Check("b", 1)])
    assert kv.get(table, "a").value == 3 and kv.get(table, "gone") is None  # type: ignore[union-attr]
    assert [e.key for e in kv.scan(table)] == ["a", "b", "n"]
    assert any_kv.get(table, "a").value == 1, "nothing written before the flush"  # type: ignore[union-attr]
    [group] = kv.flush()
    assert group.error is None and kv.base_commits == 1
    assert {e.key: e.value for e in any_kv.scan(table)} == {"a": 3, "b": "new", "n": 8}


def test_a_scan_past_keys_the_batch_deleted_still_fills_its_page(any_kv: DurableKv, table: str) -> None:
    # A short page means "the end" to every paging loop: a key deleted in the batch must not count.
    any_kv.commit(table, [Put(k, k) for k in "abcde"])
    kv = BufferedKv(any_kv)
    kv.commit(table, [Delete("b")])
    assert [e.key for e in kv.scan(table, limit=2)] == ["a", "c"]
    assert [e.key for e in kv.scan(table, after="a", limit=3)] == ["c", "d", "e"]


def test_a_conflict_in_the_batch_raises_as_the_base_would(any_kv: DurableKv, table: str) -> None:
    any_kv.commit(table, [Put("a", 1)])
    kv = BufferedKv(any_kv)
    kv.get(table, "a")
    kv.commit(table, [Put("a", 2, 1)])
    with pytest.raises(ConflictError):
        kv.commit(table, [Put("a", 3, 1)])
    with pytest.raises(ConflictError):
        kv.commit(table, [Put("a", 3, ABSENT)])


def test_a_key_changed_meanwhile_fails_its_group_alone(any_kv: DurableKv, table: str) -> None:
    any_kv.commit(table, [Put("x", 1), Put("y", 1)])
    kv = BufferedKv(any_kv)
    x, y = kv.get_many(table, ["x", "y"])
    assert x is not None and y is not None
    kv.commit(table, [Put("x", 2, x.version), Add("count", 1)])
    kv.commit(table, [Put("y", 2, y.version), Add("count", 1)])
    kv.commit(table, [Put("fresh", 1, ABSENT)])  # assumed absent, never read
    any_kv.commit(table, [Put("y", "another writer"), Put("fresh", "taken")])
    groups = kv.flush()
    assert [g.error is None for g in groups] == [True, False, False], "counters never join groups"
    assert {e.key: e.value for e in any_kv.scan(table)} == {"count": 1, "fresh": "taken", "x": 2, "y": "another writer"}


def test_labels_join_commits_into_one(any_kv: DurableKv, table: str) -> None:
    kv = BufferedKv(any_kv)
    kv.commit(table, [Put("m/c1/1", 1, ABSENT)])
    kv.commit(table, [Put("m/c1/2", 1, ABSENT)])
    kv.commit(table, [Put("m/c2/1", 1, ABSENT)])
    groups = kv.flush(lambda key: key.split("/")[1])
    assert [g.commits for g in groups] == [(0, 1), (2,)] and kv.base_commits == 2


def test_a_read_of_buffered_writes_is_observed_and_joins_the_reader_to_the_writer(
    any_kv: DurableKv, table: str
) -> None:
    # Unit 0 writes "p" (assumed absent, never read); unit 1 reads it and writes elsewhere on what it read.
    kv = BufferedKv(any_kv)
    kv.commit(table, [Put("p", "from unit 0", ABSENT), Add("n", 1), Check("s", ABSENT)])
    assert kv.observed() == (set(), set()), "a commit's own checks are not reads"
    assert kv.get(table, "p").value == "from unit 0"  # type: ignore[union-attr]
    assert kv.get(table, "n").value == 1 and kv.get(table, "s") is None  # type: ignore[union-attr]
    kv.commit(table, [Put("q", "decided on p", ABSENT)])
    seen, read = kv.observed()
    assert seen == {0}, "only the value read from p carries a decision"
    assert read == {(table, "p"), (table, "n"), (table, "s")}
    assert kv.written(0, 2) == {(table, "p"), (table, "q")}, "counters only added to are not written values"
    any_kv.commit(table, [Put("p", "another writer")])  # unit 0's assumption no longer holds
    [group] = kv.flush(joined=[{0, 1}])
    assert group.commits == (0, 1) and isinstance(group.error, ConflictError)
    assert any_kv.get(table, "q") is None, "what was decided on a failed write is not written either"


def test_a_read_after_a_contradicted_assumption_sees_the_base(any_kv: DurableKv, table: str) -> None:
    any_kv.commit(table, [Put("a", "stored")])
    kv = BufferedKv(any_kv)
    kv.commit(table, [Check("a", ABSENT)])  # assumed absent, never read
    assert kv.get(table, "a").value == "stored"  # type: ignore[union-attr]
    [group] = kv.flush()
    assert isinstance(group.error, ConflictError)


def test_a_counter_only_added_to_and_checked_keeps_its_ttl(any_kv: DurableKv, table: str) -> None:
    any_kv.commit(table, [Put("n", 1, ttl_ms=60_000)])
    before = any_kv.get(table, "n")
    assert before is not None and before.expires_at is not None
    kv = BufferedKv(any_kv)
    kv.get(table, "n")
    kv.commit(table, [Check("n", before.version)])
    kv.commit(table, [Add("n", 2)])
    [group] = kv.flush()
    after = any_kv.get(table, "n")
    assert group.error is None and after is not None and after.value == 3
    assert after.expires_at is not None and abs(after.expires_at - before.expires_at) < 5_000, "TTL kept"


class _Down:
    """A base whose reads fail (an outage) after the batch was buffered; commits are counted."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv, self.url, self.down, self.commits = kv, kv.url, False, 0

    def get_many(self, table: str, keys: list[str]) -> list[object]:
        if self.down:
            raise ConnectionError("kv unreachable")
        return self.kv.get_many(table, keys)

    def commit(self, table: str, ops: list[object]) -> list[object]:
        self.commits += 1
        return self.kv.commit(table, ops)  # type: ignore[arg-type]


def test_an_outage_while_merging_a_group_fails_that_group_and_the_others_still_flush(
    any_kv: DurableKv, table: str
) -> None:
    any_kv.commit(table, [Add("n", 1)])
    base = _Down(any_kv)
    kv = BufferedKv(base)  # type: ignore[arg-type]
    kv.commit(table, [Put("a", 1, ABSENT)])
    kv.commit(table, [Delete("n")])
    kv.commit(table, [Add("n", 1)])  # the sum after a delete is read from the base at flush
    base.down = True
    groups = kv.flush()
    assert groups[0].error is None and isinstance(groups[1].error, ConnectionError)
    assert any_kv.get(table, "a").value == 1 and any_kv.get(table, "n").value == 1  # type: ignore[union-attr]


def test_each_group_checks_a_key_only_checked_against_its_own_expectation(any_kv: DurableKv, table: str) -> None:
    any_kv.commit(table, [Put("a", "stored")])
    kv = BufferedKv(any_kv)
    kv.commit(table, [Check("a", ABSENT), Put("x", 1, ABSENT)])  # a wrong assumption (never read)
    a = kv.get(table, "a")
    assert a is not None
    kv.commit(table, [Check("a", a.version), Put("y", 1, ABSENT)])  # read, and checked as read
    groups = kv.flush()
    assert [type(g.error) for g in groups] == [ConflictError, type(None)]
    assert any_kv.get(table, "x") is None and any_kv.get(table, "y").value == 1  # type: ignore[union-attr]


def test_joined_commits_of_two_tables_stay_one_commit_per_table(any_kv: DurableKv, table: str) -> None:
    kv = BufferedKv(any_kv)
    kv.commit(table, [Put("a", 1, ABSENT)])
    kv.commit(f"{table}-2", [Put("b", 2, ABSENT)])
    groups = kv.flush(joined=[{0, 1}])
    assert [g.error for g in groups] == [None, None]
    assert any_kv.get(table, "a").value == 1 and any_kv.get(f"{table}-2", "b").value == 2  # type: ignore[union-attr]


def test_adds_whose_sum_leaves_the_counter_range_fail_their_group_and_write_nothing(
    any_kv: DurableKv, table: str
) -> None:
    # A flush hands the base the ops it validated when they were buffered, merged: a summed
    # delta past the range is refused all the same, with the rest of its group.
    from botmesh_admin.errors import ValidationError
    from botmesh_admin.kv.base import MAX_COUNTER

    kv = BufferedKv(any_kv)
    kv.commit(table, [Add("n", MAX_COUNTER), Put("a", 1)])
    kv.commit(table, [Add("n", 1)])
    [group] = kv.flush(joined=[(0, 1)])  # one group: its two adds to n become one
    assert isinstance(group.error, ValidationError) and "n" in group.error.field
    assert any_kv.get(table, "n") is None and any_kv.get(table, "a") is None


class ScanCountingKv:
    """Forwards to ``kv``, counting its ``scan`` and ``scan_merge`` calls (the real Kv, observed)."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv, self.url, self.scans, self.merges = kv, kv.url, 0, 0

    def scan(self, *args: object, **kwargs: object) -> object:
        self.scans += 1
        return self.kv.scan(*args, **kwargs)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        if name == "scan_merge":  # only where the real Kv has the capability
            merge = getattr(self.kv, name)

            def counted(*args: object, **kwargs: object) -> object:
                self.merges += 1
                return merge(*args, **kwargs)

            return counted
        return getattr(self.kv, name)


def test_prefetched_scans_answer_as_the_base_did_in_one_read(any_kv: DurableKv, table: str) -> None:
    # Read markers of three conversations: two agents, none, and more than a page holds.
    any_kv.commit(table, [Put("r/c1/ana", 1), Put("r/c1/ben", 2), Put("r/c1/#", 3), Put("r/c10/ana", 4)])
    any_kv.commit(table, [Put(f"r/c3/agent{n:02}", n) for n in range(5)])
    base = ScanCountingKv(any_kv)
    kv = BufferedKv(base)  # type: ignore[arg-type]
    kv.prefetch_scans(table, ["r/c1/", "r/c2/", "r/c3/", "r/c10/"], 5)
    native = isinstance(any_kv, ScanMerge)
    assert base.merges == (1 if native else 0) and base.scans == 0
    any_kv.commit(table, [Put("r/c2/late", 9)])  # after the read: the batch sees the base as first read
    pages = {p: [(e.key, e.value) for e in kv.scan(table, prefix=p, limit=5)] for p in ("r/c1/", "r/c2/", "r/c10/")}
    assert pages == {
        "r/c1/": [("r/c1/#", 3), ("r/c1/ana", 1), ("r/c1/ben", 2)],
        "r/c2/": [] if native else [("r/c2/late", 9)],
        "r/c10/": [("r/c10/ana", 4)],
    }
    assert base.scans == (0 if native else 3), "each whole range answered from the one read"
    # A range as long as the page was not kept (it may go on): it is scanned, and answers in full.
    assert [e.key for e in kv.scan(table, prefix="r/c3/", limit=5)] == [f"r/c3/agent{n:02}" for n in range(5)]
    assert base.scans == (1 if native else 4)


def test_a_prefetch_that_reads_the_whole_merge_limit_keeps_nothing(any_kv: DurableKv, table: str) -> None:
    for start in range(0, MAX_GET_MANY, 500):
        any_kv.commit(table, [Put(f"r/c1/a{n:04}", n) for n in range(start, start + 500)])
    any_kv.commit(table, [Put("r/c2/ana", 1)])
    base = ScanCountingKv(any_kv)
    kv = BufferedKv(base)  # type: ignore[arg-type]
    kv.prefetch_scans(table, ["r/c1/", "r/c2/"], 5000)
    assert [e.key for e in kv.scan(table, prefix="r/c2/", limit=5000)] == ["r/c2/ana"]
    assert len(kv.scan(table, prefix="r/c1/", limit=5000)) == MAX_GET_MANY
    assert base.scans == 2, "cut short at the merge's limit, so neither range was taken from it"
