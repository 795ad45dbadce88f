"""A tenant wired to the local fake provider, driven over real HTTP: the inbox's end-to-end tests share it.

``open_shop`` creates a tenant with agent ``ana``, an API token and its channels
(WhatsApp ``main`` and Telegram ``bot``, or Telegram alone) pointed at a
``FakeProviderServer``; ``post_whatsapp`` / ``post_telegram`` send the shared
fixture webhooks signed as the providers sign them, and ``drain`` runs the
journal's workers until a channel is empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from inbox.stores import default_store
from tests.backends import unique_id

PHONE_NUMBER_ID = "106540352242922"
BOT_TOKEN = "600000000:AAF-fixture-bot-token-not-real-xyz"


@dataclass
class Shop:
    tenant: str
    client: Client
    token: str
    fake: FakeProviderServer

    def api(self, method: str, path: str, body=None):
        """Call ``/api/v1/tenants/<tenant>/<path>`` with the shop's token; return ``(status, JSON body)``."""
        response = getattr(self.client, method)(
            f"/api/v1/tenants/{self.tenant}/{path}",
            data=json.dumps(body) if body is not None else None,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.token}",
        )
        return response.status_code, response.json()


def _signatures() -> dict:
    return json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())


def _telegram_secret() -> str:
    return json.loads((fixtures_dir() / "telegram" / "meta.json").read_text())["secret_token"]


@contextmanager
def open_shop(prefix: str, *, whatsapp: bool = True) -> Iterator[Shop]:
    """Yield a fresh tenant ``<prefix>-…`` with Telegram ``bot`` (and WhatsApp ``main``) on a fake provider."""
    from botmesh_admin.channels.services import channel_config_set

    tenant = unique_id(prefix)
    tenancy.tenant_create(tenant, name="Shop")
    get_user_model().objects.get_or_create(username="ana")
    tenancy.membership_set(tenant, username="ana", role="agent")
    with FakeProviderServer() as fake:
        if whatsapp:
            channel_config_set(
                tenant,
                kind="whatsapp",
                name="main",
                phone_number_id=PHONE_NUMBER_ID,
                app_secret=_signatures()["app_secret"],
                access_token="EAAG-test",
                api_base_url=fake.base_url,
            )
        channel_config_set(
            tenant,
            kind="telegram",
            name="bot",
            bot_token=BOT_TOKEN,
            webhook_secret=_telegram_secret(),
            api_base_url=fake.base_url,
        )
        yield Shop(tenant, Client(), tenancy.token_create(tenant, name="ci")[1], fake)


def drain(channel: str = "inbound") -> None:
    """Run the journal's worker of ``channel`` until nothing is left to claim."""
    while sum(journal_drain(channel=channel, limit=500).values()):
        pass


def post_whatsapp(shop: Shop, name: str, signature: str | None = None) -> int:
    """POST the raw WhatsApp fixture ``name``, signed with its fixture signature unless given; return the status."""
    raw = (fixtures_dir() / "whatsapp" / "raw" / name).read_bytes()
    response = shop.client.post(
        f"/webhooks/whatsapp/{shop.tenant}",
        data=raw,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=signature or _signatures()["signatures"][name],
    )
    return response.status_code


def post_telegram(shop: Shop, name: str) -> int:
    """POST the Telegram fixture ``name`` to channel ``bot`` with its secret token; return the status."""
    response = shop.client.post(
        f"/webhooks/telegram/{shop.tenant}/bot",
        data=(fixtures_dir() / "telegram" / name).read_bytes(),
        content_type="application/json",
        HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=_telegram_secret(),
    )
    return response.status_code


def conversation(shop: Shop, chat_key: str):
    """Return the stored conversation of ``chat_key`` on the channel that received it."""
    # Each fixture chat is on the channel that received it: "main" (the number) or "bot".
    channel_name = "main" if chat_key.startswith("whatsapp:") else "bot"
    conv = default_store().conversation_by_chat(shop.tenant, chat_key, channel_name=channel_name)
    assert conv is not None
    return conv
