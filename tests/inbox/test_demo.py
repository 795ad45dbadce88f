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
        chats = {c["chat_key"]: c for c in page["items"]}
        status, soporte = ctx.request("GET", "/api/v1/tenants/soporte/conversations?limit=200", tenant="soporte")
    assert "soporte: 38 conversations, 121 messages" in summary
    assert len(chats) == 40 + 5  # 40 ledger chats + 5 from the webhooks
    assert chats["whatsapp:573001112233"]["display_name"] == "Ana García"
    assert chats["telegram:700000001"]["blocked"]
    assert sum(c["message_count"] for c in page["items"] if c["chat_key"] not in {
        "whatsapp:573001112233", "whatsapp:5215512345678", "telegram:700000001",
        "telegram:-1001234567890:700000001", "telegram:-1001234567890:700000002"}) == 480
    assert not ctx.notes
