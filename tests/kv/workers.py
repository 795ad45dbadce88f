"""Code run in threads, spawned processes and killed subprocesses by the Kv tests.

Kept free of pytest imports so a spawned process starts quickly.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

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


def close_under_use(store: Any, work: Callable[[int, int], None], delay_s: float) -> None:
    """Close ``store`` from this thread ``delay_s`` seconds after three threads start ``work(n, i)`` in a loop.

    Each thread must stop with ``StoreUnavailable`` (never a crash, a hang or
    another error); raises ``AssertionError`` otherwise. Shared by the Kv and
    journal tests (``tests.events.workers``).
    """
    import threading
    import time

    from botmesh_admin.errors import StoreUnavailable

    started = threading.Barrier(4)
    refused: list[int] = []
    failed: list[BaseException] = []

    def use(n: int) -> None:
        started.wait()
        try:
            for i in itertools.count():
                work(n, i)
        except StoreUnavailable:
            refused.append(n)
        except BaseException as exc:  # reported below: the contract allows StoreUnavailable only
            failed.append(exc)

    users = [threading.Thread(target=use, args=(n,), daemon=True) for n in range(3)]
    for user in users:
        user.start()
    started.wait()
    time.sleep(delay_s)
    store.close()
    for user in users:
        user.join(30)
    assert not failed, repr(failed)
    assert sorted(refused) == [0, 1, 2], f"{refused} stopped with StoreUnavailable"


def close_while_in_use(url: str, table: str, rounds: int) -> None:
    """Close the Kv at ``url`` while three threads commit and scan on it (``close_under_use``), ``rounds`` times."""
    for r in range(rounds):
        kv = connect(url)
        kv.commit(table, [Put("seed", 0)])

        def work(n: int, i: int, kv: DurableKv = kv) -> None:
            kv.commit(table, [Put(f"k{n}/{i % 20}", {"i": i})])
            kv.scan(table, prefix=f"k{n}/", limit=20)

        close_under_use(kv, work, 0.001 * (r % 7))


if __name__ == "__main__":
    write_snapshots_forever(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
