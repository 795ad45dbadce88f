"""The demo's one dead letter, so the journal's Replay can be tried (issue 20, item 10).

A deliberate, labelled demo fault: ``load`` journals one ``demo.fault`` event for
the demo tenant on its own journal channel, ``demo``. Its handler fails every
attempt of the record's first delivery, saying why in the record's last error,
so the real worker retries it with the journal's backoff and then dead-letters
it, as any failing record; once an operator replays it from the journal page
(or ``POST …/events/{id}/replay``) the handler processes it. The journal pages
mark such a record "demo fault".

``load`` runs first among the demo loaders and ``settle`` last, waiting (at most
``SETTLE_S``) for the record to be dead: its retries (about 20 s with the default
policy and the beat's 5 s safety-net drain) overlap the other loaders, so the demo
start takes no longer.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .base import EventRecord
from .handlers import register

log = logging.getLogger("botmesh.events")

DEMO_FAULT_EVENT = "demo.fault"
DEMO_CHANNEL = "demo"
IDEMPOTENCY_KEY = "demo-fault"
MARKER_TABLE = "system/demo"
SETTLE_S = 60.0


class DemoFault(RuntimeError):
    """The deliberate failure of a ``demo.fault`` record (its message is what the journal shows)."""


def _marker(event_id: str) -> str:
    return f"fault/{event_id}"


@register(DEMO_FAULT_EVENT)
def demo_fault(record: EventRecord) -> None:
    """Fail each attempt of the record's first delivery; process it once it was dead-lettered and replayed.

    On the last attempt (``attempts == policy.max_attempts``) a marker is kept
    in the Kv (``system/demo``, ``fault/<event id>``) before failing, so the
    attempt after a replay finds it and succeeds. Raise ``DemoFault``.
    """
    from botmesh_admin.kv import Put
    from botmesh_admin.kv.runtime import default_kv

    from .runtime import default_journal

    kv = default_kv()
    if kv.get(MARKER_TABLE, _marker(record.id)) is not None:
        log.info("demo fault %s replayed: processed", record.id)
        return
    limit = default_journal().policy.max_attempts
    if record.attempts >= limit:
        kv.commit(MARKER_TABLE, [Put(_marker(record.id), {"dead_lettered_at_attempt": record.attempts})])
    raise DemoFault(
        f"deliberate demo fault (attempt {record.attempts} of {limit}): this demo record fails until it is "
        "a dead letter, to show the journal's retries and dead letters; Replay processes it"
    )


def load(ctx: Any) -> str:
    """Journal the demo fault for the demo tenant (once: a reload finds the same record); return a summary."""
    from botmesh_admin.demo import DEMO_TENANT

    from .services import event_publish

    record = event_publish(
        DEMO_TENANT,
        type=DEMO_FAULT_EVENT,
        channel=DEMO_CHANNEL,
        payload={"demo": "a deliberate fault: replay it from the journal page"},
        idempotency_key=IDEMPOTENCY_KEY,
    )
    ctx.demo_fault_id = record.id
    return f"journal: one deliberate demo fault ({record.id}, channel {DEMO_CHANNEL}) to replay on the Journal page"


def settle(ctx: Any) -> str:
    """Wait (at most ``SETTLE_S``) until the demo fault is a dead letter; return a summary."""
    from botmesh_admin.demo import DEMO_TENANT

    event_id = getattr(ctx, "demo_fault_id", None)
    if event_id is None:
        return "journal: no demo fault"
    deadline = time.monotonic() + SETTLE_S
    state = "?"
    while time.monotonic() < deadline:
        status, record = ctx.request("GET", f"/api/v1/tenants/{DEMO_TENANT}/events/{event_id}")
        state = record.get("state", "?") if status == 200 and isinstance(record, dict) else "?"
        if state in ("dead", "done"):
            return f"journal: the demo fault is {'a dead letter' if state == 'dead' else 'processed'}"
        time.sleep(0.5)
    ctx.notes.append(f"journal: the demo fault is still {state}; it becomes a dead letter in the background")
    return f"journal: the demo fault is {state}"
