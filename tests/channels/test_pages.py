"""The channels admin page and API: secrets are write-only, shown back only as "set ✓"."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.channels import selectors
from botmesh_admin.channels.domain import OutboundMessage
from botmesh_admin.channels.providers import provider_for
from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.tenancy import services as tenancy

from .conftest import TG_BOT_TOKEN, WA_ACCESS_TOKEN


@pytest.fixture
def admin_client(configured) -> Client:
    users = get_user_model()
    users.objects.create_user("alice", password="alice-password-1")
    users.objects.create_user("bob", password="bob-password-1")
    tenancy.membership_set("tienda", username="alice", role="admin")
    tenancy.membership_set("tienda", username="bob", role="agent")
    client = Client()
    client.login(username="alice", password="alice-password-1")
    return client


def test_list_shows_set_marks_and_webhook_urls_but_no_secret(admin_client: Client, configured) -> None:
    html = admin_client.get("/t/tienda/channels/").content.decode()
    assert 'href="/t/tienda/channels/"' in html  # nav link
    assert "App secret: set ✓" in html and "Bot token: set ✓" in html
    assert (
        "http://testserver/webhooks/whatsapp/tienda" in html
        and "http://testserver/webhooks/telegram/tienda/bot" in html
    )
    for secret in (configured.app_secret, configured.telegram_secret, WA_ACCESS_TOKEN, TG_BOT_TOKEN):
        assert secret not in html
    edit = admin_client.get("/t/tienda/channels/?edit=main").content.decode()
    assert "Update WhatsApp number main" in edit and configured.app_secret not in edit and WA_ACCESS_TOKEN not in edit


def test_admin_adds_updates_and_deletes_a_channel(admin_client: Client) -> None:
    resp = admin_client.post(
        "/t/tienda/channels/",
        {
            "kind": "telegram",
            "name": "soporte",
            "bot_username": "@soporte_bot",
            "bot_token": TG_BOT_TOKEN,
            "webhook_secret": "s3cret-token",
            "api_base_url": "",
        },
    )
    assert resp.status_code == 302
    channel = selectors.channel_config_get("tienda", name="soporte")
    assert channel.bot_username == "soporte_bot" and channel.check("webhook_secret", "s3cret-token")
    # an update with empty secret fields keeps them
    admin_client.post(
        "/t/tienda/channels/?edit=soporte",
        {"kind": "telegram", "name": "soporte", "bot_username": "soporte2_bot", "bot_token": "", "webhook_secret": ""},
    )
    channel = selectors.channel_config_get("tienda", name="soporte")
    assert channel.bot_username == "soporte2_bot" and channel.secret("bot_token") == TG_BOT_TOKEN
    asked = admin_client.post("/t/tienda/channels/soporte/delete")  # no confirm=yes: the page asks first
    assert asked.status_code == 200 and "Delete the channel &#x27;soporte&#x27;?" in asked.content.decode()
    assert admin_client.post("/t/tienda/channels/soporte/delete", {"confirm": "yes"}).status_code == 302
    assert [c.name for c in selectors.channel_config_list("tienda")] == ["bot", "main"]


def test_invalid_form_shows_the_field_and_keeps_no_secret(admin_client: Client) -> None:
    resp = admin_client.post(
        "/t/tienda/channels/",
        {"kind": "whatsapp", "name": "w2", "phone_number_id": "abc", "app_secret": "top-secret-value"},
    )
    html = resp.content.decode()
    assert resp.status_code == 422 and "top-secret-value" not in html
    # under its field in plain words (not the API's path); the typed id kept
    assert "channel.phone_number_id" not in html and 'value="abc"' in html
    assert 'id="whatsapp-phone_number_id-error" role="alert"' in html


def test_agents_and_other_tenants_cannot_open_it(admin_client: Client) -> None:
    agent = Client()
    agent.login(username="bob", password="bob-password-1")
    assert agent.get("/t/tienda/channels/").status_code == 403
    assert admin_client.get("/t/otra/channels/").status_code == 404


def test_api_put_get_list_delete(configured) -> None:
    _, token = tenancy.token_create("tienda", name="ci")
    _, other = tenancy.token_create("otra", name="ci")
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    resp = api.put(
        "/api/v1/tenants/tienda/channels/wa2",
        {"kind": "whatsapp", "phone_number_id": "333", "app_secret": "s3", "access_token": "tok"},
        content_type="application/json",
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["secrets"] == {"app_secret": True, "verify_token": False, "access_token": True}
    assert body["webhook_path"] == "/webhooks/whatsapp/tienda" and "s3" not in resp.content.decode().replace(
        "secrets", ""
    )
    assert [c["name"] for c in api.get("/api/v1/tenants/tienda/channels").json()] == ["bot", "main", "wa2"]
    bad = api.put("/api/v1/tenants/tienda/channels/wa3", {"kind": "whatsapp"}, content_type="application/json")
    assert (bad.status_code, bad.json()["field"]) == (422, "channel.phone_number_id")
    foreign = Client(HTTP_AUTHORIZATION=f"Bearer {other}")
    assert foreign.get("/api/v1/tenants/tienda/channels/main").status_code == 404
    assert foreign.get("/api/v1/tenants/otra/channels/main").status_code == 404
    assert api.delete("/api/v1/tenants/tienda/channels/wa2").status_code == 204
    assert api.get("/api/v1/tenants/tienda/channels/wa2").status_code == 404


def test_configured_channel_sends_through_the_fake_provider(configured, settings) -> None:
    with FakeProviderServer() as fake:
        settings.BOTMESH_WHATSAPP_API_BASE = fake.base_url
        settings.BOTMESH_TELEGRAM_API_BASE = fake.base_url
        wa = provider_for("tienda", selectors.channel_config_get("tienda", name="main"))
        tg = provider_for("tienda", selectors.channel_config_get("tienda", name="bot"))
        assert wa.send(OutboundMessage("whatsapp:573001112233", text="hola")).accepted
        assert tg.send(OutboundMessage("telegram:700000001", text="hola")).accepted
        assert [r.provider for r in fake.requests] == ["whatsapp", "telegram"]
        assert fake.requests[0].headers["authorization"] == f"Bearer {WA_ACCESS_TOKEN}"
        assert fake.requests[1].path == f"/bot{TG_BOT_TOKEN}/sendMessage"
