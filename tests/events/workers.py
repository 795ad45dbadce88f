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

from botmesh_admin.events import EventRecord, connect_journal
from botmesh_admin.events.worker import EventWorker


def close_while_in_use(url: str, rounds: int) -> None:
    """Close the journal at ``url`` while three threads append to it and claim from it, ``rounds`` times.

    Each thread must stop with ``StoreUnavailable`` (never a crash, a hang or
    another error); raises ``AssertionError`` otherwise.
    """
    for r in range(rounds):
        _close_while_in_use_once(url, r)


def _close_while_in_use_once(url: str, r: int) -> None:
    import threading
    import uuid

    from botmesh_admin.errors import StoreUnavailable
    from botmesh_admin.events import Envelope

    journal = connect_journal(url)
    started = threading.Barrier(4)
    refused: list[int] = []
    failed: list[BaseException] = []

    def use(n: int) -> None:
        started.wait()
        try:
            while True:
                journal.append(Envelope("inbox.message", "acme", {"n": n}, idempotency_key=uuid.uuid4().hex))
                now = int(time.time() * 1000)
                for record in journal.claim_many(now, 60_000, limit=5):
                    journal.ack(record.id, now, record.fencing_token)
        except StoreUnavailable:
            refused.append(n)
        except BaseException as exc:  # reported below: the contract allows StoreUnavailable only
            failed.append(exc)

    users = [threading.Thread(target=use, args=(n,), daemon=True) for n in range(3)]
    for user in users:
        user.start()
    started.wait()
    time.sleep(0.001 * (r % 7))
    journal.close()
    for user in users:
        user.join(30)
    assert not failed, repr(failed)
    assert sorted(refused) == [0, 1, 2], f"{refused} stopped with StoreUnavailable"


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
