"""``manage.py botmesh_events_worker [--channel X]``: a long-running journal worker.

Claims records of one channel (the default channel without ``--channel``) and
dispatches them to the registered handlers. SIGTERM or SIGINT stops it
gracefully: the record in hand is finished (acked or failed), then it exits 0.
If the record in hand is still running ``BOTMESH_DRAIN_TIMEOUT`` seconds after
the signal, it is cut off: the worker logs it, with how many provider sends
were in flight, and exits 1 (its lease lapses and the journal redelivers it;
a reply found ``sending`` is then marked not confirmed, never resent).

A store outage (the journal, the Kv or the database cannot be reached) does
not stop it: it logs the outage once, retries with backoff (up to
``--max-backoff-ms``) and resumes when the store is back; a record whose
handler met the outage is released without spending an attempt.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import import_string

from botmesh_admin.errors import ValidationError
from botmesh_admin.events.base import validate_channel
from botmesh_admin.events.handlers import dispatch
from botmesh_admin.events.services import worker_for
from botmesh_admin.observability import health

log = logging.getLogger("botmesh.events")


class Command(BaseCommand):
    help = "Drain the event journal (one channel) until SIGTERM/SIGINT; finishes the record in hand."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--channel", default=None, help="channel to drain (default: records without one)")
        parser.add_argument(
            "--lease-ms",
            type=int,
            default=None,
            help="lease per record, ms (default 30000; campaigns-run: BOTMESH_CAMPAIGN_LEASE_MS)",
        )
        parser.add_argument("--batch", type=int, default=20, help="records per batch (default 20)")
        parser.add_argument("--idle-ms", type=int, default=500, help="sleep when idle, ms (default 500)")
        parser.add_argument("--max-events", type=int, default=None, help="exit after this many records")
        parser.add_argument(
            "--max-backoff-ms", type=int, default=5_000,
            help="longest wait between retries while a store is unreachable, ms (default 5000)",
        )  # fmt: skip
        parser.add_argument(
            "--handler", default=None,
            help="dotted path of a handler function instead of the registry's dispatch",
        )  # fmt: skip

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            channel = validate_channel(opts["channel"], "--channel")
        except ValidationError as exc:
            raise CommandError(str(exc)) from None
        if opts["lease_ms"] is not None and opts["lease_ms"] < 1:
            raise CommandError("--lease-ms must be positive")
        if opts["max_backoff_ms"] < 1:
            raise CommandError("--max-backoff-ms must be positive")
        handler = import_string(opts["handler"]) if opts["handler"] else dispatch
        # worker_for: the channel's CLAIM_BATCH (campaigns-run, crm-import and outbox claim one at a time).
        worker = worker_for(channel, lease_ms=opts["lease_ms"], max_backoff_ms=opts["max_backoff_ms"])

        from django.conf import settings

        limit = float(settings.BOTMESH_DRAIN_TIMEOUT_S)
        done = threading.Event()

        def force_exit() -> None:
            # The main thread returns from run_forever and exits first when the record finishes in time.
            if not done.wait(limit):
                from botmesh_admin.observability import shutdown

                running, waiting = worker.in_hand()
                log.error(
                    "events worker: forced exit %.0f s after the stop signal: %d record in hand cut off "
                    "(redelivered after its lease), %d claimed record(s) not started (redelivered after "
                    "their lease, an attempt spent), %d send(s) cut off in flight (a reply cut off is "
                    "then not confirmed, never resent automatically)",
                    limit,
                    running,
                    waiting,
                    shutdown.inflight_count(),
                )
                os._exit(1)

        def stop(signum: int, frame: object) -> None:
            if getattr(stop, "signalled", False):
                return  # a second signal changes nothing; the drain timeout still holds
            stop.signalled = True  # type: ignore[attr-defined]
            self.stderr.write(f"signal {signum}: finishing the record in hand (at most {limit:g} s), then stopping")
            health.mark_stopping()
            worker.stop()
            threading.Thread(target=force_exit, name="botmesh-events-drain", daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"events worker draining channel {channel or '(default)'}")
        self.stdout.flush()
        try:
            totals = worker.run_forever(
                handler, batch=opts["batch"], idle_ms=opts["idle_ms"], max_events=opts["max_events"]
            )
        finally:
            done.set()
        self.stdout.write(
            f"events worker stopped: {totals['processed']} processed, {totals['failed']} failed, "
            f"{totals['stale']} stale"
        )
