"""Message traces stay for their retention whatever the UI's own traffic, and the list is newest first (issue 20).

Before: the store kept the newest 500 traces of a tenant, all kinds together,
so the admin's own page polls (an open inbox polls every 3 and 5 s) pushed
the demo's message traces out within 30 minutes; and the list was ordered by
when the store first wrote a trace, not by when it started.
"""

from __future__ import annotations

import pytest

from botmesh_admin.observability import trace_records
from botmesh_admin.observability.stores.base import TraceStore
from botmesh_admin.observability.stores.kv import KvTraceStore
from botmesh_admin.observability.stores.memory import MemoryTraceStore

from .test_store_contract import STORE_KINDS, kv_of, span, tid
from .test_trace_indexes import system_table, ticking

KEEP = {"message": 30, "http": 20, "task": 20, "internal": 20}  # ``trace_records.KEEP`` scaled down 25 times


def make_store(kind: str, request: pytest.FixtureRequest) -> TraceStore:
    if kind == "memory":
        return MemoryTraceStore(keep=KEEP, clock=ticking())
    return KvTraceStore(kv_of(kind, request), keep=KEEP, clock=ticking(), system_table=system_table())


def poll(n: int) -> list[dict]:
    """The trace of one htmx poll of the inbox list."""
    attrs = {"botmesh.kind": "http", "botmesh.htmx_partial": True}
    return [span(tid(10_000 + n), "a" * 16, None, "GET /t/{tenant}/inbox/_list", 2000.0 + n, 3.0, **attrs)]


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_a_burst_of_ui_polls_beyond_the_old_cap_does_not_evict_a_message_trace(
    kind: str, request: pytest.FixtureRequest, tenant_id: str
) -> None:
    store = make_store(kind, request)
    message = [
        span(tid(1), "a" * 16, None, "POST /webhooks/whatsapp/{tenant}", 1000.0, 9.0),
        span(tid(1), "b" * 16, "a" * 16, "inbox.project", 1004.0, 3.0, **{"botmesh.conversation_id": "c-1"}),
    ]
    store.record(tenant_id, message)
    polls = 3 * KEEP["message"]  # more than any quota: the old cap was one for every kind
    store.record_many(tenant_id, [poll(n) for n in range(polls)])
    if isinstance(store, KvTraceStore):
        store.prune(tenant_id)
    assert store.get(tenant_id, tid(1)) is not None
    assert [s.trace_id for s in store.list(tenant_id, kind="message")[0]] == [tid(1)]
    http = [s.trace_id for s in store.list(tenant_id, kind="http", limit=100)[0]]
    assert http == [tid(10_000 + n) for n in reversed(range(polls - KEEP["http"], polls))]  # the newest 20


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_the_list_is_newest_first_by_start_even_when_an_older_trace_is_written_later(
    kind: str, request: pytest.FixtureRequest, tenant_id: str
) -> None:
    """A worker's part of a trace arrives after a newer request's: the list shows start times, so it orders by them."""
    store = make_store(kind, request)
    store.record(tenant_id, [span(tid(2), "a" * 16, None, "GET /t/{tenant}/inbox/", 5000.0, 2.0)])
    store.record(tenant_id, [span(tid(1), "a" * 16, None, "inbox.project", 4000.0, 2.0)])  # older, written later
    store.record(tenant_id, [span(tid(3), "a" * 16, None, "GET /t/{tenant}/traces/", 6000.0, 2.0)])
    listed = store.list(tenant_id)[0]
    assert [s.trace_id for s in listed] == [tid(3), tid(2), tid(1)]
    first, after = store.list(tenant_id, limit=1)
    assert [s.trace_id for s in first] == [tid(3)]
    rest, _ = store.list(tenant_id, limit=5, after=after)
    assert [s.trace_id for s in rest] == [tid(2), tid(1)]


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_a_message_finds_its_newest_trace_by_its_hash(
    kind: str, request: pytest.FixtureRequest, tenant_id: str
) -> None:
    store = make_store(kind, request)
    hashes = trace_records.MESSAGE_HASHES
    store.record(tenant_id, [span(tid(1), "a" * 16, None, "inbox.project", 1000.0, 2.0, **{hashes: ["h1", "h2"]})])
    store.record(tenant_id, [span(tid(2), "a" * 16, None, "inbox.reply", 2000.0, 2.0, **{hashes: ["h2"]})])
    assert store.of_message(tenant_id, "h1") == tid(1)
    assert store.of_message(tenant_id, "h2") == tid(2)
    assert store.of_message(tenant_id, "nope") is None
    assert store.of_message(None, "h1") is None


def test_a_webhook_message_links_to_the_trace_of_its_webhook_and_an_unknown_one_is_a_404_page(tenant_client) -> None:
    """The thread's *trace* link (``/traces/message/?id=``) leads from an inbound message to its webhook's trace."""
    import json

    from django.test import Client

    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.demo import fixtures_dir
    from botmesh_admin.events.services import journal_drain
    from botmesh_admin.observability import tracing
    from inbox import selectors as inbox_selectors

    tenant = tenant_client.tenant
    raw = fixtures_dir() / "whatsapp" / "raw"
    signatures = json.loads((raw / "signatures.json").read_text())
    channel_config_set(
        tenant, kind="whatsapp", name="main", phone_number_id="106540352242922", app_secret=signatures["app_secret"]
    )
    answer = Client().post(
        f"/webhooks/whatsapp/{tenant}",
        data=(raw / "01_text.json").read_bytes(),
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=signatures["signatures"]["01_text.json"],
    )
    assert answer.status_code == 200, answer.content
    assert journal_drain(channel="inbound")["processed"] == 1
    tracing.force_flush()
    (row,), _ = inbox_selectors.conversation_list(tenant, agent="u")
    (message,), _ = inbox_selectors.message_list(tenant, row.conversation.id)

    thread = tenant_client.page.get(f"/t/{tenant}/inbox/{row.conversation.id}/")
    assert f"/t/{tenant}/traces/message/?id={message.id}" in thread.content.decode()
    found = tenant_client.page.get(f"/t/{tenant}/traces/message/", {"id": message.id})
    assert found.status_code == 302
    page = tenant_client.page.get(found["Location"]).content.decode()
    assert "POST /webhooks/whatsapp/{tenant}" in page and "inbox.project" in page

    missing = tenant_client.page.get(f"/t/{tenant}/traces/message/", {"id": "wamid.not-kept"})
    assert missing.status_code == 404
    assert "no trace of this message is kept" in missing.content.decode().lower()


def test_bot_feed_polls_are_sampled_like_htmx_polls_and_keep_other_http_traces(tenant_client) -> None:
    """The demo's three bot replicas poll ``GET …/bots/{bot}/inbound`` several times a second; one poll in ten
    is kept (by trace id), so they no longer push the other http traces out of the 500 kept."""
    from botmesh_admin.observability import tracing
    from botmesh_admin.observability.stores import trace_store

    tenant = tenant_client.tenant
    polls = 100  # none of 100 kept: 0.9**100, under 1 in 30000
    for _ in range(polls):
        assert tenant_client.bot.get(f"/api/v1/tenants/{tenant}/bots/shop-bot/inbound?since_ms=0").status_code == 200
    assert tenant_client.api.get(f"/api/v1/tenants/{tenant}/conversations").status_code == 200
    tracing.force_flush()
    http, _ = trace_store().list(tenant, kind="http", limit=200)
    names = [t.name for t in http]
    kept = names.count("GET /api/v1/tenants/{tenant}/bots/{bot}/inbound")
    assert 0 < kept < polls // 3, names  # about polls / 10 (binomial: fewer than 33 of 100 all but surely)
    assert names.count("GET /api/v1/tenants/{tenant}/conversations") == 1
