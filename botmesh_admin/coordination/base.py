"""The Coordinator contract (ARCHITECTURE §8).

Several web, worker and beat processes ("replicas") share one coordination
service. A coordinator is one replica's connection to it and offers:

- **turns** — a FIFO ticket queue per key (a chat key): ``acquire_turn`` takes a
  ticket, turns are granted in ticket order, one holder at a time, across
  replicas; ``release`` passes the turn on;
- **leadership** — ``try_lead(name)`` for exclusive jobs (``provider:<id>``, the
  ``scheduler``);
- **fenced locks** — ``acquire_lock_fenced`` / ``renew_lock`` / ``release_lock``.

Every grant carries a **fence**: an integer that grows with every acquisition
and never goes backwards, also after the service restarts empty. A write
guarded by the fence (``botmesh_admin.coordination.fencing.FenceGuard``) is
refused once a later holder has written.

Turns and leaderships are *leases* of ``lease_ms`` renewed by the coordinator's
background thread every ``lease_ms/3``. A handle stays valid locally only until
``LOCAL_VALIDITY`` of ``lease_ms`` after the last successful renewal was *sent*
(a monotonic clock, ``botmesh_admin.clock.monotonic_ms``: a test's
``use_clock(FakeClock())`` moves it), so a replica frozen for most of ``lease_ms`` gives its
leases up before the service expires them, and never acts on a lease another
replica may already hold. Each coordinator instance has an *incarnation* nonce:
a restarted replica with the same ``replica_id`` never inherits the turns of
its previous life (they pass on after ``lease_ms``).

Times are milliseconds. Events (``EVENT_KINDS``) are delivered to subscribers.
Every implementation passes ``tests/coordination/test_conformance.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from botmesh_admin.errors import Conflict, ValidationError

LOCAL_VALIDITY = 0.8
"""Share of ``lease_ms`` after a renewal was sent during which a handle is valid locally."""

EVENT_KINDS = ("leader", "follower", "lease-lost", "step-down", "handover")

SHOWN_EVENT_KINDS = ("lease-lost", "step-down", "handover")
"""The kinds a backend keeps for ``snapshot().events`` (the Replicas page's history), newest first."""

TURN_KEYS_SHOWN = 50
"""At most this many hashed chat keys a heartbeat carries (``ReplicaStatus.turn_keys``)."""

REPLICA_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")
PREFIX_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_KEY_CHARS = 512
MIN_LEASE_MS = 100


class LeaseLost(Conflict):
    """The lease or turn behind a write is no longer held (expired, lost or released). HTTP 409."""

    code = "lease_lost"


class StaleFence(Conflict):
    """A fenced write presented a fence older than one already seen. HTTP 409.

    ``current_version`` carries the highest fence seen.
    """

    code = "stale_fence"


def validate_key(key: object, field_name: str = "key") -> str:
    """Return ``key`` if it is 1..512 characters without control characters, else raise."""
    if not isinstance(key, str) or not key:
        raise ValidationError(field_name, "must be a non-empty string")
    if len(key) > MAX_KEY_CHARS:
        raise ValidationError(field_name, f"longer than {MAX_KEY_CHARS} characters")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
        raise ValidationError(field_name, "contains a control character")
    return key


def validate_name(name: object, field_name: str = "name") -> str:
    """Return a leadership ``name`` (``scheduler``, ``provider:<id>``) if well-formed, else raise."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValidationError(field_name, "must be 1-128 characters of A-Z, a-z, 0-9, '_', '.', ':', '@' or '-'")
    return name


def validate_replica_id(replica_id: object) -> str:
    """Return ``replica_id`` if well-formed (as a leadership name), else raise ``ValidationError``."""
    return validate_name(replica_id, "replica_id")


def validate_lease_ms(lease_ms: object, field_name: str = "lease_ms") -> int:
    """Return ``lease_ms`` if it is an int of at least ``MIN_LEASE_MS``, else raise."""
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int):
        raise ValidationError(field_name, "must be an integer number of milliseconds")
    if lease_ms < MIN_LEASE_MS:
        raise ValidationError(field_name, f"must be at least {MIN_LEASE_MS} ms")
    return lease_ms


def bot_prefix(tenant: str, bot: str) -> str:
    """Return the coordination prefix of one bot's replicas: ``bot-`` and 20 hex digits.

    Every replica of bot ``bot`` in tenant ``tenant`` coordinates under this
    prefix (its turns, ``provider:<id>`` and ``scheduler`` leaderships, heartbeats
    and events), and the Replicas page reads the same keys. The digest is the
    first 20 hex digits of SHA-256 over ``"<tenant>/<bot>"`` (UTF-8): a tenant id
    and a bot id together can exceed the 63 characters a prefix may have
    (``PREFIX_RE``), and bot ids may hold characters a prefix may not. Raise
    ``ValidationError`` naming ``tenant`` or ``bot`` when one is empty.
    """
    for field_name, value in (("tenant", tenant), ("bot", bot)):
        if not isinstance(value, str) or not value:
            raise ValidationError(field_name, "must be a non-empty string")
    digest = hashlib.sha256(f"{tenant}/{bot}".encode("utf-8", "surrogatepass")).hexdigest()[:20]
    return f"bot-{digest}"


@dataclass(frozen=True, slots=True)
class CoordinationEvent:
    """Something that happened to a lease.

    ``kind`` is one of ``EVENT_KINDS``; ``name`` the leadership name (or, for a
    turn, ``turn:<hash of the key>`` — chat keys never appear raw);
    ``replica_id``/``incarnation`` the replica it happened to; ``fence`` the
    fence involved; ``at_ms`` epoch milliseconds; ``previous`` the previous
    holder (``replica_id/incarnation``) for ``handover``.
    """

    kind: str
    name: str
    replica_id: str
    incarnation: str
    fence: int | None
    at_ms: int
    previous: str | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return the event as plain JSON."""
        return {
            "kind": self.kind,
            "name": self.name,
            "replica_id": self.replica_id,
            "incarnation": self.incarnation,
            "fence": self.fence,
            "at_ms": self.at_ms,
            "previous": self.previous,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """One live replica as the dashboard shows it (``age_ms`` since its last heartbeat).

    ``turns`` counts the chat turns it holds; ``turn_keys`` are the hashes
    (``core.key_digest``, 12 hex digits) of at most ``TURN_KEYS_SHOWN`` of those
    chat keys — never the keys themselves. ``lease_ms`` is the replica's own
    lease (``None`` from a heartbeat that did not say it). ``unreadable`` names the
    heartbeat's fields that were of the wrong type (``replica_status_from_info``).
    """

    replica_id: str
    incarnation: str
    role: str
    host: str
    pid: int
    age_ms: int
    turns: int
    leads: dict[str, int] = field(default_factory=dict)
    turn_keys: tuple[str, ...] = ()
    lease_ms: int | None = None
    unreadable: tuple[str, ...] = ()


def heartbeat_int(value: object) -> int | None:
    """Return ``value`` as an int if it is one (not a bool), a whole float or a string of decimal digits
    (what heartbeats in other languages send), within ±2**63; else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and 0 < len(value) <= 20 and value.lstrip("-").isdecimal() and value.isascii():
        value = int(value)
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return value
    return None


def _heartbeat_text(value: object) -> str | None:
    """Return ``value`` if it is short text (what a heartbeat's names are) or an int, else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and len(value) <= 512 else None


def replica_status_from_info(info: object, age_ms: int) -> ReplicaStatus:
    """Return the ``ReplicaStatus`` of a heartbeat's ``info`` (what ``core.Coordinator._beat`` sends).

    Every backend's ``snapshot`` reads heartbeats through this, so a field added
    to the heartbeat shows on every backend. Missing fields read as ``"?"``/0.
    Never raises: heartbeats come from bot processes (in other languages too), so
    a field of the wrong type (``"pid": "12a"``, ``"leads": [1]``) — or an
    ``info`` that is no JSON object at all — reads as missing and is named in
    ``unreadable`` (the page shows "unreadable heartbeat"); one bad heartbeat
    never takes the snapshot of the others down.
    """
    data: dict[str, Any] = info if isinstance(info, dict) else {}
    unreadable: list[str] = [] if isinstance(info, dict) else ["heartbeat"]

    def text(name: str) -> str:
        if name not in data:
            return "?"
        value = _heartbeat_text(data[name])
        if value is None:
            unreadable.append(name)
            return "?"
        return value

    def number(name: str) -> int:
        if name not in data:
            return 0
        value = heartbeat_int(data[name])
        if value is None:
            unreadable.append(name)
            return 0
        return value

    replica_id, incarnation, role, host = text("replica_id"), text("incarnation"), text("role"), text("host")
    pid, turns = number("pid"), number("turns")
    leads: dict[str, int] = {}
    raw_leads = data.get("leads", {})
    if isinstance(raw_leads, dict) and all(
        isinstance(k, str) and heartbeat_int(v) is not None for k, v in raw_leads.items()
    ):
        leads = {k: heartbeat_int(v) or 0 for k, v in raw_leads.items()}
    else:
        unreadable.append("leads")
    raw_keys = data.get("turn_keys", [])
    turn_keys: tuple[str, ...] = ()
    if isinstance(raw_keys, list | tuple) and all(isinstance(k, str) for k in raw_keys):
        turn_keys = tuple(raw_keys[:TURN_KEYS_SHOWN])
    else:
        unreadable.append("turn_keys")
    lease_ms = heartbeat_int(data.get("lease_ms"))
    return ReplicaStatus(
        replica_id=replica_id,
        incarnation=incarnation,
        role=role,
        host=host,
        pid=pid,
        age_ms=int(age_ms),
        turns=turns,
        leads=leads,
        turn_keys=turn_keys,
        lease_ms=lease_ms if lease_ms is not None and lease_ms > 0 else None,
        unreadable=tuple(unreadable),
    )


@dataclass(frozen=True, slots=True)
class LeaderStatus:
    """The current holder of one leadership (``expires_in_ms`` until its lease ends)."""

    name: str
    replica_id: str
    incarnation: str
    fence: int
    expires_in_ms: int


@dataclass(frozen=True, slots=True)
class CoordinationSnapshot:
    """What the replicas dashboard reads: live replicas, leaders, recent events."""

    replicas: list[ReplicaStatus]
    leaders: list[LeaderStatus]
    events: list[CoordinationEvent]


@runtime_checkable
class LeaseHandle(Protocol):
    """A held turn or leadership."""

    key: str
    fence: int
    previous_holder: str | None

    def valid(self) -> bool:
        """Return True while the lease is held and its local deadline has not passed."""
        ...

    def remaining_ms(self) -> int:
        """Return milliseconds until the local deadline (0 when no longer valid)."""
        ...

    def release(self) -> bool:
        """Give the lease up; return True if it was still held in the service."""
        ...


@runtime_checkable
class Coordinator(Protocol):
    """Contract of every coordinator. All methods are thread-safe."""

    replica_id: str
    incarnation: str
    lease_ms: int

    def acquire_turn(self, key: str, wait_ms: int) -> LeaseHandle | None:
        """Take a ticket on ``key`` and wait up to ``wait_ms`` for the turn.

        Turns are granted in ticket order, one holder at a time; queued tickets
        of dead replicas are skipped. Return the held turn (renewed in the
        background every ``lease_ms/3``) or ``None`` after ``wait_ms`` (the
        ticket is withdrawn). Raise ``ValidationError`` for a bad key.
        """
        ...

    def release(self, turn: LeaseHandle) -> bool:
        """Release ``turn`` (compare-and-delete) and wake the next ticket; True if it was held."""
        ...

    def try_lead(self, name: str) -> LeaseHandle | None:
        """Return the leadership of ``name`` if this replica holds or can take it, else ``None``.

        Emit ``leader`` (and ``handover`` when another replica led before) on
        taking it, ``follower`` when another replica leads (on a change only).
        """
        ...

    def acquire_lock_fenced(self, key: str, ttl_ms: int) -> tuple[str, int] | None:
        """Take the lock ``key`` for ``ttl_ms``; return ``(token, fence)`` or ``None`` if held.

        The lock is not renewed automatically: call ``renew_lock``.
        """
        ...

    def renew_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        """Set the lock's remaining time to ``ttl_ms`` (replace, never add) if ``token`` holds it."""
        ...

    def release_lock(self, key: str, token: str) -> bool:
        """Delete the lock if ``token`` holds it (compare-and-delete); return True if it did."""
        ...

    def subscribe(self, callback: Callable[[CoordinationEvent], None]) -> Callable[[], None]:
        """Call ``callback`` for every event of this coordinator; return an unsubscribe function."""
        ...

    def snapshot(self) -> CoordinationSnapshot:
        """Return live replicas, current leaders and recent lease-lost/handover events."""
        ...

    def close(self, *, release: bool = True) -> None:
        """Stop renewing; release every held lease unless ``release`` is False (a simulated crash)."""
        ...
