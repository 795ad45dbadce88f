"""The coordinator logic shared by every backend: handles, renewals, events, waiting.

A backend (``memory.MemoryCoordinationHub``, ``redis.RedisBackend``) owns the
shared state and applies each primitive atomically — take a ticket, grant,
renew, release, lock — so that ``Coordinator`` here only holds what one replica
knows: its identity, the leases it holds and their local deadlines, the
background renewal thread and the subscribers to its events.

Lease time comes from the kernel clock: local deadlines from
``botmesh_admin.clock.monotonic_ms`` and event times from ``now_ms``, so a test
under ``use_clock(FakeClock(...))`` moves every lease with ``advance`` instead of
sleeping. How long ``acquire_turn`` blocks (``wait_ms``) and how often the
background thread renews (every ``lease_ms/3``) stay real time: they are waits,
not lease arithmetic.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from botmesh_admin.clock import monotonic_ms, now_ms

from .base import (
    LOCAL_VALIDITY,
    TURN_KEYS_SHOWN,
    CoordinationEvent,
    CoordinationSnapshot,
    validate_key,
    validate_lease_ms,
    validate_name,
    validate_replica_id,
)

log = logging.getLogger("botmesh.coordination")


@dataclass(frozen=True, slots=True)
class Granted:
    """The backend granted a turn or leadership to ``ticket`` with ``fence``.

    ``previous_silent_ms``: when the previous holder's lease had run out (it
    stopped renewing: killed, frozen, cut off), the milliseconds since it last
    renewed — its lease plus how long ago the lease expired; None when it
    released the lease (step-down, clean stop) or nobody held it. Leadership
    grants report it (the ``handover`` event's reason); turn grants leave it None.
    """

    ticket: str
    fence: int
    previous: str | None
    previous_silent_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Queued:
    """The ticket waits behind the holder or earlier tickets."""

    ticket: str


@dataclass(frozen=True, slots=True)
class Held:
    """Another owner holds the leadership."""

    owner: str
    fence: int


class Backend(Protocol):
    """The shared state every coordinator of one deployment talks to (internal contract)."""

    def turn_acquire(self, key: str, owner: str, ticket: str | None, lease_ms: int) -> Granted | Queued:
        """Take a ticket (``ticket`` None) or touch ``ticket``; grant it if it is at the head and the turn is free."""
        ...

    def turn_wait(self, key: str, ticket: str, timeout_s: float) -> None:
        """Block up to ``timeout_s`` or until ``ticket`` may have become grantable."""
        ...

    def turn_withdraw(self, key: str, ticket: str) -> None:
        """Remove a queued ``ticket`` and wake the next one if the turn is free."""
        ...

    def turn_release(self, key: str, ticket: str) -> bool:
        """Release the turn held by ``ticket``; wake the next ticket; True if it held it."""
        ...

    def lead_acquire(self, name: str, owner: str, ticket: str, lease_ms: int) -> Granted | Held:
        """Grant leadership of ``name`` to ``ticket`` unless another owner's lease is live."""
        ...

    def lead_release(self, name: str, ticket: str) -> bool:
        """Release leadership held by ``ticket``."""
        ...

    def renew(self, items: list[tuple[str, str, str]], lease_ms: int) -> list[bool]:
        """Renew each ``(kind, key, ticket)`` (kind ``turn`` or ``lead``); False where it is no longer held."""
        ...

    def lock_acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        """Take lock ``key`` for ``token``; return the fence, or None if held."""
        ...

    def lock_renew(self, key: str, token: str, ttl_ms: int) -> bool:
        """Set the lock's TTL to ``ttl_ms`` if ``token`` holds it."""
        ...

    def lock_release(self, key: str, token: str) -> bool:
        """Delete the lock if ``token`` holds it."""
        ...

    def heartbeat(self, owner: str, info: dict[str, Any]) -> None:
        """Record that ``owner`` is alive with ``info`` (role, host, turns, leads)."""
        ...

    def unregister(self, owner: str) -> None:
        """Remove ``owner`` from the live replicas."""
        ...

    def publish(self, event: CoordinationEvent) -> None:
        """Append ``event`` to the recent events the dashboard shows."""
        ...

    def snapshot(self, live_ms: int) -> CoordinationSnapshot:
        """Return replicas whose heartbeat is younger than ``live_ms``, leaders and recent events."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def handover_reason(previous_silent_ms: int | None) -> str:
    """Return why a leadership changed hands, the ``handover`` event's ``detail`` (the Replicas page's reason).

    ``previous_silent_ms`` is ``Granted.previous_silent_ms``: a number says the
    previous holder's lease expired after that many ms without a renewal; None
    says it gave the lease up (its own ``step-down`` event says why, if it stepped down).
    """
    if previous_silent_ms is None:
        return "previous holder released the lease (stepped down or stopped)"
    return f"previous holder's lease expired (no renewal for {max(0, previous_silent_ms)} ms)"


def key_digest(key: str) -> str:
    """Return a short hash of a chat key for events and logs (ids never appear raw)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def default_replica_id() -> str:
    """Return ``<host>-<pid>``, sanitised to the replica id alphabet."""
    host = "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in socket.gethostname()) or "host"
    return f"{host[:100]}-{os.getpid()}"


class Lease:
    """A held turn (``kind="turn"``) or leadership (``kind="lead"``); see ``base.LeaseHandle``."""

    def __init__(
        self,
        coordinator: Coordinator,
        kind: str,
        key: str,
        ticket: str,
        fence: int,
        previous_holder: str | None,
        deadline: float,
    ) -> None:
        self._coordinator = coordinator
        self.kind = kind
        self.key = key
        self.ticket = ticket
        self.fence = fence
        self.previous_holder = previous_holder
        self._deadline = deadline  # monotonic_ms() milliseconds
        self._state = "held"  # held | released | lost

    def __repr__(self) -> str:
        name = self.key if self.kind == "lead" else f"turn:{key_digest(self.key)}"
        return f"<Lease {name} fence={self.fence} {self._state}>"

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def name(self) -> str:
        return self.key

    @property
    def state(self) -> str:
        """``held``, ``released`` or ``lost`` (an expired local deadline reads as ``lost``)."""
        if self._state == "held" and monotonic_ms() >= self._deadline:
            return "lost"
        return self._state

    def valid(self) -> bool:
        """Return True while held and before the local deadline (monotonic clock)."""
        return self._state == "held" and monotonic_ms() < self._deadline

    def remaining_ms(self) -> int:
        """Return milliseconds until the local deadline, 0 once invalid."""
        if self._state != "held":
            return 0
        return max(0, int(self._deadline - monotonic_ms()))

    def release(self) -> bool:
        """Give the lease up; True if the service still had it."""
        return self._coordinator._release_lease(self)


class Coordinator:
    """One replica's coordinator over a ``Backend`` (see ``base.Coordinator`` for the contract)."""

    def __init__(
        self,
        backend: Backend,
        *,
        replica_id: str | None = None,
        lease_ms: int = 15000,
        role: str = "web",
    ) -> None:
        self._backend = backend
        self.replica_id = validate_replica_id(replica_id or default_replica_id())
        self.lease_ms = validate_lease_ms(lease_ms)
        self.incarnation = secrets.token_hex(4)
        self.owner = f"{self.replica_id}/{self.incarnation}"
        self.role = role
        self.host = socket.gethostname()
        self._started_ms = now_ms()
        self._lock = threading.Lock()
        self._leases: dict[int, Lease] = {}
        self._leads: dict[str, Lease] = {}
        self._last_seen_leader: dict[str, str] = {}
        self._subscribers: list[Callable[[CoordinationEvent], None]] = []
        self._lead_seq = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._closed = False
        self._beat()
        self._thread = threading.Thread(target=self._run, name=f"coordinator-{self.replica_id}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.owner}>"

    # -- turns ---------------------------------------------------------------

    def acquire_turn(self, key: str, wait_ms: int) -> Lease | None:
        """See ``base.Coordinator.acquire_turn``."""
        validate_key(key)
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or wait_ms < 0:
            from botmesh_admin.errors import ValidationError

            raise ValidationError("wait_ms", "must be a non-negative integer number of milliseconds")
        self._check_open()
        give_up = time.monotonic() + wait_ms / 1000  # real time: how long the caller blocks
        poll_s = self.lease_ms / 3000
        sent = monotonic_ms()
        reply = self._backend.turn_acquire(key, self.owner, None, self.lease_ms)
        while isinstance(reply, Queued):
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                self._backend.turn_withdraw(key, reply.ticket)
                return None
            self._backend.turn_wait(key, reply.ticket, min(remaining, poll_s))
            sent = monotonic_ms()
            reply = self._backend.turn_acquire(key, self.owner, reply.ticket, self.lease_ms)
        lease = Lease(self, "turn", key, reply.ticket, reply.fence, reply.previous, self._deadline(sent))
        with self._lock:
            self._leases[id(lease)] = lease
        return lease

    def release(self, turn: Lease) -> bool:
        """See ``base.Coordinator.release``."""
        return self._release_lease(turn)

    # -- leadership ----------------------------------------------------------

    def try_lead(self, name: str) -> Lease | None:
        """See ``base.Coordinator.try_lead``."""
        validate_name(name)
        self._check_open()
        with self._lock:
            current = self._leads.get(name)
            if current is not None and current.valid():
                return current
            self._lead_seq += 1
            ticket = f"{self.owner}#{self._lead_seq}"
        sent = monotonic_ms()
        reply = self._backend.lead_acquire(name, self.owner, ticket, self.lease_ms)
        if isinstance(reply, Held):
            with self._lock:
                changed = self._last_seen_leader.get(name) != reply.owner
                self._last_seen_leader[name] = reply.owner
            if changed:
                self._emit("follower", name, reply.fence, previous=reply.owner)
            return None
        lease = Lease(self, "lead", name, ticket, reply.fence, reply.previous, self._deadline(sent))
        with self._lock:
            self._leases[id(lease)] = lease
            self._leads[name] = lease
            self._last_seen_leader[name] = self.owner
        self._emit("leader", name, reply.fence, previous=reply.previous)
        if reply.previous is not None and reply.previous != self.owner:
            detail = handover_reason(reply.previous_silent_ms)
            self._emit("handover", name, reply.fence, previous=reply.previous, detail=detail, publish=True)
        self._beat()
        return lease

    def lead_provider(self, provider_id: str) -> Lease | None:
        """Return the leadership of the exclusive transport ``provider:<provider_id>`` or None."""
        return self.try_lead(f"provider:{provider_id}")

    def step_down(self, name: str, reason: str) -> bool:
        """Give up the leadership of ``name`` on purpose and say why; True if this replica held it.

        Publish a ``step-down`` event with ``reason`` as its detail (the Replicas
        page shows it), e.g. a bot whose exclusive transport has been closed for
        ``provider_down_ms``. Raise ``ValidationError`` for a bad name or an empty reason.
        """
        validate_name(name)
        if not isinstance(reason, str) or not reason.strip():
            from botmesh_admin.errors import ValidationError

            raise ValidationError("reason", "must say why the replica steps down")
        with self._lock:
            lease = self._leads.get(name)
        if lease is None or lease._state != "held":
            return False
        fence = lease.fence
        held = self._release_lease(lease)
        self._emit("step-down", name, fence, detail=reason[:200], publish=True)
        return held

    def leading(self) -> dict[str, int]:
        """Return ``{name: fence}`` of the leaderships this replica holds validly."""
        with self._lock:
            return {name: lease.fence for name, lease in self._leads.items() if lease.valid()}

    # -- fenced locks --------------------------------------------------------

    def acquire_lock_fenced(self, key: str, ttl_ms: int) -> tuple[str, int] | None:
        """See ``base.Coordinator.acquire_lock_fenced``."""
        validate_key(key)
        validate_lease_ms(ttl_ms, "ttl_ms")
        token = secrets.token_hex(16)
        fence = self._backend.lock_acquire(key, token, ttl_ms)
        return None if fence is None else (token, fence)

    def renew_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        """See ``base.Coordinator.renew_lock``."""
        validate_key(key)
        validate_lease_ms(ttl_ms, "ttl_ms")
        return self._backend.lock_renew(key, token, ttl_ms)

    def release_lock(self, key: str, token: str) -> bool:
        """See ``base.Coordinator.release_lock``."""
        validate_key(key)
        return self._backend.lock_release(key, token)

    # -- events, status ------------------------------------------------------

    def subscribe(self, callback: Callable[[CoordinationEvent], None]) -> Callable[[], None]:
        """See ``base.Coordinator.subscribe``."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def held_turns(self) -> int:
        """Return how many turns this replica holds validly."""
        with self._lock:
            return sum(1 for lease in self._leases.values() if lease.kind == "turn" and lease.valid())

    def held_turn_digests(self) -> list[str]:
        """Return the hashes (``key_digest``) of at most ``TURN_KEYS_SHOWN`` chat keys whose turn is held."""
        with self._lock:
            keys = {lease.key for lease in self._leases.values() if lease.kind == "turn" and lease.valid()}
        return sorted(key_digest(key) for key in keys)[:TURN_KEYS_SHOWN]

    def snapshot(self) -> CoordinationSnapshot:
        """See ``base.Coordinator.snapshot``; replicas are live within 3 × ``lease_ms``."""
        return self._backend.snapshot(3 * self.lease_ms)

    def close(self, *, release: bool = True) -> None:
        """See ``base.Coordinator.close``."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        if release:
            with self._lock:
                leases = list(self._leases.values())
            for lease in leases:
                try:
                    self._release_lease(lease)
                except Exception:  # noqa: BLE001 (best effort on shutdown)
                    log.warning("coordinator %s: release on close failed", self.owner)
            try:
                self._backend.unregister(self.owner)
            except Exception:  # noqa: BLE001
                log.warning("coordinator %s: unregister on close failed", self.owner)
        self._backend.close()

    # -- internals -----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _deadline(self, sent: float) -> float:
        """Return the local deadline (``monotonic_ms``) of a lease whose grant or renewal was sent at ``sent``."""
        return sent + self.lease_ms * LOCAL_VALIDITY

    def _release_lease(self, lease: Lease) -> bool:
        with self._lock:
            self._leases.pop(id(lease), None)
            if lease.kind == "lead" and self._leads.get(lease.key) is lease:
                del self._leads[lease.key]
            was_held = lease._state == "held"
            lease._state = "released" if was_held else lease._state
        if not was_held:
            return False
        if lease.kind == "turn":
            return self._backend.turn_release(lease.key, lease.ticket)
        released = self._backend.lead_release(lease.key, lease.ticket)
        self._beat()
        return released

    def _emit(
        self,
        kind: str,
        name: str,
        fence: int | None,
        *,
        previous: str | None = None,
        detail: str = "",
        publish: bool = False,
    ) -> None:
        event = CoordinationEvent(
            kind=kind,
            name=name,
            replica_id=self.replica_id,
            incarnation=self.incarnation,
            fence=fence,
            at_ms=now_ms(),
            previous=previous,
            detail=detail,
        )
        log.info("coordination %s %s fence=%s replica=%s", kind, name, fence, self.owner)
        if publish or kind == "leader":
            try:
                self._backend.publish(event)
            except Exception:  # noqa: BLE001 (the dashboard's history is best effort)
                log.warning("coordinator %s: could not publish %s", self.owner, kind)
        with self._lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # noqa: BLE001 (a subscriber must not break renewals)
                log.exception("coordination event subscriber failed")

    def _lose(self, lease: Lease, detail: str) -> None:
        with self._lock:
            if lease._state != "held":
                return
            lease._state = "lost"
            self._leases.pop(id(lease), None)
            if lease.kind == "lead" and self._leads.get(lease.key) is lease:
                del self._leads[lease.key]
        name = lease.key if lease.kind == "lead" else f"turn:{key_digest(lease.key)}"
        self._emit("lease-lost", name, lease.fence, detail=detail, publish=True)
        # Give it up in the service too, so the next holder need not wait for expiry.
        try:
            if lease.kind == "turn":
                self._backend.turn_release(lease.key, lease.ticket)
            else:
                self._backend.lead_release(lease.key, lease.ticket)
        except Exception:  # noqa: BLE001
            log.warning("coordinator %s: could not release a lost lease", self.owner)

    def _beat(self) -> None:
        info = {
            "replica_id": self.replica_id,
            "incarnation": self.incarnation,
            "role": self.role,
            "host": self.host,
            "pid": os.getpid(),
            "started_ms": self._started_ms,
            "turns": self.held_turns(),
            "turn_keys": self.held_turn_digests(),
            "leads": self.leading(),
            "lease_ms": self.lease_ms,
        }
        try:
            self._backend.heartbeat(self.owner, info)
        except Exception:  # noqa: BLE001 (retried on the next tick)
            log.warning("coordinator %s: heartbeat failed", self.owner)

    def _renew_once(self) -> None:
        with self._lock:
            leases = [lease for lease in self._leases.values() if lease._state == "held"]
        now = monotonic_ms()
        live = []
        for lease in leases:
            if now >= lease._deadline:
                self._lose(lease, "renewals stalled past the local deadline")
            else:
                live.append(lease)
        if live:
            sent = monotonic_ms()
            try:
                results = self._backend.renew([(lease.kind, lease.key, lease.ticket) for lease in live], self.lease_ms)
            except Exception:  # noqa: BLE001 (the deadline decides; retried next tick)
                log.warning("coordinator %s: renewal failed", self.owner)
                results = None
            if results is not None:
                deadline = self._deadline(sent)
                for lease, ok in zip(live, results, strict=True):
                    if not ok:
                        self._lose(lease, "the service no longer holds it")
                        continue
                    with self._lock:
                        late = lease._state == "held" and monotonic_ms() >= lease._deadline
                        if lease._state == "held" and not late:
                            lease._deadline = deadline
                    if late:
                        self._lose(lease, "renewal answered after the local deadline")
        self._beat()

    def _run(self) -> None:
        interval = self.lease_ms / 3000
        while not self._stop.wait(interval):
            try:
                self._renew_once()
            except Exception:  # noqa: BLE001 (the loop must survive anything)
                log.exception("coordinator %s: renewal loop error", self.owner)
