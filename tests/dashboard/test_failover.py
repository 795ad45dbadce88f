"""Failover you can watch (issue 19 item 5): three real bot replica processes, SIGKILL and SIGSTOP.

Three ``failover_bot.py`` processes (the project's bot client, ``BotReplica``)
coordinate under ``bot_prefix(tenant, "tienda-bot")`` — over Redis, and over the Kv
in a SQLite file (``kv:sqlite:///…``, how the embedded default's bots run) — and answer the
live admin's inbound feed; the test reads the Replicas API
(``GET …/bots/tienda-bot/replicas``) as an operator would. It

1. SIGKILLs the ``provider:main`` leader while its ticket waits in a chat's turn
   queue: another replica leads within ``lease_ms`` + 1 s, the API's events show
   the handover from the dead replica, the dead replica's queued ticket is
   skipped (the chat is answered by a survivor once its turn is free), and the
   dead replica leaves the list after three leases;
2. SIGSTOPs the new leader inside a handling, past its lease, and SIGCONTs it
   after the last replica answered that message: frozen, the API lists it as not
   responding; resumed, it steps down (``lease-lost`` with its reason in the API),
   responds again as a follower, and its late answer is refused by its fence
   (409 ``stale_fence``);
3. checks with an overlap detector over every recorded (chat, replica, start,
   end) that no chat was ever handled by two replicas at once, and that every
   inbound message was answered exactly once (one bot reply each in the thread).

Lease 1500 ms; every process is stopped in ``finally``; the live server binds a free port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from botmesh_admin.botclient import AdminClient, coordinator_for
from botmesh_admin.coordination.base import bot_prefix
from botmesh_admin.coordination.bots import use_bot_backends
from botmesh_admin.coordination.runtime import backend_from_url
from botmesh_admin.events import default_journal
from botmesh_admin.events.handlers import dispatch
from botmesh_admin.events.worker import EventWorker
from tests import backends

pytestmark = pytest.mark.django_db(transaction=True)

BOT = "tienda-bot"
LEASE_MS = 1500
T = TypeVar("T")


def _drain() -> None:
    for channel in ("ledger", "outbox"):
        worker = EventWorker(default_journal(), lease_ms=30_000, channel=channel)
        while sum(worker.run_batch(dispatch, 50).values()):
            pass


def _until(what: str, probe: Callable[[], T | None], timeout_s: float, *, step_s: float = 0.05) -> T:
    """Return ``probe()``'s first truthy value, draining the journal meanwhile; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        _drain()
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(step_s)


class World:
    """The live admin, the tenant's tokens, the replica processes and what they recorded."""

    def __init__(self, live_server: Any, tmp_path: Path, coordination: str) -> None:
        from botmesh_admin.tenancy import services as tenancy

        self.url = live_server.url
        self.tenant = backends.unique_id("failover")
        tenancy.tenant_create(self.tenant, name="Failover")
        self.bot_token = tenancy.token_create(self.tenant, name="bot", role="bot", bot=BOT)[1]
        self.agent_token = tenancy.token_create(self.tenant, name="sre", role="agent")[1]
        self.admin_token = tenancy.token_create(self.tenant, name="ci")[1]
        # The live server's first requests import the whole API: wait for it as a load balancer would.
        self.admin = AdminClient(self.url, tenant=self.tenant, bot=BOT, token=self.bot_token, timeout_s=60)
        self.admin.inbound(since_ms=0)
        self.coordination = coordination
        self.tmp = tmp_path
        self.records = tmp_path / "handled.jsonl"
        self.marker = tmp_path / "slow.jsonl"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.sent: list[str] = []

    def start(self, replica_id: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}  # a bot has no Django
        env.update(BOTMESH_BOT_TOKEN=self.bot_token, BOTMESH_KV_URL=f"sqlite:///{self.tmp / 'bot-fences.sqlite3'}")
        argv = [
            sys.executable, "-m", "tests.dashboard.failover_bot", "--admin-url", self.url, "--tenant", self.tenant,
            "--bot", BOT, "--coordination", self.coordination, "--replica-id", replica_id,
            "--record", str(self.records), "--marker", str(self.marker), "--lease-ms", str(LEASE_MS),
        ]  # fmt: skip
        log = open(self.tmp / f"{replica_id}.log", "wb")  # noqa: SIM115 - the process owns it
        self.procs[replica_id] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.terminate()
                    proc.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait(timeout=5)

    def push(self, *messages: tuple[int, str]) -> list[str]:
        """Push inbound messages ``(chat number, text)`` through the ledger; return their ids."""
        records: list[dict[str, Any]] = []
        for chat, text in messages:
            message_id = f"in-{chat}-{len(self.sent)}"
            self.sent.append(message_id)
            records.append(
                {
                    "id": message_id,
                    "channel": "whatsapp",
                    "chatId": f"whatsapp:57300{chat:07d}",
                    "senderId": f"whatsapp:57300{chat:07d}",
                    "direction": "in",
                    "type": "text",
                    "body": text,
                    "timestamp": int(time.time() * 1000) - 60_000 + len(self.sent),
                }
            )
        assert self.admin.ledger_push(records)["accepted"] == len(records)
        _drain()
        return [r["id"] for r in records]

    def get(self, path: str, token: str | None = None) -> Any:
        request = urllib.request.Request(
            f"{self.url}/api/v1/tenants/{self.tenant}/{path}",
            headers={"Authorization": f"Bearer {token or self.agent_token}"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def replicas(self) -> dict[str, Any]:
        """The Replicas API of the bot, as an SRE's agent token reads it."""
        return self.get(f"bots/{BOT}/replicas")  # type: ignore[no-any-return]

    def provider_leader(self) -> dict[str, Any] | None:
        return next((x for x in self.replicas()["leaders"] if x["name"] == "provider:main"), None)

    def inbound(self) -> dict[str, Any]:
        items, _ = self.admin.inbound(since_ms=0, limit=200)
        return {m.id: m for m in items}

    def answered(self, ids: list[str]) -> bool:
        inbound = self.inbound()
        return all(i in inbound and inbound[i].answered for i in ids)

    def recorded(self) -> list[dict[str, Any]]:
        if not self.records.exists():
            return []
        return [json.loads(line) for line in self.records.read_text().splitlines() if line.strip()]


@pytest.fixture(params=["redis", "kv-sqlite"])
def world(request, live_server, tmp_path: Path) -> Iterator[World]:  # type: ignore[no-untyped-def]
    """The bots coordinate over Redis, or over the Kv in a SQLite file (the embedded default's ``kv:``)."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
    else:
        url = f"kv:sqlite:///{tmp_path / 'coordination.sqlite3'}"
    w = World(live_server, tmp_path, url)
    opened: list[Any] = []

    def backend(prefix: str) -> Any:  # the admin reads the bots' prefix where they coordinate
        opened.append(backend_from_url(url, prefix))
        return opened[-1]

    try:
        with use_bot_backends(backend):
            yield w
    finally:
        w.stop_all()
        for b in opened:
            b.close()


def _tickets(backend: Any, key: str) -> list[str]:
    """Return the tickets (``<seq>|<replica id>/<incarnation>``) queued on turn ``key``, first first."""
    from botmesh_admin.coordination.kv import KvBackend, hashed
    from botmesh_admin.coordination.redis import RedisBackend

    if isinstance(backend, RedisBackend):  # the key layout in coordination/redis.py
        return [m.decode() for m in backend.client.zrange(backend._turn_keys(key)[0][0], 0, -1)]
    assert isinstance(backend, KvBackend)  # the key layout in coordination/kv.py
    entry = backend.kv.get(backend.table, f"t/{hashed(key)}/q")
    return [str(t[0]) for t in entry.value["tickets"]] if entry is not None else []


def _overlaps(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Return pairs of handlings of one chat by two replicas whose held intervals intersect."""
    held = sorted((r for r in records if r["valid_at_end"]), key=lambda r: (r["chat"], r["start_ms"]))
    found = []
    for first, second in zip(held, held[1:], strict=False):
        same_holder = (first["replica"], first["incarnation"]) == (second["replica"], second["incarnation"])
        if first["chat"] == second["chat"] and not same_holder and second["start_ms"] < first["end_ms"]:
            found.append((first, second))
    return found


def test_the_provider_leader_dies_and_another_leads_a_frozen_one_steps_down(world: World) -> None:
    booted = time.monotonic()
    ids = world.push(*[(chat, f"hola {i}") for i in range(3) for chat in (1, 2, 3, 4)])
    for i in (1, 2, 3):
        world.start(f"tienda-bot-{i}")
    _until("12 messages answered", lambda: world.answered(ids), 30)
    assert _until("a provider:main leader", world.provider_leader, 10)
    # Two replicas may answer all twelve before the third has finished starting on a loaded machine.
    assert _until("three live replicas", lambda: len(world.replicas()["replicas"]) == 3, 60)
    started = time.monotonic()  # the failover itself is bounded below; starting three processes is the machine's

    # 1. A chat's turn is held (by the test) while the leader's ticket waits in its queue; then SIGKILL.
    holder = coordinator_for(world.coordination, tenant=world.tenant, bot=BOT, lease_ms=LEASE_MS, replica_id="holder")
    queue = backend_from_url(world.coordination, bot_prefix(world.tenant, BOT))
    try:
        # The turn key of chat 9 (InboundMessage.turn_key), taken before its message arrives.
        channel = world.inbound()[ids[0]].channel_name
        turn_key = f"chat:{channel}|whatsapp:57300{9:07d}" if channel else f"chat:whatsapp:57300{9:07d}"
        turn = holder.acquire_turn(turn_key, 0)
        assert turn is not None
        held_chat = world.push((9, "hola"))

        def leader_first() -> dict[str, Any] | None:
            leader = world.provider_leader()
            first_ticket = _tickets(queue, turn_key)[:1]
            owner = f"{leader['replica_id']}/{leader['incarnation']}" if leader else "-"
            return leader if first_ticket and first_ticket[0].endswith(f"|{owner}") else None

        # Waiters give up after 2 s (turn_wait_ms) and queue again at the back: the leader's ticket comes first in time.
        first = _until("the leader's ticket first in the queue behind the held turn", leader_first, 60)
        victim = first["replica_id"]
        victim_owner = f"{victim}/{first['incarnation']}"

        def victim_queued() -> bool:
            return any(ticket.endswith(f"|{victim_owner}") for ticket in _tickets(queue, turn_key))

        world.procs[victim].send_signal(signal.SIGKILL)
        world.procs[victim].wait(timeout=5)
        killed = time.monotonic()
        new = _until(
            "another replica leads provider:main",
            lambda: (x := world.provider_leader()) is not None and x["replica_id"] != victim and x,
            LEASE_MS / 1000 + 3,
            step_s=0.02,
        )
        took_ms = (time.monotonic() - killed) * 1000
        assert took_ms <= LEASE_MS + 1000, f"provider:main led again after {took_ms:.0f} ms"
        assert 0 < new["lease_left_ms"] <= LEASE_MS and new["fence"] > first["fence"]
        handover = _until(  # published just after the grant
            "the handover in the events",
            lambda: [e for e in world.replicas()["events"] if e["kind"] == "handover" and e["name"] == "provider:main"],
            2,
        )
        assert handover[0]["previous"] == victim_owner and handover[0]["replica_id"] == new["replica_id"]
        assert handover[0]["reason"].startswith("previous holder's lease expired (no renewal for ")
        released = time.monotonic()
        assert turn.release()
        _until(
            "the held chat answered after its turn was freed", lambda: world.answered(held_chat), LEASE_MS / 1000 + 1
        )
        freed_ms = (time.monotonic() - released) * 1000
        assert not victim_queued()  # the dead replica's ticket, first in line, was skipped, not served
        by = _until(
            "the answer of the held chat recorded",
            lambda: [r for r in world.recorded() if r["message"] == held_chat[0] and r["outcome"] == "answered"],
            5,
        )
        assert [r["replica"] != victim for r in by] == [True], by
    finally:
        holder.close()
        queue.close()

    # The survivors go on answering; the dead replica leaves the list after three of its leases.
    more = world.push(*[(chat, f"otra vez {chat}") for chat in (1, 2, 3, 4)])
    _until("4 more answered by the survivors", lambda: world.answered(more), 15)

    def without_victim() -> list[str] | None:
        listed = [r["replica_id"] for r in world.replicas()["replicas"]]
        return None if victim in listed else listed

    assert len(_until("the killed replica off the list", without_victim, 3 * LEASE_MS / 1000 + 3)) == 2

    # 2. SIGSTOP the leader inside a handling, past its lease; SIGCONT after the other replica answered.
    frozen = new["replica_id"]
    slow = world.push((5, "slow"))
    marked = _until(
        "the leader in the slow handling", lambda: world.marker.read_text() if world.marker.exists() else None, 10
    )
    assert json.loads(marked.splitlines()[0])["replica"] == frozen
    world.procs[frozen].send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    last = _until(
        "the last replica leads",
        lambda: (x := world.provider_leader()) is not None and x["replica_id"] not in (victim, frozen) and x,
        LEASE_MS / 1000 + 3,
    )
    _until("the slow message answered by the last replica", lambda: world.answered(slow), 10)
    assert (time.monotonic() - stopped) * 1000 > LEASE_MS  # frozen past its lease
    assert {r["replica_id"]: r for r in world.replicas()["replicas"]}[frozen]["responding"] is False
    world.procs[frozen].send_signal(signal.SIGCONT)
    late = _until(
        "the frozen replica's late answer recorded",
        lambda: next((r for r in world.recorded() if r["replica"] == frozen and r["message"] == slow[0]), None),
        10,
    )
    assert late["outcome"] == "stale_fence" and late["valid_at_end"] is False
    assert late["late_send"] == "409 stale_fence"  # the admin's fence guard refuses the late answer
    lost = _until(
        "the frozen replica's step-down in the events",
        lambda: [e for e in world.replicas()["events"] if e["kind"] == "lease-lost" and e["replica_id"] == frozen],
        5,
    )
    assert "provider:main" in {e["name"] for e in lost} and all(e["reason"] for e in lost)
    assert world.provider_leader()["replica_id"] == last["replica_id"]  # type: ignore[index]
    assert _until(  # alive again, as a follower
        "the frozen replica responding again",
        lambda: {r["replica_id"]: r for r in world.replicas()["replicas"]}[frozen]["responding"],
        5,
    )
    assert not any(frozen in x["replica_id"] for x in world.replicas()["leaders"] if x["name"] == "provider:main")

    # 3. No chat was handled by two replicas at once; every message was answered exactly once.
    records = world.recorded()
    assert not _overlaps(records), _overlaps(records)[:3]
    answered = [r["message"] for r in records if r["outcome"] == "answered"]
    assert len(answered) == len(set(answered)), "a message answered twice"  # (a timed-out answer records "failed")
    inbound = world.inbound()
    for message_id in world.sent:
        conversation = inbound[message_id].conversation_id
        thread = world.get(f"conversations/{conversation}/messages?limit=200", world.admin_token)["items"]
        replies = [m for m in thread if m["direction"] == "out" and m.get("reply_to") == message_id]
        assert len(replies) == 1, (message_id, replies)
    took = time.monotonic() - started
    print(
        f"failover: provider:main led again {took_ms:.0f} ms after SIGKILL; held chat answered {freed_ms:.0f} ms "
        f"after its turn was freed; {len(records)} handlings, {len(world.sent)} messages, {took:.1f} s after the "
        f"replicas were up ({started - booted:.1f} s to start them and answer the first twelve)"
    )
    # Quiet, 10-26 s; in the full suite under xdist 62-65 s (session 8's CI): a bound on the test's time, not
    # on the product's (the handover itself is bounded above, LEASE_MS + 1 s after the SIGKILL).
    assert took < 120
