"""A reply the provider refuses because the user blocked the bot denies the contact's consent, as a campaign send does.

End to end over real HTTP: a signed Telegram webhook creates the conversation
and its CRM contact, the agent replies through the API, the outbox worker
sends to the local fake provider (answering 403 "Forbidden: bot was blocked by
the user"), and the contact read back through the API shows Telegram consent
``denied`` with the provider's words as evidence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id

BOT_TOKEN = "600000000:AAF-fixture-bot-token-not-real-xyz"
SOFIA = "700000001"  # the Telegram user of fixtures 02_text.json (private chat) and 05_group_a.json (a group)
GROUP = "-1001234567890"


@dataclass
class Shop:
    tenant: str
    client: Client
    token: str
    fake: FakeProviderServer

    def api(self, method: str, path: str, body=None):
        response = getattr(self.client, method)(
            f"/api/v1/tenants/{self.tenant}/{path}",
            data=json.dumps(body) if body is not None else None,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.token}",
        )
        return response.status_code, response.json()


@pytest.fixture
def shop(db):
    from botmesh_admin.channels.services import channel_config_set

    tenant = unique_id("blk")
    tenancy.tenant_create(tenant, name="Shop")
    get_user_model().objects.get_or_create(username="ana")
    tenancy.membership_set(tenant, username="ana", role="agent")
    meta = json.loads((fixtures_dir() / "telegram" / "meta.json").read_text())
    with FakeProviderServer() as fake:
        channel_config_set(
            tenant,
            kind="telegram",
            name="bot",
            bot_token=BOT_TOKEN,
            webhook_secret=meta["secret_token"],
            api_base_url=fake.base_url,
        )
        yield Shop(tenant, Client(), tenancy.token_create(tenant, name="ci")[1], fake)


def drain(channel: str) -> None:
    while sum(journal_drain(channel=channel, limit=500).values()):
        pass


def _incoming(shop: Shop, fixture: str) -> None:
    meta = json.loads((fixtures_dir() / "telegram" / "meta.json").read_text())
    response = shop.client.post(
        f"/webhooks/telegram/{shop.tenant}/bot",
        data=(fixtures_dir() / "telegram" / fixture).read_bytes(),
        content_type="application/json",
        HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=meta["secret_token"],
    )
    assert response.status_code == 200, response.content
    drain("inbound")


def _reply(shop: Shop, chat_key: str, text: str) -> dict:
    status, page = shop.api("get", "conversations?limit=50")
    assert status == 200
    [conv] = [c for c in page["items"] if c["chat_key"] == chat_key]
    status, reply = shop.api("post", f"conversations/{conv['id']}/reply", {"text": text})
    assert status == 202, reply
    drain("outbox")
    status, thread = shop.api("get", f"conversations/{conv['id']}/messages?limit=50")
    assert status == 200
    return next(m for m in thread["items"] if m["id"] == reply["id"])


def _sofia(shop: Shop) -> dict:
    status, page = shop.api("get", f"contacts?identity=telegram:{SOFIA}")
    assert status == 200
    [contact] = page["items"]
    return contact


def test_a_reply_to_a_user_who_blocked_the_bot_denies_their_telegram_consent_with_the_evidence(shop):
    _incoming(shop, "02_text.json")
    assert _sofia(shop)["consent"].get("telegram", {}).get("status") != "denied"
    shop.fake.script(SOFIA, "blocked")
    message = _reply(shop, f"telegram:{SOFIA}", "¿Te ayudo con la dirección?")
    assert (message["reply"]["state"], message["reply"]["error_code"]) == ("failed", 403)
    consent = _sofia(shop)["consent"]["telegram"]
    assert consent["status"] == "denied" and consent["source"] == "inbox"
    assert consent["evidence"] == f"Telegram 403 to reply {message['id']}: Forbidden: bot was blocked by the user"
    assert shop.fake.count(SOFIA) == 1  # not retried


def test_a_403_in_a_group_is_the_bot_leaving_the_group_not_the_user_blocking_it(shop):
    _incoming(shop, "05_group_a.json")
    shop.fake.script(GROUP, "blocked")
    message = _reply(shop, f"telegram:{GROUP}:{SOFIA}", "Sí, 20% este mes")
    assert (message["reply"]["state"], message["reply"]["error_code"]) == ("failed", 403)
    assert _sofia(shop)["consent"].get("telegram", {}).get("status") != "denied"
