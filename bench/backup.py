"""Backup and restore throughput: botmesh's copies against the plainest copy of the same data.

Run ``.venv/bin/python bench/backup.py [--entries 100000]`` (after
``eval "$(scripts/services.sh)"`` for the Redis lines; a missing server is skipped).

Each line compares with a baseline measured in the same run on the same data:

- sqlite online backup (``sqlite3.Connection.backup``) vs ``shutil.copyfile`` of the file
  (the copy is not safe while writers run; the backup is — this is its price)
- logical Kv export (``tables()`` + ``scan`` to JSON lines) vs a raw ``SELECT`` of every row
- logical Kv import (``import_entries``) vs ``executemany`` of the same rows into a fresh table
- redis: export vs a raw ``SCAN`` + pipelined ``HGETALL``; import vs a pipelined ``HSET`` + ``ZADD``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from botmesh_admin.backup import logical, physical  # noqa: E402
from botmesh_admin.kv import Put, connect  # noqa: E402

TABLES = 20


def timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def line(what: str, n: int, ours: float, base: float, unit: str = "entries") -> None:
    print(f"{what:<34} {n / ours:>12,.0f} {unit}/s   baseline {n / base:>12,.0f}/s   ratio {base / ours:5.2f}")


def fill(kv, entries: int, prefix: str) -> list[str]:  # type: ignore[no-untyped-def]
    tables = [f"{prefix}/t{i:02d}/c" for i in range(TABLES)]
    per = entries // TABLES
    value = {"name": "Ana García", "tags": ["vip", "promo"], "n": 1, "text": "x" * 120}
    for table in tables:
        for start in range(0, per, 500):
            kv.commit(table, [Put(f"k{j:07d}", value) for j in range(start, min(per, start + 500))])
    return tables


def bench_sqlite(entries: int, tmp: Path) -> None:
    url = f"sqlite:///{tmp}/kv.sqlite3"
    kv = connect(url)
    fill(kv, entries, "bench")
    size_mb = (tmp / "kv.sqlite3").stat().st_size / 1e6
    ours = timed(lambda: physical.sqlite_backup(tmp / "kv.sqlite3", tmp / "copy.sqlite3"))
    base = timed(lambda: shutil.copyfile(tmp / "kv.sqlite3", tmp / "raw.sqlite3"))
    print(f"sqlite online backup of {size_mb:.1f} MB: {ours:.3f} s, file copy {base:.3f} s, ratio {base / ours:.2f}")

    ours = timed(lambda: logical.kv_export(kv, tmp / "kv.jsonl"))

    def raw_select() -> None:
        conn = sqlite3.connect(tmp / "kv.sqlite3")
        with (tmp / "raw.jsonl").open("w") as out:
            for row in conn.execute("SELECT tbl, key, value, version, expires_at FROM botmesh_kv ORDER BY tbl, key"):
                out.write(json.dumps([row[0], row[1], json.loads(row[2]), row[3], row[4]]) + "\n")
        conn.close()

    line("sqlite: logical Kv export", entries, ours, timed(raw_select))

    target = connect(f"sqlite:///{tmp}/restored.sqlite3")
    ours = timed(lambda: logical.kv_import(target, tmp / "kv.jsonl", replace=False))

    def raw_insert() -> None:
        conn = sqlite3.connect(tmp / "raw-insert.sqlite3", isolation_level=None)
        conn.execute("CREATE TABLE botmesh_kv (tbl TEXT, key TEXT, value TEXT, version INTEGER,"
                     " expires_at INTEGER, PRIMARY KEY (tbl, key)) WITHOUT ROWID")  # fmt: skip
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        rows = [json.loads(x) for x in (tmp / "raw.jsonl").read_text().splitlines()]
        for start in range(0, len(rows), 1000):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO botmesh_kv VALUES (?, ?, ?, ?, ?)",
                [(t, k, json.dumps(v), ver, exp) for t, k, v, ver, exp in rows[start : start + 1000]],
            )
            conn.execute("COMMIT")
        conn.close()

    line("sqlite: logical Kv import", entries, ours, timed(raw_insert))
    kv.close()
    target.close()


def bench_redis(entries: int, tmp: Path) -> None:
    url = os.environ.get("BOTMESH_TEST_REDIS_URL")
    if not url:
        print("redis: skipped (set BOTMESH_TEST_REDIS_URL)")
        return
    import redis

    base_url = url.rsplit("/", 1)[0]
    source_url, target_url = f"{base_url}/12", f"{base_url}/13"  # databases this script owns
    client, target_client = redis.Redis.from_url(source_url), redis.Redis.from_url(target_url)
    for c in (client, target_client):
        for key in c.scan_iter(match="bmkv:*", count=1000):
            c.delete(key)
    kv, target = connect(source_url), connect(target_url)
    fill(kv, entries, f"bench-{uuid.uuid4().hex[:6]}")
    ours = timed(lambda: logical.kv_export(kv, tmp / "redis.jsonl"))

    def raw_export() -> None:
        with (tmp / "redis-raw.jsonl").open("w") as out:
            keys = list(client.scan_iter(match="bmkv:*:e:*", count=1000))
            for start in range(0, len(keys), 1000):
                pipe = client.pipeline(transaction=False)
                for key in keys[start : start + 1000]:
                    pipe.hgetall(key)
                for key, h in zip(keys[start : start + 1000], pipe.execute(), strict=True):
                    out.write(json.dumps([key.decode(), h[b"v"].decode(), int(h[b"ver"])]) + "\n")

    line("redis: logical Kv export", entries, ours, timed(raw_export))
    ours = timed(lambda: logical.kv_import(target, tmp / "redis.jsonl", replace=False))

    def raw_import() -> None:
        rows = [json.loads(x) for x in (tmp / "redis-raw.jsonl").read_text().splitlines()]
        for start in range(0, len(rows), 1000):
            pipe = target_client.pipeline(transaction=False)
            for key, value, version in rows[start : start + 1000]:
                raw = "raw" + key
                pipe.hset(raw, mapping={"v": value, "ver": version})
                pipe.zadd(raw.split(":e:")[0] + ":i", {raw.split(":e:")[1]: 0})
            pipe.execute()

    line("redis: logical Kv import", entries, ours, timed(raw_import))
    for c in (client, target_client):
        for key in c.scan_iter(match="*bmkv:*", count=1000):
            c.delete(key)
        c.close()
    kv.close()
    target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{args.entries:,} Kv entries in {TABLES} tables (~200-byte JSON values)")
        bench_sqlite(args.entries, Path(tmp))
        bench_redis(args.entries, Path(tmp))


if __name__ == "__main__":
    main()
