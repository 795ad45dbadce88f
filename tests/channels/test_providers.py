"""Providers against the local fake provider server, for every answer of send_responses.json."""

from __future__ import annotations

import socket
import time

import pytest

from botmesh_admin.channels.domain import OutboundMessage, SendResult, Template
from botmesh_admin.channels.providers import (
    ConsoleProvider,
    Provider,
    TelegramProvider,
    WhatsAppProvider,
)
from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.errors import ValidationError

from .conftest import TG_BOT_TOKEN as TOKEN
from .conftest import WA_PHONE_NUMBER_ID as PHONE_ID


def wa(fake: FakeProviderServer, **kw) -> WhatsAppProvider:
    return WhatsAppProvider(fake.base_url, PHONE_ID, "EAAG-token", **kw)


def tg(fake: FakeProviderServer, **kw) -> TelegramProvider:
    return TelegramProvider(fake.base_url, TOKEN, **kw)


def test_whatsapp_accepted_answers_with_the_canonical_wa_id(fake) -> None:
    result = wa(fake).send(OutboundMessage("+57 300 111 2233", text="Hola", idempotency_key="reply-1"))
    assert result.status == "accepted" and result.accepted
    assert result.recipient == "573001112233" and result.chat_key == "+57 300 111 2233"
    assert result.provider_message_id.startswith("wamid.")
    [req] = fake.requests
    assert req.path == f"/{PHONE_ID}/messages"
    assert req.body == {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": "+57 300 111 2233",
        "type": "text",
        "text": {"body": "Hola", "preview_url": False},
    }
    assert req.headers["authorization"] == "Bearer EAAG-token" and req.headers["idempotency-key"] == "reply-1"


def test_whatsapp_chat_key_is_stripped_and_template_has_parameters(fake) -> None:
    message = OutboundMessage("whatsapp:573001112233", template=Template("pedido_listo", "es", ("Ana", "8812")))
    assert wa(fake).send(message).recipient == "573001112233"
    body = fake.requests[0].body
    assert body["to"] == "573001112233" and body["type"] == "template"
    assert body["template"] == {
        "name": "pedido_listo",
        "language": {"code": "es"},
        "components": [
            {"type": "body", "parameters": [{"type": "text", "text": "Ana"}, {"type": "text", "text": "8812"}]}
        ],
    }


@pytest.mark.parametrize(
    ("answer", "code", "retryable", "retry_after_ms"),
    [("window_closed", 131047, False, None), ("rate_limited", 130429, True, 1000), ("bad_token", 190, False, None)],
)
def test_whatsapp_errors(fake, answer, code, retryable, retry_after_ms) -> None:
    fake.script("573001112233", answer)
    result = wa(fake).send(OutboundMessage("whatsapp:573001112233", text="hola"))
    assert result == SendResult(
        status="failed",
        chat_key="whatsapp:573001112233",
        error_code=code,
        error_title=result.error_title,
        retryable=retryable,
        retry_after_ms=retry_after_ms,
    )
    assert result.error_title


def test_telegram_accepted(fake) -> None:
    result = tg(fake).send(OutboundMessage("telegram:700000001", text="Claro, te ayudo.", reply_to="700000001:3"))
    assert result.accepted and result.recipient == "700000001"
    assert result.provider_message_id.startswith("700000001:")
    [req] = fake.requests
    assert req.path == f"/bot{TOKEN}/sendMessage"
    assert req.body == {
        "chat_id": 700000001,
        "text": "Claro, te ayudo.",
        "reply_parameters": {"message_id": 3, "allow_sending_without_reply": True},
    }


def test_telegram_reply_to_an_id_that_is_no_ascii_number_is_sent_without_reply_parameters(fake) -> None:
    """``"²".isdigit()`` is True but ``int("²")`` fails: no Telegram message id, and no send fails on it."""
    result = tg(fake).send(OutboundMessage("telegram:700000001", text="hola", reply_to="700000001:²"))
    assert result.accepted
    assert fake.requests[0].body == {"chat_id": 700000001, "text": "hola"}


def test_telegram_group_participant_is_answered_in_the_group(fake) -> None:
    tg(fake).send(OutboundMessage("telegram:-1001234567890:700000002", text="hola"))
    assert fake.requests[0].body["chat_id"] == -1001234567890


@pytest.mark.parametrize(
    ("answer", "code", "retryable", "retry_after_ms"),
    [("blocked", 403, False, None), ("rate_limited", 429, True, 3000), ("chat_not_found", 400, False, None)],
)
def test_telegram_errors(fake, answer, code, retryable, retry_after_ms) -> None:
    fake.script("700000001", answer)
    result = tg(fake).send(OutboundMessage("telegram:700000001", text="hola"))
    assert (result.status, result.error_code, result.retryable, result.retry_after_ms) == (
        "failed",
        code,
        retryable,
        retry_after_ms,
    )
    assert result.error_title


def test_telegram_refuses_templates_without_a_request(fake) -> None:
    result = tg(fake).send(OutboundMessage("telegram:1", template=Template("x")))
    assert (result.status, result.retryable) == ("failed", False) and fake.count() == 0


def test_broadcast_returns_one_result_per_message_in_order(fake) -> None:
    fake.script("+52 1 55 1234 5678", "window_closed")
    fake.script("573009998877", "rate_limited", times=1)
    messages = [
        OutboundMessage(f"whatsapp:{n}", text="promo")
        for n in ("573001112233", "5215512345678", "573009998877", "573009998877")
    ]
    results = wa(fake, max_workers=3).broadcast(messages)
    assert [(r.chat_key, r.status) for r in results] == [
        ("whatsapp:573001112233", "accepted"),
        ("whatsapp:5215512345678", "failed"),
        (results[2].chat_key, results[2].status),
        (results[3].chat_key, results[3].status),
    ]
    # the rate limit answered exactly one of the two sends to 573009998877, the other was accepted
    assert sorted(r.status for r in results[2:]) == ["accepted", "failed"]
    assert fake.count("573009998877") == 2 and fake.count() == 4


def test_network_error_is_a_retryable_failure() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = WhatsAppProvider(f"http://127.0.0.1:{port}", PHONE_ID, "t", timeout_s=2).send(
        OutboundMessage("whatsapp:1", text="x")
    )
    assert (result.status, result.retryable, result.error_code) == ("failed", True, None)


def test_dropped_connection_and_timeout_are_retryable_failures_recorded_once(fake) -> None:
    fake.script("573001112233", "drop")
    result = wa(fake).send(OutboundMessage("whatsapp:573001112233", text="x"))
    assert (result.status, result.retryable) == ("failed", True)
    assert fake.count("573001112233") == 1  # the request arrived: the outbox must not blindly resend
    fake.script("573001112233", "accepted", delay_s=1.0)
    started = time.monotonic()
    result = wa(fake, timeout_s=0.2).send(OutboundMessage("whatsapp:573001112233", text="x"))
    assert (result.status, result.retryable) == ("failed", True) and time.monotonic() - started < 0.9


def test_slow_provider_delays_the_answer(fake) -> None:
    fake.set_delay(0.2)
    started = time.monotonic()
    assert tg(fake).send(OutboundMessage("telegram:1", text="x")).accepted
    assert time.monotonic() - started >= 0.2


def test_script_rejects_unknown_answers(fake) -> None:
    with pytest.raises(ValueError, match="unknown answer"):
        fake.script("1", "sometimes")


def test_console_provider_accepts_and_is_stable_per_idempotency_key() -> None:
    console = ConsoleProvider("whatsapp")
    assert isinstance(console, Provider)
    first = console.send(OutboundMessage("whatsapp:573001112233", text="x", idempotency_key="k1"))
    again = console.send(OutboundMessage("whatsapp:573001112233", text="x", idempotency_key="k1"))
    assert first.accepted and first.provider_message_id == again.provider_message_id
    assert first.recipient == "573001112233" and len(console.sent) == 2


def test_outbound_message_is_validated() -> None:
    with pytest.raises(ValidationError, match="message.text"):
        OutboundMessage("whatsapp:1")
    with pytest.raises(ValidationError, match="message.text"):
        OutboundMessage("whatsapp:1", text="x" * 4097)
    with pytest.raises(ValidationError, match="message.chat_key"):
        OutboundMessage(" ", text="x")


def test_a_redirect_is_a_failure_and_is_never_followed(fake) -> None:
    """A provider (or what answers in its place) redirecting a send elsewhere gets no second request."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            self.send_response(307)
            self.send_header("Location", f"{fake.base_url}/{PHONE_ID}/messages")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = WhatsAppProvider(f"http://127.0.0.1:{server.server_port}", PHONE_ID, "EAAG-token")
        result = provider.send(OutboundMessage("whatsapp:573001112233", text="hola"))
    finally:
        server.shutdown()
        server.server_close()
    assert (result.status, result.error_code, result.retryable) == ("failed", 307, False)
    assert fake.count() == 0


@pytest.mark.parametrize("kind", ["whatsapp", "telegram"])
def test_public_only_refuses_a_loopback_provider_before_sending(fake, kind) -> None:
    """Production's check at connection time: the address reached must be public; nothing is sent."""
    provider = wa(fake, public_only=True) if kind == "whatsapp" else tg(fake, public_only=True)
    result = provider.send(OutboundMessage(f"{kind}:573001112233", text="hola"))
    assert (result.status, result.retryable) == ("failed", False)
    assert "non-public address" in result.error_title
    assert fake.count() == 0
    assert wa(fake).send(OutboundMessage("whatsapp:573001112233", text="hola")).status == "accepted"


@pytest.mark.django_db
def test_in_production_a_tenant_base_url_reaching_a_private_address_gets_nothing(fake, settings) -> None:
    """A URL saved while it looked public (a host name that later resolves to this machine) is checked again
    at every connection in production; the operator's own ``BOTMESH_*_API_BASE`` is trusted."""
    from dataclasses import replace

    from botmesh_admin.channels.providers import provider_for
    from botmesh_admin.channels.selectors import channel_config_list
    from botmesh_admin.channels.services import channel_config_set
    from botmesh_admin.tenancy.services import tenant_create
    from tests.backends import unique_id

    tenant = unique_id("ssrf")
    tenant_create(tenant, name="SSRF")
    channel_config_set(tenant, kind="telegram", name="bot", bot_token=TOKEN, api_base_url=fake.base_url)
    (channel,) = channel_config_list(tenant, kind="telegram")
    message = OutboundMessage("telegram:700000001", text="hola")
    settings.CONFIG = replace(settings.CONFIG, profile="production")
    refused = provider_for(tenant, channel).send(message)
    assert (refused.status, refused.retryable) == ("failed", False) and fake.count() == 0
    settings.BOTMESH_TELEGRAM_API_BASE = fake.base_url  # the operator's setting, not the tenant's
    assert provider_for(tenant, replace(channel, api_base_url=None)).send(message).status == "accepted"
    assert fake.count() == 1


def test_development_allows_a_loopback_fake_but_no_other_private_address(fake) -> None:
    """``allow_loopback`` (development): the local fake provider is reached; this machine's private
    interface address (not loopback) is refused before a byte is sent."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    provider = wa(fake, public_only=True, allow_loopback=True)
    assert provider.send(OutboundMessage("whatsapp:573001112233", text="hola")).status == "accepted"
    assert fake.count() == 1

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: it only picks the outgoing interface
        private = probe.getsockname()[0]
    except OSError:
        pytest.skip("this machine has no non-loopback IPv4 address")
    finally:
        probe.close()
    import ipaddress

    if ipaddress.ip_address(private).is_global:
        pytest.skip(f"this machine's address {private} is public")
    hits: list[str] = []

    class Accept(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", 0), Accept)  # noqa: S104 - reached through the private address
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        inside = WhatsAppProvider(
            f"http://{private}:{server.server_port}", PHONE_ID, "EAAG-token", public_only=True, allow_loopback=True
        )
        result = inside.send(OutboundMessage("whatsapp:573001112233", text="hola"))
    finally:
        server.shutdown()
        server.server_close()
    assert (result.status, result.retryable) == ("failed", False) and "non-public address" in result.error_title
    assert hits == []
