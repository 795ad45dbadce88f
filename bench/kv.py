"""Single-key compare-and-set writes per second: DurableKv against the raw driver.

Run ``.venv/bin/python bench/kv.py [--seconds 3]`` after
``eval "$(scripts/services.sh)"``; it reads ``BOTMESH_TEST_POSTGRES_URL`` and
``BOTMESH_TEST_REDIS_URL`` (a backend whose URL is missing is skipped).

Each line compares one backend with a baseline measured in the same run, on the
same server, doing the same work by hand: one CAS write of a small JSON value
whose expected version the writer already knows (no read before the write).

- sqlite: ``UPDATE … SET value=?, version=version+1 WHERE key=? AND version=?``
- postgresql: the same ``UPDATE`` through psycopg (autocommit, one round trip)
- redis: a minimal ``EVALSHA`` CAS script, and WATCH/MULTI/EXEC
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from botmesh_admin.kv import Put, connect  # noqa: E402

TARGET_RATIO = 0.5
ROUNDS = 3


def rate(step: Callable[[], None], seconds: float) -> float:
    """Return calls of ``step`` per second over ``seconds`` (after a short warm-up)."""
    warm_until = time.perf_counter() + min(0.3, seconds / 5)
    while time.perf_counter() < warm_until:
        step()
    count = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(20):
            step()
        count += 20
        now = time.perf_counter()
        if now >= end:
            return count / (now - start)


def kv_cas_step(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """Return (step, cleanup): one DurableKv CAS write per step."""
    kv = connect(url)
    table = f"bench/{uuid.uuid4().hex}"
    version = kv.commit(table, [Put("counter", {"n": 0})])[0].version

    def step() -> None:
        nonlocal version
        (entry,) = kv.commit(table, [Put("counter", {"n": version}, expect=version)])
        version = entry.version

    def cleanup() -> None:
        kv.drop(table)
        kv.close()

    return step, cleanup


def sql_update_step(execute: Callable[[str, tuple[object, ...]], int], placeholder: str):
    """Return a step doing the raw ``UPDATE … WHERE key AND version`` CAS."""
    p = placeholder
    sql = f"UPDATE bench_raw_cas SET value = {p}, version = version + 1 WHERE key = {p} AND version = {p}"
    version = 1

    def step() -> None:
        nonlocal version
        if execute(sql, (json.dumps({"n": version}), "counter", version)) != 1:
            raise RuntimeError("raw CAS lost its version")
        version += 1

    return step


def raw_sqlite_step(path: str) -> tuple[Callable[[], None], Callable[[], None]]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE bench_raw_cas (key TEXT PRIMARY KEY, value TEXT, version INTEGER)")
    conn.execute("INSERT INTO bench_raw_cas VALUES ('counter', '{}', 1)")
    step = sql_update_step(lambda sql, params: conn.execute(sql, params).rowcount, "?")
    return step, conn.close


def raw_postgres_step(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    table = f"bench_raw_cas_{uuid.uuid4().hex[:12]}"
    conn.execute(f'CREATE TABLE {table} (key text COLLATE "C" PRIMARY KEY, value text, version bigint)')
    conn.execute(f"INSERT INTO {table} VALUES ('counter', '{{}}', 1)")

    def execute(sql: str, params: tuple[object, ...]) -> int:
        return conn.execute(sql.replace("bench_raw_cas", table), params).rowcount

    def cleanup() -> None:
        conn.execute(f"DROP TABLE {table}")
        conn.close()

    return sql_update_step(execute, "%s"), cleanup


RAW_CAS_LUA = """
if redis.call('HGET', KEYS[1], 'ver') ~= ARGV[1] then return -1 end
return redis.call('HSET', KEYS[1], 'v', ARGV[2], 'ver', ARGV[1] + 1)
"""


def raw_redis_evalsha_step(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    import redis

    client = redis.Redis.from_url(url)
    key = f"bench:{uuid.uuid4().hex}"
    client.hset(key, mapping={"v": "{}", "ver": 1})
    script = client.register_script(RAW_CAS_LUA)
    version = 1

    def step() -> None:
        nonlocal version
        if script(keys=[key], args=[version, json.dumps({"n": version})]) < 0:
            raise RuntimeError("raw CAS lost its version")
        version += 1

    def cleanup() -> None:
        client.delete(key)
        client.close()

    return step, cleanup


def raw_redis_watch_step(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    import redis

    client = redis.Redis.from_url(url)
    key = f"bench:{uuid.uuid4().hex}"
    client.hset(key, mapping={"v": "{}", "ver": 1})
    version = 1

    def step() -> None:
        nonlocal version
        with client.pipeline() as pipe:
            pipe.watch(key)
            if int(pipe.hget(key, "ver")) != version:
                raise RuntimeError("raw CAS lost its version")
            pipe.multi()
            pipe.hset(key, mapping={"v": json.dumps({"n": version}), "ver": version + 1})
            pipe.execute()
        version += 1

    def cleanup() -> None:
        client.delete(key)
        client.close()

    return step, cleanup


def compare(
    name: str,
    kv_factory: Callable[[], tuple[Callable[[], None], Callable[[], None]]],
    baselines: list[tuple[str, Callable[[], tuple[Callable[[], None], Callable[[], None]]]]],
    seconds: float,
) -> list[tuple[str, float, str, float]]:
    """Measure ``kv_factory`` and each baseline in interleaved rounds; keep the best of each.

    The best of several rounds filters out noise from other processes on the host.
    """
    factories = [("DurableKv", kv_factory), *baselines]
    best = {label: 0.0 for label, _ in factories}
    for _ in range(ROUNDS):
        for label, factory in factories:
            step, cleanup = factory()
            try:
                best[label] = max(best[label], rate(step, seconds / ROUNDS))
            finally:
                cleanup()
    return [(name, best["DurableKv"], label, best[label]) for label, _ in baselines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per backend and baseline (default 3)")
    args = parser.parse_args()
    rows: list[tuple[str, float, str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += compare(
            "sqlite",
            lambda: kv_cas_step(f"sqlite:///{tmp}/kv-{uuid.uuid4().hex}.db"),
            [("raw sqlite3 UPDATE", lambda: raw_sqlite_step(f"{tmp}/raw-{uuid.uuid4().hex}.db"))],
            args.seconds,
        )
    pg = os.environ.get("BOTMESH_TEST_POSTGRES_URL")
    if pg:
        rows += compare(
            "postgresql",
            lambda: kv_cas_step(pg),
            [("raw psycopg UPDATE", lambda: raw_postgres_step(pg))],
            args.seconds,
        )
    else:
        print("postgresql: skipped (BOTMESH_TEST_POSTGRES_URL not set)", file=sys.stderr)
    redis_url = os.environ.get("BOTMESH_TEST_REDIS_URL")
    if redis_url:
        rows += compare(
            "redis",
            lambda: kv_cas_step(redis_url),
            [
                ("raw EVALSHA CAS", lambda: raw_redis_evalsha_step(redis_url)),
                ("raw WATCH/MULTI/EXEC", lambda: raw_redis_watch_step(redis_url)),
            ],
            args.seconds,
        )
    else:
        print("redis: skipped (BOTMESH_TEST_REDIS_URL not set)", file=sys.stderr)

    print(f"{'backend':<11} {'DurableKv CAS/s':>15}  {'baseline':<22} {'baseline/s':>10}  ratio")
    failed = False
    for name, kv_rate, label, base_rate in rows:
        ratio = kv_rate / base_rate
        failed |= ratio < TARGET_RATIO
        mark = "" if ratio >= TARGET_RATIO else f"  below target {TARGET_RATIO}"
        print(f"{name:<11} {kv_rate:>15,.0f}  {label:<22} {base_rate:>10,.0f}  {ratio:.2f}{mark}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
