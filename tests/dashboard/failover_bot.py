"""One replica process of ``tienda-bot`` for ``test_failover.py``: the real bot client plus a recorder.

``python -m tests.dashboard.failover_bot --admin-url … --coordination … --replica-id … --record FILE``
(bot token in ``BOTMESH_BOT_TOKEN``; no Django). It is ``botclient.BotReplica``
leading ``provider:main`` over the admin's session and answering every inbound
message ``re: <text>`` under the chat's turn, polling every ``--poll-ms``.

The recorder (the overlap detector's input) appends one JSON line per handled
message to ``--record``: ``chat`` (conversation id), ``message``, ``replica``,
``incarnation``, ``start_ms``/``end_ms`` (epoch ms: from the moment the turn was
granted to the moment the answer's request returned, inside the turn),
``outcome``, ``fence`` and ``valid_at_end`` (the turn still held at ``end_ms``:
it was held for the whole interval). A message whose text is ``slow`` is answered
by the provider leader only (the others leave it), after writing
``--marker`` and sleeping ``--slow-ms`` — the window in which the test freezes
it. A handling whose turn was lost meanwhile (outcome ``stale_fence``) sends its
late answer anyway with its old fence, and records what the admin said in
``late_send`` (the fence must refuse it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from botmesh_admin.botclient import AdminClient, AdminError, AdminSession, BotReplica, InboundMessage, coordinator_for
from botmesh_admin.botclient.replica import Handled, wall_ms
from botmesh_admin.coordination.base import LeaseHandle


class RecordingReplica(BotReplica):
    """``BotReplica`` that records each handling's held interval (see the module docstring)."""

    def __init__(self, *args: Any, record: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.record = record
        self._write = threading.Lock()

    def _handle_in_turn(self, message: InboundMessage, handler: Any, turn: LeaseHandle, start: int) -> Handled:
        began = wall_ms()  # the turn is held from here (handle() took it)
        handled = super()._handle_in_turn(message, handler, turn, start)
        line: dict[str, Any] = {
            "chat": message.conversation_id,
            "message": message.id,
            "replica": self.replica_id,
            "incarnation": self.incarnation,
            "start_ms": began,
            "end_ms": wall_ms(),
            "outcome": handled.outcome,
            "fence": turn.fence,
            "valid_at_end": turn.valid(),
            "late_send": None,
        }
        if handled.outcome == "stale_fence":  # frozen past the lease: send the late answer, old fence and all
            try:
                self.admin.reply(message, answer_text(message), fence=turn.fence)
                line["late_send"] = "accepted"
            except AdminError as exc:
                line["late_send"] = f"{exc.status} {exc.code}"
        with self._write, open(self.record, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        return handled


def answer_text(message: InboundMessage) -> str:
    return f"re: {message.text}"


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--admin-url", "--tenant", "--bot", "--coordination", "--replica-id", "--record", "--marker"):
        parser.add_argument(name, required=True)
    parser.add_argument("--lease-ms", type=int, default=1500)
    parser.add_argument("--poll-ms", type=int, default=150)
    parser.add_argument("--slow-ms", type=int, default=1000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    admin = AdminClient(args.admin_url, tenant=args.tenant, bot=args.bot, token=os.environ["BOTMESH_BOT_TOKEN"])
    coordinator = coordinator_for(
        args.coordination, tenant=args.tenant, bot=args.bot, lease_ms=args.lease_ms, replica_id=args.replica_id
    )
    replica = RecordingReplica(
        admin,
        coordinator,
        record=args.record,
        provider_id="main",
        transport=AdminSession(admin),
        push_every_ms=1000,
        turn_wait_ms=2000,
    )

    def handler(message: InboundMessage) -> str | None:
        if message.text == "slow":
            if not replica.is_provider_leader():
                return None  # the leader's job: left for it
            with open(args.marker, "a", encoding="utf-8") as out:
                out.write(json.dumps({"replica": replica.replica_id, "message": message.id}) + "\n")
            time.sleep(args.slow_ms / 1000)
        return answer_text(message)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    replica.start()
    print(f"replica {replica.replica_id}/{replica.incarnation} pid {os.getpid()} started", flush=True)
    while not stop.is_set():
        try:
            replica.poll(handler, since_ms=0)
        except AdminError as exc:
            print(f"poll failed: {exc.status} {exc.code}", file=sys.stderr, flush=True)
        stop.wait(args.poll_ms / 1000)
    replica.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
