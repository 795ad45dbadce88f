"""Traces: ids only as keyed hashes, no message content anywhere, one trace per message, kept for the dashboard."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from botmesh_admin.kv import DurableKv
from botmesh_admin.observability import selectors, tracing
from botmesh_admin.observability.guard import hash_id
from botmesh_admin.observability.tracing import extract_context, inject_context, span
from inbox.stores import default_store

from .conftest import TenantClient

MARKER = "ZEBRA-7731-secret-text"
PHONE = "+573001112233"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Every span that ends during the test, as an exporter would receive it."""
    exporter = InMemorySpanExporter()
    with tracing.capture(exporter):
        yield exporter


def dump(exporter: InMemorySpanExporter) -> str:
    return "\n".join(s.to_json() for s in exporter.get_finished_spans())


def flush_to_kv() -> None:
    tracing.force_flush()


def test_hash_id_is_keyed_stable_and_short(settings) -> None:  # type: ignore[no-untyped-def]
    import hashlib
    import hmac

    expected = hmac.new(settings.BOTMESH_HASH_KEY.encode(), PHONE.encode(), hashlib.sha256).hexdigest()[:16]
    assert hash_id(PHONE) == expected == hash_id(f" {PHONE} ")
    assert hash_id(PHONE) != hashlib.sha256(PHONE.encode()).hexdigest()[:16]


def test_span_hashes_ids_and_drops_content(exported: InMemorySpanExporter) -> None:
    with span(
        "message.receive",
        tenant="tienda",
        chat_id=PHONE,
        sender_id="u-42",
        text=MARKER,
        caption=MARKER,
        channel="whatsapp",
    ):
        pass
    (finished,) = exported.get_finished_spans()
    attrs = dict(finished.attributes or {})
    assert attrs["botmesh.chat_id_hash"] == hash_id(PHONE)
    assert attrs["botmesh.sender_id_hash"] == hash_id("u-42")
    assert attrs["botmesh.channel"] == "whatsapp" and attrs["botmesh.tenant"] == "tienda"
    assert MARKER not in dump(exported) and PHONE not in dump(exported)


def test_an_exception_keeps_its_type_but_never_its_message(exported: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError), span("message.send"):
        raise ValueError(f"provider refused text {MARKER} to {PHONE}")
    (finished,) = exported.get_finished_spans()
    assert finished.status.description == "ValueError"
    assert [e.attributes["exception.type"] for e in finished.events] == ["ValueError"]
    assert MARKER not in dump(exported) and PHONE.lstrip("+") not in dump(exported)


def test_third_party_spans_are_guarded_on_export(exported: InMemorySpanExporter) -> None:
    from opentelemetry import trace

    tracer = trace.get_tracer("somebody.else")
    with pytest.raises(RuntimeError), tracer.start_as_current_span("GET /x") as raw:
        raw.set_attribute("http.url", f"https://h/api/contacts/{PHONE}?q={MARKER}")
        raw.set_attribute("message", MARKER)
        raw.set_attribute("wa_id", "573001112233")
        raw.add_event("log", {"body": MARKER, "note": MARKER})
        raise RuntimeError(MARKER)
    text = dump(exported)
    assert MARKER not in text and "573001112233" not in text
    (finished,) = exported.get_finished_spans()
    assert finished.attributes["http.url"] == f"https://h/api/contacts/h:{hash_id(PHONE)}"
    assert finished.attributes["wa_id_hash"] == hash_id("573001112233")


def test_context_carried_in_a_payload_continues_the_trace(exported: InMemorySpanExporter) -> None:
    payload: dict = {}
    with span("message.receive", tenant="tienda") as first:
        payload["trace"] = inject_context()
    assert payload["trace"]["traceparent"].startswith("00-") and payload["trace"]["tenant"] == "tienda"

    def worker() -> None:
        with span("message.project", parent=payload["trace"]):
            with span("message.send"):
                pass

    t = threading.Thread(target=worker)
    t.start()
    t.join(timeout=10)
    spans = {s.name: s for s in exported.get_finished_spans()}
    trace_id = first.get_span_context().trace_id
    assert {s.context.trace_id for s in spans.values()} == {trace_id}
    assert spans["message.project"].parent.span_id == first.get_span_context().span_id
    assert spans["message.send"].attributes["botmesh.tenant"] == "tienda"
    assert extract_context(None) == extract_context({})


def test_no_active_span_means_an_empty_carrier() -> None:
    assert inject_context() == {}


def test_kv_processor_files_a_local_trace_under_its_tenant(fresh_kv: DurableKv, tenant_id: str) -> None:
    records: list[tuple[str | None, list[dict]]] = []
    processor = tracing.KvTraceProcessor(lambda tenant, spans: records.append((tenant, spans)), interval_s=60)
    remove = tracing.add_span_processor(processor)
    try:
        with span("GET /t/x/inbox/"):
            with span("inner.step"):
                pass
            processor.flush(force=False)
            assert records == []  # the child waits for its local root
            with span("message.receive", tenant=tenant_id):
                pass
        processor.flush(force=False)
    finally:
        remove()
    assert len(records) == 1
    tenant, spans = records[0]
    assert tenant == tenant_id
    assert sorted(s["name"] for s in spans) == ["GET /t/x/inbox/", "inner.step", "message.receive"]


def test_force_flush_waits_for_a_write_the_writer_thread_has_begun(
    monkeypatch: pytest.MonkeyPatch, tenant_id: str
) -> None:
    """Regression (a flake of the Django-request trace test under xdist load): the writer thread
    had taken a finished trace out of the pending set and was still converting its spans when
    ``force_flush`` found nothing pending and returned; the reader right after saw no trace."""
    records: list[tuple[str | None, list[dict]]] = []
    converting, release = threading.Event(), threading.Event()
    convert = tracing.span_to_dict

    def slow_in_writer_thread(s):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "botmesh-trace-writer":
            converting.set()
            release.wait(2)
        return convert(s)

    monkeypatch.setattr(tracing, "span_to_dict", slow_in_writer_thread)
    processor = tracing.KvTraceProcessor(lambda tenant, spans: records.append((tenant, spans)), interval_s=0.01)
    remove = tracing.add_span_processor(processor)
    try:
        with span("message.receive", tenant=tenant_id):
            pass
        assert converting.wait(5), "the writer thread never took the trace"
        threading.Timer(0.3, release.set).start()
        processor.force_flush()
        assert [tenant for tenant, _ in records] == [tenant_id]
    finally:
        release.set()
        remove()
        processor.shutdown()


def test_marker_text_appears_nowhere_on_the_message_path(
    tenant_client: TenantClient, exported: InMemorySpanExporter
) -> None:
    """Regression for ARCHITECTURE §10: a message's text reaches no span, event, status or stored trace.

    Drives what exists of the message path today: an authenticated API request
    carrying the text (query and body), the webhook → journal → projection →
    send spans through the tracing helpers (as channels/inbox call them), and a
    failing send whose exception message holds the text. Extend with the real
    webhook and inbox projection as they land.
    """
    tenant = tenant_client.tenant
    response = tenant_client.bot.post(
        f"/api/v1/tenants/{tenant}/bots/tienda-bot/metrics?text={MARKER}&phone={PHONE}",
        {"replica": "pod-a", "note": MARKER, "messages": {"in": 1}},
        content_type="application/json",
    )
    assert response.status_code == 201
    with span("message.receive", tenant=tenant, chat_id=PHONE, sender_id=PHONE, text=MARKER, channel="whatsapp"):
        carrier = inject_context()
    with span("message.project", parent=carrier, conversation_id="conv-1", body=MARKER, caption=MARKER):
        with span("message.crm_upsert", phone=PHONE, note=MARKER):
            pass
    with pytest.raises(ConnectionError), span("message.send", parent=carrier, to=PHONE, text=MARKER):
        raise ConnectionError(f"could not send {MARKER!r} to {PHONE}")
    flush_to_kv()
    text = dump(exported)
    assert MARKER not in text
    assert PHONE not in text and PHONE.lstrip("+") not in text
    assert hash_id(PHONE) in text

    stored = [selectors.trace_get(tenant, t.trace_id) for t in selectors.trace_list(tenant)[0]]
    stored_text = json.dumps([s["spans"] for s in stored])
    assert MARKER not in stored_text and PHONE.lstrip("+") not in stored_text
    kinds = {selectors.trace_list(tenant)[0][i].kind for i in range(len(stored))}
    assert {"http", "message"} <= kinds


def test_django_requests_are_traced_under_the_callers_tenant(tenant_client: TenantClient) -> None:
    tenant = tenant_client.tenant
    assert tenant_client.api.get(f"/api/v1/tenants/{tenant}/bots/metrics").status_code == 200
    flush_to_kv()
    items, _ = selectors.trace_list(tenant, kind="http")
    assert any("bots/metrics" in item.name for item in items), [i.name for i in items]
    listed = tenant_client.api.get(f"/api/v1/tenants/{tenant}/traces", {"kind": "http"}).json()
    assert listed["items"] and listed["items"][0]["kind"] == "http"
    one = tenant_client.api.get(f"/api/v1/tenants/{tenant}/traces/{listed['items'][0]['trace_id']}").json()
    assert one["spans"][0]["depth"] == 0 and one["spans"][0]["attributes"]["botmesh.tenant"] == tenant


def test_a_trace_filter_with_a_control_character_is_422_naming_conversation(tenant_client: TenantClient) -> None:
    """A new user's ``?conversation=%00`` was refused naming ``prefix``, the Kv scan's own argument."""
    tenant = tenant_client.tenant
    r = tenant_client.api.get(f"/api/v1/tenants/{tenant}/traces", {"conversation": "\x00"})
    assert r.status_code == 422, r.content
    assert r.json()["field"] == "conversation", r.json()


def test_stored_request_spans_keep_no_client_ip_or_user_agent(tenant_client: TenantClient) -> None:
    """A trace must not show who called: client IPs and user agents are kept only as keyed hashes.

    Regression: found by exploratory testing (request spans kept ``net.peer.ip`` and ``http.user_agent``).
    """
    tenant = tenant_client.tenant
    ip, agent = "203.0.113.77", "Mozilla/5.0 (Exploratory; Tester) Gecko/20100101"
    response = tenant_client.api.get(f"/api/v1/tenants/{tenant}/bots/metrics", REMOTE_ADDR=ip, HTTP_USER_AGENT=agent)
    assert response.status_code == 200
    flush_to_kv()
    items, _ = selectors.trace_list(tenant, kind="http")
    stored = json.dumps([selectors.trace_get(tenant, item.trace_id)["spans"] for item in items])
    assert "bots/metrics" in stored
    assert ip not in stored and "Exploratory" not in stored
    assert hash_id(ip) in stored and hash_id(agent) in stored


def test_client_attributes_of_any_convention_version_become_hashes() -> None:
    """Found by exploratory testing: old and new OpenTelemetry names of the caller are all hashed."""
    from botmesh_admin.observability.guard import guard_attributes

    names = (
        "http.client_ip",
        "client.address",
        "net.peer.ip",
        "net.sock.peer.addr",
        "network.peer.address",
        "net.peer.name",
        "http.user_agent",
        "user_agent.original",
    )
    guarded = guard_attributes({name: "198.51.100.9" for name in names} | {"http.method": "GET"})
    assert guarded == {f"{name}_hash": hash_id("198.51.100.9") for name in names} | {"http.method": "GET"}


def test_a_tenant_id_with_a_digit_run_is_kept_while_the_same_digits_elsewhere_are_hashed() -> None:
    """A flake found a product bug: tenant ``obs-8166590161`` was filed as ``obs-h:bada…`` (the digit run
    read as a phone number), so the trace was credited to no tenant. Tenant ids are shop names."""
    from botmesh_admin.observability.guard import guard_attributes

    guarded = guard_attributes({"botmesh.tenant": "shop-5730012345", "http.route": "/t/shop-5730012345/"})
    assert guarded == {"botmesh.tenant": "shop-5730012345", "http.route": f"/t/shop-h:{hash_id('5730012345')}/"}


def test_probes_and_metrics_scrapes_are_not_traced(tenant_client: TenantClient, exported: InMemorySpanExporter) -> None:
    tenant_client.api.get("/healthz")
    tenant_client.api.get("/metrics")
    assert [s.name for s in exported.get_finished_spans()] == []


def test_celery_tasks_are_traced(exported: InMemorySpanExporter) -> None:
    from botmesh_admin.celery import app

    @app.task(name="tests.observability.add")
    def add(a: int, b: int) -> int:
        return a + b

    with span("message.enqueue"):
        assert add.apply(args=(2, 3)).get() == 5
    names = [s.name for s in exported.get_finished_spans()]
    assert any("tests.observability.add" in n for n in names), names


def test_marker_text_of_a_real_webhook_and_reply_appears_in_no_span(
    tenant_client: TenantClient, exported: InMemorySpanExporter
) -> None:
    """The real path: signed WhatsApp webhook → journal → inbox projection → agent reply → provider send."""
    pytest.importorskip("inbox.handlers")
    from botmesh_admin.channels import whatsapp
    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.channels.testing import FakeProviderServer
    from botmesh_admin.demo import fixtures_dir
    from botmesh_admin.events.services import journal_drain

    tenant = tenant_client.tenant
    secret = json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())["app_secret"]
    raw = (fixtures_dir() / "whatsapp" / "raw" / "01_text.json").read_text()
    raw = raw.replace("Hola, ¿tienen envíos a Medellín? 🚚", f"Mi pedido {MARKER}").encode()
    signature = whatsapp.signature(raw, secret)

    def drain(channel: str) -> None:
        while sum(journal_drain(channel=channel, limit=500).values()):
            pass

    with FakeProviderServer() as fake:
        channel_config_set(
            tenant,
            kind="whatsapp",
            name="main",
            phone_number_id="106540352242922",
            app_secret=secret,
            access_token="EAAG-test",
            api_base_url=fake.base_url,
        )
        response = tenant_client.api.post(
            f"/webhooks/whatsapp/{tenant}",
            data=raw,
            content_type="application/json",
            HTTP_X_HUB_SIGNATURE_256=signature,
        )
        assert response.status_code == 200, response.content
        drain("inbound")
        conversations = tenant_client.api.get(f"/api/v1/tenants/{tenant}/conversations").json()["items"]
        assert len(conversations) == 1
        reply = tenant_client.api.post(
            f"/api/v1/tenants/{tenant}/conversations/{conversations[0]['id']}/reply",
            {"text": f"Respuesta {MARKER}"},
            content_type="application/json",
        )
        assert reply.status_code == 202, reply.content
        drain("outbox")
        assert any(MARKER in json.dumps(r.body) for r in fake.requests), "the text did reach the provider"
    flush_to_kv()
    text = dump(exported)
    assert "inbox." in text or "message." in text  # the path was traced
    assert MARKER not in text and "573001112233" not in text
    for scope in (tenant, None):
        for summary in selectors.trace_list(scope, limit=200)[0]:
            stored = json.dumps(selectors.trace_get(scope, summary.trace_id)["spans"])
            assert MARKER not in stored and "573001112233" not in stored


def test_hash_id_follows_a_changed_key(settings) -> None:  # type: ignore[no-untyped-def]
    before = hash_id(PHONE)
    settings.BOTMESH_HASH_KEY = "another-key"
    assert hash_id(PHONE) != before


def test_a_webhook_is_one_trace_from_its_server_span_to_the_projection(
    tenant_client: TenantClient, exported: InMemorySpanExporter
) -> None:
    """Webhooks skip the generic Django instrumentation: their own SERVER span roots the message's trace.

    Only an authenticated webhook files its trace under the tenant; a bad signature names none.
    """
    from opentelemetry.trace import SpanKind

    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.demo import fixtures_dir
    from botmesh_admin.events.services import journal_drain

    tenant = tenant_client.tenant
    signed = json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())
    raw = (fixtures_dir() / "whatsapp" / "raw" / "01_text.json").read_bytes()
    channel_config_set(
        tenant, kind="whatsapp", name="main", phone_number_id="106540352242922", app_secret=signed["app_secret"]
    )
    post = tenant_client.api.post
    assert (
        post(
            f"/webhooks/whatsapp/{tenant}",
            data=raw,
            content_type="application/json",
            HTTP_X_HUB_SIGNATURE_256="sha256=" + "0" * 64,
        ).status_code
        == 401
    )
    assert (
        post(
            f"/webhooks/whatsapp/{tenant}",
            data=raw,
            content_type="application/json",
            HTTP_X_HUB_SIGNATURE_256=signed["signatures"]["01_text.json"],
        ).status_code
        == 200
    )
    assert journal_drain(channel="inbound")["processed"] == 1

    spans = exported.get_finished_spans()
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    assert [s.name for s in servers] == ["POST /webhooks/whatsapp/{tenant}"] * 2
    assert {s.attributes["http.route"] for s in servers} == {"/webhooks/whatsapp/{tenant}"}
    refused, accepted = servers
    assert refused.attributes["http.response.status_code"] == 401 and "botmesh.tenant" not in refused.attributes
    assert accepted.attributes["http.response.status_code"] == 200
    assert accepted.attributes["botmesh.tenant"] == tenant and accepted.attributes["botmesh.events"] == 1
    (projection,) = [s for s in spans if s.name == "inbox.project"]
    assert projection.context.trace_id == accepted.context.trace_id
    assert projection.parent.span_id == accepted.context.span_id
    # the trace is found from its conversation (the traces page's conversation filter)

    conversation = default_store().conversation_by_chat(tenant, "whatsapp:573001112233", channel_name="main")
    assert projection.attributes["botmesh.conversation_id"] == conversation.id
    flush_to_kv()
    found = selectors.trace_list(tenant, conversation=conversation.id)[0]
    assert [t.trace_id for t in found] == [format(accepted.context.trace_id, "032x")]


def test_webhooks_never_enter_the_generic_django_instrumentation(
    tenant_client: TenantClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A webhook (its own server span) skips the instrumentation's middleware; an API request still runs it.

    Excluded URLs recorded nothing but still cost three absolute-URL rebuilds and matches per
    request (issue 21: the web side of a webhook does only its own work).
    """
    from opentelemetry.instrumentation.django.middleware.otel_middleware import _DjangoMiddleware

    seen: list[str] = []
    original = _DjangoMiddleware.process_request

    def counted(self: _DjangoMiddleware, request: Any) -> Any:
        seen.append(request.path)
        return original(self, request)

    monkeypatch.setattr(_DjangoMiddleware, "process_request", counted)
    tenant = tenant_client.tenant
    assert (
        tenant_client.api.post(f"/webhooks/whatsapp/{tenant}", data=b"{}", content_type="application/json").status_code
        == 404
    )
    assert tenant_client.api.get(f"/api/v1/tenants/{tenant}/bots/metrics").status_code == 200
    assert seen == [f"/api/v1/tenants/{tenant}/bots/metrics"]


def test_server_spans_name_their_route_in_one_syntax(
    tenant_client: TenantClient, exported: InMemorySpanExporter
) -> None:
    """Regression for issue 18 item 7: API and page spans said Django's ``<str:tenant>``, webhooks another form.

    Every request span is ``"<METHOD> <route>"`` with the route as OpenAPI and
    the OpenTelemetry ``http.route`` convention write it (``/t/{tenant}/metrics/``).
    """
    from opentelemetry.trace import SpanKind

    tenant = tenant_client.tenant
    assert tenant_client.api.get(f"/api/v1/tenants/{tenant}/bots/metrics").status_code == 200
    assert tenant_client.api.get(f"/api/v1/tenants/{tenant}/traces/{'0' * 32}").status_code == 404
    assert tenant_client.page.get(f"/t/{tenant}/metrics/").status_code == 200
    servers = [s for s in exported.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert [s.name for s in servers] == [
        "GET /api/v1/tenants/{tenant}/bots/metrics",
        "GET /api/v1/tenants/{tenant}/traces/{trace_id}",
        "GET /t/{tenant}/metrics/",
    ]
    assert [s.attributes["http.route"] for s in servers] == [s.name.split(" ", 1)[1] for s in servers]


def test_each_ledger_record_is_projected_in_a_trace_of_its_own_linked_to_the_push(
    tenant_client: TenantClient, exported: InMemorySpanExporter
) -> None:
    """Issue 20, item 1: a push of 480 records was one trace of 483 spans, credited to one conversation."""
    from botmesh_admin.demo import fixtures_dir
    from botmesh_admin.events.services import journal_drain

    lines = (fixtures_dir() / "ledger" / "messages.jsonl").read_text().splitlines()[:3]
    records = [dict(json.loads(line), tenantId=None) for line in lines]
    response = tenant_client.bot.post(
        f"/api/v1/tenants/{tenant_client.tenant}/ledger", records, content_type="application/json"
    )
    assert response.status_code == 202, response.content
    assert journal_drain(channel="ledger")["processed"] == 3
    spans = exported.get_finished_spans()
    (push,) = [s for s in spans if s.name.startswith("POST") and "ledger" in s.name]
    assert push.attributes["botmesh.records"] == 3
    projections = [s for s in spans if s.name == "inbox.project"]
    assert len({p.context.trace_id for p in projections} | {push.context.trace_id}) == 4
    for projection in projections:
        assert projection.parent is None
        assert [link.context.span_id for link in projection.links] == [push.context.span_id]
        assert projection.attributes["botmesh.tenant"] == tenant_client.tenant
        assert len(projection.attributes["botmesh.message_id_hashes"]) == 1


def test_a_path_beyond_latin_1_is_answered_and_traced(
    tenant_client: TenantClient, exported: InMemorySpanExporter
) -> None:
    """open-telemetry/opentelemetry-python-contrib#3237: a path with ``注文`` or ``🤖`` was a 500 under tracing."""
    from urllib.parse import quote

    response = tenant_client.page.get(f"/t/{tenant_client.tenant}/traces/{quote('注文🤖')}/")
    assert response.status_code == 404
    (server,) = [s for s in exported.get_finished_spans() if s.name.startswith("GET /t/")]
    assert server.name == "GET /t/{tenant}/traces/{trace_id}/"
    assert 404 in (server.attributes.get("http.status_code"), server.attributes.get("http.response.status_code"))
