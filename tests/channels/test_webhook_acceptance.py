"""Webhook acceptance as a service (``channels.services.webhooks``): which number, whose secret, then the journal.

The views only map these answers to HTTP (``test_webhooks.py`` drives them);
here the rules are called directly: a refusal writes nothing, and the body of
a request no channel could accept is never read.
"""

from __future__ import annotations

import pytest

from botmesh_admin.channels import services
from botmesh_admin.channels.whatsapp import signature
from botmesh_admin.events import connect_journal, use_journal

from .conftest import fixture_path


@pytest.fixture
def journal():
    journal = connect_journal("memory://")
    with use_journal(journal):
        yield journal


def _unread() -> bytes:
    raise AssertionError("the body of a request no channel accepts is not read")


def test_a_body_signed_with_another_numbers_secret_is_refused_and_writes_nothing(configured, journal) -> None:
    services.channel_config_set("tienda", kind="whatsapp", name="second", phone_number_id="222", app_secret="s2")
    raw = fixture_path("whatsapp", "raw", "01_text.json").read_bytes()  # a change for the number of "main"
    with pytest.raises(services.WebhookRefused) as refused:
        services.webhook_whatsapp_accept("tienda", read_body=lambda: raw, signature=signature(raw, "s2"))
    assert (refused.value.status, refused.value.code) == (401, "bad_signature")
    assert "not signed with this number's app secret" in refused.value.message
    assert journal.list(tenant="tienda", limit=10) == []
    accepted = services.webhook_whatsapp_accept(
        "tienda", read_body=lambda: raw, signature=signature(raw, configured.app_secret)
    )
    assert len(accepted.events) == 1 and accepted.skipped == 0
    [record] = journal.list(tenant="tienda", limit=10)
    assert (str(record.id), record.payload["config"]) == (accepted.event_id, "main")
    assert accepted.events[0].channel_name == "main"


def test_no_channel_or_a_wrong_secret_is_refused_without_reading_the_body(configured, journal) -> None:
    with pytest.raises(services.WebhookRefused) as refused:
        services.webhook_whatsapp_accept("otra", read_body=_unread, signature="sha256=00")
    assert (refused.value.status, refused.value.code) == (404, "not_found")
    with pytest.raises(services.WebhookRefused) as refused:
        services.webhook_telegram_accept("tienda", name="bot", read_body=_unread, secret="not-the-secret")
    assert (refused.value.status, refused.value.code, refused.value.message) == (
        401,
        "bad_secret",
        "X-Telegram-Bot-Api-Secret-Token does not match",
    )
    with pytest.raises(services.WebhookRefused) as refused:
        services.webhook_telegram_accept("tienda", name="nope", read_body=_unread, secret=configured.telegram_secret)
    assert refused.value.status == 404
    assert journal.list(tenant="tienda", limit=10) == []


def test_a_whatsapp_from_that_is_no_phone_number_is_skipped_not_stored(configured, journal) -> None:
    """A fresh user's report: ``"from": "12345"`` made conversation whatsapp:12345, whose handoff the
    bots' API refuses (``must be whatsapp:<wa_id>``): the bot asked every minute and never answered."""
    import json

    body = json.loads(fixture_path("whatsapp", "raw", "01_text.json").read_text())
    value = body["entry"][0]["changes"][0]["value"]
    value["messages"][0]["from"] = "12345"
    for contact in value.get("contacts", []):
        contact["wa_id"] = "12345"
    raw = json.dumps(body).encode()
    accepted = services.webhook_whatsapp_accept(
        "tienda", read_body=lambda: raw, signature=signature(raw, configured.app_secret)
    )
    assert (len(accepted.events), accepted.skipped) == (0, 1)
    [record] = journal.list(tenant="tienda", limit=10)  # journaled, as every accepted body: with no event
    assert record.payload["events"] == []
