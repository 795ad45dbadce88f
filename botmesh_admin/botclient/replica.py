"""``BotReplica``: one well-behaved replica of a bot (ARCHITECTURE §8, the bot side).

A replica holds a coordinator connection under the bot's prefix
(``coordination.base.bot_prefix(tenant, bot)``) and the admin's bot endpoints
(``admin.AdminClient``). It

- **registers and heartbeats**: the coordinator writes the replica's heartbeat
  (replica id, incarnation, role ``bot``, host, pid, turns held, leaderships) on
  creation and every ``lease_ms/3``;
- **takes a chat's turn** before handling an inbound message and releases it
  after (per-chat FIFO turns, key ``InboundMessage.turn_key``); the answer carries
  the turn's fence, so a replica frozen past its lease has its late answer refused
  (409 ``stale_fence``);
- **reads handoff state**: a message of a chat a human holds is not answered (the
  admin refuses it too: 409 ``handed_off``); it is recorded in the ledger as
  dropped (``dropped: "handoff"``);
- **leads** ``provider:<provider_id>`` while its transport is open — it opens the
  exclusive transport (``Transport``) on taking the lead, and steps down (releases
  the leadership, closes the transport) once the transport has been closed for
  ``provider_down_ms``; it leads ``scheduler`` to run the jobs of ``every``;
- **pushes** its ledger records (``POST …/ledger``) and a metrics snapshot
  (``POST …/bots/{bot}/metrics``, botmesh's ``metrics()`` shape) every
  ``push_every_ms``.

Times are milliseconds unless a name ends in ``_s``. Thread-safe; one
background thread runs leadership, pushes and jobs (``start``/``close``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from botmesh_admin.coordination.base import LeaseHandle, bot_prefix
from botmesh_admin.coordination.core import Coordinator

from .admin import AdminClient, AdminError, InboundMessage

log = logging.getLogger("botmesh.botclient")

Handler = Callable[[InboundMessage], "str | None"]
"""Return the answer's text for an inbound message, or ``None`` to leave it unanswered."""


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def log_hash_key(token: str) -> bytes:
    """Return the key of ``id_hash``: ``BOTMESH_HASH_KEY`` (through ``config.env``, so ``_FILE`` works) when set,
    else a key derived from the bot ``token`` (SHA-256 of ``"botmesh-bot-log-hash\0" + token``).

    With the admin's ``BOTMESH_HASH_KEY`` a chat's hash in the bot's logs is the one in the admin's logs and
    traces (``observability.guard.hash_id``); without it, hashes still cannot be reversed by hashing candidate
    phone numbers, but change with the token.
    """
    from botmesh_admin.config import env

    configured = env("BOTMESH_HASH_KEY")
    if configured:
        return configured.encode("utf-8")
    return hashlib.sha256(b"botmesh-bot-log-hash\0" + token.encode("utf-8")).digest()


def id_hash(value: str, key: bytes) -> str:
    """Return 16 hex digits of HMAC-SHA256 of ``value`` (stripped) under ``key`` (``log_hash_key``).

    Chat ids never appear raw in logs, nor as an unkeyed hash, which anyone could reverse by hashing
    every phone number (the house rule, as ``observability.guard.hash_id``).
    """
    return hmac.new(key, value.strip().encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:16]


class Transport(Protocol):
    """An exclusive transport only the ``provider:<id>`` leader may hold (a Telegram getUpdates poll,
    a WhatsApp on-premise session). ``is_open`` is polled every ``lease_ms/3``."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def is_open(self) -> bool: ...


class AdminSession:
    """The demo's transport: "open" while the admin answers ``/healthz`` (the console provider's session)."""

    def __init__(self, admin: AdminClient) -> None:
        self._admin = admin
        self._opened = False

    def open(self) -> None:
        self._opened = True

    def close(self) -> None:
        self._opened = False

    def is_open(self) -> bool:
        return self._opened and self._admin.healthy()


def coordinator_for(
    url: str,
    *,
    tenant: str,
    bot: str,
    lease_ms: int,
    replica_id: str | None = None,
    fence_kv_url: str | None = None,
) -> Coordinator:
    """Return a coordinator for one replica of ``bot`` under ``bot_prefix(tenant, bot)``, role ``bot``.

    ``url`` as ``coordination.runtime.coordinator_from_url`` reads it: ``kv:<Kv URL>``
    (the DurableKv the admin uses, e.g. ``kv:sqlite:///var/kv.sqlite3`` — the
    embedded default, across processes; ``kv:postgresql://…``), ``redis://…`` or
    ``memory:`` (one process). A Redis coordinator keeps the high-water mark of its
    fences in the admin's Kv (so they never go backwards after Redis restarts empty):
    ``fence_kv_url``, else ``BOTMESH_KV_URL``, else — inside a Django process — the
    configured Kv. Raise ``ValidationError`` naming ``url`` or ``fence_kv_url``.
    """
    from botmesh_admin.coordination.runtime import coordinator_from_url
    from botmesh_admin.errors import ValidationError

    prefix = bot_prefix(tenant, bot)
    if not url.startswith(("redis://", "rediss://", "redis+cluster://")):
        return coordinator_from_url(url, prefix=prefix, lease_ms=lease_ms, role="bot", replica_id=replica_id)
    from botmesh_admin.config import env
    from botmesh_admin.coordination.redis import RedisCoordinator
    from botmesh_admin.kv import connect

    kv_url = fence_kv_url or env("BOTMESH_KV_URL")  # config.env: BOTMESH_KV_URL_FILE works too
    if kv_url is None and not _django_configured():
        raise ValidationError("fence_kv_url", "a Redis coordinator needs the admin's Kv URL for its fences")
    fence_kv = connect(kv_url) if kv_url else None
    return RedisCoordinator(url, prefix, lease_ms, replica_id, role="bot", fence_kv=fence_kv)


def _django_configured() -> bool:
    import sys

    if "django.conf" not in sys.modules:
        return False
    from django.conf import settings

    return bool(settings.configured)


@dataclass(frozen=True, slots=True)
class Handled:
    """What ``BotReplica.handle`` did with one message.

    ``outcome``: ``answered``; ``duplicate`` (another replica answered it first);
    ``handed_off``; ``stale_fence`` (the turn's lease ran out while handling — a
    replica frozen past it —, so nothing was sent; or it was sent and the admin
    refused it with 409 ``stale_fence``: a later turn had answered); ``no_turn``; ``ignored`` (the
    handler returned ``None``); ``failed`` (the admin could not be asked). The
    turn was held from before ``start_ms`` (epoch ms) until after ``end_ms``, so
    two spans of one chat never overlap while their leases hold.
    """

    message_id: str
    conversation_id: str
    outcome: str
    fence: int | None
    start_ms: int
    end_ms: int

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form (one line of the ``handled_log``, before the replica's own fields)."""
        return {name: getattr(self, name) for name in Handled.__dataclass_fields__}


class BotReplica:
    """One replica of ``bot`` (see the module docstring). ``close`` releases what it holds."""

    def __init__(
        self,
        admin: AdminClient,
        coordinator: Coordinator,
        *,
        provider_id: str | None = None,
        transport: Transport | None = None,
        provider_down_ms: int = 5000,
        push_every_ms: int = 10_000,
        turn_wait_ms: int = 5000,
        handled_log: str | None = None,
    ) -> None:
        """``handled_log``: a file that gets one JSON line per handled message (``Handled`` plus
        ``replica_id`` and ``incarnation``) — what a test's overlap detector reads."""
        self.admin = admin
        self._hash_key = log_hash_key(getattr(admin, "_token", ""))  # chat ids in logs: keyed hash only
        self.coordinator = coordinator
        self.provider_id = provider_id
        self.transport = transport
        self.provider_down_ms = provider_down_ms
        self.push_every_ms = push_every_ms
        self.turn_wait_ms = turn_wait_ms
        self.handled_log = handled_log
        self._lock = threading.Lock()
        self._ledger: list[dict[str, Any]] = []
        self._jobs: list[tuple[float, Callable[[], None], list[float]]] = []
        self._provider: LeaseHandle | None = None
        self._scheduler: LeaseHandle | None = None
        self._closed_since: float | None = None
        self._stepped_down = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_ms = wall_ms()
        self._counts = {"in": 0, "out": 0, "outFailed": 0, "duplicate": 0, "handoff": 0, "errors": 0, "stale": 0}
        self._chats: set[str] = set()
        self._random = random.Random()

    # -- identity ----------------------------------------------------------------------

    @property
    def replica_id(self) -> str:
        return self.coordinator.replica_id

    @property
    def incarnation(self) -> str:
        return self.coordinator.incarnation

    def __repr__(self) -> str:
        return f"<BotReplica {self.admin.bot} {self.replica_id}/{self.incarnation}>"

    # -- turns and answers ---------------------------------------------------------------

    def handle(self, message: InboundMessage, handler: Handler, *, wait_ms: int | None = None) -> Handled:
        """Handle one inbound message under its chat's turn; return what happened.

        Take the turn (``turn_key``, waiting up to ``wait_ms``, default
        ``turn_wait_ms``; none in time → ``no_turn``), re-read the
        handoff state, call ``handler`` and send its answer with the turn's fence,
        then release the turn. Already answered → ``duplicate``; a human holds the
        chat → ``handed_off`` (ledger: dropped ``handoff``); the turn was taken
        over meanwhile → ``stale_fence``. Never raises for the admin's answers.
        """
        turn = self.coordinator.acquire_turn(message.turn_key, self.turn_wait_ms if wait_ms is None else wait_ms)
        start = wall_ms()  # the turn is held from here until after end_ms
        if turn is None:
            return Handled(message.id, message.conversation_id, "no_turn", None, start, start)
        try:
            return self._handle_in_turn(message, handler, turn, start)
        finally:
            try:
                turn.release()
            except Exception as exc:  # noqa: BLE001 - the coordinator is unreachable: the lease expires by itself
                log.warning("%r: could not release a turn (%s); it expires after lease_ms", self, type(exc).__name__)

    def _handle_in_turn(self, message: InboundMessage, handler: Handler, turn: LeaseHandle, start: int) -> Handled:
        try:
            state = self.admin.handoff(message.chat_id, channel=message.channel_name)
        except AdminError as exc:
            log.warning("%r: handoff read failed (%s)", self, exc.code)
            self._count("errors")
            return self._done(message, "failed", turn.fence, start)
        if state.handed_off:
            self._drop(message, "handoff")
            return self._done(message, "handed_off", turn.fence, start)
        text = handler(message)
        if text is None:
            return self._done(message, "ignored", turn.fence, start)
        if not turn.valid():  # frozen past the lease: nothing is sent (the admin would refuse it anyway)
            self._count("stale")
            return self._done(message, "stale_fence", turn.fence, start)
        try:
            reply, created = self.admin.reply(message, text, fence=turn.fence)
        except AdminError as exc:
            outcome = exc.code if exc.code in ("stale_fence", "handed_off") else "failed"
            self._count({"stale_fence": "stale", "handed_off": "handoff"}.get(outcome, "outFailed"))
            if outcome == "handed_off":
                self._drop(message, "handoff")
            log.info("%r: answer refused %s %s", self, exc.status, exc.code)
            return self._done(message, outcome, turn.fence, start)
        if not created:
            self._count("duplicate")
            return self._done(message, "duplicate", turn.fence, start)
        self._count("in")
        self._count("out")
        with self._lock:
            self._chats.add(message.conversation_id)
            self._ledger.append(self._record(message, reply["id"], text, dropped=None))
        return self._done(message, "answered", turn.fence, start)

    def _record(
        self, message: InboundMessage, record_id: str, text: str | None, *, dropped: str | None
    ) -> dict[str, Any]:
        """Return the ledger record (StoredMessage) of an answer the bot sent or dropped."""
        record: dict[str, Any] = {
            "id": record_id,
            "channel": message.channel,
            "chatId": message.chat_id,
            "senderId": "bot",
            "direction": "out",
            "type": "text",
            "body": text,
            "timestamp": wall_ms(),
        }
        if message.channel_name:
            record["channelName"] = message.channel_name
        if dropped:
            record["dropped"] = dropped
        return record

    def _drop(self, message: InboundMessage, reason: str) -> None:
        self._count("handoff")
        with self._lock:  # one record per message: its id derives from the message (the ledger dedups)
            self._ledger.append(self._record(message, f"{message.id}.{reason}", None, dropped=reason))

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + 1

    def _done(self, message: InboundMessage, outcome: str, fence: int | None, start: int) -> Handled:
        handled = Handled(message.id, message.conversation_id, outcome, fence, start, wall_ms())
        if self.handled_log:
            line = handled.to_json()
            line.update(replica_id=self.replica_id, incarnation=self.incarnation)
            with self._lock, open(self.handled_log, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")
        log.info("%r: message of chat %s %s fence=%s", self, id_hash(message.chat_id, self._hash_key), outcome, fence)
        return handled

    def poll(self, handler: Handler, *, since_ms: int, limit: int = 50, max_pages: int = 20) -> list[Handled]:
        """Read the inbound feed since ``since_ms`` and ``handle`` every unanswered message not handed off.

        At most ``max_pages`` pages of ``limit`` conversations (one sweep). A chat whose
        turn another replica holds is skipped (it is answering it; a message it leaves
        comes back in the next poll), and each replica walks a page's chats in its own
        random order, so replicas reading the same page share the work instead of
        queueing behind each other. Return what was handled (``no_turn`` left out).
        """
        done: list[Handled] = []
        after: str | None = None
        for _ in range(max_pages):
            items, after = self.admin.inbound(since_ms=since_ms, after=after, limit=limit)
            chats: dict[str, list[InboundMessage]] = {}
            for item in items:
                if not (item.answered or item.handed_off):
                    chats.setdefault(item.turn_key, []).append(item)
            order = list(chats.values())
            self._random.shuffle(order)
            for messages in order:
                for message in messages:  # oldest first within a chat
                    handled = self.handle(message, handler, wait_ms=0)
                    if handled.outcome == "no_turn":
                        break
                    done.append(handled)
            if after is None:
                break
        return done

    # -- leadership ----------------------------------------------------------------------

    def is_provider_leader(self) -> bool:
        """Return True while this replica leads ``provider:<provider_id>`` (its lease valid)."""
        lease = self._provider
        return lease is not None and lease.valid()

    def is_scheduler(self) -> bool:
        """Return True while this replica leads ``scheduler``."""
        lease = self._scheduler
        return lease is not None and lease.valid()

    def every(self, seconds: float, job: Callable[[], None]) -> None:
        """Run ``job`` every ``seconds`` on the scheduler leader only (the first run one interval after lead)."""
        self._jobs.append((seconds, job, [time.monotonic() + seconds]))

    def _lead_provider(self) -> None:
        if self.provider_id is None:
            return
        transport_open = self.transport is None or self.transport.is_open()
        now = time.monotonic()
        if self.is_provider_leader():
            if transport_open:
                self._closed_since = None
                return
            self._closed_since = self._closed_since or now
            if (now - self._closed_since) * 1000 >= self.provider_down_ms:
                log.warning(
                    "%r: transport closed for %d ms: stepping down as provider:%s",
                    self,
                    self.provider_down_ms,
                    self.provider_id,
                )
                self._provider = None
                self.coordinator.step_down(
                    f"provider:{self.provider_id}", f"transport closed for {self.provider_down_ms} ms"
                )  # a step-down event with the reason (the Replicas page shows it)
                if self.transport is not None:
                    self.transport.close()
                self._stepped_down = True
            return
        if self._provider is not None:  # lost (frozen past the lease, or the service dropped it)
            self._provider = None
            if self.transport is not None:
                self.transport.close()
        if self._stepped_down and self.transport is not None and not self._transport_reachable():
            return  # stepped down for a closed transport: come back once it can open again
        lease = self.coordinator.try_lead(f"provider:{self.provider_id}")
        if lease is not None:
            self._provider = lease
            self._closed_since = None
            self._stepped_down = False
            if self.transport is not None:
                self.transport.open()

    def _transport_reachable(self) -> bool:
        assert self.transport is not None
        self.transport.open()  # a probe: opening is what tells whether the transport is back
        try:
            return self.transport.is_open()
        finally:
            self.transport.close()

    def _lead_scheduler(self) -> None:
        if not self.is_scheduler():
            self._scheduler = self.coordinator.try_lead("scheduler")
        if not self.is_scheduler():
            return
        now = time.monotonic()
        for seconds, job, due in self._jobs:
            if now >= due[0]:
                due[0] = now + seconds
                try:
                    job()
                except Exception:  # noqa: BLE001 - a job's failure must not stop leadership
                    log.exception("%r: scheduled job failed", self)

    # -- pushes --------------------------------------------------------------------------

    def metrics(self) -> dict[str, Any]:
        """Return this replica's snapshot in botmesh's ``metrics()`` shape (camelCase)."""
        now = wall_ms()
        with self._lock:
            counts = dict(self._counts)
            chats = len(self._chats)
        return {
            "startedAt": self._started_ms,
            "uptimeMs": now - self._started_ms,
            "conversations": {"started": chats, "completed": 0, "ended": 0, "active": chats, "avgDurationMs": 0},
            "flows": {},
            "messages": {"in": counts["in"], "out": counts["out"], "outFailed": counts["outFailed"]},
            "dropped": {"duplicate": counts["duplicate"], "blocked": 0, "handoff": counts["handoff"]},
            "presenceSkipped": {"typing": 0, "markRead": 0},
            "triggered": 0,
            "errors": counts["errors"],
        }

    def push(self) -> None:
        """Push the ledger records kept since the last push, then a metrics snapshot (errors logged)."""
        with self._lock:
            records, self._ledger = self._ledger, []
        try:
            if records:
                self.admin.ledger_push(records)
        except AdminError as exc:
            log.warning("%r: ledger push failed (%s); kept for the next push", self, exc.code)
            with self._lock:
                self._ledger[:0] = records
        try:
            self.admin.metrics_push(self.replica_id, self.metrics())
        except AdminError as exc:
            log.warning("%r: metrics push failed (%s)", self, exc.code)

    # -- lifecycle -----------------------------------------------------------------------

    def tick(self) -> None:
        """One round of the background loop: leadership, jobs (leader only). Tests may call it directly."""
        self._lead_provider()
        self._lead_scheduler()

    def start(self) -> BotReplica:
        """Start the background thread (leadership every ``lease_ms/3``, pushes every ``push_every_ms``)."""

        def run() -> None:
            interval = self.coordinator.lease_ms / 3000
            next_push = time.monotonic()
            while not self._stop.is_set():
                try:
                    self.tick()
                    if time.monotonic() >= next_push:
                        next_push = time.monotonic() + self.push_every_ms / 1000
                        self.push()
                except Exception:  # noqa: BLE001 - the loop must survive a blip of the coordinator
                    log.exception("%r: background round failed", self)
                self._stop.wait(interval)

        self._thread = threading.Thread(target=run, name=f"botreplica-{self.replica_id}", daemon=True)
        self._thread.start()
        return self

    def close(self, *, release: bool = True) -> None:
        """Stop the loop, push what is left, release leaderships and turns, close the coordinator."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if release:
            self.push()
        if self.transport is not None:
            self.transport.close()
        self.coordinator.close(release=release)
