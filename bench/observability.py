"""Observability overhead: counter increments and Prometheus rendering, each against a baseline.

Run ``.venv/bin/python bench/observability.py [--ops 2000]`` after
``eval "$(scripts/services.sh)"`` (a server that is missing is skipped).

1. ``metrics.count()`` through the shared counter store, per backend, against
   the cheapest write of the same backend measured in the same run:
   - Redis: ``RedisCounterStore`` (HINCRBY in MULTI/EXEC) vs raw redis-py ``HINCRBY``;
   - Kv (SQLite file, PostgreSQL): ``KvCounterStore`` (get + CAS commit) vs one
     blind ``Put`` commit of the same Kv.
2. ``to_prometheus_many`` for 1 + 50 series sets (a process and 50 replicas)
   vs ``prometheus_client.generate_latest`` of a registry whose collector yields
   the same families and samples.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
os.environ.setdefault("BOTMESH_KV_URL", "memory://")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import django  # noqa: E402

django.setup()

from botmesh_admin.kv import Put, connect  # noqa: E402
from botmesh_admin.observability import metrics  # noqa: E402
from botmesh_admin.observability.prometheus import FAMILIES, _as_snapshot, to_prometheus_many  # noqa: E402
from botmesh_admin.observability.stores.kv import KvCounterStore  # noqa: E402
from botmesh_admin.observability.stores.redis import RedisCounterStore  # noqa: E402


def rate(n: int, fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def report(name: str, ours: float, base: float, base_name: str) -> None:
    print(f"{name:<34} {ours:>10,.0f} ops/s   {base_name:<28} {base:>10,.0f} ops/s   ratio {ours / base:.2f}x")


def bench_counters(ops: int) -> None:
    redis_url = os.environ.get("BOTMESH_TEST_REDIS_URL")
    if redis_url:
        import redis

        key = f"bench:counters:{uuid.uuid4().hex}"
        store = RedisCounterStore(redis_url, key=key)
        raw = redis.Redis.from_url(redis_url)
        with metrics.use_counter_store(store):
            ours = rate(ops, lambda: metrics.count("messages.in"))
        base = rate(ops, lambda: raw.hincrby(key + ":raw", "messages.in", 1))
        report("count() on Redis", ours, base, "raw HINCRBY")
        raw.delete(key, key + ":raw")
    else:
        print("count() on Redis: skipped (BOTMESH_TEST_REDIS_URL not set)")
    urls = {"SQLite file": f"sqlite:///{tempfile.mkdtemp()}/kv.sqlite3"}
    if os.environ.get("BOTMESH_TEST_POSTGRES_URL"):
        urls["PostgreSQL"] = os.environ["BOTMESH_TEST_POSTGRES_URL"]
    for name, url in urls.items():
        kv = connect(url)
        table = f"observability/~bench-{uuid.uuid4().hex[:8]}/counters"
        store = KvCounterStore(kv, table=table)
        n = max(200, ops // 4)
        with metrics.use_counter_store(store):
            ours = rate(n, lambda: metrics.count("messages.in"))
        base = rate(n, lambda kv=kv, raw=table + "-raw": kv.commit(raw, [Put("messages.in", 1)]))  # type: ignore[misc]
        report(f"count() on Kv ({name})", ours, base, "blind Put commit")
        kv.drop(table)
        kv.drop(table + "-raw")
        kv.close()


def bench_prometheus(rounds: int) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from tests.observability.test_domain import BOTMESH_JSON

    sets = [(BOTMESH_JSON, None)] + [
        (BOTMESH_JSON, {"tenant": "tienda", "bot": "tienda-bot", "replica": f"pod-{i}"}) for i in range(50)
    ]
    parsed = [(_as_snapshot(s), labels or {}) for s, labels in sets]

    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            for name, kind, help_text, samples_of, _ in FAMILIES:
                base = "botmesh_" + (name[: -len("_total")] if kind == "counter" else name)
                own_names = sorted({k for snap, _ in parsed for own, _ in samples_of(snap) for k in own})
                names = ["tenant", "bot", "replica", *own_names]
                family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                    base, help_text, labels=names
                )
                for snap, const in parsed:
                    for own, value in samples_of(snap):
                        merged = {**{k: "" for k in names}, **const, **own}
                        family.add_metric([merged[k] for k in names], value)
                yield family

    registry = CollectorRegistry()
    registry.register(Collector())  # type: ignore[arg-type]
    ours = rate(rounds, lambda: to_prometheus_many(sets))
    base = rate(rounds, lambda: generate_latest(registry))
    report("to_prometheus_many (51 sets)", ours, base, "prometheus_client render")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    bench_counters(args.ops)
    bench_prometheus(args.rounds)


if __name__ == "__main__":
    main()
