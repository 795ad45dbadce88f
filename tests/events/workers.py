"""A journal worker process for the multi-process tests (``python -m tests.events.workers``).

Usage: ``workers.py URL LOG [--lease-ms N] [--hang-at N]``. Each handled record
appends ``<id> <fencing token>`` to LOG before the worker acks it (so a record
handled but not acked when the process is killed is still in the log). With
``--hang-at N`` the N-th handler call writes ``HANG <id> <token>`` and sleeps
forever (the test kills the process with SIGKILL). SIGTERM stops the worker
gracefully: the record in hand is finished first. Kept free of pytest imports.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from botmesh_admin.events import EventJournal, EventRecord, connect_journal
from botmesh_admin.events.worker import EventWorker


def close_while_in_use(url: str, rounds: int) -> None:
    """Close the journal at ``url`` under three appending, claiming threads (``close_under_use``), ``rounds`` times."""
    import uuid

    from botmesh_admin.events import Envelope
    from tests.kv.workers import close_under_use

    for r in range(rounds):
        journal = connect_journal(url)

        def work(n: int, i: int, journal: EventJournal = journal) -> None:
            journal.append(Envelope("inbox.message", "acme", {"n": n}, idempotency_key=uuid.uuid4().hex))
            now = int(time.time() * 1000)
            for record in journal.claim_many(now, 60_000, limit=5):
                journal.ack(record.id, now, record.fencing_token)

        close_under_use(journal, work, 0.001 * (r % 7))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("log")
    parser.add_argument("--lease-ms", type=int, default=5000)
    parser.add_argument("--hang-at", type=int, default=0)
    args = parser.parse_args(argv)
    journal = connect_journal(args.url)
    worker = EventWorker(journal, lease_ms=args.lease_ms)
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop())
    log = open(args.log, "a", buffering=1)  # noqa: SIM115 - line-buffered for the process's life
    calls = 0

    def handler(record: EventRecord) -> None:
        nonlocal calls
        calls += 1
        if calls == args.hang_at:
            log.write(f"HANG {record.id} {record.fencing_token}\n")
            while True:
                time.sleep(60)
        log.write(f"{record.id} {record.fencing_token}\n")

    print(f"ready {os.getpid()}", flush=True)
    totals = worker.run_forever(handler, batch=50, idle_ms=20)
    print(f"stopped {totals}", flush=True)
    journal.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
