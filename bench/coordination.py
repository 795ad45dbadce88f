"""Benchmark: coordinator turn acquire+release per second vs redis-py's ``Lock``, same run.

Four processes (``--procs``) loop for ``--seconds`` each on:

- ``hot``: one key every process contends for;
- ``1000``: a key picked at random among 1,000 per operation.

For each, the baseline is redis-py's ``Lock`` (``SET NX PX`` + Lua release) on
the same Redis with the same key choice, measured in the same run, alternating
rounds (``--rounds``) and keeping each side's best. A turn is
more than a lock: a FIFO ticket, a fence from the prefix counter, a lease
renewed in the background. Prints ops/s and the ratio turn/Lock.

    .venv/bin/python bench/coordination.py [--redis-url redis://127.0.0.1:6379/0]
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
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    kv_url = f"sqlite:///{tempfile.mkdtemp(prefix='bench-coord-')}/kv.sqlite3"
    print(f"{args.procs} processes, {args.seconds:.0f} s each, Redis {args.redis_url}")
    print(f"{'workload':<12}{'turn ops/s':>14}{'Lock ops/s':>14}{'turn/Lock':>12}")
    for label, keys in (("1 hot key", 1), ("1,000 keys", 1000)):
        # Alternate the two and keep each one's best round: a busy machine slows both alike.
        lock = turn = 0.0
        for _ in range(args.rounds):
            lock = max(lock, measure(_lock_worker, args.redis_url, keys, args.procs, args.seconds, kv_url))
            turn = max(turn, measure(_turn_worker, args.redis_url, keys, args.procs, args.seconds, kv_url))
        print(f"{label:<12}{turn:>14,.0f}{lock:>14,.0f}{turn / lock:>11.2f}x", flush=True)


if __name__ == "__main__":
    main()
