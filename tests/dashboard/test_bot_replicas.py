"""The Replicas page and API show each bot's replicas (issue 19, item 3), through the test client.

A bot's replicas are coordinators under ``bot_prefix(tenant, bot)``; here they
share an in-process hub per prefix (the page reads it through
``use_bot_backends``), the admin's own processes the ``web`` fixture's hub.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from botmesh_admin.clock import FakeClock, now_ms, use_clock
from botmesh_admin.coordination.base import bot_prefix
from botmesh_admin.coordination.bots import use_bot_backends
from botmesh_admin.coordination.core import key_digest
from botmesh_admin.coordination.memory import MemoryCoordinator
from botmesh_admin.observability import services as metrics
from botmesh_admin.tenancy import services as tenancy

from .conftest import BotHubs, client_for

pytestmark = pytest.mark.usefixtures("members", "isolated")


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """Lease and heartbeat time on a fake clock (request it before ``bots``: it outlives their replicas)."""
    with use_clock(FakeClock(now_ms())) as fake:
        yield fake


CHAT = "whatsapp:573001112233"


def _push(tenant: str, bot: str, replica: str) -> None:
    metrics.bot_metrics_push(tenant, bot=bot, replica=replica, snapshot={"messages": {"in": 1, "out": 1}})


def _three_replicas(bots: BotHubs) -> tuple[MemoryCoordinator, MemoryCoordinator, MemoryCoordinator]:
    a, b, c = (bots.replica("tienda", "tienda-bot", f"tienda-bot-{i}") for i in (1, 2, 3))
    first = a.try_lead("provider:wa-main")
    assert first is not None and b.try_lead("provider:wa-main") is None
    assert a.step_down("provider:wa-main", reason="transport closed for 30000 ms")
    assert b.try_lead("provider:wa-main") is not None and c.try_lead("scheduler") is not None
    assert c.acquire_turn(CHAT, 0) is not None and c.acquire_turn("telegram:42", 0) is not None
    for replica in (a, b, c):
        replica._beat()
        _push("tienda", "tienda-bot", replica.replica_id)
    return a, b, c


def test_page_shows_each_bots_replicas_leaders_turns_and_events(bots: BotHubs) -> None:
    """Replica id, incarnation, host, heartbeat age, role; leaders with fence and lease; hashed turns; events."""
    a, b, c = _three_replicas(bots)
    html = client_for("bob").get("/t/tienda/replicas/").content.decode()
    section = html.split('data-bot="tienda-bot"')[1].split("</article>")[0]
    for replica in (a, b, c):
        row = section.split(f'data-bot-replica="{replica.replica_id}"')[1].split("</tr>")[0]
        assert replica.incarnation in row and replica.host in row and " s ago" in row
    assert "leads provider:wa-main" in section.split('data-bot-replica="tienda-bot-2"')[1].split("</tr>")[0]
    assert "follower" in section.split('data-bot-replica="tienda-bot-1"')[1].split("</tr>")[0]
    turns_row = section.split('data-bot-replica="tienda-bot-3"')[1].split("</tr>")[0]
    assert key_digest(CHAT) in turns_row and key_digest("telegram:42") in turns_row
    assert "573001112233" not in html  # chat keys are hashed, never shown raw
    assert "2 chat turns held" in section
    leader = section.split('data-bot-lead="provider:wa-main"')[1].split("</tr>")[0]
    assert "tienda-bot-2" in leader and b.incarnation in leader and " ms</td>" in leader
    assert 'data-bot-lead="scheduler"' in section
    events = section.split('data-testid="bot-events"')[1].split("</table>")[0]
    assert 'data-event="step-down"' in events and "transport closed for 30000 ms" in events
    assert 'data-event="handover"' in events and a.owner in events
    # The admin's own processes are a section of their own, after the bots.
    assert html.index('data-testid="admin-processes"') > html.index('data-bot="tienda-bot"')
    admin = html.split('data-testid="admin-processes"')[1]
    assert 'data-replica="web-1"' in admin and "tienda-bot-1" not in admin


def test_the_fragment_polls_itself_and_keeps_the_bot_filter(bots: BotHubs) -> None:
    """htmx swaps ``#replicas-live`` every 2 s from the same URL (``?bot=`` included); no JS needed to read it."""
    _three_replicas(bots)
    only = bots.replica("tienda", "quiet-bot", "quiet-1")
    only._beat()
    html = client_for("bob").get("/t/tienda/replicas/?bot=quiet-bot").content.decode()
    assert 'hx-get="/t/tienda/replicas/?bot=quiet-bot"' in html and 'hx-trigger="every 2s"' in html
    assert 'data-bot-replica="quiet-1"' in html and 'data-bot="tienda-bot"' not in html
    fragment = client_for("bob").get("/t/tienda/replicas/", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in fragment and fragment.startswith('<div id="replicas-live"')
    assert 'data-bot="tienda-bot"' in fragment and 'data-bot="quiet-bot"' not in fragment


def test_the_bot_filter_takes_every_bot_id_the_api_takes(bots: BotHubs) -> None:
    """A fresh user's report: ``?bot=Tienda%20Bot`` was a 400 (the registry's slug rule) while the page listed it."""
    spaced = bots.replica("tienda", "Tienda Bot é", "r-1")
    spaced._beat()
    response = client_for("bob").get("/t/tienda/replicas/", {"bot": "Tienda Bot é"})
    assert response.status_code == 200 and 'data-bot-replica="r-1"' in response.content.decode()
    too_long = client_for("bob").get("/t/tienda/replicas/", {"bot": "b" * 64})
    assert too_long.status_code == 400 and "remove it from the address" in too_long.content.decode()


def test_a_tenant_without_bots_says_how_one_appears(bots: BotHubs) -> None:
    html = client_for("eve").get("/t/otra/replicas/").content.decode()
    assert 'data-testid="no-bots"' in html and "pushes metrics" in html


def test_a_silent_replica_is_not_responding_then_leaves_after_three_leases(clock: FakeClock, bots: BotHubs) -> None:
    """Silent past its lease: listed as not responding, its expired turns not counted; gone after 3 leases."""
    client, api = client_for("bob"), _api("tienda")
    _push("tienda", "tienda-bot", "gone-1")
    # Warm up first (a process's first request imports the views): a slow request must not eat the window below.
    assert client.get("/t/tienda/replicas/").status_code == 200
    assert api.get("/api/v1/tenants/tienda/bots/tienda-bot/replicas").status_code == 200
    alive = bots.replica("tienda", "tienda-bot", "alive-1", lease_ms=10_000)
    gone = bots.replica("tienda", "tienda-bot", "gone-1", lease_ms=2000)
    assert gone.acquire_turn(CHAT, 0) is not None and gone.try_lead("provider:wa-main") is not None
    gone._beat()
    gone.close(release=False)  # SIGKILL: its heartbeat stops; the hub keeps the last one
    silent_since = clock()
    clock.advance(2200)  # past its lease, well within 3 of them (6 s)
    section = client.get("/t/tienda/replicas/").content.decode().split('data-bot="tienda-bot"')[1]
    row = section.split('data-bot-replica="gone-1"')[1].split("</tr>")[0]
    assert 'class="silent"' in row and "not responding" in row and key_digest(CHAT) not in row
    assert "1 live replica<" in section and "1 not responding" in section and "0 chat turns held" in section
    body = api.get("/api/v1/tenants/tienda/bots/tienda-bot/replicas").json()
    by_id = {r["replica_id"]: r for r in body["replicas"]}
    assert by_id["gone-1"]["responding"] is False and by_id["gone-1"]["turns"] == 0 and by_id["gone-1"]["leads"] == {}
    assert by_id["alive-1"]["responding"] is True and body["turns"] == 0 and body["leaders"] == []
    clock.advance(max(0, 6100 - (clock() - silent_since)))  # past 3 × 2000 ms
    assert 'data-bot-replica="gone-1"' not in client.get("/t/tienda/replicas/").content.decode()
    assert alive.snapshot()


def test_a_killed_leader_is_not_responding_and_the_handover_says_its_lease_expired(
    clock: FakeClock, bots: BotHubs
) -> None:
    """``./dev run``, kill -9 of the provider leader: 2 live replicas, 1 not responding, and why it handed over."""
    client, api = client_for("bob"), _api("tienda")
    for i in (1, 2, 3):
        _push("tienda", "tienda-bot", f"tienda-bot-{i}")
    assert client.get("/t/tienda/replicas/").status_code == 200  # warm up (see the test above)
    assert api.get("/api/v1/tenants/tienda/bots/tienda-bot/replicas").status_code == 200
    a = bots.replica("tienda", "tienda-bot", "tienda-bot-1", lease_ms=2000)
    # The survivors' long leases keep them responding however slowly a loaded machine serves the page.
    b, c = (bots.replica("tienda", "tienda-bot", f"tienda-bot-{i}", lease_ms=10_000) for i in (2, 3))
    assert a.try_lead("provider:main") is not None and b.try_lead("provider:main") is None
    a._beat()
    a.close(release=False)  # SIGKILL: no release, no more renewals or heartbeats
    clock.advance(2300)  # past its 2000 ms lease, within 3 of them (6 s)
    assert b.try_lead("provider:main") is not None
    for replica in (b, c):
        replica._beat()
    section = client.get("/t/tienda/replicas/").content.decode().split('data-bot="tienda-bot"')[1]
    assert "2 live replicas<" in section and "1 not responding<" in section and "3 live" not in section
    row = section.split(f'data-incarnation="{a.incarnation}"')[1].split("</tr>")[0]
    assert "not responding" in row and "follower" not in row and "leads" not in row
    handover = section.split('<tr data-event="handover">')[1].split("</tr>")[0]
    assert "provider:main" in handover and f"tienda-bot-1/{a.incarnation}" in handover
    assert "previous holder&#x27;s lease expired (no renewal for " in handover
    body = api.get("/api/v1/tenants/tienda/bots/tienda-bot/replicas").json()
    assert (body["live_count"], body["not_responding_count"]) == (2, 1)
    responding = {(r["replica_id"], r["incarnation"]): r["responding"] for r in body["replicas"]}
    assert responding == {
        ("tienda-bot-1", a.incarnation): False,
        ("tienda-bot-2", b.incarnation): True,
        ("tienda-bot-3", c.incarnation): True,
    }
    event = next(e for e in body["events"] if e["kind"] == "handover")
    assert (event["name"], event["replica_id"], event["previous"]) == ("provider:main", "tienda-bot-2", a.owner)
    silent_ms = int(event["reason"].removeprefix("previous holder's lease expired (no renewal for ").split(" ms)")[0])
    assert 2000 <= silent_ms < 10_000


def _api(tenant: str, role: str = "agent") -> Client:
    _, token = tenancy.token_create(tenant, name=f"{role}-token", role=role)
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def test_api_answers_what_the_page_shows(bots: BotHubs) -> None:
    """``GET …/replicas`` (every known bot and the admin's processes) and ``GET …/bots/{bot}/replicas``."""
    a, b, c = _three_replicas(bots)
    client = _api("tienda")
    body = client.get("/api/v1/tenants/tienda/replicas").json()
    assert [x["bot"] for x in body["bots"]] == ["tienda-bot"]
    bot = body["bots"][0]
    assert bot["prefix"] == bot_prefix("tienda", "tienda-bot") and bot["turns"] == 2 and bot["problem"] is None
    by_id = {r["replica_id"]: r for r in bot["replicas"]}
    assert set(by_id) == {"tienda-bot-1", "tienda-bot-2", "tienda-bot-3"}
    assert by_id["tienda-bot-3"]["turn_keys"] == sorted([key_digest(CHAT), key_digest("telegram:42")])
    assert by_id["tienda-bot-2"]["incarnation"] == b.incarnation and by_id["tienda-bot-2"]["lease_ms"] == 1500
    assert 0 <= by_id["tienda-bot-1"]["heartbeat_age_ms"] < 1500 and by_id["tienda-bot-1"]["responding"] is True
    assert (bot["live_count"], bot["not_responding_count"]) == (3, 0)
    leaders = {x["name"]: x for x in bot["leaders"]}
    assert leaders["provider:wa-main"]["replica_id"] == "tienda-bot-2"
    assert 0 < leaders["provider:wa-main"]["lease_left_ms"] <= 1500 and leaders["scheduler"]["fence"] > 0
    kinds = [(e["kind"], e["name"], e["reason"]) for e in bot["events"]]
    assert kinds[:2] == [
        ("handover", "provider:wa-main", "previous holder released the lease (stepped down or stopped)"),
        ("step-down", "provider:wa-main", "transport closed for 30000 ms"),
    ]
    assert bot["events"][0]["previous"] == a.owner
    assert "web-1" in {r["replica_id"] for r in body["admin"]["replicas"]}
    assert "573001112233" not in client.get("/api/v1/tenants/tienda/replicas").content.decode()
    one = client.get("/api/v1/tenants/tienda/bots/tienda-bot/replicas").json()
    assert one["bot"] == "tienda-bot" and {r["replica_id"] for r in one["replicas"]} == set(by_id)


def test_a_tenant_never_sees_another_tenants_bot_of_the_same_id(bots: BotHubs) -> None:
    """Tenant ``otra`` asking for ``tienda-bot`` reads its own prefix: empty, not tienda's replicas."""
    _three_replicas(bots)
    theirs = bots.replica("otra", "tienda-bot", "otra-replica")
    theirs._beat()
    own = _api("otra").get("/api/v1/tenants/otra/bots/tienda-bot/replicas").json()
    assert [r["replica_id"] for r in own["replicas"]] == ["otra-replica"] and own["leaders"] == []
    assert _api("otra").get("/api/v1/tenants/otra/replicas").json()["bots"] == []  # it pushed no metrics
    assert _api("otra").get("/api/v1/tenants/tienda/replicas").status_code == 404
    html = client_for("eve").get("/t/otra/replicas/?bot=tienda-bot").content.decode()
    assert "otra-replica" in html and "tienda-bot-1" not in html
    assert client_for("eve").get("/t/tienda/replicas/").status_code == 404


def test_a_bad_bot_id_is_refused_naming_the_field(bots: BotHubs) -> None:
    response = _api("tienda").get(f"/api/v1/tenants/tienda/bots/{'x' * 64}/replicas")
    assert response.status_code == 422 and response.json()["field"] == "bot"
    # The page's filter is a 400 page naming it, as the other lists' — for what the API refuses too: a bot id
    # is any text of 1-63 characters (validate_bot_id), so a NUL is one, and it shows no other bot (a new user
    # had found that a NUL showed every bot).
    for bad in ("x" * 64, "x" * 5000):
        page = client_for("bob").get("/t/tienda/replicas/", {"bot": bad})
        assert page.status_code == 400 and "remove it from the address to see every bot" in page.content.decode(), bad
    _three_replicas(bots)
    page = client_for("bob").get("/t/tienda/replicas/", {"bot": "\x00"})
    assert page.status_code == 200 and 'data-bot="tienda-bot"' not in page.content.decode()


def test_an_unreachable_coordinator_is_said_on_the_page_and_in_the_api(web) -> None:  # type: ignore[no-untyped-def]
    """The bot's section says the coordination service is down; the page and the API still answer 200."""
    import socket

    from botmesh_admin.coordination.redis import RedisBackend

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _push("tienda", "tienda-bot", "r-1")
    with use_bot_backends(lambda prefix: RedisBackend(f"redis://127.0.0.1:{port}/0", prefix, socket_timeout_s=1)):
        html = client_for("bob").get("/t/tienda/replicas/").content.decode()
        body = _api("tienda").get("/api/v1/tenants/tienda/replicas").json()
    section = html.split('data-bot="tienda-bot"')[1].split("</article>")[0]
    assert "Coordinator unreachable: Redis coordinator: ConnectionError" in section
    assert body["bots"][0]["problem"] == "Redis coordinator: ConnectionError" and body["bots"][0]["replicas"] == []
