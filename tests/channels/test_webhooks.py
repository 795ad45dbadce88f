"""Webhook views: signed bytes are journaled before the 200; anything unauthenticated writes nothing."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from botmesh_admin.channels.domain import event_from_json
from botmesh_admin.events import connect_journal, use_journal

from .conftest import WA_VERIFY_TOKEN, fixture_path, load_json, telegram_updates

SIGNATURES = load_json("whatsapp", "raw", "signatures.json")
TG_HEADER = "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"


@pytest.fixture
def journal():
    journal = connect_journal("memory://")
    with use_journal(journal):
        yield journal


def records(journal, tenant: str = "tienda") -> list:
    return journal.list(tenant=tenant, limit=200)


def post_wa(
    client: Client, name: str, *, raw: bytes | None = None, signature: str | None = None, tenant: str = "tienda"
):
    raw = fixture_path("whatsapp", "raw", name).read_bytes() if raw is None else raw
    header = SIGNATURES["signatures"][name] if signature is None else signature
    return client.post(
        f"/webhooks/whatsapp/{tenant}", raw, content_type="application/json", HTTP_X_HUB_SIGNATURE_256=header
    )


@pytest.mark.parametrize("name", sorted(SIGNATURES["signatures"]))
def test_signed_fixture_is_journaled_before_200(configured, journal, client: Client, name: str) -> None:
    resp = post_wa(client, name)
    assert resp.status_code == 200
    [record] = records(journal)
    assert (record.type, record.channel, record.tenant, record.state) == (
        "whatsapp.webhook",
        "inbound",
        "tienda",
        "pending",
    )
    assert record.payload["config"] == "main"
    assert resp.json() == {"received": len(record.payload["events"]), "event_id": record.id}


def test_batch_journals_three_messages_in_one_envelope(configured, journal, client: Client) -> None:
    assert post_wa(client, "08_batch.json").status_code == 200
    [record] = records(journal)
    events = [event_from_json(e) for e in record.payload["events"]]
    assert len(events) == 3 and {e.chat_key for e in events} == {"whatsapp:5215512345678", "whatsapp:573001112233"}


def test_redelivery_is_journaled_once(configured, journal, client: Client) -> None:
    first = post_wa(client, "01_text.json").json()
    again = post_wa(client, "01_text.json").json()
    assert first == again and len(records(journal)) == 1


@pytest.mark.parametrize("position", [0, 100, -2])
def test_one_changed_byte_gets_401_and_writes_nothing(configured, journal, client: Client, position: int) -> None:
    raw = bytearray(fixture_path("whatsapp", "raw", "01_text.json").read_bytes())
    raw[position] ^= 0x20
    resp = post_wa(client, "01_text.json", raw=bytes(raw))
    assert resp.status_code == 401 and resp.json()["error"] == "bad_signature"
    assert records(journal) == []


def test_wrong_secret_or_missing_header_gets_401(configured, journal, client: Client) -> None:
    from botmesh_admin.channels.whatsapp import signature

    raw = fixture_path("whatsapp", "raw", "01_text.json").read_bytes()
    wrong = post_wa(client, "01_text.json", signature=signature(raw, "wrong-secret"))
    assert wrong.status_code == 401 and wrong.json()["message"] == "X-Hub-Signature-256 does not match the body"
    resp = client.post("/webhooks/whatsapp/tienda", raw, content_type="application/json")
    assert resp.status_code == 401 and resp.json()["message"] == "X-Hub-Signature-256 is missing"
    assert records(journal) == []


def test_unknown_tenant_or_number_is_404(configured, journal, client: Client) -> None:
    assert post_wa(client, "01_text.json", tenant="nadie").status_code == 404
    assert post_wa(client, "01_text.json", tenant="otra").status_code == 404  # exists, no WhatsApp channel
    from botmesh_admin.channels.whatsapp import signature

    raw = fixture_path("whatsapp", "raw", "01_text.json").read_bytes().replace(b"106540352242922", b"999")
    assert post_wa(client, "01_text.json", raw=raw, signature=signature(raw, configured.app_secret)).status_code == 404
    assert records(journal) == []


def test_signed_bad_json_is_400(configured, journal, client: Client) -> None:
    from botmesh_admin.channels.whatsapp import signature

    for raw in (b"{not json", b"[1, 2]"):
        assert post_wa(client, "x", raw=raw, signature=signature(raw, configured.app_secret)).status_code == 400
    assert records(journal) == []


def test_body_signed_with_another_numbers_secret_is_401(configured, journal, client: Client) -> None:
    from botmesh_admin.channels import services
    from botmesh_admin.channels.whatsapp import signature

    services.channel_config_set(
        "tienda", kind="whatsapp", name="second", phone_number_id="222", app_secret="second-secret"
    )
    raw = fixture_path("whatsapp", "raw", "01_text.json").read_bytes()  # for number 106540352242922
    assert post_wa(client, "x", raw=raw, signature=signature(raw, "second-secret")).status_code == 401
    other = raw.replace(b"106540352242922", b"222")
    assert post_wa(client, "x", raw=other, signature=signature(other, "second-secret")).status_code == 200
    assert [r.payload["config"] for r in records(journal)] == ["second"]


def test_handshake(configured, client: Client) -> None:
    params = {"hub.mode": "subscribe", "hub.verify_token": WA_VERIFY_TOKEN, "hub.challenge": "1158201444"}
    resp = client.get("/webhooks/whatsapp/tienda", params)
    assert (resp.status_code, resp.content) == (200, b"1158201444")
    assert client.get("/webhooks/whatsapp/tienda", {**params, "hub.verify_token": "nope"}).status_code == 403
    assert client.get("/webhooks/whatsapp/otra", params).status_code == 404


@pytest.mark.parametrize("name", sorted(telegram_updates()))
def test_telegram_update_with_secret_is_journaled(configured, journal, client: Client, name: str) -> None:
    raw = fixture_path("telegram", name).read_bytes()
    resp = client.post(
        "/webhooks/telegram/tienda/bot", raw, content_type="application/json", **{TG_HEADER: configured.telegram_secret}
    )
    assert resp.status_code == 200
    [record] = records(journal)
    assert (record.type, record.channel, record.payload["config"]) == ("telegram.update", "inbound", "bot")
    assert record.idempotency_key == f"telegram:bot:{telegram_updates()[name]['update_id']}"
    assert len(record.payload["events"]) == 1


def test_telegram_kicked_event_survives_the_journal(configured, journal, client: Client) -> None:
    raw = fixture_path("telegram", "08_blocked.json").read_bytes()
    client.post(
        "/webhooks/telegram/tienda/bot", raw, content_type="application/json", **{TG_HEADER: configured.telegram_secret}
    )
    [event] = [event_from_json(e) for e in records(journal)[0].payload["events"]]
    assert event.blocked and event.chat_key == "telegram:700000001"


def test_telegram_bad_secret_unknown_channel_and_bad_body(configured, journal, client: Client) -> None:
    raw = fixture_path("telegram", "02_text.json").read_bytes()
    url = "/webhooks/telegram/tienda/bot"
    wrong = client.post(url, raw, content_type="application/json", **{TG_HEADER: "wrong"})
    assert wrong.status_code == 401 and wrong.json()["message"].endswith("does not match")
    missing = client.post(url, raw, content_type="application/json")
    assert missing.status_code == 401 and missing.json()["message"] == "X-Telegram-Bot-Api-Secret-Token is missing"
    assert (
        client.post(
            "/webhooks/telegram/tienda/main",
            raw,
            content_type="application/json",
            **{TG_HEADER: configured.telegram_secret},
        ).status_code
        == 404
    )  # main is WhatsApp
    assert (
        client.post(
            "/webhooks/telegram/otra/bot",
            raw,
            content_type="application/json",
            **{TG_HEADER: configured.telegram_secret},
        ).status_code
        == 404
    )
    assert (
        client.post(
            url, b'{"no_update_id": 1}', content_type="application/json", **{TG_HEADER: configured.telegram_secret}
        ).status_code
        == 400
    )
    assert client.get(url).status_code == 405
    assert records(journal) == []


def test_webhooks_need_no_csrf_token(configured, journal) -> None:
    client = Client(enforce_csrf_checks=True)
    assert post_wa(client, "01_text.json").status_code == 200


# -- the per-process copy of the configuration (selectors.channel_config_list_cached) -----------


def channel_queries(client: Client, *requests) -> int:
    """Send ``requests`` (callables taking the client); return how many channel-table queries they ran."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        for request in requests:
            request(client)
    return sum("channels_channelconfig" in q["sql"] for q in ctx.captured_queries)


def test_webhooks_read_the_configuration_once_per_ttl(configured, journal, client: Client) -> None:
    raw = fixture_path("telegram", "02_text.json").read_bytes()
    first = channel_queries(client, lambda c: post_wa(c, "01_text.json"))
    again = channel_queries(
        client,
        lambda c: post_wa(c, "02_image_caption.json"),
        lambda c: c.post(
            "/webhooks/telegram/tienda/bot",
            raw,
            content_type="application/json",
            **{TG_HEADER: configured.telegram_secret},
        ),
    )
    assert (first, again) == (1, 0)
    assert len(records(journal)) == 3


def test_secret_rotated_by_another_process_is_honoured_at_once(configured, journal, client: Client) -> None:
    from botmesh_admin.channels import credentials
    from botmesh_admin.channels.models import ChannelConfig
    from botmesh_admin.channels.whatsapp import signature

    assert post_wa(client, "01_text.json").status_code == 200  # the copy now holds the old secret
    # Another process rotates the secret: this process's copy is not told.
    ChannelConfig.objects.filter(tenant_id="tienda", name="main").update(
        app_secret_encrypted=credentials.encrypt("rotated-secret")
    )
    raw = fixture_path("whatsapp", "raw", "04_reaction.json").read_bytes()
    assert post_wa(client, "x", raw=raw, signature=signature(raw, "rotated-secret")).status_code == 200
    other = fixture_path("whatsapp", "raw", "06_statuses.json").read_bytes()
    assert post_wa(client, "x", raw=other, signature=signature(other, configured.app_secret)).status_code == 401


def test_number_added_by_another_process_is_found_at_once(configured, journal, client: Client) -> None:
    from botmesh_admin.channels import credentials
    from botmesh_admin.channels.models import ChannelConfig
    from botmesh_admin.channels.whatsapp import signature

    assert post_wa(client, "01_text.json").status_code == 200
    ChannelConfig.objects.create(
        tenant_id="tienda",
        kind="whatsapp",
        name="second",
        phone_number_id="222",
        app_secret_encrypted=credentials.encrypt("second-secret"),
    )
    raw = fixture_path("whatsapp", "raw", "01_text.json").read_bytes().replace(b"106540352242922", b"222")
    assert post_wa(client, "x", raw=raw, signature=signature(raw, "second-secret")).status_code == 200
    assert [r.payload["config"] for r in records(journal)][0] == "second"


def test_a_change_through_services_drops_the_copy_at_once(configured, journal, client: Client) -> None:
    from botmesh_admin.channels import services
    from botmesh_admin.channels.whatsapp import signature

    assert post_wa(client, "01_text.json").status_code == 200
    services.channel_config_set("tienda", kind="whatsapp", name="main", app_secret="changed-secret")
    raw = fixture_path("whatsapp", "raw", "04_reaction.json").read_bytes()
    assert post_wa(client, "x", raw=raw, signature=signature(raw, configured.app_secret)).status_code == 401
    services.channel_config_delete("tienda", name="main")
    assert channel_queries(client, lambda c: post_wa(c, "x", raw=raw, signature=signature(raw, "changed-secret"))) == 2


DEEP = b"[" * 3000 + b"]" * 3000


def test_signed_deeply_nested_json_is_400_not_500(configured, journal, client: Client) -> None:
    """Found by exploratory testing: a signed body nested 3000 levels deep answered 500 with a traceback."""
    from botmesh_admin.channels.whatsapp import signature

    for raw in (DEEP, b'{"entry": ' + DEEP + b"}"):
        resp = post_wa(client, "x", raw=raw, signature=signature(raw, configured.app_secret))
        assert resp.status_code == 400 and resp.json()["error"] == "bad_request"
    assert records(journal) == []


def test_telegram_deeply_nested_json_with_secret_is_400_not_500(configured, journal, client: Client) -> None:
    """Found by exploratory testing: an update nested 3000 levels deep answered 500 with a traceback."""
    for raw in (DEEP, b'{"update_id": 1, "message": ' + DEEP + b"}"):
        resp = client.post(
            "/webhooks/telegram/tienda/bot",
            raw,
            content_type="application/json",
            **{TG_HEADER: configured.telegram_secret},
        )
        assert resp.status_code == 400 and resp.json()["error"] == "bad_request"
    assert records(journal) == []


def test_signed_message_with_unreadable_time_is_refused_and_not_journaled(configured, journal, client: Client) -> None:
    """Found by exploratory testing: a webhook timestamp "abc" was journaled and shown as 1 Jan 1970."""
    from botmesh_admin.channels.whatsapp import signature

    raw = fixture_path("whatsapp", "raw", "01_text.json").read_bytes()
    body = json.loads(raw)
    body["entry"][0]["changes"][0]["value"]["messages"][0]["timestamp"] = "abc"
    raw = json.dumps(body).encode()
    resp = post_wa(client, "x", raw=raw, signature=signature(raw, configured.app_secret))
    assert resp.status_code == 422
    assert resp.json()["field"] == "entry[0].changes[0].value.messages[0].timestamp"
    assert records(journal) == []


def test_telegram_message_with_unreadable_date_is_400_and_not_journaled(configured, journal, client: Client) -> None:
    """Found by exploratory testing: a Telegram date "abc" was journaled and shown as 1 Jan 1970."""
    update = telegram_updates()["02_text.json"]
    update["message"]["date"] = "abc"
    resp = client.post(
        "/webhooks/telegram/tienda/bot",
        json.dumps(update),
        content_type="application/json",
        **{TG_HEADER: configured.telegram_secret},
    )
    assert resp.status_code == 400 and "message.date" in resp.json()["message"]
    assert resp.json()["field"] == "message.date"  # named as WhatsApp's 422 names its timestamp
    assert records(journal) == []
