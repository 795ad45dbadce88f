"""Index upkeep's share of the write path (issue 16, item 7), both sides interleaved in one process.

Run ``.venv/bin/python bench/upkeep.py [--slices 8] [--messages 250] [--chats 200]``
after ``eval "$(scripts/services.sh)"`` (reads ``BOTMESH_TEST_POSTGRES_URL``).

``bench/ingest.py --no-index-upkeep`` compares two whole runs (web, workers,
PostgreSQL), but on this machine two identical runs differ by up to 30 % (the
empty-request ceiling moved from 1,100 to 3,250 req/s between rounds), more
than the share being measured. Here one process does the worker's part of
ingest for two tenants of one fresh database: ``idx`` through the stores' own
write path with every index kept, ``raw`` with ``IndexedTable.commit``
committing only the store's operations (``bench/no_index_upkeep`` does the same
to whole processes). Slices alternate — ``idx``, ``raw``, ``raw``, ``idx``, … —
so drifts of the machine fall on both sides alike. A slice appends
``--messages`` WhatsApp webhook records (one text message each, spread over
``--chats`` senders; every sender's first slice creates its conversation and
CRM contact) to the PostgreSQL journal, as the webhook does, then one
``EventWorker`` drains them with the registry's ``dispatch`` (batched
projection, CRM upserts, traces). Measured per slice: wall time and the CPU of
this process plus that of the PostgreSQL backends of this database. Printed:
the median per side, per message, and the upkeep's share
``idx / raw − 1`` (target ≤ 10 %), for CPU and for wall time. The first slice
of each side warms up (tables, plans, first contacts) and is left out.
``--profile FILE`` also writes a cProfile of the indexed side's drains (its
figures then include the profiler's overhead).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
IDX, RAW = "bench-idx", "bench-raw"


def _ingest() -> Any:
    """Load ``bench/ingest.py`` as a module (bench/ is not on sys.path: ``bench/campaigns.py`` would shadow the app)."""
    spec = importlib.util.spec_from_file_location("bench_ingest", ROOT / "bench" / "ingest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _without_upkeep_for(tenant: str) -> None:
    """Make ``IndexedTable.commit`` skip the upkeep for ``tenant``'s tables only."""
    from botmesh_admin.kv import indexes

    keep = indexes.IndexedTable.commit
    mark = f"/{tenant}/"

    def commit(self: Any, table: str, ops: Any, changes: Any) -> Any:
        if mark in table:
            return self.kv.commit(table, list(ops))
        return keep(self, table, ops, changes)

    indexes.IndexedTable.commit = commit  # type: ignore[method-assign]


def _records(tenant: str, start: int, n: int, chats: int) -> list[Any]:
    """Return ``n`` journal envelopes of one WhatsApp text message each, as the webhook appends them."""
    from botmesh_admin.channels.domain import InboundMessage
    from botmesh_admin.events import Envelope

    out = []
    for i in range(start, start + n):
        chat = f"whatsapp:5730022{i % chats:05d}"
        message = InboundMessage(
            channel="whatsapp", chat_key=chat, sender_id=chat, provider_message_id=f"wamid.{tenant}.{i}",
            type="text", text=f"hola {i}", timestamp_ms=1_764_000_000_000 + i, sender_name=f"Cliente {i % chats}",
        )  # fmt: skip
        out.append(
            Envelope(
                type="whatsapp.webhook",
                tenant=tenant,
                payload={"config": "main", "events": [message.to_json()]},
                idempotency_key=f"{tenant}-{i}",
                channel="inbound",
            )
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=8, help="slices per side (the first is a warm-up)")
    parser.add_argument("--messages", type=int, default=250, help="messages per slice")
    parser.add_argument("--chats", type=int, default=200, help="distinct senders per tenant")
    parser.add_argument(
        "--profile", metavar="FILE", help="also write a cProfile of the indexed side's drains to FILE (pstats)"
    )
    args = parser.parse_args()
    if args.slices < 2 or args.messages < 1 or args.chats < 1:
        parser.error("--slices >= 2, --messages >= 1, --chats >= 1")
    ingest = _ingest()
    server = os.environ.get("BOTMESH_TEST_POSTGRES_URL")
    if not server:
        print('BOTMESH_TEST_POSTGRES_URL is not set: eval "$(scripts/services.sh)" first', file=sys.stderr)
        return 2
    url = ingest.fresh_database(server)
    try:
        ingest.setup_django(url)  # migrates; tenant bench-inbox with its WhatsApp channel
        from botmesh_admin.channels.services import channel_config_set
        from botmesh_admin.events import default_journal
        from botmesh_admin.events.handlers import dispatch
        from botmesh_admin.events.worker import EventWorker
        from botmesh_admin.tenancy.services import tenant_create

        for tenant in (IDX, RAW):
            tenant_create(tenant, name=tenant)
            channel_config_set(
                tenant, kind="whatsapp", name="main", phone_number_id=ingest.PHONE_NUMBER_ID,
                app_secret=ingest.APP_SECRET,
            )  # fmt: skip
        _without_upkeep_for(RAW)
        journal = default_journal()
        worker = EventWorker(journal, lease_ms=60_000, channel="inbound")
        cpu: dict[str, list[float]] = {IDX: [], RAW: []}
        own: dict[str, list[float]] = {IDX: [], RAW: []}
        wall: dict[str, list[float]] = {IDX: [], RAW: []}
        done = {IDX: 0, RAW: 0}
        profiler = cProfile.Profile() if args.profile else None
        order = [IDX, RAW, RAW, IDX] * ((args.slices + 1) // 2)
        order = [t for t in order][: 2 * args.slices]
        for tenant in order:
            for envelope in _records(tenant, done[tenant], args.messages, args.chats):
                journal.append(envelope)
            backends = ingest.database_backends(url)
            before = ingest.cpu_by_pid([os.getpid(), *backends])
            t0 = time.perf_counter()
            drained = 0
            profiling = profiler is not None and tenant == IDX and done[tenant] > 0
            if profiling:
                profiler.enable()
            while drained < args.messages:
                got = worker.run_batch(dispatch, 50)
                if not sum(got.values()):
                    raise SystemExit(f"the journal ran dry after {drained} of {args.messages} records")
                drained += got["processed"]
                if got.get("failed") or got.get("dead"):
                    raise SystemExit(f"records failed: {got}")
            elapsed = time.perf_counter() - t0
            if profiling:
                profiler.disable()
            after = ingest.cpu_by_pid([os.getpid(), *ingest.database_backends(url)])
            done[tenant] += args.messages
            cpu[tenant].append(ingest.cpu_used(before, after) * 1000 / args.messages)
            me = os.getpid()
            own[tenant].append(ingest.cpu_used({me: before[me]}, {me: after[me]}) * 1000 / args.messages)
            wall[tenant].append(elapsed * 1000 / args.messages)
            per = f"{cpu[tenant][-1]:5.2f} ms CPU/msg, {wall[tenant][-1]:5.2f} ms wall/msg"
            print(f"  slice {tenant}: {per}", flush=True)
        _check(IDX, done[IDX], args.chats)
        if profiler is not None:
            profiler.dump_stats(args.profile)  # the CPU figures of the profiled slices include its overhead
        print(
            f"index upkeep on the worker's write path, PostgreSQL: {args.slices} slices of {args.messages} messages "
            f"per side over {args.chats} senders (first slice of each side left out), medians per message"
        )
        pg = {t: [a - b for a, b in zip(cpu[t], own[t], strict=True)] for t in cpu}
        for what, by in (
            ("CPU (this process + PostgreSQL)", cpu),
            ("  of which this process", own),
            ("  of which PostgreSQL", pg),
            ("wall", wall),
        ):
            with_idx, raw = statistics.median(by[IDX][1:]), statistics.median(by[RAW][1:])
            share = with_idx / raw - 1
            verdict = "meets" if share <= 0.10 else "ABOVE"
            print(
                f"  {what:32} with indexes {with_idx:5.2f} ms   without {raw:5.2f} ms   "
                f"upkeep {share * 100:+5.1f} % ({verdict} the 10 % target)"
            )
    finally:
        from django.db import connections

        connections.close_all()
        for conn in ingest._sampler.values():
            conn.close()
        from botmesh_admin.kv.runtime import default_kv

        default_kv().close()
        ingest.drop_database(server)
    return 0


def _check(tenant: str, messages: int, chats: int) -> None:
    """Fail unless every message of the indexed tenant is in its inbox and the indexes agree with the records."""
    from botmesh_admin.kv.indexes import declared
    from botmesh_admin.kv.runtime import default_kv
    from botmesh_admin.kv.tenant import TenantKv
    from inbox import selectors

    rows, _ = selectors.conversation_list(tenant, agent="bench", limit=min(chats, 200))
    assert len(rows) == min(chats, 200), len(rows)
    assert sum(r.conversation.inbound_count for r in rows) == messages * min(chats, 200) // chats
    kv = default_kv()
    for collection in declared():
        if collection.package not in ("inbox", "crm"):
            continue
        layout = collection.layout(kv)
        table = TenantKv(kv, collection.package).table(tenant, collection.collection)
        drift = {n: r for n in layout.index_names() if any((r := layout.check(table, n)).values())}
        assert not drift, (collection.collection, drift)


if __name__ == "__main__":
    raise SystemExit(main())
