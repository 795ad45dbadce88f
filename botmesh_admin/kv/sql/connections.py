"""What both SQL dialects share: a connection per thread and process, and the SQL text built from one template.

``ThreadConnections`` hands each thread its own driver connection (SQLite's and
psycopg's are not to be shared between threads) and abandons, never closes, one
inherited through ``fork``. A thread holds its connection's lock while it uses
it (``using``), so ``close`` from another thread never closes a connection in
the middle of a statement: closing one under a running ``sqlite3_step`` crashes
the interpreter (a use-after-free in the driver), it does not raise.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from botmesh_admin.errors import StoreUnavailable

from ..base import Entry
from ..encoding import load_value

Conn = TypeVar("Conn")


class _Slot:
    """One thread's connection; closing it is left to a finalizer (thread exit or ``close``).

    ``lock`` is the owning thread's use lock (held inside ``using``); ``doomed``
    marks a connection ``close`` could not take because it stayed in use, which
    its owner closes on its next ``get``.
    """

    __slots__ = ("conn", "pid", "finalizer", "lock", "doomed", "__weakref__")

    conn: Any
    pid: int
    finalizer: weakref.finalize
    lock: threading.RLock
    doomed: bool


def _close_quietly(close: Callable[[Any], None], conn: Any) -> None:
    with contextlib.suppress(Exception):
        close(conn)


class ThreadConnections(Generic[Conn]):
    """Hand each thread (and each process) its own connection; close them all on ``close``.

    A connection made before a ``fork`` is abandoned in the child, never closed
    there, so the parent's session survives. Callers use a connection only
    inside ``using()`` (the dialects' error contexts enter it), which ``close``
    waits for, at most ``close_wait_s`` seconds per connection.
    """

    close_wait_s = 10.0

    def __init__(self, open_conn: Callable[[], Conn], close_conn: Callable[[Conn], None]) -> None:
        self._open = open_conn
        self._close_conn = close_conn
        self._local = threading.local()
        self._slots: weakref.WeakSet[_Slot] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.closed = False

    def _use_lock(self) -> threading.RLock:
        lock: threading.RLock | None = getattr(self._local, "lock", None)
        if lock is None or getattr(self._local, "lock_pid", None) != os.getpid():
            lock = self._local.lock = threading.RLock()  # a fork copies locks in their state: start afresh
            self._local.lock_pid = os.getpid()
        return lock

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """Hold this thread's connection against a ``close`` from another thread for the block."""
        with self._use_lock():
            yield

    def get(self) -> Conn:
        """Return this thread's connection, opening it first if needed.

        Raises ``StoreUnavailable`` once ``close`` has been called.
        """
        slot: _Slot | None = getattr(self._local, "slot", None)
        if self.closed:
            if slot is not None and slot.doomed and slot.pid == os.getpid():
                self._local.slot = None
                slot.finalizer()  # close took every connection but this one, in use back then
            raise StoreUnavailable("the Kv is closed")
        if slot is not None:
            if slot.pid == os.getpid():
                return slot.conn
            slot.finalizer.detach()  # inherited through fork: belongs to the parent
        conn = self._open()
        slot = _Slot()
        slot.conn, slot.pid, slot.lock, slot.doomed = conn, os.getpid(), self._use_lock(), False
        slot.finalizer = weakref.finalize(slot, _close_quietly, self._close_conn, conn)
        with self._lock:
            self._slots.add(slot)
        self._local.slot = slot
        return conn

    def discard(self) -> None:
        """Close this thread's connection (after a connection-level error)."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is not None:
            self._local.slot = None
            if slot.pid == os.getpid():
                slot.finalizer()

    def close(self) -> None:
        """Close every thread's connection; later calls raise ``StoreUnavailable``.

        Waits for a connection another thread is using (``using``) to be free,
        at most ``close_wait_s`` seconds; one still in use then is left to its
        owner, which closes it on its next ``get`` (or the finalizer at thread
        exit).
        """
        self.closed = True
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            if slot.pid != os.getpid():
                continue
            if slot.lock.acquire(timeout=self.close_wait_s):
                try:
                    slot.finalizer()
                finally:
                    slot.lock.release()
            else:
                slot.doomed = True


_NOT_AN_INTEGER = "not an integer"  # stands for a stored value added() must refuse


def _scan_sql(placeholder: str, now: str, inclusive: bool, bounded: bool) -> str:
    p = placeholder
    return (
        f"SELECT key, value, version, expires_at FROM botmesh_kv WHERE tbl = {p}"
        f" AND key {'>=' if inclusive else '>'} {p}"
        f"{f' AND key < {p}' if bounded else ''}"
        f" AND (expires_at IS NULL OR expires_at > {now}) ORDER BY key LIMIT {p}"
    )


def _scan_follow_sql(placeholder: str, now: str, inclusive: bool, bounded: bool, target_key: str) -> str:
    """Return a scan (``_scan_sql``) joined to the entries its values name; ``target_key`` is that key's SQL.

    Rows: the scanned entry's four columns, then the target's (all NULL when none).
    Parameters, in order: the scan's, the table, those of ``target_key`` (which
    reads ``i.value``), then the time where ``now`` is a placeholder (SQLite).
    """
    p = placeholder
    return (
        f"WITH i AS ({_scan_sql(p, now, inclusive, bounded)})"
        " SELECT i.key, i.value, i.version, i.expires_at, r.key, r.value, r.version, r.expires_at FROM i"
        f" LEFT JOIN botmesh_kv r ON r.tbl = {p} AND r.key = {target_key}"
        f" AND (r.expires_at IS NULL OR r.expires_at > {now}) ORDER BY i.key"
    )


def _scan_merge_sql(placeholder: str, now: str, inclusive: bool, ranges: int, target_key: str) -> str:
    """Return ``ranges`` bounded scans merged by suffix, joined to their targets (``ScanMerge``).

    Each range is a scan (``_scan_sql``, bounded) that also returns its
    prefix's length; their union is ordered by ``(suffix, key)`` and cut at the
    limit, then joined as in ``_scan_follow_sql``. Parameters, in order: per
    range the prefix length, the table, start, end, the time where ``now`` is a
    placeholder (SQLite) and the range's limit; then the merged limit, the
    table, those of ``target_key``, and the time again where it is a placeholder.
    """
    p = placeholder
    ops = ">=" if inclusive else ">"
    union = " UNION ALL ".join(
        f"SELECT * FROM (SELECT key, value, version, expires_at, {p} AS plen FROM botmesh_kv WHERE tbl = {p}"
        f" AND key {ops} {p} AND key < {p} AND (expires_at IS NULL OR expires_at > {now})"
        f" ORDER BY key LIMIT {p}) AS b{n}"
        for n in range(ranges)
    )
    return (
        f"WITH u AS ({union}),"
        f" i AS (SELECT key, value, version, expires_at, substr(key, plen + 1) AS suffix FROM u"
        f" ORDER BY suffix, key LIMIT {p})"
        " SELECT i.key, i.value, i.version, i.expires_at, r.key, r.value, r.version, r.expires_at FROM i"
        f" LEFT JOIN botmesh_kv r ON r.tbl = {p} AND r.key = {target_key}"
        f" AND (r.expires_at IS NULL OR r.expires_at > {now}) ORDER BY i.suffix, i.key"
    )


def _followed(rows: Sequence[Sequence[Any]]) -> list[tuple[Entry, Entry | None]]:
    """Return the ``(entry, target)`` pairs of ``_scan_follow_sql`` rows (shared with SQLite)."""
    out: list[tuple[Entry, Entry | None]] = []
    for key, value, version, expires_at, tkey, tvalue, tversion, texpires_at in rows:
        target = None if tkey is None else Entry(tkey, load_value(tvalue), tversion, texpires_at)
        out.append((Entry(key, load_value(value), version, expires_at), target))
    return out


def _tables_sql(placeholder: str, now: str, bounded: bool) -> str:
    p = placeholder
    return (
        f"SELECT tbl FROM botmesh_kv WHERE tbl >= {p}{f' AND tbl < {p}' if bounded else ''}"
        f" AND (expires_at IS NULL OR expires_at > {now}) GROUP BY tbl ORDER BY tbl"
    )


__all__ = ["ThreadConnections"]
