"""The in-memory coordination hub: the reference backend (one process, any number of replicas).

``MemoryCoordinationHub`` holds the state every ``MemoryCoordinator`` of one
process shares, under one lock, with the same semantics as the Redis scripts:
a ticket queue and a holder per turn key, a holder per leadership, locks with a
TTL, and one fence counter for the whole hub, so fences stay monotonic when a
key is evicted. Keys that are idle (no live holder, no live ticket) are evicted
least-recently-used first beyond ``max_idle_keys``; a recreated key reports
``previous_holder=None``. Expiry uses the monotonic clock of the kernel
(``botmesh_admin.clock.monotonic_ms``), which a test's ``use_clock(FakeClock())`` moves.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from botmesh_admin.clock import monotonic_ms
from botmesh_admin.errors import ValidationError

from .base import (
    SHOWN_EVENT_KINDS,
    CoordinationEvent,
    CoordinationSnapshot,
    LeaderStatus,
    ReplicaStatus,
    replica_status_from_info,
)
from .core import Coordinator, Granted, Held, Queued

EVICTION_SCAN = 64  # keys visited per eviction pass at most (keeps every call O(1) amortised)
EVENTS_KEPT = 200


@dataclass
class _Holder:
    ticket: str
    owner: str
    fence: int
    expires: float  # monotonic ms
    lease_ms: int = 0


@dataclass
class _KeyState:
    seq: int = 0
    queue: OrderedDict[str, float] = field(default_factory=OrderedDict)  # ticket -> deadline (ms)
    holder: _Holder | None = None
    last_owner: str | None = None
    lapsed: _Holder | None = None  # the holder whose lease ran out, until the next grant (the handover's reason)

    def live_holder(self, now: float) -> _Holder | None:
        if self.holder is not None and self.holder.expires <= now:
            self.lapsed, self.holder = self.holder, None
        return self.holder

    def idle(self, now: float) -> bool:
        if self.live_holder(now) is not None:
            return False
        return all(deadline <= now for deadline in self.queue.values())


class MemoryCoordinationHub:
    """Shared state of in-process coordinators (see the module docstring)."""

    def __init__(self, max_idle_keys: int = 10000) -> None:
        if isinstance(max_idle_keys, bool) or not isinstance(max_idle_keys, int) or max_idle_keys < 1:
            raise ValidationError("max_idle_keys", "must be a positive integer")
        self.max_idle_keys = max_idle_keys
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._keys: OrderedDict[tuple[str, str], _KeyState] = OrderedDict()
        self._fence = 0
        self._replicas: dict[str, tuple[float, dict[str, Any]]] = {}
        self._events: deque[CoordinationEvent] = deque(maxlen=EVENTS_KEPT)

    def __len__(self) -> int:
        """Return how many keys the hub holds (idle ones included)."""
        with self._lock:
            return len(self._keys)

    # -- key table -----------------------------------------------------------

    def _state(self, kind: str, key: str, now: float) -> _KeyState:
        ident = (kind, key)
        state = self._keys.get(ident)
        if state is None:
            state = self._keys[ident] = _KeyState()
            self._evict(now)
        else:
            self._keys.move_to_end(ident)
        return state

    def _evict(self, now: float) -> None:
        visited = 0
        while len(self._keys) > self.max_idle_keys and visited < EVICTION_SCAN:
            ident, state = next(iter(self._keys.items()))
            visited += 1
            if state.idle(now):
                del self._keys[ident]
            else:
                self._keys.move_to_end(ident)

    def _next_fence(self) -> int:
        self._fence += 1
        return self._fence

    def _grant(self, state: _KeyState, ticket: str, owner: str, lease_ms: int, now: float) -> Granted:
        fence = self._next_fence()
        previous, state.last_owner = state.last_owner, owner
        lapsed, state.lapsed = state.lapsed, None
        silent = None if lapsed is None else round(now - lapsed.expires) + lapsed.lease_ms
        state.holder = _Holder(ticket, owner, fence, now + lease_ms, lease_ms)
        return Granted(ticket, fence, previous, silent)

    # -- turns ---------------------------------------------------------------

    def turn_acquire(self, key: str, owner: str, ticket: str | None, lease_ms: int) -> Granted | Queued:
        with self._lock:
            now = monotonic_ms()
            state = self._state("t", key, now)
            if ticket is None or ticket not in state.queue:
                # A new ticket, or one skipped as dead while its owner was away: the back of the queue.
                state.seq += 1
                ticket = f"{state.seq}|{owner}"
            state.queue[ticket] = now + lease_ms
            if state.live_holder(now) is not None:
                return Queued(ticket)
            for head, deadline in list(state.queue.items()):
                if head == ticket:
                    break
                if deadline > now:
                    return Queued(ticket)
                del state.queue[head]  # a dead replica's ticket is skipped
            del state.queue[ticket]
            return self._grant(state, ticket, owner, lease_ms, now)

    def turn_wait(self, key: str, ticket: str, timeout_s: float) -> None:
        with self._changed:
            self._changed.wait(timeout_s)

    def turn_withdraw(self, key: str, ticket: str) -> None:
        with self._changed:
            state = self._keys.get(("t", key))
            if state is not None:
                state.queue.pop(ticket, None)
            self._changed.notify_all()

    def turn_release(self, key: str, ticket: str) -> bool:
        with self._changed:
            now = monotonic_ms()
            state = self._keys.get(("t", key))
            holder = state.live_holder(now) if state is not None else None
            if holder is None or holder.ticket != ticket:
                return False
            state.holder = None  # type: ignore[union-attr]
            self._keys.move_to_end(("t", key))
            self._changed.notify_all()
            return True

    # -- leadership ----------------------------------------------------------

    def lead_acquire(self, name: str, owner: str, ticket: str, lease_ms: int) -> Granted | Held:
        with self._lock:
            now = monotonic_ms()
            state = self._state("l", name, now)
            holder = state.live_holder(now)
            if holder is not None and holder.owner != owner:
                return Held(holder.owner, holder.fence)
            return self._grant(state, ticket, owner, lease_ms, now)

    def lead_release(self, name: str, ticket: str) -> bool:
        with self._lock:
            state = self._keys.get(("l", name))
            holder = state.live_holder(monotonic_ms()) if state is not None else None
            if holder is None or holder.ticket != ticket:
                return False
            state.holder = None  # type: ignore[union-attr]
            return True

    def renew(self, items: list[tuple[str, str, str]], lease_ms: int) -> list[bool]:
        results = []
        with self._lock:
            now = monotonic_ms()
            for kind, key, ticket in items:
                state = self._keys.get(("t" if kind == "turn" else "l", key))
                holder = state.live_holder(now) if state is not None else None
                if holder is None or holder.ticket != ticket:
                    results.append(False)
                else:
                    holder.expires = now + lease_ms
                    results.append(True)
        return results

    # -- locks ---------------------------------------------------------------

    def lock_acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        with self._lock:
            now = monotonic_ms()
            state = self._state("k", key, now)
            if state.live_holder(now) is not None:
                return None
            return self._grant(state, token, token, ttl_ms, now).fence

    def lock_renew(self, key: str, token: str, ttl_ms: int) -> bool:
        with self._lock:
            state = self._keys.get(("k", key))
            holder = state.live_holder(monotonic_ms()) if state is not None else None
            if holder is None or holder.ticket != token:
                return False
            holder.expires = monotonic_ms() + ttl_ms
            return True

    def lock_release(self, key: str, token: str) -> bool:
        with self._lock:
            state = self._keys.get(("k", key))
            holder = state.live_holder(monotonic_ms()) if state is not None else None
            if holder is None or holder.ticket != token:
                return False
            state.holder = None  # type: ignore[union-attr]
            return True

    def lock_ttl_ms(self, key: str) -> int | None:
        """Return the remaining milliseconds of lock ``key``, or None if it is free (tests, dashboard)."""
        with self._lock:
            state = self._keys.get(("k", key))
            holder = state.live_holder(monotonic_ms()) if state is not None else None
            return None if holder is None else int(holder.expires - monotonic_ms())

    # -- replicas, events ----------------------------------------------------

    def heartbeat(self, owner: str, info: dict[str, Any]) -> None:
        with self._lock:
            self._replicas[owner] = (monotonic_ms(), dict(info))

    def unregister(self, owner: str) -> None:
        with self._lock:
            self._replicas.pop(owner, None)

    def publish(self, event: CoordinationEvent) -> None:
        with self._lock:
            self._events.append(event)

    def snapshot(self, live_ms: int) -> CoordinationSnapshot:
        with self._lock:
            now = monotonic_ms()
            replicas = []
            for owner, (beat, info) in list(self._replicas.items()):
                if now - beat > live_ms:
                    if now - beat > 10 * live_ms:
                        del self._replicas[owner]
                    continue
                replicas.append(_replica_status(info, int(now - beat)))
            leaders = []
            for (kind, name), state in self._keys.items():
                holder = state.live_holder(now) if kind == "l" else None
                if holder is not None:
                    replica_id, _, incarnation = holder.owner.partition("/")
                    leaders.append(LeaderStatus(name, replica_id, incarnation, holder.fence, int(holder.expires - now)))
            events = [e for e in self._events if e.kind in SHOWN_EVENT_KINDS][::-1]
        replicas.sort(key=lambda r: (r.role, r.replica_id))
        leaders.sort(key=lambda leader: leader.name)
        return CoordinationSnapshot(replicas, leaders, events)

    def close(self) -> None:
        """The hub outlives its coordinators; nothing to release."""


def _replica_status(info: dict[str, Any], age_ms: int) -> ReplicaStatus:
    return replica_status_from_info(info, age_ms)


class MemoryCoordinator(Coordinator):
    """A coordinator over a ``MemoryCoordinationHub`` shared by the replicas of one process."""

    def __init__(
        self,
        hub: MemoryCoordinationHub,
        replica_id: str | None = None,
        *,
        lease_ms: int = 15000,
        role: str = "web",
    ) -> None:
        self.hub = hub
        super().__init__(hub, replica_id=replica_id, lease_ms=lease_ms, role=role)
