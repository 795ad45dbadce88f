"""KvCoordinator: coordination over a DurableKv (SQLite file, PostgreSQL, any shared Kv).

The embedded default and PostgreSQL-only installations coordinate across
processes without Redis (ARCHITECTURE §8): every replica reads and writes the
entries below with the Kv's compare-and-set ``commit`` (read, compute, commit
with ``expect=<version read>``, retry on ``ConflictError`` up to
``MAX_ATTEMPTS`` times, then ``StoreUnavailable``). The semantics are those of
``memory.MemoryCoordinationHub`` and the Redis scripts; this docstring is the
wire protocol for a bot written in another language.

Table and keys
--------------

Everything of prefix ``P`` (``BOTMESH_COORDINATION_PREFIX``, or
``coordination.bot_prefix(tenant, bot)`` for a bot's replicas) lives in one Kv
table, ``coordination/~coordinator/P`` — a kernel namespace (``~``) no tenant
id can name (``kv/tenant.py``). ``H(x)`` is the lowercase hex SHA-256 of the
UTF-8 bytes of ``x``: chat keys and lock keys never appear raw, and any key
fits the Kv's 512-byte key limit.

======================  ==============================================================  ===========
key                     value (JSON)                                                    Kv TTL
======================  ==============================================================  ===========
``fence``               integer: the last fence issued for ``P``                         none
``t/H(key)/q``          turn queue ``{"seq": n, "tickets": [[ticket, deadline_ms], …]}``  ``IDLE_MS``
``t/H(key)/h``          turn holder record (below)                                      ``IDLE_MS``
``l/<name>``            leadership holder record (``scheduler``, ``provider:<id>``)      ``IDLE_MS``
``k/H(key)``            fenced lock holder record (``ticket`` is the lock token)        ``IDLE_MS``
``r/<owner>``           replica heartbeat (below)                                       max(60 s, 30 × lease)
``events``              integer: events published so far (``Add(events, 1)``)            none
``e/<n mod 200, %03d>`` event ``n``: ``CoordinationEvent.to_json()`` + ``"seq": n``      none
======================  ==============================================================  ===========

``IDLE_MS`` is one day, set again by every write: an idle key vanishes (and a
recreated one reports no previous holder). Events and the counters never expire.

A **holder record** is ``{"holder": null | {"ticket": str, "owner": str,
"fence": int, "expires_ms": int, "lease_ms": int}, "last_owner": str | null, "last_fence":
int}``; ``last_owner`` is the previous holder a grant reports as
``previous_holder``. A release sets ``holder`` to null; an expired lease leaves
it in place, so the next grant tells the two apart: its ``handover`` event says
"previous holder's lease expired (no renewal for N ms)" with N = now -
``expires_ms`` + ``lease_ms`` (the grant's own lease when ``lease_ms`` is
missing). An ``owner`` is ``<replica_id>/<incarnation>`` (a new random
incarnation per process); a turn ticket is ``<n>|<owner>`` where ``n``
is the queue's ``seq`` after incrementing it; a leadership ticket is
``<owner>#<n>``. A holder is *live* while ``expires_ms`` > now; a queued ticket
is live while its ``deadline_ms`` > now (its waiter touches it, setting it to
now + ``lease_ms``, at least every ``lease_ms/2``); a dead one is skipped.

Times are **wall-clock epoch milliseconds of the writing host** (``botmesh_admin.clock.now_ms``,
which a test's ``use_clock(FakeClock())`` moves). Hosts that
share a PostgreSQL Kv must keep their clocks synchronised (NTP) to well within
``lease_ms``; a replica also gives its leases up locally after
``LOCAL_VALIDITY`` × ``lease_ms`` on its monotonic clock (``core.Lease``),
which clock skew does not affect.

The operations
--------------

- **Take a turn** on ``key``: read ``q``, ``h`` and ``fence`` (one
  ``get_many``). A new ticket goes to the back of ``tickets`` (``seq`` + 1). If
  ``h`` has a live holder, or a live ticket is ahead of this one, commit the
  queue (``Put q expect=<version>``) and wait: poll again after ``POLL_MS`` (no
  cross-process wake-up; waiters in one process are woken at once on a
  release). Dead tickets ahead are removed. Otherwise take a fence and commit
  ``Put q`` (ticket removed) and ``Put h`` (holder, ``last_owner``/``last_fence``
  = this grant), both with ``expect=<version read>`` (``ABSENT`` if absent),
  in one commit.
- **Take a fence**, inside the grant's commit: ``n`` = the ``fence`` read (if
  absent: the highest of the durable fence marks of the Redis coordinator and
  the file-locked beat, ``coordination/system/fences`` keys ``fence:P`` and
  ``fence:scheduler-file``, value ``{"ceiling": n}``, or 0), the fence is
  ``max(n, last_fence) + 1`` and the commit also holds ``Put fence <fence>
  expect=<version read>``. When that commit fails on ``fence`` (another grant
  took one meanwhile), the retries take the fence first with its own
  ``commit([Add("fence", 1)])`` (``Add`` never conflicts) and use the returned
  value. The entry has no TTL and lives in the same durable Kv as the data it
  guards, so fences never go backwards, also after every process restarts or
  after a move from Redis. A fence taken for a grant whose commit then
  conflicted is skipped (fences are increasing, not contiguous).
- **Renew** a turn or leadership: if the holder record's holder has this
  ``ticket`` and is live, set ``expires_ms`` = now + ``lease_ms`` (CAS); else the
  lease is lost. Every ``lease_ms/3``.
- **Release**: if the holder has this ``ticket``, set ``holder`` to null (CAS).
  **Withdraw** a ticket: remove it from ``tickets`` (CAS).
- **Lead** ``name``: if ``l/<name>`` has a live holder with another ``owner``,
  it leads; else grant as for a turn (a fence, a new holder).
- **Fenced lock** ``key``: as leadership, on ``k/H(key)``, with the caller's
  token as ticket and owner and ``ttl_ms`` as lease; renew sets ``expires_ms`` =
  now + ``ttl_ms`` (replaces, never adds).
- **Heartbeat** every ``lease_ms/3``: ``Put r/<owner>`` with ``{"replica_id",
  "incarnation", "role", "host", "pid", "started_ms", "turns": <held turns>,
  "leads": {name: fence}, "beat_ms", "lease_ms"}``; a clean stop deletes it.
  A replica is live while now - ``beat_ms`` ≤ the reader's ``live_ms``.
- **Publish an event** (``leader``, ``handover``, ``lease-lost``): ``n =
  Add("events", 1)``, then ``Put e/<n mod EVENTS_KEPT>``: the last 200 events,
  newest = highest ``seq``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import StoreUnavailable, ValidationError
from botmesh_admin.kv import ABSENT, Add, ConflictError, Delete, DurableKv, Entry, Op, Put
from botmesh_admin.kv.cas import cas_retry
from botmesh_admin.kv.tenant import KERNEL_MARK

from .base import (
    PREFIX_RE,
    SHOWN_EVENT_KINDS,
    CoordinationEvent,
    CoordinationSnapshot,
    LeaderStatus,
    heartbeat_int,
    replica_status_from_info,
)
from .core import Coordinator, Granted, Held, Queued

T = TypeVar("T")

POLL_MS = 20
"""How often a queued waiter re-reads its turn (milliseconds): wake-ups are not cross-process."""
IDLE_MS = 24 * 3600 * 1000
"""Kv TTL of a turn, leadership or lock record, renewed by every write: idle keys vanish after a day."""
REPLICA_TTL_MS_MIN = 60_000
"""A heartbeat entry's Kv TTL is the larger of this and 30 × ``lease_ms`` (10 × the 3 × ``lease_ms`` liveness)."""
EVENTS_KEPT = 200
MAX_ATTEMPTS = 64
"""Compare-and-set attempts of one operation before it gives up with ``StoreUnavailable``."""
SCAN_PAGE = 1000
MAX_LISTED = 10_000  # replicas / leaderships a snapshot reads at most

TABLE_NAMESPACE = "coordinator"

# Waiters of every KvBackend of this process: a release wakes them at once (other processes poll).
_local_change = threading.Condition()


def coordination_table(prefix: str) -> str:
    """Return the Kv table of prefix ``prefix``: ``coordination/~coordinator/<prefix>``.

    Raise ``ValidationError`` (field ``prefix``) unless ``prefix`` matches ``base.PREFIX_RE``.
    """
    if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):
        raise ValidationError("prefix", "must be 1-63 characters of a-z, 0-9, '_', '.' or '-'")
    # A kernel namespace ("~" is outside the tenant id alphabet); the collection is the prefix,
    # whose alphabet (PREFIX_RE) adds only "." to the id alphabet, so TenantKv.kernel_table cannot build it.
    return f"coordination/{KERNEL_MARK}{TABLE_NAMESPACE}/{prefix}"


def hashed(key: str) -> str:
    """Return ``H(key)``: the hex SHA-256 of ``key``'s UTF-8 bytes."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _empty_holder() -> dict[str, Any]:
    return {"holder": None, "last_owner": None, "last_fence": 0}


def _live_holder(record: dict[str, Any], now: int) -> dict[str, Any] | None:
    holder = record.get("holder")
    if holder is not None and int(holder["expires_ms"]) > now:
        return holder  # type: ignore[no-any-return]
    return None


def _expect(entry: Entry | None) -> int | Any:
    return entry.version if entry is not None else ABSENT


class KvBackend:
    """The Kv side of ``KvCoordinator`` (see the module docstring for the keys and values).

    ``kv`` is any DurableKv that every replica reaches (a shared SQLite file,
    PostgreSQL, Redis); ``MemoryKv`` coordinates the threads of one process.
    ``owns_kv`` closes ``kv`` with the backend. ``lease_ms`` sets the heartbeat
    entry's TTL. Raise ``ValidationError`` for a bad prefix.
    """

    def __init__(self, kv: DurableKv, prefix: str, *, owns_kv: bool = False, lease_ms: int = 15000) -> None:
        self.table = coordination_table(prefix)
        self.prefix = prefix
        self.kv = kv
        self._owns_kv = owns_kv
        self.lease_ms = lease_ms
        self._seed_start: int | None = None
        # The holder records this backend wrote last (record key -> (value, version)): a release or
        # renewal of its own lease commits against that version without reading first; a conflict
        # (someone else wrote the record) falls back to read, compute, commit.
        self._written: dict[str, tuple[dict[str, Any], int]] = {}

    # -- plumbing ------------------------------------------------------------

    def _cas(self, attempt: Callable[[bool], T]) -> T:
        """Run ``attempt(inline)`` (read, compute, commit) until it commits without a conflict.

        ``inline`` says whether a grant takes its fence inside its own commit
        (a compare-and-set of ``fence``); after a conflict on ``fence`` (another
        grant took one meanwhile) the next attempts take it with ``Add`` first.
        """
        inline = True

        def once() -> T:
            nonlocal inline
            try:
                return attempt(inline)
            except ConflictError as exc:
                if exc.key == "fence":
                    inline = False
                raise  # another replica wrote between our read and our commit: cas_retry reads again

        return cas_retry(
            once,
            what=f"Kv coordinator table {self.table}",
            attempts=MAX_ATTEMPTS,
            exhausted=lambda: StoreUnavailable(
                f"Kv coordinator: {MAX_ATTEMPTS} compare-and-set conflicts in a row on {self.table}"
            ),
        )

    def _seed(self) -> int:
        """Return where a new counter starts: above the durable marks of the other electors of this prefix.

        A deployment that coordinated through Redis (``FenceWatermark`` of the
        prefix: at or above every fence Redis issued) or the file-locked beat
        (``scheduler-file``) has written fences into the same FenceGuards; the
        counter starts above both, so switching to the Kv never goes backwards.
        """
        if self._seed_start is None:
            from .redis import FenceWatermark

            self._seed_start = max(FenceWatermark(self.kv, name).read() for name in (self.prefix, "scheduler-file"))
        return self._seed_start

    def next_fence(self) -> int:
        """Return a new fence from the prefix's durable counter (``Add``: never conflicts)."""
        if self.kv.get(self.table, "fence") is None:
            try:
                self.kv.commit(self.table, [Put("fence", self._seed(), expect=ABSENT)])
            except ConflictError:
                pass  # another replica created it first (from the same marks)
        entry = self.kv.commit(self.table, [Add("fence", 1)])[0]
        assert entry is not None
        return int(entry.value)

    def _grant_record(
        self,
        record: dict[str, Any],
        ticket: str,
        owner: str,
        lease_ms: int,
        now: int,
        fence_entry: Entry | None,
        inline: bool,
    ) -> tuple[dict[str, Any], Granted, list[Op]]:
        """Return the new holder record, the grant and the ops to commit with it (the fence's, if inline)."""
        last = int(record.get("last_fence", 0))
        extra: list[Op] = []
        if inline:
            counter = int(fence_entry.value) if fence_entry is not None else self._seed()
            fence = max(counter, last) + 1  # never at or below the record's last fence (a counter reset by hand)
            extra.append(Put("fence", fence, expect=_expect(fence_entry)))
        else:
            fence = self.next_fence()
            while fence <= last:
                fence = self.next_fence()
        previous = record.get("last_owner")
        old = record.get("holder")
        silent = None
        if old is not None and int(old["expires_ms"]) <= now:
            # Expired, not released (a release sets holder to null): it stopped renewing. A record
            # without lease_ms (an older writer) is taken to have had this grant's lease.
            silent = now - int(old["expires_ms"]) + int(old.get("lease_ms") or lease_ms)
        new = {
            "holder": {
                "ticket": ticket,
                "owner": owner,
                "fence": fence,
                "expires_ms": now + lease_ms,
                "lease_ms": lease_ms,
            },
            "last_owner": owner,
            "last_fence": fence,
        }
        return new, Granted(ticket, fence, previous, silent), extra

    def _put_holder(self, record_key: str, record: dict[str, Any], expect: Any, extra: Sequence[Op] = ()) -> None:
        """Commit holder record ``record`` (with ``extra`` ops first) and remember its version."""
        entries = self.kv.commit(self.table, [*extra, Put(record_key, record, expect=expect, ttl_ms=IDLE_MS)])
        written = entries[-1]
        assert written is not None
        if record.get("holder") is not None:
            self._written[record_key] = (record, written.version)
        else:
            self._written.pop(record_key, None)

    def _own_record(self, record_key: str, ticket: str) -> tuple[dict[str, Any], int] | None:
        known = self._written.get(record_key)
        if known is None or known[0]["holder"]["ticket"] != ticket:
            return None
        return known

    @staticmethod
    def _wake() -> None:
        with _local_change:
            _local_change.notify_all()

    def _turn_keys(self, key: str) -> tuple[str, str]:
        base = f"t/{hashed(key)}"
        return f"{base}/q", f"{base}/h"

    # -- turns ---------------------------------------------------------------

    def turn_acquire(self, key: str, owner: str, ticket: str | None, lease_ms: int) -> Granted | Queued:
        q_key, h_key = self._turn_keys(key)

        def attempt(inline: bool) -> Granted | Queued:
            q_entry, h_entry, fence_entry = self.kv.get_many(self.table, [q_key, h_key, "fence"])
            now = now_ms()
            queue: dict[str, Any] = dict(q_entry.value) if q_entry is not None else {"seq": 0, "tickets": []}
            tickets: list[list[Any]] = [list(t) for t in queue["tickets"]]
            record = dict(h_entry.value) if h_entry is not None else _empty_holder()
            mine = ticket
            position = next((i for i, t in enumerate(tickets) if t[0] == mine), None) if mine else None
            touched = False
            if position is None:
                # A new ticket, or one skipped as dead while its owner was away: the back of the queue.
                queue["seq"] = int(queue["seq"]) + 1
                mine = f"{queue['seq']}|{owner}"
                tickets.append([mine, now + lease_ms])
                position = len(tickets) - 1
                touched = True
            elif int(tickets[position][1]) - now < lease_ms // 2:
                tickets[position][1] = now + lease_ms  # still waiting: keep the ticket alive
                touched = True
            assert mine is not None
            grantable = _live_holder(record, now) is None
            if grantable:
                live_ahead = [t for t in tickets[:position] if int(t[1]) > now]
                if len(live_ahead) < position:  # dead replicas' tickets ahead are skipped
                    tickets = live_ahead + tickets[position:]
                    touched = True
                grantable = not live_ahead
            if not grantable:
                if touched:
                    queue["tickets"] = tickets
                    self.kv.commit(self.table, [Put(q_key, queue, expect=_expect(q_entry), ttl_ms=IDLE_MS)])
                return Queued(mine)
            queue["tickets"] = [t for t in tickets if t[0] != mine]
            new_record, granted, extra = self._grant_record(record, mine, owner, lease_ms, now, fence_entry, inline)
            queue_put = Put(q_key, queue, expect=_expect(q_entry), ttl_ms=IDLE_MS)
            self._put_holder(h_key, new_record, _expect(h_entry), [*extra, queue_put])
            return granted

        return self._cas(attempt)

    def turn_wait(self, key: str, ticket: str, timeout_s: float) -> None:
        """Sleep up to ``min(timeout_s, POLL_MS)``; a release in this process wakes the waiter at once."""
        with _local_change:
            _local_change.wait(max(0.0, min(timeout_s, POLL_MS / 1000)))

    def turn_withdraw(self, key: str, ticket: str) -> None:
        q_key, _ = self._turn_keys(key)

        def attempt(_: bool) -> None:
            entry = self.kv.get(self.table, q_key)
            if entry is None:
                return
            queue = dict(entry.value)
            kept = [t for t in queue["tickets"] if t[0] != ticket]
            if len(kept) == len(queue["tickets"]):
                return
            queue["tickets"] = kept
            self.kv.commit(self.table, [Put(q_key, queue, expect=entry.version, ttl_ms=IDLE_MS)])

        self._cas(attempt)
        self._wake()

    def turn_release(self, key: str, ticket: str) -> bool:
        released = self._holder_release(self._turn_keys(key)[1], ticket)
        self._wake()
        return released

    def _holder_release(self, record_key: str, ticket: str) -> bool:
        known = self._own_record(record_key, ticket)
        if known is not None:
            self._written.pop(record_key, None)  # forgotten whatever happens next
            record, version = known
            try:
                self._put_holder(record_key, {**record, "holder": None}, version)
                return int(record["holder"]["expires_ms"]) > now_ms()
            except ConflictError:
                pass  # written by another replica since: read it

        def attempt(_: bool) -> bool:
            entry = self.kv.get(self.table, record_key)
            holder = entry.value.get("holder") if entry is not None else None
            if entry is None or holder is None or holder["ticket"] != ticket:
                return False
            self._put_holder(record_key, {**entry.value, "holder": None}, entry.version)
            return int(holder["expires_ms"]) > now_ms()

        return self._cas(attempt)

    def _holder_renew(self, record_key: str, ticket: str, lease_ms: int) -> bool:
        known = self._own_record(record_key, ticket)
        if known is not None:
            record, version = known
            now = now_ms()
            if int(record["holder"]["expires_ms"]) <= now:
                return False  # expired: another replica may hold it now
            try:
                self._put_holder(
                    record_key, {**record, "holder": {**record["holder"], "expires_ms": now + lease_ms}}, version
                )
                return True
            except ConflictError:
                self._written.pop(record_key, None)

        def attempt(_: bool) -> bool:
            entry = self.kv.get(self.table, record_key)
            if entry is None:
                return False
            now = now_ms()
            holder = _live_holder(entry.value, now)
            if holder is None or holder["ticket"] != ticket:
                return False
            self._put_holder(
                record_key, {**entry.value, "holder": {**holder, "expires_ms": now + lease_ms}}, entry.version
            )
            return True

        return self._cas(attempt)

    # -- leadership ----------------------------------------------------------

    def lead_acquire(self, name: str, owner: str, ticket: str, lease_ms: int) -> Granted | Held:
        record_key = f"l/{name}"

        def attempt(inline: bool) -> Granted | Held:
            entry, fence_entry = self.kv.get_many(self.table, [record_key, "fence"])
            now = now_ms()
            record = dict(entry.value) if entry is not None else _empty_holder()
            holder = _live_holder(record, now)
            if holder is not None and holder["owner"] != owner:
                return Held(str(holder["owner"]), int(holder["fence"]))
            new_record, granted, extra = self._grant_record(record, ticket, owner, lease_ms, now, fence_entry, inline)
            self._put_holder(record_key, new_record, _expect(entry), extra)
            return granted

        return self._cas(attempt)

    def lead_release(self, name: str, ticket: str) -> bool:
        return self._holder_release(f"l/{name}", ticket)

    def renew(self, items: list[tuple[str, str, str]], lease_ms: int) -> list[bool]:
        return [
            self._holder_renew(self._turn_keys(key)[1] if kind == "turn" else f"l/{key}", ticket, lease_ms)
            for kind, key, ticket in items
        ]

    # -- locks ---------------------------------------------------------------

    def lock_acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        record_key = f"k/{hashed(key)}"

        def attempt(inline: bool) -> int | None:
            entry, fence_entry = self.kv.get_many(self.table, [record_key, "fence"])
            now = now_ms()
            record = dict(entry.value) if entry is not None else _empty_holder()
            if _live_holder(record, now) is not None:
                return None
            new_record, granted, extra = self._grant_record(record, token, token, ttl_ms, now, fence_entry, inline)
            self._put_holder(record_key, new_record, _expect(entry), extra)
            return granted.fence

        return self._cas(attempt)

    def lock_renew(self, key: str, token: str, ttl_ms: int) -> bool:
        return self._holder_renew(f"k/{hashed(key)}", token, ttl_ms)

    def lock_release(self, key: str, token: str) -> bool:
        return self._holder_release(f"k/{hashed(key)}", token)

    def lock_ttl_ms(self, key: str) -> int | None:
        """Return the lock's remaining milliseconds, or None if it is free (tests, dashboard)."""
        entry = self.kv.get(self.table, f"k/{hashed(key)}")
        now = now_ms()
        holder = _live_holder(entry.value, now) if entry is not None else None
        return None if holder is None else int(holder["expires_ms"]) - now

    # -- replicas, events ----------------------------------------------------

    def heartbeat(self, owner: str, info: dict[str, Any]) -> None:
        value = {**info, "beat_ms": now_ms(), "lease_ms": self.lease_ms}
        ttl_ms = max(REPLICA_TTL_MS_MIN, 30 * self.lease_ms)
        self.kv.commit(self.table, [Put(f"r/{owner}", value, ttl_ms=ttl_ms)])

    def unregister(self, owner: str) -> None:
        self.kv.commit(self.table, [Delete(f"r/{owner}")])

    def publish(self, event: CoordinationEvent) -> None:
        counter = self.kv.commit(self.table, [Add("events", 1)])[0]
        assert counter is not None
        seq = int(counter.value)
        self.kv.commit(self.table, [Put(f"e/{seq % EVENTS_KEPT:03d}", {**event.to_json(), "seq": seq})])

    def _scan_all(self, prefix: str, cap: int) -> list[Entry]:
        out: list[Entry] = []
        after: str | None = None
        while len(out) < cap:
            page = self.kv.scan(self.table, prefix=prefix, after=after, limit=min(SCAN_PAGE, cap - len(out)))
            out += page
            if len(page) < SCAN_PAGE:
                break
            after = page[-1].key
        return out

    def snapshot(self, live_ms: int) -> CoordinationSnapshot:
        """Return replicas whose heartbeat is younger than ``live_ms``, live leaders and recent events.

        Reads O(replicas + leaderships + ``EVENTS_KEPT``) entries, never a turn or lock record.
        """
        now = now_ms()
        replicas = []
        for entry in self._scan_all("r/", MAX_LISTED):
            info = entry.value
            # A heartbeat is a bot process's JSON (any language): a malformed one never fails the
            # snapshot of the others. Without a readable beat_ms its liveness is unknown: skipped (its
            # TTL removes it); other bad fields show as unreadable (replica_status_from_info).
            beat = heartbeat_int(info.get("beat_ms")) if isinstance(info, dict) else None
            age = now - beat if beat is not None else live_ms + 1
            if age > live_ms:
                continue
            replicas.append(replica_status_from_info(info, max(0, age)))
        leaders = []
        for entry in self._scan_all("l/", MAX_LISTED):
            holder = _live_holder(entry.value, now)
            if holder is not None:
                replica_id, _, incarnation = str(holder["owner"]).partition("/")
                leaders.append(
                    LeaderStatus(
                        entry.key[2:], replica_id, incarnation, int(holder["fence"]), int(holder["expires_ms"]) - now
                    )
                )
        stored = sorted(self._scan_all("e/", EVENTS_KEPT), key=lambda e: -int(e.value.get("seq", 0)))
        events = [_event(e.value) for e in stored if e.value.get("kind") in SHOWN_EVENT_KINDS]
        replicas.sort(key=lambda r: (r.role, r.replica_id))
        leaders.sort(key=lambda leader: leader.name)
        return CoordinationSnapshot(replicas, leaders, events)

    def close(self) -> None:
        if self._owns_kv:
            self.kv.close()


def _event(data: dict[str, Any]) -> CoordinationEvent:
    fields: Sequence[str] = CoordinationEvent.__dataclass_fields__.keys()  # type: ignore[assignment]
    return CoordinationEvent(**{k: data[k] for k in fields if k in data})


class KvCoordinator(Coordinator):
    """A coordinator over a DurableKv that every replica reaches (see the module docstring).

    ``kv`` is the shared Kv (``sqlite:///…`` on one host, ``postgresql://…``);
    ``prefix`` namespaces the state (several deployments or bots may share one
    Kv); ``owns_kv`` closes ``kv`` with the coordinator. Raise
    ``ValidationError`` for a bad prefix, lease or replica id and
    ``StoreUnavailable`` when the Kv cannot be reached.
    """

    def __init__(
        self,
        kv: DurableKv,
        prefix: str,
        lease_ms: int = 15000,
        replica_id: str | None = None,
        *,
        role: str = "web",
        owns_kv: bool = False,
    ) -> None:
        self.backend = KvBackend(kv, prefix, owns_kv=owns_kv, lease_ms=lease_ms)
        super().__init__(self.backend, replica_id=replica_id, lease_ms=lease_ms, role=role)
