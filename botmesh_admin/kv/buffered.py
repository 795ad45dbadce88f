"""BufferedKv: commits held in memory over a real DurableKv, then written as a few merged commits.

A batch of writes that each read → compare-and-set → commit (the inbox's
projection of a claimed journal batch) runs unchanged against a
``BufferedKv(base)``: reads see the base as first read plus every buffered
commit; a buffered commit checks its expectations against that view and
raises ``ConflictError`` as the base would. ``flush(labels)`` then writes the
buffered commits as one real commit per *group* — commits that touch a common
key (other than counters only added to, or keys only checked), or a common
label (``labels(key)``: what the caller calls one unit, e.g. a conversation) —
each op merged per key into its net effect:

- the expectation is the key's state *before the batch*: the version (or
  absence) first read, else what the first expectation on it assumed; a key
  only ever written with ``ANY`` keeps ``ANY``;
- the final value is ``Put`` (or ``Delete``; a key created and deleted again
  becomes a ``Check`` that it is still absent); counters only added to stay one
  ``Add`` of the sum (never conflicting); keys only checked stay ``Check``.

So the group's commit succeeds exactly when nothing the batch relied on
changed meanwhile — then it has the effect of the buffered commits run one
after the other — and fails with ``ConflictError`` otherwise, writing nothing
of that group (the caller redoes that group's work against the base). Index
upkeep (``kv.indexes``) is computed by the buffered commits as usual and merged
like any other op. Versions the buffered view reports are its own (a flushed
key's version grows by one per group, not per buffered commit).

A read that saw buffered ops depends on the commits that made them, and a
later write of a key read changes what the reader would have seen: the caller
collects, after each unit of work, ``observed()`` (the commits its reads saw
and the keys it read) and ``written(start, end)`` (the keys its commits set),
and passes to ``flush(joined=...)`` each unit's commits together with the
commits it read and those of the earlier units that read a key it sets — so
they are written, or fail, together, and a failed group's units can be redone
in their order against the base.

Not thread-safe: one batch, one thread. TTLs are kept (``ttl_ms`` of the last
``Put``, else what is left of the base entry's); nothing expires inside the buffer.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .base import (
    ABSENT,
    ANY,
    Add,
    Check,
    ConflictError,
    Delete,
    DurableKv,
    Entry,
    Expect,
    Op,
    Put,
    ScanMerge,
    commit_groups,
)
from .encoding import prefix_end
from .validation import (
    MAX_GET_MANY,
    MAX_MERGE_PREFIXES,
    Validated,
    now_ms,
    validate_commit,
    validate_delta,
)

_UNKNOWN = object()  # a key's base entry, not read


@dataclass
class _Slot:
    """What the batch knows of one key: its base entry (``_UNKNOWN`` unless read) and its buffered ops."""

    base: object = _UNKNOWN
    ops: list[tuple[int, Op]] = field(default_factory=list)  # (commit index, op)
    assumed: Expect = ANY  # the base an expectation assumed when the base was not read


@dataclass(frozen=True)
class FlushedGroup:
    """One merged commit: the buffered commits it holds (indexes), its op count, and its error (``None``: done)."""

    commits: tuple[int, ...]
    ops: int
    error: Exception | None


def _fold(start: Entry | None, key: str, ops: Iterable[Op]) -> Entry | None:
    """Return the entry after ``ops`` starting from ``start`` (the Kv contract's semantics; no clock)."""
    current = start
    for op in ops:
        if isinstance(op, Put):
            current = Entry(key, op.value, current.version + 1 if current else 1, None)
        elif isinstance(op, Delete):
            current = None
        elif isinstance(op, Add):
            base = int(current.value) if current is not None else 0
            current = Entry(
                key, base + op.delta, current.version + 1 if current else 1, current.expires_at if current else None
            )
    return current


def _holds(entry: Entry | None, expect: Expect) -> bool:
    if expect is ANY:
        return True
    if expect is ABSENT:
        return entry is None
    return entry is not None and entry.version == expect


class BufferedKv:
    """A ``DurableKv`` whose commits are buffered until ``flush`` (see the module docstring)."""

    def __init__(self, base: DurableKv) -> None:
        self.base = base
        self.url = base.url
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._held: dict[str, list[str]] = {}  # per table, the keys with buffered ops, sorted (scans' merge)
        self._commits: list[tuple[str, tuple[Op, ...]]] = []
        self._scans: dict[tuple[str, str, str | None, int], list[Entry]] = {}
        self.base_commits = 0  # merged commits (groups) ``flush`` wrote
        self._tables: set[str] = set()
        self._seen: set[int] = set()  # commits whose buffered ops a read saw since ``observed()``
        self._read: set[tuple[str, str]] = set()  # keys read since ``observed()``

    # -- reads --------------------------------------------------------------------------

    def _slot(self, table: str, key: str) -> _Slot:
        slot = self._slots.get((table, key))
        if slot is None:
            slot = self._slots[(table, key)] = _Slot()
            self._tables.add(table)
        return slot

    def _load(self, table: str, keys: Sequence[str]) -> None:
        """Read the base entries of ``keys`` not read yet (one ``get_many``)."""
        missing = list(dict.fromkeys(k for k in keys if self._slot(table, k).base is _UNKNOWN))
        for start in range(0, len(missing), 1000):
            part = missing[start : start + 1000]
            for key, entry in zip(part, self.base.get_many(table, part), strict=True):
                self._slots[(table, key)].base = entry

    def _start(self, key: str, slot: _Slot) -> Entry | None:
        """Return the entry the batch's ops on ``key`` apply to: the base read, else the assumed one."""
        base = slot.base
        if base is not _UNKNOWN:
            assert base is None or isinstance(base, Entry)
            # An assumption the base contradicts dooms its group at ``flush``; until then reads see the base.
            return base
        if slot.assumed is ANY or slot.assumed is ABSENT:
            return None
        assert isinstance(slot.assumed, int)
        return Entry(key, None, slot.assumed)  # the version assumed; its value unread

    def _peek(self, table: str, key: str, *, read: bool = True) -> Entry | None:
        """Return the key's entry as the batch sees it without reading the base (a guessed version if unread).

        ``read``: a caller's read (not a commit's own check), so the commits that
        set the value it sees (``Put``, ``Delete``) are ``observed``; counters
        only added to and keys only checked carry no decision.
        """
        slot = self._slot(table, key)
        if read:
            self._read.add((table, key))
            self._seen.update(i for i, op in slot.ops if isinstance(op, Put | Delete))
        return _fold(self._start(key, slot), key, (op for _, op in slot.ops))

    def _view(self, table: str, key: str) -> Entry | None:
        """Return the key's entry as the batch sees it, reading its base when its value depends on it."""
        slot = self._slot(table, key)
        if slot.base is _UNKNOWN and not any(isinstance(op, Put | Delete) for _, op in slot.ops):
            self._load(table, [key])  # no op of the batch sets its value: the base's is it
        return self._peek(table, key)

    def prefetch(self, table: str, keys: Sequence[str]) -> None:
        """Read ``keys`` of ``table`` from the base now, in one round trip, for the batch's later reads."""
        self._load(table, keys)

    def prefetch_scans(self, table: str, prefixes: Sequence[str], limit: int) -> None:
        """Read the first page of each of ``prefixes`` now, in one round trip per 64, for the batch's scans.

        For prefixes of small ranges read by many units of a batch (a
        conversation's read markers): ``scan(table, prefix, limit=limit)`` then
        answers from what this read, as from its own first base page. One
        ``ScanMerge.scan_merge`` per ``MAX_MERGE_PREFIXES`` prefixes, of at most
        ``MAX_GET_MANY`` entries; when that many come back some range may be cut
        short, so none of that call is kept (each is scanned when read). A base
        without ``ScanMerge`` reads nothing now. ``prefixes`` as for
        ``scan_merge`` (distinct, none starting another; ``ValidationError``).
        """
        if not isinstance(self.base, ScanMerge):
            return
        wanted = [p for p in dict.fromkeys(prefixes) if (table, p, None, limit) not in self._scans]
        for start in range(0, len(wanted), MAX_MERGE_PREFIXES):
            chunk = sorted(wanted[start : start + MAX_MERGE_PREFIXES])  # the base's scan_merge validates them
            rows = self.base.scan_merge(table, chunk, None, MAX_GET_MANY)
            if len(rows) >= MAX_GET_MANY:
                continue
            pages: dict[str, list[Entry]] = {p: [] for p in chunk}
            for entry, _ in rows:
                # The prefix of a key: the last one not after it (none starts another, so it is that one).
                pages[chunk[bisect.bisect_right(chunk, entry.key) - 1]].append(entry)
            for prefix, page in pages.items():
                if len(page) < limit:  # a whole range: scan's own first page would be the same
                    self._scans[(table, prefix, None, limit)] = sorted(page, key=lambda e: e.key)

    def get(self, table: str, key: str) -> Entry | None:
        """Return the entry as the batch sees it (the base as first read, plus the buffered commits)."""
        return self._view(table, key)

    def get_many(self, table: str, keys: Sequence[str]) -> list[Entry | None]:
        """Return ``get`` of each key, reading the unread ones from the base in one round trip."""
        self._load(table, [k for k in keys if not self._slot(table, k).ops])
        return [self._view(table, key) for key in keys]

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Entry]:
        """Return up to ``limit`` entries by key as the batch sees them (base pages read once per batch)."""
        ours = self._held.get(table, [])
        end = prefix_end(prefix) if prefix else None
        if after is not None and after >= prefix:
            lo = bisect.bisect_right(ours, after)
        else:
            lo = bisect.bisect_left(ours, prefix)
        hi = len(ours) if end is None else bisect.bisect_left(ours, end)
        written = ours[lo:hi]  # the batch's keys in the range: a bisection, not a walk of every slot
        found: dict[str, Entry] = {}
        cursor, complete = after, False
        while True:
            page = self._base_scan(table, prefix, cursor, limit)
            for e in page:
                slot = self._slot(table, e.key)
                if slot.base is _UNKNOWN:
                    slot.base = e
                if not slot.ops:
                    found[e.key] = e
            if len(page) < limit:
                complete = True
                break
            cursor = page[-1].key
            # Count only keys the batch still holds: a key it deleted fills no row of the page.
            held = sum(1 for k in written if k <= cursor and self._peek(table, k) is not None)
            if sum(1 for k in found if k <= cursor) + held >= limit:
                break
        for key in written:
            if complete or (cursor is not None and key <= cursor):
                slot = self._slot(table, key)
                if slot.base is _UNKNOWN:
                    slot.base = None  # inside the range the base pages cover, and not in them: absent
                entry = self._view(table, key)
                if entry is not None:
                    found[key] = entry
        return [found[k] for k in sorted(found)][:limit]

    def _base_scan(self, table: str, prefix: str, after: str | None, limit: int) -> list[Entry]:
        key = (table, prefix, after, limit)
        page = self._scans.get(key)
        if page is None:
            page = self._scans[key] = self.base.scan(table, prefix=prefix, after=after, limit=limit)
        return page

    # -- writes -------------------------------------------------------------------------

    def commit(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        """Buffer ``ops`` as one commit after checking their expectations against the batch's view.

        Raise ``ConflictError`` naming the first failed key (nothing buffered),
        as the base would. An expectation on a key the batch never read is
        assumed to hold and checked by ``flush`` against the base. Versions in
        the results are the buffer's (guessed for a key never read nor expected).
        """
        validate_commit(table, ops)
        assume: list[tuple[_Slot, Expect]] = []
        for op in ops:
            if isinstance(op, Add) or op.expect is ANY:
                continue
            slot = self._slot(table, op.key)
            if slot.base is _UNKNOWN and not slot.ops and slot.assumed is ANY:
                assume.append((slot, op.expect))  # the base is assumed as expected; flush checks it
                continue
            current = self._peek(table, op.key, read=False)
            if not _holds(current, op.expect):
                raise ConflictError(table, op.key, op.expect, current.version if current else None)
        for slot, expect in assume:
            slot.assumed = expect
        index = len(self._commits)
        self._commits.append((table, tuple(ops)))
        for op in ops:
            slot = self._slot(table, op.key)
            if not slot.ops:
                bisect.insort(self._held.setdefault(table, []), op.key)
            slot.ops.append((index, op))
        return [None if isinstance(op, Delete) else self._peek(table, op.key, read=False) for op in ops]

    def observed(self) -> tuple[set[int], set[tuple[str, str]]]:
        """Return (and forget) what the reads since the last call saw: ``(commit indexes, (table, key) read)``.

        The commits are those whose ``Put`` or ``Delete`` a read saw (counters
        only added to and keys only checked carry no decision); a commit's own
        expectation checks are not reads.
        """
        seen, read = self._seen, self._read
        self._seen, self._read = set(), set()
        return seen, read

    def written(self, start: int, end: int) -> set[tuple[str, str]]:
        """Return the ``(table, key)`` the buffered commits ``start`` ≤ i < ``end`` ``Put`` or ``Delete``."""
        return {
            (table, op.key) for table, ops in self._commits[start:end] for op in ops if isinstance(op, Put | Delete)
        }

    def mark(self) -> int:
        """Return a savepoint: the number of commits buffered so far."""
        return len(self._commits)

    def commits(self) -> list[tuple[str, tuple[Op, ...]]]:
        """Return the buffered commits ``(table, ops)`` in order."""
        return list(self._commits)

    def flush(
        self, labels: Callable[[str], str | None] = lambda key: None, joined: Iterable[Iterable[int]] = ()
    ) -> list[FlushedGroup]:
        """Write the buffered commits as one merged commit per group (see the module docstring), in order.

        ``joined``: sets of commit indexes that must land together (a unit's
        commits and the ones its reads saw, ``observed()``). Return each
        group's outcome; a group's ``error`` (a ``ConflictError``, or the
        base's own error, also one met while merging) means nothing of it was
        written. The buffer is empty afterwards.
        """
        groups = self._groups(labels, joined)
        merged: list[list[Op]] = []
        errors: list[Exception | None] = []
        by_table: dict[str, list[int]] = {}  # table -> its groups with ops, in order
        for n, (table, members) in enumerate(groups):
            ops: list[Op] = []
            error: Exception | None = None
            try:
                ops = self._merged(table, set(members))
            except Exception as exc:  # noqa: BLE001 - reported per group; the caller redoes its work
                error = exc
            merged.append(ops)
            errors.append(error)
            if ops and error is None:
                by_table.setdefault(table, []).append(n)
        for table, numbers in by_table.items():
            # every op was validated when it was buffered; the groups' writes are disjoint
            # (a key two groups share is only added to, or only checked): one call each table
            try:
                outcome = commit_groups(self.base, table, [Validated(merged[n]) for n in numbers])
            except Exception as exc:  # noqa: BLE001 - the store failed: every group of the call redoes its work
                outcome = [exc] * len(numbers)
            for n, error in zip(numbers, outcome, strict=True):
                errors[n] = error
                self.base_commits += error is None
        out = [
            FlushedGroup(tuple(members), len(ops), error)
            for (_, members), ops, error in zip(groups, merged, errors, strict=True)
        ]
        self._slots.clear()
        self._held.clear()
        self._commits.clear()
        self._scans.clear()
        self._seen.clear()
        self._read.clear()
        return out

    def _groups(
        self, labels: Callable[[str], str | None], joined: Iterable[Iterable[int]] = ()
    ) -> list[tuple[str, list[int]]]:
        """Return ``(table, commit indexes)`` per group, ordered by each group's first commit."""
        parent = list(range(len(self._commits)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        def union(indexes: Iterable[int]) -> None:
            first: int | None = None
            for i in indexes:
                if first is None:
                    first = find(i)
                else:
                    parent[find(i)] = first

        for slot in self._slots.values():
            kinds = {type(op) for _, op in slot.ops}
            if len(slot.ops) > 1 and kinds not in ({Add}, {Check}):
                union(i for i, _ in slot.ops)
        by_label: dict[tuple[str, str], list[int]] = {}
        for i, (table, ops) in enumerate(self._commits):
            for op in ops:
                label = labels(op.key)
                if label is not None:
                    by_label.setdefault((table, label), []).append(i)
        for members in by_label.values():
            union(members)
        for together in joined:  # within one table: one commit writes one table
            by_table: dict[str, list[int]] = {}
            for i in together:
                if 0 <= i < len(self._commits):
                    by_table.setdefault(self._commits[i][0], []).append(i)
            for members in by_table.values():
                union(members)
        groups: dict[int, list[int]] = {}
        for i in range(len(self._commits)):
            groups.setdefault(find(i), []).append(i)
        return [(self._commits[members[0]][0], members) for members in groups.values()]

    def _merged(self, table: str, members: set[int]) -> list[Op]:
        """Return the net ops of the commits ``members`` of ``table``, one per key, in first-touch order."""
        keys: dict[str, None] = {}
        for i in sorted(members):
            for op in self._commits[i][1]:
                keys.setdefault(op.key, None)
        out: list[Op] = []
        for key in keys:
            slot = self._slots[(table, key)]
            ops = [op for i, op in slot.ops if i in members]
            merged = self._net(table, key, slot, ops)
            if merged is not None:
                out.append(merged)
        return out

    def _net(self, table: str, key: str, slot: _Slot, ops: list[Op]) -> Op | None:
        """Return the one op with the net effect of ``ops`` on ``key``, expecting its state before the batch."""
        kinds = {type(op) for op in ops}
        if kinds == {Add}:
            return Add(key, validate_delta(sum(op.delta for op in ops if isinstance(op, Add)), f"{key}: summed delta"))
        if Add in kinds and slot.base is _UNKNOWN:
            self._load(table, [key])  # a counter's sum after a put or delete depends on the base
        checked = Add in kinds or any(op.expect is not ANY for op in ops)
        expect: Expect = slot.assumed
        if expect is ANY and checked and slot.base is not _UNKNOWN:
            base = slot.base
            assert base is None or isinstance(base, Entry)
            expect = ABSENT if base is None else base.version
        if kinds == {Check}:  # no commit of the batch writes it: this group's own checks hold or not
            first = ops[0].expect
            return None if first is ANY else Check(key, first)
        final = _fold(self._start(key, slot), key, ops)
        if final is not None:
            if Put in kinds:
                ttl = next((op.ttl_ms for op in reversed(ops) if isinstance(op, Put)), None)
            else:  # only added to and checked: the base entry's expiry stands
                ttl = None if final.expires_at is None else max(1, int(final.expires_at - now_ms()))
            return Put(key, final.value, expect, ttl)
        if expect is ABSENT or (expect is ANY and slot.base is None):
            return None if expect is ANY else Check(key, ABSENT)
        return Delete(key, expect)

    def forget_cached_states(self) -> None:
        """Drop the index states cached through this object (``kv.indexes``): call it before discarding it."""
        from .indexes import forget_cached_states

        for table in self._tables:
            forget_cached_states(self, table)

    # -- the rest of the contract --------------------------------------------------------

    def drop(self, table: str) -> None:
        """Refused: a batch never drops a table."""
        raise NotImplementedError("BufferedKv buffers commits only")

    def sweep(self, limit: int = 1000) -> int:
        """Sweep the base."""
        return self.base.sweep(limit)

    def ping(self) -> None:
        """Ping the base."""
        self.base.ping()

    def close(self) -> None:
        """Nothing of its own to release (the base stays open)."""


__all__ = ["BufferedKv", "FlushedGroup"]
