"""The DurableKv contract (ARCHITECTURE §4).

A DurableKv holds *tables*; a table holds *entries* ordered by key (byte order of
the UTF-8 encoding). Every write goes through ``commit(table, ops)``, an atomic
batch inside one table: either every operation applies or none does.

Each entry carries a ``version`` that grows by one with every write of its key;
a key that is absent (never written, deleted or expired) starts again at 1 on
its next ``Put``. Expectations make a commit a compare-and-set:

- ``ANY`` — no condition;
- ``ABSENT`` — the key must not exist (or have expired);
- an ``int`` — the key must exist with exactly that version.

Times are epoch **milliseconds**; ``ttl_ms`` is a duration in milliseconds.
Every backend passes ``tests/kv/test_conformance.py``.

Optional capabilities (``TableListing``, ``EntryImport``), which every shipped
backend has, serve backups and restores (``botmesh_admin.backup``); package
code never lists tables (there is no call that reads across tenants).
``ScanFollow`` (every shipped backend has it; wrappers such as ``BufferedKv``
may not) reads an index page and the records it points at in one round trip;
``botmesh_admin.kv.indexes`` uses it when present and otherwise does the same
with ``scan`` then ``get_many``. ``ScanMerge`` (SQLite, PostgreSQL and Redis have it) reads
the first entries of several index ranges merged in one round trip;
``indexes.merged_scan`` does the same with one ``scan`` per range elsewhere.
``CommitGroups`` (SQL backends) writes several independent commits of one table
in one transaction — one round trip and one durable flush instead of one each;
``commit_groups(kv, table, groups)`` commits them one by one elsewhere.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

from botmesh_admin.errors import Conflict

JsonValue: TypeAlias = Any  # dict | list | str | int | float | bool | None, checked by validate_value


class _Expect(enum.Enum):
    ANY = "any"
    ABSENT = "absent"

    def __repr__(self) -> str:
        return self.name


ANY = _Expect.ANY
"""Expectation that always holds."""
ABSENT = _Expect.ABSENT
"""Expectation that the key does not exist (never written, deleted, or expired)."""

Expect: TypeAlias = _Expect | int


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored entry. ``expires_at`` is epoch milliseconds or ``None`` (no TTL)."""

    key: str
    value: JsonValue
    version: int
    expires_at: int | None = None


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``value`` at ``key`` if ``expect`` holds; ``ttl_ms`` (milliseconds) sets an expiry."""

    key: str
    value: JsonValue
    expect: Expect = ANY
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key`` if ``expect`` holds. Deleting an absent key with ``ANY`` is a no-op."""

    key: str
    expect: Expect = ANY


@dataclass(frozen=True, slots=True)
class Check:
    """Assert ``expect`` on ``key`` without writing it (a read guard inside a batch)."""

    key: str
    expect: Expect


@dataclass(frozen=True, slots=True)
class Add:
    """Add ``delta`` to the integer at ``key`` (an absent key counts as 0): a counter.

    FoundationDB's atomic ADD: an ``Add`` carries no expectation and never makes
    a commit conflict, so writers that only add to a counter never serialise on
    each other's versions. The entry's version still grows by one, so a ``Check``
    or a ``Put`` that expects an older version of the counter conflicts. An
    existing expiry is kept; a created counter has none. The stored value must
    be an integer and the sum must stay within ``±MAX_COUNTER`` (2**53 - 1, exact
    in every backend, Lua's doubles included), else the commit raises
    ``ValidationError`` naming the op and nothing of it applies. A counter at 0
    stays (it is not deleted).
    """

    key: str
    delta: int

    @property
    def expect(self) -> _Expect:
        """Always ``ANY``: an ``Add`` never conflicts."""
        return ANY


Op: TypeAlias = Put | Delete | Check | Add
MAX_COUNTER = 2**53 - 1
"""The largest magnitude a counter (``Add``) may reach: exact as a double (Redis Lua)."""


class ConflictError(Conflict):
    """An expectation in a commit failed; nothing of the batch was applied.

    ``key`` names the first key (in batch order) whose expectation failed;
    ``current_version`` is that key's version, or ``None`` if it is absent.
    """

    code = "kv_conflict"

    def __init__(self, table: str, key: str, expected: Expect, current_version: int | None) -> None:
        super().__init__(
            f"conflict on {table!r} key {key!r}: expected {expected!r}, found "
            f"{'absent' if current_version is None else f'version {current_version}'}",
            current_version=current_version,
            key=key,
        )
        self.table = table
        self.key = key
        self.expected = expected


@runtime_checkable
class DurableKv(Protocol):
    """Contract of every Kv backend. All methods are thread-safe."""

    url: str

    def get(self, table: str, key: str) -> Entry | None:
        """Return the live entry at ``key`` in ``table``, or ``None`` if absent or expired."""
        ...

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Entry]:
        """Return up to ``limit`` live entries whose key starts with ``prefix``.

        Entries are in ascending byte order of the key; ``after`` is exclusive
        (pass the last key of the previous page to get the next one). ``limit``
        is 1..10000.
        """
        ...

    def commit(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        """Apply ``ops`` atomically and return, per op, the entry after it.

        ``Put`` and ``Add`` return the written entry, ``Delete`` returns ``None``,
        ``Check`` returns the checked entry (or ``None`` if absent). Raise ``ConflictError``
        naming the first failed key if any expectation fails; then nothing is
        written. A key may appear at most once in a batch.
        """
        ...

    def get_many(self, table: str, keys: Sequence[str]) -> list[Entry | None]:
        """Return, for each of ``keys`` in order, its live entry or ``None``.

        One round trip on the serialising backends (an index page fetches its
        records with it). At most ``MAX_GET_MANY`` (1,000) keys; a key may repeat.
        """
        ...

    def drop(self, table: str) -> None:
        """Delete every entry of ``table`` (tenant erasure)."""
        ...

    def sweep(self, limit: int = 1000) -> int:
        """Reclaim up to ``limit`` expired entries; return how many were removed."""
        ...

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` if the backend cannot be reached."""
        ...

    def close(self) -> None:
        """Release connections and files. The instance is unusable afterwards."""
        ...


@runtime_checkable
class TableListing(Protocol):
    """Optional capability: enumerate tables (backups, operator tools)."""

    def tables(self, prefix: str = "") -> list[str]:
        """Return the names of the tables starting with ``prefix`` that hold a live entry.

        Names come in ascending byte order. A table whose every entry was
        deleted, dropped or has expired is not listed.
        """
        ...


@runtime_checkable
class EntryImport(Protocol):
    """Optional capability: write entries exactly as a backup holds them (restore)."""

    def import_entries(self, table: str, entries: Sequence[Entry]) -> int:
        """Store each entry with its own ``value``, ``version`` and ``expires_at``; return how many.

        An existing key is overwritten; other keys of ``table`` are left alone.
        Entries whose ``expires_at`` has passed are skipped (not counted). This
        bypasses compare-and-set: only restores use it, on a stopped installation.
        Raise ``ValidationError`` for a bad table, key, value or version.
        """
        ...


@runtime_checkable
class ScanFollow(Protocol):
    """Optional capability: a page of index entries and the records they point at, in one call."""

    def scan_follow(
        self, table: str, prefix: str = "", after: str | None = None, limit: int = 100, *, field: str = "pk"
    ) -> list[tuple[Entry, Entry | None]]:
        """Return ``scan(table, prefix, after, limit)`` with each entry's target: ``(entry, target)``.

        The target is the live entry of ``table`` at the key held by the
        string ``field`` of the entry's value (an index entry's ``pk``); it is
        ``None`` when that key is absent or expired, or the value has no such
        string. Both are read at one instant (one statement or script, one
        round trip). ``limit`` is 1..``MAX_GET_MANY`` (1,000).
        """
        ...


@runtime_checkable
class ScanMerge(Protocol):
    """Optional capability: several index ranges merged by what follows each prefix, with their records, in one call."""

    def scan_merge(
        self,
        table: str,
        prefixes: Sequence[str],
        after: str | None = None,
        limit: int = 100,
        *,
        field: str = "pk",
    ) -> list[tuple[Entry, Entry | None]]:
        """Return the first ``limit`` live entries under any of ``prefixes``, each with its target.

        ``prefixes``: 1..``MAX_MERGE_PREFIXES`` (64) distinct non-empty
        strings, none starting another. An entry's *suffix* is its key without
        its prefix; entries come ordered by ``(suffix, key)``, and ``after`` (a
        suffix, exclusive) keeps only larger suffixes: the k-way merge of index
        ranges that order their entries alike (one status or channel each).
        Targets as in ``ScanFollow.scan_follow``; all read at one instant, one
        round trip. ``limit`` is 1..``MAX_GET_MANY``. Raise ``ValidationError``
        naming the argument for bad input.
        """
        ...


@runtime_checkable
class CommitGroups(Protocol):
    """Optional capability: several independent commits of one table in one call (group commit)."""

    def commit_groups(self, table: str, groups: Sequence[Sequence[Op]]) -> list[Exception | None]:
        """Apply each of ``groups`` atomically, as ``commit`` would, all in one transaction.

        Groups are independent: a key may appear in several groups only if every
        op on it, in every group, is an ``Add`` (the counter gets the sum of the
        groups that apply; its version grows by one for the call) or every one a
        ``Check``. A group whose expectation fails writes nothing and the others
        still apply. Return, per group, ``None`` (applied) or the error its own
        ``commit`` would raise (``ConflictError``, or ``ValidationError`` for a
        refused ``Add``); a group that fails reports its first failed op, an
        ``Add`` measured on the value before the call. Raise ``ValidationError``
        for bad input (nothing written) and ``StoreUnavailable`` if the backend
        cannot be reached (the call's outcome is then unknown, as a commit's).
        """
        ...


def commit_groups(kv: DurableKv, table: str, groups: Sequence[Sequence[Op]]) -> list[Exception | None]:
    """Commit ``groups`` of ``table`` (see ``CommitGroups``): in one call where ``kv`` can, else one by one.

    Return, per group, ``None`` or the error its commit raised. One by one, that
    includes a ``StoreUnavailable`` (the other groups are still tried); in one
    call, a ``StoreUnavailable`` is raised for all. An empty group is ``None``
    and commits nothing. Raise ``ValidationError`` for bad input, before any write.
    """
    from .validation import validate_groups

    if isinstance(kv, CommitGroups):
        return kv.commit_groups(table, groups)
    validate_groups(table, groups)
    out: list[Exception | None] = []
    for ops in groups:
        if not ops:
            out.append(None)
            continue
        try:
            kv.commit(table, ops)
        except Exception as exc:  # noqa: BLE001 - each group's own outcome, as its commit raised it
            out.append(exc)
        else:
            out.append(None)
    return out
