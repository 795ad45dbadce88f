"""Backlog projection: the same inbound webhook records projected one by one vs as claimed batches, on PostgreSQL.

Run ``.venv/bin/python bench/projection_batch.py [messages=600] [conversations=5]`` after
``eval "$(scripts/services.sh)"`` with ``DATABASE_URL=sqlite:////tmp/<file>`` (the Django tables; migrated here).

A backlog of ``messages`` WhatsApp webhook records (one text message each) over
``conversations`` chats sits in an in-memory journal; one ``EventWorker``
(``claim_batch`` 20) drains it into the inbox over the PostgreSQL Kv
(``BOTMESH_TEST_POSTGRES_URL``), once with a plain handler (each record projected
alone: the baseline) and once with the registry's ``dispatch`` (the inbox's batch
handler), alternating, two rounds. Printed: msg/s, the worker's CPU ms per message,
the Kv commits (inbox, CRM and the metrics counters when no ``REDIS_URL``), and the
ratio batched / one by one. Batching pays where a batch holds several messages
of one conversation (a backlog, a busy chat); records of distinct chats are one
commit each either way.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class CountingKv:
    """The PostgreSQL Kv, its commits counted."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.url, self.commits = kv, kv.url, 0

    def commit(self, table: str, ops: Any) -> Any:
        self.commits += 1
        return self.kv.commit(table, ops)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


def run(kv: CountingKv, batched: bool, messages: int, conversations: int) -> tuple[float, float, int]:
    """Drain a backlog of ``messages`` records; return (msg/s, worker CPU ms per message, Kv commits)."""
    from botmesh_admin.channels.domain import InboundMessage
    from botmesh_admin.events import Envelope
    from botmesh_admin.events.handlers import dispatch
    from botmesh_admin.events.memory import MemoryEventJournal
    from botmesh_admin.events.worker import EventWorker
    from botmesh_admin.kv.runtime import use_kv
    from inbox.services import event_project

    tenant = "bl" + uuid.uuid4().hex[:10]
    journal = MemoryEventJournal()

    def message(chat: str, pid: str, i: int) -> InboundMessage:
        return InboundMessage(
            channel="whatsapp", chat_key=chat, sender_id=chat, provider_message_id=pid, type="text",
            text=f"m{i}", timestamp_ms=1_764_000_000_000 + i,
        )  # fmt: skip

    for i in range(messages):
        ev = message(f"whatsapp:5730011{i % conversations:05d}", f"wamid.{tenant}.{i}", i)
        journal.append(
            Envelope(
                type="whatsapp.webhook",
                tenant=tenant,
                payload={"config": "main", "events": [ev.to_json()]},
                idempotency_key=f"{tenant}-{i}",
                channel="inbound",
            )  # fmt: skip
        )
    handler = dispatch if batched else (lambda record: dispatch(record))  # a plain function: one by one
    worker = EventWorker(journal, 60_000, channel="inbound", claim_batch=20)
    with use_kv(kv):  # type: ignore[arg-type]
        event_project(tenant, message("whatsapp:573009999999", f"wamid.{tenant}.first", 0))  # the table exists
        c0, t0, p0 = kv.commits, time.perf_counter(), time.process_time()
        done = 0
        while True:
            n = worker.run_batch(handler, 1000)
            done += n["processed"]
            if not sum(n.values()):
                break
        assert done == messages, done
        return messages / (time.perf_counter() - t0), (time.process_time() - p0) * 1000 / messages, kv.commits - c0


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "botmesh_admin.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from botmesh_admin.kv import connect

    call_command("migrate", verbosity=0)
    messages = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    conversations = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    kv = CountingKv(connect(os.environ["BOTMESH_TEST_POSTGRES_URL"]))
    best: dict[bool, float] = {}
    for r in range(2):
        for batched in (False, True):
            rate, cpu, commits = run(kv, batched, messages, conversations)
            best[batched] = max(best.get(batched, 0.0), rate)
            side = "batched   " if batched else "one by one"
            print(
                f"round {r + 1} {side}: {rate:6.0f} msg/s  worker CPU {cpu:5.2f} ms/msg  "
                f"Kv commits {commits} for {messages} messages in {conversations} conversations"
            )
    print(f"ratio batched / one by one: {best[True] / best[False]:.2f}x (best of 2 rounds each)")


if __name__ == "__main__":
    main()
