"""Code run in threads, spawned processes and killed subprocesses by the Kv tests.

Kept free of pytest imports so a spawned process starts quickly.
"""

from __future__ import annotations

import sys

from botmesh_admin.kv import ABSENT, Add, ConflictError, DurableKv, Put, connect


def increment(kv: DurableKv, table: str, key: str, times: int) -> int:
    """Add 1 to the counter at ``key`` ``times`` times by read + compare-and-set + retry.

    Return how many conflicts were retried.
    """
    conflicts = 0
    for _ in range(times):
        while True:
            current = kv.get(table, key)
            value = current.value + 1 if current else 1
            expect = current.version if current else ABSENT
            try:
                kv.commit(table, [Put(key, value, expect=expect)])
                break
            except ConflictError:
                conflicts += 1
    return conflicts


def increment_by_url(url: str, table: str, key: str, times: int) -> int:
    """Connect to ``url`` (in a fresh process) and run ``increment``."""
    kv = connect(url)
    try:
        return increment(kv, table, key, times)
    finally:
        kv.close()


def add_ones(kv: DurableKv, table: str, key: str, times: int) -> None:
    """Commit ``Add(key, 1)`` ``times`` times: no read, no retry (a ConflictError propagates)."""
    for _ in range(times):
        kv.commit(table, [Add(key, 1)])


def add_ones_by_url(url: str, table: str, key: str, times: int) -> None:
    """Connect to ``url`` (in a fresh process) and run ``add_ones``."""
    kv = connect(url)
    try:
        add_ones(kv, table, key, times)
    finally:
        kv.close()


def snapshot_value(n: int, size: int) -> dict[str, object]:
    """Return the value the FileKv crash writer stores as its ``n``-th write."""
    return {"n": n, "blob": chr(ord("a") + n % 26) * size}


def write_snapshots_forever(url: str, start: int, size: int) -> None:
    """Write ever larger counters with ``size``-character blobs; print each committed ``n``."""
    kv = connect(url)
    n = start
    while True:
        n += 1
        kv.commit("crash", [Put("doc", snapshot_value(n, size))])
        print(n, flush=True)


if __name__ == "__main__":
    write_snapshots_forever(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
