"""An outbox handler for the frozen reply sender test: pauses right after it marks a reply ``sending``.

``manage.py botmesh_events_worker --handler tests.faults.paused_reply.handle``
with ``FAULTS_DIR`` set. It is the registry's ``dispatch``; only
``inbox.replies._set_reply`` is wrapped: after a write of ``sending`` it
appends ``sending <message id>`` to ``<FAULTS_DIR>/paused.log`` and sleeps
``PAUSE_S``, so the test can freeze the process (SIGSTOP) at that point —
after the durable ``sending``, before the claim check and the provider request.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from botmesh_admin.events.handlers import dispatch
from inbox import replies

PAUSE_S = 1.0
_set_reply = replies._set_reply


def _paused_set_reply(inbox: Any, tenant: str, message: Any, **changes: Any) -> Any:
    written = _set_reply(inbox, tenant, message, **changes)
    if changes.get("state") == "sending":
        with open(Path(os.environ["FAULTS_DIR"]) / "paused.log", "a", encoding="utf-8") as out:
            out.write(f"sending {message.id}\n")
        time.sleep(PAUSE_S)  # the test's SIGSTOP lands here
    return written


replies._set_reply = _paused_set_reply  # type: ignore[assignment]
handle = dispatch
