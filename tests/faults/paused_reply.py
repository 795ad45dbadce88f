"""An outbox handler for the frozen reply sender test: pauses right after it marks a reply ``sending``.

``manage.py botmesh_events_worker --handler tests.faults.paused_reply.handle``
with ``FAULTS_DIR`` set. It is the registry's ``dispatch``; only
``inbox.services.replies._set_reply`` is wrapped: after a write of ``sending`` it
appends ``sending <message id>`` to ``<FAULTS_DIR>/paused.log`` and waits
(at most ``PAUSE_LIMIT_S``) until the file ``<FAULTS_DIR>/resume`` exists, so
the test freezes the process (SIGSTOP) at that point — after the durable
``sending``, before the claim check and the provider request — however slow
the machine, and writes the file before it resumes it (SIGCONT).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from botmesh_admin.events.handlers import dispatch
from inbox.services import replies

PAUSE_LIMIT_S = 60.0
_set_reply = replies._set_reply


def _paused_set_reply(tenant: str, message: Any, **changes: Any) -> Any:
    written = _set_reply(tenant, message, **changes)
    if changes.get("state") == "sending":
        directory = Path(os.environ["FAULTS_DIR"])
        with open(directory / "paused.log", "a", encoding="utf-8") as out:
            out.write(f"sending {message.id}\n")
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while not (directory / "resume").exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # the test's SIGSTOP lands here
    return written


replies._set_reply = _paused_set_reply  # type: ignore[assignment]
handle = dispatch
