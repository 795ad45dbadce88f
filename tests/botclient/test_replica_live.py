"""The bot-side client against the real admin (live server) and a real coordinator (Redis).

Inbound messages go in as a bot's ledger push over HTTP and are projected by the
events worker; the replicas read them from ``GET …/bots/{bot}/inbound``, answer
through ``POST …/bots/{bot}/replies`` under their chat's turn, and the answers
are what an agent reads in the conversation's thread.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from botmesh_admin.botclient import AdminClient, AdminError, BotReplica, InboundMessage, coordinator_for
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
        "bot": tenancy.token_create(tenant, name="bot", role="bot", bot=BOT)[1],
        "admin": tenancy.token_create(tenant, name="ci")[1],
    }


@pytest.fixture
def admin(live_server, tenant, tokens) -> AdminClient:
    # A long timeout: the machine the suite runs on may be loaded (the first request builds the API, too).
    return AdminClient(live_server.url, tenant=tenant, bot=BOT, token=tokens["bot"], timeout_s=60)


@pytest.fixture(params=["redis", "kv-sqlite"])
def coordination_url(request, tmp_path) -> str:
    """The coordinators a bot replica runs over: Redis, and the Kv (SQLite file) of the embedded default."""
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    return f"kv:sqlite:///{tmp_path}/coordination.sqlite3"


@pytest.fixture
def replicas(admin, tenant, coordination_url):
    made: list[BotReplica] = []

    def make(replica_id: str, lease_ms: int = LEASE_MS, **kwargs) -> BotReplica:
        coordinator = coordinator_for(
            coordination_url, tenant=tenant, bot=BOT, lease_ms=lease_ms, replica_id=replica_id
        )
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


def test_a_chat_a_human_holds_is_left_alone(admin, replicas, live_server, tenant, tokens):
    _push(admin, [_inbound(0, 2, "hola"), _inbound(1, 3, "menu")])
    items, _ = admin.inbound(since_ms=0)
    held = next(i for i in items if i.text == "hola")
    url = f"{live_server.url}/api/v1/tenants/{tenant}/conversations/{held.conversation_id}/handoff"
    request = urllib.request.Request(
        url,
        data=json.dumps({"active": True}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {tokens['admin']}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=20).close()
    assert admin.handoff(held.chat_id).handed_off

    replica = replicas("r1")
    # The feed says so, and a replica that handles it anyway (it read the feed before) re-reads the handoff.
    assert [(i.text, i.handed_off) for i in admin.inbound(since_ms=0)[0]] == [("menu", False), ("hola", True)]
    assert replica.handle(held, lambda m: "¡Hola!").outcome == "handed_off"
    assert [h.outcome for h in replica.poll(lambda m: "Menú", since_ms=0)] == ["answered"]
    with pytest.raises(AdminError) as refused:  # and the admin refuses an answer in a held chat
        admin.reply(held, "¡Hola!", fence=10**9)
    assert (refused.value.status, refused.value.code) == (409, "handed_off")
    thread = _thread(live_server, tenant, tokens["admin"], held.conversation_id)
    assert [(m["direction"], m["text"]) for m in thread] == [("in", "hola")]

    replica.push()  # the dropped answer goes to the ledger: the metrics page counts it
    _drain()
    thread = _thread(live_server, tenant, tokens["admin"], held.conversation_id)
    assert [(m["direction"], m["dropped"]) for m in thread] == [("in", None), ("out", "handoff")]
    samples = _get(f"{live_server.url}/api/v1/tenants/{tenant}/bots/{BOT}/metrics?replica=r1", tokens["admin"])
    assert samples[-1]["snapshot"]["dropped"]["handoff"] == 1


def test_three_replicas_answer_a_burst_exactly_once_and_never_hold_a_chat_together(
    admin, replicas, live_server, tenant, tokens
):
    chats, per_chat = 8, 6
    _push(admin, [_inbound(i, 100 + i % chats, f"mensaje {i}") for i in range(chats * per_chat)])
    # Leases long enough that a loaded machine never starves a renewal: this test is about turns and answers.
    group = [replicas(f"r{n}", lease_ms=10_000) for n in range(3)]
    handled: list = []
    lock = threading.Lock()

    def work(replica: BotReplica) -> None:
        for _ in range(100):
            done = replica.poll(lambda m: f"respuesta a {m.text}", since_ms=0, limit=5)
            with lock:
                handled.extend((replica.replica_id, h) for h in done)
            if not done and all(i.answered for i in admin.inbound(since_ms=0, limit=200)[0]):
                return

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(work, group))
    elapsed = time.monotonic() - started
    answered = [h for _, h in handled if h.outcome == "answered"]
    assert sorted(h.message_id for h in answered) == sorted(
        f"in-{100 + i % chats}-{i}" for i in range(chats * per_chat)
    )
    assert {h.outcome for _, h in handled} <= {"answered", "duplicate"}, [h for _, h in handled]
    by_chat: dict[str, list] = {}
    for replica_id, h in handled:
        by_chat.setdefault(h.conversation_id, []).append((h.start_ms, h.end_ms, replica_id))
    for spans in by_chat.values():  # turns of one chat never overlap (end of one ≤ start of the next)
        spans.sort()
        assert all(a[1] <= b[0] + 1 for a, b in zip(spans, spans[1:], strict=False)), spans
    replies = []
    for conversation_id in by_chat:
        thread = _thread(live_server, tenant, tokens["admin"], conversation_id)
        replies += [m for m in thread if m["direction"] == "out"]
    assert sorted(m["reply_to"] for m in replies) == sorted(h.message_id for h in answered)  # once each
    shares = sorted(sum(1 for r, h in handled if r == rid and h.outcome == "answered") for rid in ("r0", "r1", "r2"))
    assert shares[0] > 0, shares  # the work is shared
    print(f"BOTCLIENT burst: {len(answered)} answered once by 3 replicas {shares} "
          f"({len(handled) - len(answered)} duplicates refused) in {elapsed:.1f} s")  # fmt: skip


def test_a_late_answer_with_the_fence_of_a_turn_taken_over_is_refused(admin, replicas, tenant):
    _push(admin, [_inbound(0, 7, "hola")])
    [message], _ = admin.inbound(since_ms=0)
    frozen, live = replicas("frozen"), replicas("live")
    turn = frozen.coordinator.acquire_turn(message.turn_key, 0)
    assert turn is not None
    frozen.coordinator.close(release=False)  # its renewals stop, as in a process frozen past its lease
    started = time.monotonic()
    assert live.poll(lambda m: "¡Hola!", since_ms=0) == []  # a poll skips a chat whose turn is held
    assert live.handle(message, lambda m: "¡Hola!").outcome == "answered"  # waits its turn (FIFO)
    assert time.monotonic() - started < LEASE_MS / 1000 + 5  # the turn passed on once the lease ran out
    assert not turn.valid()
    with pytest.raises(AdminError) as refused:
        admin.reply(message, "¡Hola! (tarde)", fence=turn.fence)
    assert (refused.value.status, refused.value.code) == (409, "stale_fence")
    assert refused.value.body["current_version"] > turn.fence


class Switch:
    """A transport the test opens and closes (the exclusive provider session of a bot)."""

    def __init__(self) -> None:
        self.up = True
        self.opened = 0

    def open(self) -> None:
        self.opened += 1

    def close(self) -> None:
        pass

    def is_open(self) -> bool:
        return self.up


def test_the_provider_leader_steps_down_once_its_transport_is_closed_for_provider_down_ms(replicas):
    first, second = Switch(), Switch()
    a = replicas("a", provider_id="main", transport=first, provider_down_ms=300)
    b = replicas("b", provider_id="main", transport=second, provider_down_ms=300)
    a.tick()
    b.tick()
    assert (a.is_provider_leader(), b.is_provider_leader()) == (True, False)
    assert (a.is_scheduler(), b.is_scheduler()) == (True, False)
    first.up = False
    a.tick()
    assert a.is_provider_leader()  # closed, but not yet for provider_down_ms
    time.sleep(0.35)
    a.tick()
    assert not a.is_provider_leader()
    b.tick()
    assert b.is_provider_leader() and second.opened == 1  # the other replica took the lead and opened its transport
    a.tick()
    assert not a.is_provider_leader()  # it stays down while its transport is closed
    events = a.coordinator.snapshot().events
    assert [(e.kind, e.name, e.detail) for e in events if e.kind == "step-down"] == [
        ("step-down", "provider:main", "transport closed for 300 ms")
    ]
    assert any(e.kind == "handover" and e.name == "provider:main" and e.replica_id == "b" for e in events)


def test_the_feed_reads_a_message_answered_before_the_bot_came_as_answered(admin, replicas):
    asked = _inbound(0, 9, "hola")
    answered_then = {**asked, "id": "out-9-1", "senderId": "bot", "direction": "out", "body": "¡Hola!",
                     "timestamp": asked["timestamp"] + 5}  # fmt: skip
    _push(admin, [asked, answered_then, _inbound(10, 9, "menu")])
    assert [(i.text, i.answered) for i in admin.inbound(since_ms=0)[0]] == [("hola", True), ("menu", False)]
    done = replicas("r1").poll(lambda m: "Menú", since_ms=0)
    assert [(h.message_id, h.outcome) for h in done] == [("in-9-10", "answered")]
    assert [(i.text, i.answered) for i in admin.inbound(since_ms=0)[0]] == [("hola", True), ("menu", True)]


def test_a_replica_whose_turn_ran_out_while_it_handled_sends_nothing(admin, replicas, live_server, tenant, tokens):
    _push(admin, [_inbound(0, 8, "hola")])
    [message], _ = admin.inbound(since_ms=0)
    stalled, live = replicas("stalled"), replicas("live")
    outcome: list[str] = []

    def stall(m: InboundMessage) -> str:
        stalled.coordinator.close(release=False)  # renewals stop, as in a process frozen mid-handling
        outcome.append(live.handle(m, lambda _: "¡Hola!").outcome)  # the chat's next turn, once the lease ran out
        return "¡Hola! (tarde)"

    assert stalled.handle(message, stall).outcome == "stale_fence"  # the client saw its lease gone: nothing sent
    assert outcome == ["answered"]
    thread = _thread(live_server, tenant, tokens["admin"], message.conversation_id)
    assert [(m["direction"], m["text"]) for m in thread] == [("in", "hola"), ("out", "¡Hola!")]


def test_the_inbound_feed_pages_conversations_newest_first_and_stops_at_since_ms(admin, live_server, tenant, tokens):
    from botmesh_admin.tenancy import services as tenancy

    now = int(time.time() * 1000)
    _push(admin, [{**_inbound(0, 200 + n, f"chat {n}"), "timestamp": now - 50_000 + n * 1000} for n in range(5)])
    seen, after, pages = [], None, 0
    while True:
        items, after = admin.inbound(since_ms=0, after=after, limit=2)
        seen += [i.text for i in items]
        pages += 1
        if after is None:
            break
    assert (seen, pages) == (["chat 4", "chat 3", "chat 2", "chat 1", "chat 0"], 3)
    items, after = admin.inbound(since_ms=now - 50_000 + 2500, limit=2)  # chats 3 and 4 only
    assert [i.text for i in items] == ["chat 4", "chat 3"]
    items, after = admin.inbound(since_ms=now - 50_000 + 2500, after=after, limit=2)
    assert (items, after) == ([], None)  # the sweep ended at the first older conversation
    with pytest.raises(AdminError) as bad:
        admin.inbound(since_ms=0, after="garbage")
    assert (bad.value.status, bad.value.body.get("field")) == (422, "after")
    other = backends.unique_id("other")
    tenancy.tenant_create(other, name="Other")
    foreign = AdminClient(
        live_server.url, tenant=tenant, bot=BOT, token=tenancy.token_create(other, name="b", role="bot")[1]
    )
    with pytest.raises(AdminError) as refused:  # another tenant's bot token reads nothing of this tenant
        foreign.inbound(since_ms=0)
    assert (refused.value.status, refused.value.body.get("items")) == (404, None)


def test_the_replicas_log_names_a_chat_by_a_keyed_hash_only(admin, tokens, caplog, monkeypatch):
    """Review of the bot replicas: the log held plain SHA-256 of the chat id (reversible by hashing phone
    numbers). It is HMAC-SHA256, by BOTMESH_HASH_KEY (the admin's key: the admin's hash) or the token."""
    import hashlib
    import hmac
    import logging

    from django.conf import settings

    from botmesh_admin.observability.guard import hash_id

    def logged(n: int, key: str | None) -> tuple[str, str]:
        """Answer one new message of chat ``n`` with ``BOTMESH_HASH_KEY`` = ``key``; its chat id and logged hash."""
        if key is None:
            monkeypatch.delenv("BOTMESH_HASH_KEY", raising=False)
        else:
            monkeypatch.setenv("BOTMESH_HASH_KEY", key)
        _push(admin, [_inbound(n, 70 + n, "hola")])
        caplog.clear()
        replica = BotReplica(admin, coordinator_for("memory:", tenant=admin.tenant, bot=BOT, lease_ms=LEASE_MS))
        try:
            with caplog.at_level(logging.INFO, logger="botmesh.botclient"):
                done = replica.poll(lambda message: "hola", since_ms=0)
        finally:
            replica.close(release=False)
        assert [h.outcome for h in done] == ["answered"]
        chat_id = next(m.chat_id for m in admin.inbound(since_ms=0)[0] if m.id == done[0].message_id)
        (line,) = [r.getMessage() for r in caplog.records if "message of chat" in r.getMessage()]
        assert chat_id not in line
        return chat_id, line.split("message of chat ")[1].split()[0]

    chat_id, with_admin_key = logged(0, str(settings.BOTMESH_HASH_KEY))
    assert with_admin_key == hash_id(chat_id)  # one chat, one hash in the bot's and the admin's logs
    chat_id, by_token = logged(1, None)
    key = hashlib.sha256(b"botmesh-bot-log-hash\0" + tokens["bot"].encode()).digest()
    assert by_token == hmac.new(key, chat_id.encode(), hashlib.sha256).hexdigest()[:16]
    assert not hashlib.sha256(chat_id.encode()).hexdigest().startswith(by_token[:12])  # not the unkeyed hash
