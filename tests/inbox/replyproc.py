"""Steps of the reply crash test run as real processes over one embedded installation.

``python -m tests.inbox.replyproc <step> '<json args>'`` with the environment
of ``test_reply_crash.installation`` (SQLite database, Kv and journal files
under one directory — the embedded default's layout). Steps:

- ``setup``: migrate, create the tenant and its WhatsApp channel (provider at
  ``base_url``), POST the signed fixture ``01_text.json`` to the webhook, project
  it, and queue an agent's reply; print ``{"conversation_id", "message_id"}``.
- ``resend``: the agent's explicit resend of a reply, then drain the outbox once.

Each prints one JSON line last (flushed).
"""

from __future__ import annotations

import json
import sys

from inbox.stores import default_store


def setup(args: dict) -> dict:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.demo import fixtures_dir
    from botmesh_admin.events.services import journal_drain
    from botmesh_admin.tenancy import services as tenancy
    from inbox.services import replies

    call_command("migrate", verbosity=0, interactive=False)
    tenant = args["tenant"]
    tenancy.tenant_create(tenant, name="Crash")
    get_user_model().objects.get_or_create(username="ana")
    tenancy.membership_set(tenant, username="ana", role="agent")
    raw_dir = fixtures_dir() / "whatsapp" / "raw"
    signatures = json.loads((raw_dir / "signatures.json").read_text())
    channel_config_set(
        tenant,
        kind="whatsapp",
        name="main",
        phone_number_id="106540352242922",
        app_secret=signatures["app_secret"],
        access_token="EAAG-test",
        api_base_url=args["base_url"],
    )
    response = Client().post(
        f"/webhooks/whatsapp/{tenant}",
        data=(raw_dir / "01_text.json").read_bytes(),
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=signatures["signatures"]["01_text.json"],
    )
    assert response.status_code == 200, response.content
    assert journal_drain(channel="inbound")["processed"] == 1
    conversation = default_store().conversation_by_chat(tenant, "whatsapp:573001112233", channel_name="main")
    assert conversation is not None
    reply = replies.reply_create(tenant, conversation.id, author="ana", text="¿Le llegó el pedido?")
    return {"conversation_id": conversation.id, "message_id": reply.id}


def resend(args: dict) -> dict:
    from botmesh_admin.events.services import journal_drain
    from inbox.services import replies

    queued = replies.reply_resend(
        args["tenant"], args["message_id"], conversation_id=args["conversation_id"], actor="ana"
    )
    return {"queued": queued.reply.state, "drained": journal_drain(channel="outbox")}


def main() -> None:
    import django

    django.setup()
    step, args = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps({"setup": setup, "resend": resend}[step](args)), flush=True)


if __name__ == "__main__":
    main()
