"""Steps of the reply outbox fault tests, each run as a process of its own over one embedded installation.

``python -m tests.faults.reply_steps <step> '<json args>'`` with the
environment of the test (``project_env``: SQLite database, Kv and journal files
under one directory). Steps:

- ``setup``: migrate, create the tenant and its WhatsApp channel (provider at
  ``base_url``), ingest one signed webhook, and queue ``replies`` agent replies
  (``tests.inbox.replyproc``'s setup for the first); print ``{"conversation_id", "message_ids"}``.
- ``takeover``: what another worker does once the first one's lease lapsed —
  drain the outbox once with a ``lease_ms`` lease — and then, when the reply
  ``message_id`` is not confirmed, what the agent does: resend it (the worker
  drains the outbox again and sends it). With ``wait_go`` it is started ahead
  of time (Django takes seconds to load) and waits for a line on stdin first.

Each prints one JSON line last (flushed).
"""

from __future__ import annotations

import json
import sys

from inbox.stores import default_store


def setup(args: dict) -> dict:
    from inbox.services import replies
    from tests.inbox import replyproc

    first = replyproc.setup(args)
    ids = [first["message_id"]]
    for n in range(1, args.get("replies", 1)):
        ids.append(replies.reply_create(args["tenant"], first["conversation_id"], author="ana",
                                        text=f"Respuesta {n + 1}").id)  # fmt: skip
    return {"conversation_id": first["conversation_id"], "message_ids": ids}


def takeover(args: dict) -> dict:
    from botmesh_admin.events.services import journal_drain
    from inbox.services import replies

    if args.get("wait_go"):
        print("READY", flush=True)
        sys.stdin.readline()
    drained = journal_drain(channel="outbox", lease_ms=args.get("lease_ms", 1500))
    message = default_store().message_get(args["tenant"], args["message_id"])
    assert message is not None and message.reply is not None
    out = {"drained": drained, "found": message.reply.state}
    if message.reply.state == "not_confirmed":
        replies.reply_resend(args["tenant"], args["message_id"], conversation_id=message.conversation_id, actor="ana")
        out["resent"] = journal_drain(channel="outbox")
    return out


def main() -> None:
    import django

    django.setup()
    step, args = sys.argv[1], json.loads(sys.argv[2])
    steps = {"setup": setup, "takeover": takeover}
    print(json.dumps(steps[step](args)), flush=True)


if __name__ == "__main__":
    main()
