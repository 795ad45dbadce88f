"""The bot-side client against the real admin (live server) and a real coordinator (Redis).

Inbound messages go in as a bot's ledger push over HTTP and are projected by the
events worker; the replicas read them from ``GET …/bots/{bot}/inbound``, answer
through ``POST …/bots/{bot}/replies`` under their chat's turn, and the answers
are what an agent reads in the conversation's thread.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from botmesh_admin.botclient import AdminClient, BotReplica, InboundMessage, coordinator_for
from botmesh_admin.events import default_journal
from botmesh_admin.events.handlers import dispatch
from botmesh_admin.events.worker import EventWorker
from tests import backends

pytestmark = pytest.mark.django_db(transaction=True)

BOT = "tienda-bot"
LEASE_MS = 1500


def _drain(channel: str = "ledger") -> None:
    worker = EventWorker(default_journal(), lease_ms=30_000, channel=channel)
    while sum(worker.run_batch(dispatch, 50).values()):
        pass


def _get(url: str, token: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=20) as response:
        return json.loads(response.read())


def _inbound(i: int, chat: int, text: str = "hola") -> dict:
    return {
        "id": f"in-{chat}-{i}",
        "channel": "whatsapp",
        "chatId": f"whatsapp:57300{chat:07d}",
        "senderId": f"whatsapp:57300{chat:07d}",
        "direction": "in",
        "type": "text",
        "body": text,
        "timestamp": int(time.time() * 1000) - 60_000 + i,
    }


@pytest.fixture
def tenant(live_server):
    from botmesh_admin.tenancy import services as tenancy

    tenant = backends.unique_id("bots")
    tenancy.tenant_create(tenant, name="Bots")
    return tenant


@pytest.fixture
def tokens(tenant):
    from botmesh_admin.tenancy import services as tenancy

    return {
        "bot": tenancy.token_create(tenant, name="bot", role="bot")[1],
        "admin": tenancy.token_create(tenant, name="ci")[1],
    }


@pytest.fixture
def admin(live_server, tenant, tokens) -> AdminClient:
    return AdminClient(live_server.url, tenant=tenant, bot=BOT, token=tokens["bot"])


@pytest.fixture
def replicas(admin, tenant, redis_url, request):
    made: list[BotReplica] = []

    def make(replica_id: str, **kwargs) -> BotReplica:
        coordinator = coordinator_for(redis_url, tenant=tenant, bot=BOT, lease_ms=LEASE_MS, replica_id=replica_id)
        replica = BotReplica(admin, coordinator, **kwargs)
        made.append(replica)
        return replica

    yield make
    for replica in made:
        replica.close(release=False)


def _push(admin: AdminClient, records: list[dict]) -> None:
    assert admin.ledger_push(records)["accepted"] == len(records)
    _drain()


def _thread(live_server, tenant, token, conversation_id) -> list[dict]:
    base = f"{live_server.url}/api/v1/tenants/{tenant}/conversations/{conversation_id}/messages?limit=200"
    return _get(base, token)["items"]


def test_a_message_is_handled_under_its_chats_turn_and_the_turn_released_after(
    admin, replicas, live_server, tenant, tokens
):
    _push(admin, [_inbound(0, 1, "hola")])
    replica = replicas("r1")
    seen: list[tuple[str, bool]] = []
    other = replicas("r2")

    def handler(message: InboundMessage) -> str:
        # While r1 handles the chat, r2 cannot take its turn.
        seen.append((message.text or "", other.coordinator.acquire_turn(message.turn_key, 0) is None))
        return "¡Hola! menu"

    done = replica.poll(handler, since_ms=0)
    assert [h.outcome for h in done] == ["answered"]
    assert seen == [("hola", True)]
    items, _ = admin.inbound(since_ms=0)
    assert other.coordinator.acquire_turn(items[0].turn_key, 0) is not None  # released after handling
    assert [(i.text, i.answered) for i in items] == [("hola", True)]
    thread = _thread(live_server, tenant, tokens["admin"], items[0].conversation_id)
    assert [(m["direction"], m["text"], m["source"]) for m in thread] == [
        ("in", "hola", "ledger"),
        ("out", "¡Hola! menu", "bot"),
    ]
    assert thread[1]["reply"]["state"] == "queued"
    _drain("outbox")  # the same outbox and console provider as an agent's reply
    assert _thread(live_server, tenant, tokens["admin"], items[0].conversation_id)[1]["reply"]["state"] == "accepted"
    conversation = _get(
        f"{live_server.url}/api/v1/tenants/{tenant}/conversations/{items[0].conversation_id}", tokens["admin"]
    )
    assert conversation["handoff"] is None and conversation["assignee"] is None  # the bot took nothing over
