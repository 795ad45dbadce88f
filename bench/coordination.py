"""Benchmark: coordinator turn acquire+release per second vs redis-py's ``Lock``, same run.

Four processes (``--procs``) loop for ``--seconds`` each on:

- ``hot``: one key every process contends for;
- ``1000``: a key picked at random among 1,000 per operation.

For each, the baseline is redis-py's ``Lock`` (``SET NX PX`` + Lua release) on
the same Redis with the same key choice, measured in the same run, alternating
rounds (``--rounds``) and keeping each side's best. A turn is
more than a lock: a FIFO ticket, a fence from the prefix counter, a lease
renewed in the background. Prints ops/s and the ratio turn/Lock.

A last workload runs one process on 1,000 keys: the cost of a turn without
contention. The ``KvCoordinator`` rows (``kv:`` over an SQLite file and, when
``--postgres-url`` / ``BOTMESH_TEST_POSTGRES_URL`` is given, PostgreSQL) run
the same loops in the same run and print their turns/s, the cost of one turn
(acquire + release, ms, as one process sees it: procs × seconds / turns) and
the ratio against the Redis coordinator's turns/s.

    .venv/bin/python bench/coordination.py [--redis-url redis://127.0.0.1:6379/0] [--postgres-url postgresql://…]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _turn_worker(url: str, prefix: str, kv_url: str, keys: int, seconds: float, start_at: float, out) -> None:  # type: ignore[no-untyped-def]
    from botmesh_admin.coordination.redis import RedisCoordinator
    from botmesh_admin.kv import connect

    coordinator = RedisCoordinator(url, prefix, 15000, f"bench-{os.getpid()}", fence_kv=connect(kv_url))
    rng = random.Random(os.getpid())
    names = [f"chat:{i}" for i in range(keys)]
    time.sleep(max(0.0, start_at - time.time()))
    done, stop = 0, time.monotonic() + seconds
    while time.monotonic() < stop:
        turn = coordinator.acquire_turn(names[rng.randrange(keys)], 30000)
        assert turn is not None
        turn.release()
        done += 1
    coordinator.close()
    out.put(done)


def _kv_turn_worker(url: str, prefix: str, kv_url: str, keys: int, seconds: float, start_at: float, out) -> None:  # type: ignore[no-untyped-def]
    from botmesh_admin.coordination.kv import KvCoordinator
    from botmesh_admin.kv import connect

    coordinator = KvCoordinator(connect(url), prefix, 15000, f"bench-{os.getpid()}", owns_kv=True)
    rng = random.Random(os.getpid())
    names = [f"chat:{i}" for i in range(keys)]
    time.sleep(max(0.0, start_at - time.time()))
    done, stop = 0, time.monotonic() + seconds
    while time.monotonic() < stop:
        turn = coordinator.acquire_turn(names[rng.randrange(keys)], 30000)
        assert turn is not None
        turn.release()
        done += 1
    coordinator.close()
    out.put(done)


def _lock_worker(url: str, prefix: str, kv_url: str, keys: int, seconds: float, start_at: float, out) -> None:  # type: ignore[no-untyped-def]
    import redis

    client = redis.Redis.from_url(url)
    rng = random.Random(os.getpid())
    names = [f"{prefix}:lock:{i}" for i in range(keys)]
    time.sleep(max(0.0, start_at - time.time()))
    done, stop = 0, time.monotonic() + seconds
    while time.monotonic() < stop:
        lock = client.lock(names[rng.randrange(keys)], timeout=15, sleep=0.001, blocking_timeout=30)
        assert lock.acquire()
        lock.release()
        done += 1
    client.close()
    out.put(done)


def measure(worker, url: str, keys: int, procs: int, seconds: float, kv_url: str) -> float:  # type: ignore[no-untyped-def]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    start_at = time.time() + 2.0  # every process imports and connects before the clock starts
    ps = [ctx.Process(target=worker, args=(url, prefix, kv_url, keys, seconds, start_at, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    total = sum(out.get(timeout=seconds + 60) for _ in ps)
    for p in ps:
        p.join()
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=os.environ.get("BOTMESH_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--postgres-url", default=os.environ.get("BOTMESH_TEST_POSTGRES_URL"))
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    kv_url = f"sqlite:///{tempfile.mkdtemp(prefix='bench-coord-')}/kv.sqlite3"
    kv_rows = [("Kv SQLite", f"sqlite:///{tempfile.mkdtemp(prefix='bench-coord-kv-')}/kv.sqlite3")]
    if args.postgres_url:
        kv_rows.append(("Kv PostgreSQL", args.postgres_url))
    print(f"{args.procs} processes, {args.seconds:.0f} s each, Redis {args.redis_url}")
    print(f"{'workload':<12}{'coordinator':<15}{'turns/s':>10}{'ms/turn':>9}{'vs Redis':>10}{'Lock ops/s':>12}")
    # The last workload is one process alone: the bare cost of a turn, without contention.
    for label, keys, procs in (("1 hot key", 1, args.procs), ("1,000 keys", 1000, args.procs), ("1 process", 1000, 1)):
        # Alternate the sides and keep each one's best round: a busy machine slows all alike.
        lock = turn = 0.0
        kv_best = {name: 0.0 for name, _ in kv_rows}
        for _ in range(args.rounds):
            lock = max(lock, measure(_lock_worker, args.redis_url, keys, procs, args.seconds, kv_url))
            turn = max(turn, measure(_turn_worker, args.redis_url, keys, procs, args.seconds, kv_url))
            for name, url in kv_rows:
                kv_best[name] = max(kv_best[name], measure(_kv_turn_worker, url, keys, procs, args.seconds, url))

        def row(
            name: str, rate: float, extra: str = "", label: str = label, redis: float = turn, n: int = procs
        ) -> None:
            cost_ms = n * 1000 / rate if rate else float("inf")
            print(f"{label:<12}{name:<15}{rate:>10,.0f}{cost_ms:>9.2f}{rate / redis:>9.2f}x{extra}", flush=True)

        row("Redis", turn, f"{lock:>12,.0f}  (turn/Lock {turn / lock:.2f}x)")
        for name, _ in kv_rows:
            row(name, kv_best[name])


if __name__ == "__main__":
    main()
