"""Fixtures of the observability tests: a tenant with an API client, a member's browser session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.kv import DurableKv, connect
from botmesh_admin.kv.runtime import use_kv
from botmesh_admin.observability import metrics
from botmesh_admin.observability.stores.memory import MemoryCounterStore
from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id


class BotClient:
    """Requests as a bot token of the bot the path names (``…/bots/<bot>/…``): a bot token acts only as its
    own bot, so one is created per bot on first use; paths naming no bot use the first token."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.clients: dict[str, Client] = {}

    def client(self, path: str) -> Client:
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(path).path.split("/")
        bot = unquote(parts[parts.index("bots") + 1]) if "bots" in parts[:-1] else "bot"
        if not 1 <= len(bot) <= 63:  # no bot id: the path is refused (422 naming bot) before the token's bot
            bot = "bot"
        if bot not in self.clients:
            _, token = tenancy.token_create(self.tenant, name="bot", role="bot", bot=bot)
            self.clients[bot] = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
        return self.clients[bot]

    def get(self, path: str, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        return self.client(path).get(path, *args, **kwargs)

    def post(self, path: str, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        return self.client(path).post(path, *args, **kwargs)


@dataclass
class TenantClient:
    """A tenant, API clients holding an agent's and a bot's token, and a logged-in member's client.

    A bot token may only push (ledger, metrics), so pushes go through ``bot`` and reads through ``api``.
    """

    tenant: str
    api: Client
    page: Client
    token: str
    bot: BotClient

    def push(self, bot: str, body: dict, **extra: object):  # type: ignore[no-untyped-def]
        # A client percent-escapes the bot id (any text: "/", newlines, any script).
        return self.bot.post(
            f"/api/v1/tenants/{self.tenant}/bots/{quote(bot, safe='')}/metrics",
            body,
            content_type="application/json",
            **extra,
        )


def make_tenant(role: str = "agent") -> TenantClient:
    tenant = unique_id("obs")
    tenancy.tenant_create(tenant, name=f"Tenant {tenant}")
    _, plaintext = tenancy.token_create(tenant, name="agent", role="agent")
    user = get_user_model().objects.create_user(username=f"u-{tenant}", password="pw-12345678")
    tenancy.membership_set(tenant, username=user.username, role=role)
    page = Client()
    page.force_login(user)
    return TenantClient(
        tenant=tenant,
        api=Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}"),
        page=page,
        token=plaintext,
        bot=BotClient(tenant),
    )


@pytest.fixture
def fresh_kv() -> Iterator[DurableKv]:
    """A fresh in-memory Kv as the default Kv for the test (isolates the stores' data)."""
    kv = connect("memory://")
    with use_kv(kv):
        yield kv


@pytest.fixture
def counters() -> Iterator[MemoryCounterStore]:
    """Process counters in a fresh memory store."""
    with metrics.use_counter_store(MemoryCounterStore()) as store:
        yield store


@pytest.fixture
def tenant_client(db: None, fresh_kv: DurableKv) -> TenantClient:
    """A tenant with an agent API token and a logged-in agent."""
    return make_tenant("agent")


@pytest.fixture
def admin_client(db: None, fresh_kv: DurableKv) -> TenantClient:
    """A tenant with an agent API token and a logged-in admin."""
    return make_tenant("admin")
