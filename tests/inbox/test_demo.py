"""THE DEMO: the inbox loader drives the real endpoints of a running server and waits for the worker."""

from __future__ import annotations

import threading

import pytest

from botmesh_admin.demo import DemoContext, ensure_accounts, fixtures_dir
from botmesh_admin.events import connect_journal, use_journal
from botmesh_admin.events.services import journal_drain
from botmesh_admin.kv import connect
from botmesh_admin.kv.runtime import use_kv
from inbox import demo

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_loads_through_webhooks_and_ledger(live_server):
    stop = threading.Event()

    def worker() -> None:  # what the Celery worker does in ``./dev run``
        while not stop.is_set():
            took = [sum(journal_drain(channel=c, limit=200).values()) for c in ("inbound", "ledger")]
            if not sum(took):
                stop.wait(0.1)

    with use_kv(connect("memory://")), use_journal(connect_journal("memory://")):
        ctx = DemoContext(base_url=live_server.url, tokens=ensure_accounts(), fixtures=fixtures_dir())
        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        try:
            summary = demo.load(ctx)
        finally:
            stop.set()
            thread.join(timeout=10)
        status, page = ctx.request("GET", "/api/v1/tenants/tienda/conversations?limit=200", tenant="tienda")
        chats = {(c["channel_name"], c["chat_key"]): c for c in page["items"]}
        status, soporte = ctx.request("GET", "/api/v1/tenants/soporte/conversations?limit=200", tenant="soporte")
    assert "soporte: 38 conversations, 121 messages" in summary
    webhook_chats = {
        ("main", "whatsapp:573001112233"),
        ("main", "whatsapp:5215512345678"),
        ("bot", "telegram:700000001"),
        ("bot", "telegram:-1001234567890:700000001"),
        ("bot", "telegram:-1001234567890:700000002"),
        # the second number and the second bot (issue 15, item 1): the same customers, other conversations
        ("ventas", "whatsapp:573001112233"),
        ("ventas", "whatsapp:5215512345678"),
        ("ayuda", "telegram:700000001"),
    }
    assert webhook_chats <= set(chats)
    assert len(chats) == 40 + len(webhook_chats)  # 40 ledger chats (on the bot's own channels) + the webhooks'
    assert {channel for channel, _ in chats} == {"main", "ventas", "bot", "ayuda"}
    assert chats[("main", "whatsapp:573001112233")]["display_name"] == "Ana García"
    assert chats[("bot", "telegram:700000001")]["blocked"] and not chats[("ayuda", "telegram:700000001")]["blocked"]
    assert sum(c["message_count"] for key, c in chats.items() if key not in webhook_chats) == 480
    assert not ctx.notes
