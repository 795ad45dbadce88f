"""THE DEMO of the inbox: the shared fixtures go in through the running server's real endpoints.

1. configure the demo tenant's two WhatsApp numbers and two Telegram bots through the
   channels API: ``main`` (app secret of ``whatsapp/raw/signatures.json``, phone number id
   106540352242922) and ``ventas`` (a second number of the same Meta app: same app secret),
   ``bot`` (secret of ``telegram/meta.json``) and ``ayuda`` (a secret of its own);
2. POST every ``whatsapp/raw/*.json`` with its ``X-Hub-Signature-256`` to the webhook, and
   every Telegram update with ``X-Telegram-Bot-Api-Secret-Token`` to ``bot``; then, since
   the fixtures hold one number, the bodies of ``SECOND_NUMBER_BODIES`` as Meta would post
   them for ``ventas`` (``channels.testing.whatsapp_body_for_number``, signed with the app
   secret) and ``SECOND_BOT_UPDATES`` to ``ayuda`` — the same customers, each on two
   channels, so two conversations each;
3. push ``ledger/messages.jsonl`` through the ledger endpoint, each tenant's records with
   that tenant's token (the demo tenant's bot runs on ``main`` and ``bot``: its records
   name that channel, as a bot on a tenant with several numbers does);
4. wait (polling the API) until the worker has projected them; return a summary.

No access token or bot token is configured, so in development replies go to the console provider.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

WHATSAPP_CHANNEL = "main"
SECOND_WHATSAPP_CHANNEL = "ventas"
TELEGRAM_CHANNEL = "bot"
SECOND_TELEGRAM_CHANNEL = "ayuda"
PHONE_NUMBER_ID = "106540352242922"
SECOND_PHONE_NUMBER_ID = "106540352299999"
SECOND_DISPLAY_NUMBER = "15550783999"
SECOND_BOT_SECRET = "botmesh-demo-ayuda-secret"
SECOND_NUMBER_BODIES = ("01_text.json", "03_button_reply.json", "08_batch.json")
SECOND_BOT_UPDATES = ("01_start.json", "02_text.json", "04_edited.json")
WAIT_S = 180.0


def _configure_channels(ctx: Any, tenant: str) -> None:
    fixtures = ctx.fixtures
    app_secret = json.loads((fixtures / "whatsapp" / "raw" / "signatures.json").read_text())["app_secret"]
    secret = json.loads((fixtures / "telegram" / "meta.json").read_text())["secret_token"]
    channels = {
        WHATSAPP_CHANNEL: {
            "kind": "whatsapp",
            "phone_number_id": PHONE_NUMBER_ID,
            "display_phone_number": "+1 555 078 3881",
            "app_secret": app_secret,
            "verify_token": "botmesh-demo-verify",
        },
        SECOND_WHATSAPP_CHANNEL: {
            "kind": "whatsapp",
            "phone_number_id": SECOND_PHONE_NUMBER_ID,
            "display_phone_number": "+1 555 078 3999",
            "app_secret": app_secret,
            "verify_token": "botmesh-demo-verify",
        },
        TELEGRAM_CHANNEL: {"kind": "telegram", "bot_username": "tienda_demo_bot", "webhook_secret": secret},
        SECOND_TELEGRAM_CHANNEL: {
            "kind": "telegram",
            "bot_username": "tienda_ayuda_bot",
            "webhook_secret": SECOND_BOT_SECRET,
        },
    }
    for name, body in channels.items():
        status, answer = ctx.request("PUT", f"/api/v1/tenants/{tenant}/channels/{name}", body, tenant=tenant)
        if status != 200:
            raise RuntimeError(f"inbox demo: configuring channel {name} failed: {status} {answer}")


def _post_webhooks(ctx: Any, tenant: str) -> int:
    fixtures = ctx.fixtures
    raw = fixtures / "whatsapp" / "raw"
    signatures = json.loads((raw / "signatures.json").read_text())
    posted = 0
    for name, signature in sorted(signatures["signatures"].items()):
        status, answer = ctx.request(
            "POST",
            f"/webhooks/whatsapp/{tenant}",
            (raw / name).read_bytes(),
            headers={signatures["header"]: signature},
            tenant=None,
        )
        if status != 200:
            raise RuntimeError(f"inbox demo: WhatsApp webhook {name} answered {status} {answer}")
        posted += 1
    from botmesh_admin.channels.testing import compact_json, whatsapp_body_for_number
    from botmesh_admin.channels.whatsapp import signature

    for name in SECOND_NUMBER_BODIES:  # through the same signed ingestion path, for the second number
        body = whatsapp_body_for_number(
            json.loads((raw / name).read_bytes()),
            phone_number_id=SECOND_PHONE_NUMBER_ID,
            display_phone_number=SECOND_DISPLAY_NUMBER,
        )
        data = compact_json(body)
        status, answer = ctx.request(
            "POST",
            f"/webhooks/whatsapp/{tenant}",
            data,
            headers={signatures["header"]: signature(data, signatures["app_secret"])},
            tenant=None,
        )
        if status != 200:
            raise RuntimeError(
                f"inbox demo: WhatsApp webhook {name} for {SECOND_WHATSAPP_CHANNEL} answered {status} {answer}"
            )
        posted += 1
    meta = json.loads((fixtures / "telegram" / "meta.json").read_text())
    updates = [(TELEGRAM_CHANNEL, meta["secret_token"], p) for p in sorted((fixtures / "telegram").glob("0*.json"))]
    updates += [(SECOND_TELEGRAM_CHANNEL, SECOND_BOT_SECRET, fixtures / "telegram" / n) for n in SECOND_BOT_UPDATES]
    for bot, secret, path in updates:
        status, answer = ctx.request(
            "POST",
            f"/webhooks/telegram/{tenant}/{bot}",
            path.read_bytes(),
            headers={meta["header"]: secret},
            tenant=None,
        )
        if status != 200:
            raise RuntimeError(f"inbox demo: Telegram webhook {path.name} for {bot} answered {status} {answer}")
        posted += 1
    return posted


def _push_ledger(ctx: Any) -> dict[str, dict[str, int]]:
    lines = (ctx.fixtures / "ledger" / "messages.jsonl").read_text(encoding="utf-8").splitlines()
    by_tenant: dict[str, list[str]] = defaultdict(list)
    from botmesh_admin.demo import DEMO_TENANT

    own = {"whatsapp": WHATSAPP_CHANNEL, "telegram": TELEGRAM_CHANNEL}
    for line in lines:
        if line.strip():
            record = json.loads(line)
            if record["tenantId"] == DEMO_TENANT:  # the demo tenant has two of each: name the bot's own
                line = json.dumps(dict(record, channelName=own[record["channel"]]), ensure_ascii=False)
            by_tenant[record["tenantId"]].append(line)
    receipts = {}
    for tenant, records in by_tenant.items():
        if tenant not in ctx.tokens:
            continue
        status, answer = ctx.request(
            "POST",
            f"/api/v1/tenants/{tenant}/ledger",
            "\n".join(records).encode(),
            headers={"Content-Type": "application/x-ndjson"},
            tenant=tenant,
        )
        if status != 202:
            raise RuntimeError(f"inbox demo: ledger push for {tenant} answered {status} {answer}")
        receipts[tenant] = answer
    return receipts


def _totals(ctx: Any, tenant: str) -> tuple[int, int]:
    conversations = messages = 0
    after = None
    while True:
        query = "limit=200" + (f"&after={after}" if after else "")
        status, page = ctx.request("GET", f"/api/v1/tenants/{tenant}/conversations?{query}", tenant=tenant)
        if status != 200:
            return conversations, messages
        conversations += len(page["items"])
        messages += sum(c["message_count"] for c in page["items"])
        after = page.get("next")
        if not after:
            return conversations, messages


def load(ctx: Any) -> str:
    """Load the inbox demo through the HTTP endpoints and wait for the worker; return a summary."""
    from botmesh_admin.demo import DEMO_TENANT

    _configure_channels(ctx, DEMO_TENANT)
    posted = _post_webhooks(ctx, DEMO_TENANT)
    receipts = _push_ledger(ctx)
    expected = {t: r["accepted"] for t, r in receipts.items()}
    deadline = time.monotonic() + WAIT_S
    previous: dict[str, tuple[int, int]] = {}
    while True:
        totals = {t: _totals(ctx, t) for t in sorted({DEMO_TENANT, *expected})}
        projected = all(totals[t][1] >= expected.get(t, 0) for t in totals)
        if projected and totals == previous:
            break
        if time.monotonic() > deadline:
            ctx.notes.append("inbox demo: the worker had not projected everything yet; it continues in the background")
            break
        previous = totals
        time.sleep(1.0)
    parts = [f"{t}: {c} conversations, {m} messages" for t, (c, m) in totals.items()]
    return f"inbox ({posted} webhooks, {sum(expected.values())} ledger records): " + "; ".join(parts)
