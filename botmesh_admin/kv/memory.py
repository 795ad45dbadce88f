"""MemoryKv: the reference DurableKv, held in one process's memory."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

from .base import ABSENT, Add, Check, ConflictError, Delete, Entry, Op, Put
from .validation import (
    added,
    expectation_holds,
    follow_key,
    is_live,
    now_ms,
    validate_commit,
    validate_get_many,
    validate_import,
    validate_key,
    validate_scan,
    validate_scan_follow,
    validate_table,
    validate_table_prefix,
)


class MemoryKv:
    """DurableKv in a dict of sorted tables; the model every other backend is tested against.

    ``clock`` returns epoch milliseconds (injectable for TTL tests). Values are
    stored as given after validation; callers get the same JSON back (a deep
    copy through ``json`` round-trip is not made, so do not mutate returned values).
    """

    def __init__(self, url: str = "memory://", clock: Callable[[], int] = now_ms) -> None:
        self.url = url
        self._clock = clock
        self._lock = threading.RLock()
        self._tables: dict[str, dict[str, Entry]] = {}
        self._keys: dict[str, list[str]] = {}  # sorted keys per table

    def _live(self, table: str, key: str, now: int) -> Entry | None:
        entry = self._tables.get(table, {}).get(key)
        return entry if is_live(entry, now) else None

    def get(self, table: str, key: str) -> Entry | None:
        """Return the live entry at ``key``, or ``None``."""
        validate_table(table)
        validate_key(key)
        with self._lock:
            return self._live(table, key, self._clock())

    def get_many(self, table: str, keys: Sequence[str]) -> list[Entry | None]:
        """Return the live entry (or ``None``) of each key, in order."""
        keys = validate_get_many(table, keys)
        with self._lock:
            now = self._clock()
            return [self._live(table, key, now) for key in keys]

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Entry]:
        """Return up to ``limit`` live entries by ascending key (see the contract)."""
        validate_scan(table, prefix, after, limit)
        with self._lock:
            return self._scan(table, prefix, after, limit, self._clock())

    def scan_follow(
        self, table: str, prefix: str = "", after: str | None = None, limit: int = 100, *, field: str = "pk"
    ) -> list[tuple[Entry, Entry | None]]:
        """Return a scan's entries with the live entry each one's ``field`` names (``ScanFollow``)."""
        validate_scan_follow(table, prefix, after, limit, field)
        with self._lock:
            now = self._clock()
            out: list[tuple[Entry, Entry | None]] = []
            for entry in self._scan(table, prefix, after, limit, now):
                target = follow_key(entry.value, field)
                out.append((entry, None if target is None else self._live(table, target, now)))
            return out

    def _scan(self, table: str, prefix: str, after: str | None, limit: int, now: int) -> list[Entry]:
        """Return up to ``limit`` live entries of ``table`` (the caller holds the lock)."""
        keys = self._keys.get(table, [])
        start = prefix if after is None or after < prefix else after
        i = bisect.bisect_left(keys, start)
        if after is not None and i < len(keys) and keys[i] == after:
            i += 1
        out: list[Entry] = []
        rows = self._tables.get(table, {})
        while i < len(keys) and len(out) < limit:
            key = keys[i]
            if not key.startswith(prefix):
                break
            entry = rows[key]
            if is_live(entry, now):
                out.append(entry)
            i += 1
        return out

    def commit(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        """Apply ``ops`` atomically (see the contract)."""
        validate_commit(table, ops)
        with self._lock:
            now = self._clock()
            sums: dict[int, int] = {}
            for i, op in enumerate(ops):
                current = self._live(table, op.key, now)
                if isinstance(op, Add):
                    # added() reads None as an absent key; a stored JSON null is a non-integer value
                    stored = None if current is None else ("null" if current.value is None else current.value)
                    sums[i] = added(stored, op.delta, f"ops[{i}]")
                elif not expectation_holds(current, op.expect):
                    raise ConflictError(table, op.key, op.expect, current.version if current else None)
            rows = self._tables.setdefault(table, {})
            keys = self._keys.setdefault(table, [])
            results: list[Entry | None] = []
            for i, op in enumerate(ops):
                current = self._live(table, op.key, now)
                if isinstance(op, Add):
                    entry = Entry(
                        op.key,
                        sums[i],
                        (current.version + 1) if current else 1,
                        current.expires_at if current else None,
                    )
                    if op.key not in rows:
                        bisect.insort(keys, op.key)
                    rows[op.key] = entry
                    results.append(entry)
                elif isinstance(op, Put):
                    entry = Entry(
                        op.key,
                        op.value,
                        (current.version + 1) if current else 1,
                        now + op.ttl_ms if op.ttl_ms is not None else None,
                    )
                    if op.key not in rows:
                        bisect.insort(keys, op.key)
                    rows[op.key] = entry
                    results.append(entry)
                elif isinstance(op, Delete):
                    if op.key in rows:
                        del rows[op.key]
                        keys.pop(bisect.bisect_left(keys, op.key))
                    results.append(None)
                else:
                    assert isinstance(op, Check)
                    results.append(current)
            return results

    def drop(self, table: str) -> None:
        """Delete every entry of ``table``."""
        validate_table(table)
        with self._lock:
            self._tables.pop(table, None)
            self._keys.pop(table, None)

    def sweep(self, limit: int = 1000) -> int:
        """Remove up to ``limit`` expired entries; return how many."""
        removed = 0
        with self._lock:
            now = self._clock()
            for table, rows in self._tables.items():
                dead = [k for k, e in rows.items() if not is_live(e, now)][: limit - removed]
                for key in dead:
                    del rows[key]
                    keys = self._keys[table]
                    keys.pop(bisect.bisect_left(keys, key))
                removed += len(dead)
                if removed >= limit:
                    break
        return removed

    def tables(self, prefix: str = "") -> list[str]:
        """Return the tables starting with ``prefix`` that hold a live entry, by name."""
        validate_table_prefix(prefix)
        with self._lock:
            now = self._clock()
            return sorted(
                table
                for table, rows in self._tables.items()
                if table.startswith(prefix) and any(is_live(e, now) for e in rows.values())
            )

    def import_entries(self, table: str, entries: Sequence[Entry]) -> int:
        """Store ``entries`` as given (restore); return how many were live and stored."""
        entries = validate_import(table, entries)
        with self._lock:
            now = self._clock()
            rows = self._tables.setdefault(table, {})
            keys = self._keys.setdefault(table, [])
            stored = 0
            for entry in entries:
                if not is_live(entry, now):
                    continue
                if entry.key not in rows:
                    bisect.insort(keys, entry.key)
                rows[entry.key] = entry
                stored += 1
            return stored

    def ping(self) -> None:
        """Always reachable."""

    def close(self) -> None:
        """Nothing to release."""


__all__ = ["MemoryKv", "ABSENT"]
