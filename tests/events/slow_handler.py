"""A handler for the worker-command test: logs start and end, sleeps in between.

The log file is ``$BOTMESH_TEST_HANDLER_LOG``. Kept free of pytest imports.
"""

from __future__ import annotations

import os
import time

from botmesh_admin.events import EventRecord


def handle(record: EventRecord) -> None:
    with open(os.environ["BOTMESH_TEST_HANDLER_LOG"], "a", buffering=1) as log:
        log.write(f"start {record.id}\n")
        time.sleep(float(os.environ.get("BOTMESH_TEST_HANDLER_SLEEP", "1.0")))
        log.write(f"end {record.id}\n")


def poison(record: EventRecord) -> None:
    """Log ``ran <key>``; a record whose payload has ``poison`` kills the process (as an OOM kill would)."""
    if record.payload.get("poison"):
        os.kill(os.getpid(), 9)  # SIGKILL: no except, no finally, no ack
    with open(os.environ["BOTMESH_TEST_HANDLER_LOG"], "a", buffering=1) as log:
        log.write(f"ran {record.idempotency_key}\n")
    time.sleep(0.02)
