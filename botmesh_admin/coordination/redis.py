"""RedisCoordinator: coordination over a standalone Redis (``redis://``) or Redis Cluster.

Key layout for prefix ``P`` (every key of one coordination key shares a hash
tag, so each script touches one cluster slot):

===========================  ======================================================
``{P:t:<key>}:q``            sorted set of queued tickets (score = ticket number)
``{P:t:<key>}:d``            hash ticket -> deadline (ms); a ticket not touched
                             within ``lease_ms`` belongs to a dead replica: skipped
``{P:t:<key>}:h``            hash of the holder: ticket, owner, fence, exp (ms)
``{P:t:<key>}:m``            hash: ticket counter, last fence, last owner
``{P:t:<key>}:w:<ticket>``   list a waiter blocks on (``BLPOP``); pushed on release
``{P:l:<name>}:h`` / ``:m``  leadership holder (ticket, owner, fence, exp, lease ms) / last fence and owner
``{P:k:<key>}`` / ``:m``     fenced lock (token, fence; ``PEXPIRE`` = TTL) / last fence
``{P}:fence``                hash n (last fence issued), ceil (highest allowed)
``{P}:replicas``, ``:beats`` replica info (JSON) and heartbeat times
``{P}:leads``, ``{P}:events`` leadership names; recent events (JSON, capped)
===========================  ======================================================

Times are the Redis server's clock (``TIME``), in milliseconds: leases, queued
tickets and locks expire in Redis' real time, which ``botmesh_admin.clock.use_clock``
does not move, so tests of the Redis coordinator wait in real time (only the
replica's local deadlines, ``core.Lease``, follow the kernel clock).

**Fences** come from one counter per prefix and are checked per key (a grant
never carries a fence at or below the key's last one). The counter may not
pass ``ceil``; ``ceil`` is raised only after a durable high-water mark in the
Kv (``coordination/system/fences``) has been raised past it. After Redis
restarts empty, the counter is re-seeded from that mark, which is at least every
fence ever issued — so fences never go backwards.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from botmesh_admin.errors import StoreUnavailable, ValidationError
from botmesh_admin.kv import ABSENT, DurableKv, Put, TenantKv
from botmesh_admin.kv.cas import cas_retry

from .base import (
    PREFIX_RE,
    SHOWN_EVENT_KINDS,
    CoordinationEvent,
    CoordinationSnapshot,
    LeaderStatus,
    replica_status_from_info,
)
from .core import Coordinator, Granted, Held, Queued
from .fencing import FENCE_CAS_ATTEMPTS

T = TypeVar("T")

FENCE_BLOCK = 65536
IDLE_MS = 24 * 3600 * 1000  # keys of an idle coordination key vanish after a day
EVENTS_KEPT = 200

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

FENCE_NEXT_LUA = """
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return -1 end
local c = tonumber(redis.call('HGET', KEYS[1], 'ceil') or '0')
n = tonumber(n) + 1
if n > c then return -2 end
redis.call('HSET', KEYS[1], 'n', n)
return n
"""

# ARGV: base (counter start if missing), new ceiling. Only ever raises the ceiling.
FENCE_SEED_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'n', ARGV[1], 'ceil', ARGV[2])
  return 1
end
local c = tonumber(redis.call('HGET', KEYS[1], 'ceil') or '0')
if tonumber(ARGV[2]) > c then redis.call('HSET', KEYS[1], 'ceil', ARGV[2]) end
return 0
"""

# KEYS q d h m [fence counter]; ARGV owner, ticket ('' = new), lease_ms, fence ('' = not
# fetched), idle_ms. With the counter key (standalone Redis, where every key is on one
# node) the script takes the fence itself. Reply {0, ticket} queued, {1, ticket, fence,
# previous owner or ''} granted, {2, ticket, last fence} fence too low, {3, ticket}
# grantable: fetch a fence, {4, ticket} grantable but the counter needs its ceiling raised.
TURN_ACQUIRE_LUA = (
    _NOW
    + """
local owner, ticket, lease, fence, idle = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local h = redis.call('HMGET', KEYS[3], 'ticket', 'exp')
local holder = h[1]
if holder and tonumber(h[2]) <= now then
  redis.call('DEL', KEYS[3])
  holder = false
end
local queued = true
local function enqueue()
  if queued then return end
  redis.call('ZADD', KEYS[1], tonumber(string.match(ticket, '^(%d+)')), ticket)
  redis.call('HSET', KEYS[2], ticket, now + lease)
  redis.call('PEXPIRE', KEYS[1], idle)
  redis.call('PEXPIRE', KEYS[2], idle)
  queued = true
end
if ticket == '' or not redis.call('ZSCORE', KEYS[1], ticket) then
  local seq = redis.call('HINCRBY', KEYS[4], 'seq', 1)
  ticket = seq .. '|' .. owner
  if not holder and redis.call('EXISTS', KEYS[1]) == 0 then
    queued = false  -- free turn, empty queue: granted without queueing (the common case)
  else
    redis.call('ZADD', KEYS[1], seq, ticket)
  end
end
if queued then
  redis.call('HSET', KEYS[2], ticket, now + lease)
  redis.call('PEXPIRE', KEYS[1], idle)
  redis.call('PEXPIRE', KEYS[2], idle)
  if holder then return {0, ticket} end
  while true do
    local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
    if head == ticket then break end
    local deadline = tonumber(redis.call('HGET', KEYS[2], head))
    if deadline and deadline > now then return {0, ticket} end
    redis.call('ZREM', KEYS[1], head)
    redis.call('HDEL', KEYS[2], head)
  end
end
if fence == '' then
  if not KEYS[5] then
    enqueue()  -- in a cluster: keep the ticket while the client fetches a fence
    return {3, ticket}
  end
  -- Standalone Redis: take the fence from the prefix counter in the same script.
  local n = redis.call('HGET', KEYS[5], 'n')
  local ceiling = tonumber(redis.call('HGET', KEYS[5], 'ceil') or '0')
  if not n or tonumber(n) + 1 > ceiling then
    enqueue()
    return {4, ticket}
  end
  fence = string.format('%d', tonumber(n) + 1)
  redis.call('HSET', KEYS[5], 'n', fence)
end
local last = tonumber(redis.call('HGET', KEYS[4], 'fence') or '0')
if tonumber(fence) <= last then
  enqueue()
  return {2, ticket, tostring(last)}
end
if queued then
  redis.call('ZREM', KEYS[1], ticket)
  redis.call('HDEL', KEYS[2], ticket)
end
local prev = redis.call('HGET', KEYS[4], 'owner')
redis.call('HSET', KEYS[3], 'ticket', ticket, 'owner', owner, 'fence', fence, 'exp', now + lease)
redis.call('HSET', KEYS[4], 'fence', fence, 'owner', owner)
redis.call('PEXPIRE', KEYS[3], idle)
redis.call('PEXPIRE', KEYS[4], idle)
return {1, ticket, fence, prev or ''}
"""
)

# KEYS q d h; ARGV ticket, wake key prefix, lease_ms. Wakes the head ticket.
TURN_RELEASE_LUA = (
    _NOW
    + """
local h = redis.call('HMGET', KEYS[3], 'ticket', 'exp')
if h[1] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[3])
local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if head then
  local w = ARGV[2] .. head
  redis.call('LPUSH', w, '1')
  redis.call('PEXPIRE', w, ARGV[3])
end
if tonumber(h[2]) <= now then return 0 end
return 1
"""
)

# KEYS q d h; ARGV ticket, wake key prefix, lease_ms.
TURN_WITHDRAW_LUA = (
    _NOW
    + """
local was_head = redis.call('ZRANGE', KEYS[1], 0, 0)[1] == ARGV[1]
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', ARGV[2] .. ARGV[1])
local exp = tonumber(redis.call('HGET', KEYS[3], 'exp') or '0')
if was_head and exp <= now then
  local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if head then
    redis.call('LPUSH', ARGV[2] .. head, '1')
    redis.call('PEXPIRE', ARGV[2] .. head, ARGV[3])
  end
end
return 1
"""
)

# KEYS h; ARGV ticket, lease_ms, idle_ms.
RENEW_LUA = (
    _NOW
    + """
local h = redis.call('HMGET', KEYS[1], 'ticket', 'exp')
if h[1] ~= ARGV[1] or tonumber(h[2]) <= now then return 0 end
redis.call('HSET', KEYS[1], 'exp', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
)

# KEYS h m; ARGV owner, ticket, lease_ms, fence ('' = not fetched), idle_ms.
# Reply {0, holder owner, holder fence} held, {1, fence, previous or '', silent ms or -1}, {2, last}, {3}.
# A release deletes h; an expired lease leaves it: silent = ms since the expired holder last
# renewed (now - exp + its lease; this grant's lease for a hash written without one), -1 after a release.
LEAD_ACQUIRE_LUA = (
    _NOW
    + """
local h = redis.call('HMGET', KEYS[1], 'ticket', 'exp', 'owner', 'fence', 'lease')
if h[1] and tonumber(h[2]) > now and h[3] ~= ARGV[1] then return {0, h[3], h[4]} end
if ARGV[4] == '' then return {3} end
local last = tonumber(redis.call('HGET', KEYS[2], 'fence') or '0')
if tonumber(ARGV[4]) <= last then return {2, tostring(last)} end
local silent = -1
if h[1] and tonumber(h[2]) <= now then
  silent = now - tonumber(h[2]) + tonumber(h[5] or ARGV[3])
end
local prev = redis.call('HGET', KEYS[2], 'owner')
redis.call('HSET', KEYS[1], 'ticket', ARGV[2], 'owner', ARGV[1], 'fence', ARGV[4],
  'exp', now + tonumber(ARGV[3]), 'lease', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('HSET', KEYS[2], 'fence', ARGV[4], 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {1, ARGV[4], prev or '', silent}
"""
)

# KEYS h; ARGV ticket (compare-and-delete).
HOLDER_RELEASE_LUA = """
if redis.call('HGET', KEYS[1], 'ticket') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS lock m; ARGV token, ttl_ms, fence, idle_ms. Reply {0} held, {1} taken, {2, last}.
LOCK_ACQUIRE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {0} end
local last = tonumber(redis.call('HGET', KEYS[2], 'fence') or '0')
if tonumber(ARGV[3]) <= last then return {2, tostring(last)} end
redis.call('HSET', KEYS[1], 'ticket', ARGV[1], 'fence', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'fence', ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {1}
"""

# KEYS lock; ARGV token, ttl_ms. PEXPIRE replaces the remaining time, never adds to it.
LOCK_RENEW_LUA = """
if redis.call('HGET', KEYS[1], 'ticket') ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""

# KEYS replicas beats; ARGV owner, info JSON.
HEARTBEAT_LUA = (
    _NOW
    + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
return now
"""
)

# KEYS replicas beats; ARGV live_ms, forget_ms. Reply {now, owner, age, info, ...}.
REPLICAS_LUA = (
    _NOW
    + """
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]))
for _, owner in ipairs(gone) do
  redis.call('ZREM', KEYS[2], owner)
  redis.call('HDEL', KEYS[1], owner)
end
local out = {now}
local live = redis.call('ZRANGEBYSCORE', KEYS[2], now - tonumber(ARGV[1]), '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local info = redis.call('HGET', KEYS[1], live[i])
  if info then
    table.insert(out, live[i])
    table.insert(out, now - tonumber(live[i + 1]))
    table.insert(out, info)
  end
end
return out
"""
)

LEADER_LUA = (
    _NOW
    + """
local h = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'exp')
if not h[1] or tonumber(h[3]) <= now then return false end
return {h[1], h[2], tonumber(h[3]) - now}
"""
)


def _parse_cluster_url(url: str) -> dict[str, Any]:
    from botmesh_admin.kv.redis import _parse_cluster_url as parse

    return parse(url)


class FenceWatermark:
    """The durable high-water mark of one prefix's fences, in a DurableKv entry."""

    def __init__(self, kv: DurableKv | None, prefix: str) -> None:
        self._kv = kv
        self.key = f"fence:{prefix}"

    @property
    def kv(self) -> DurableKv:
        if self._kv is None:
            from botmesh_admin.kv.runtime import default_kv

            self._kv = default_kv()
        return self._kv

    @property
    def table(self) -> str:
        return TenantKv(self.kv, "coordination").reserved_table("system", "fences")

    def read(self) -> int:
        """Return the mark (0 if never written)."""
        entry = self.kv.get(self.table, self.key)
        return int(entry.value["ceiling"]) if entry is not None else 0

    def raise_past(self, observed: int, block: int) -> tuple[int, int]:
        """Raise the mark to ``max(mark, observed) + block`` with compare-and-set; return (old, new)."""

        def attempt() -> tuple[int, int]:
            entry = self.kv.get(self.table, self.key)
            old = int(entry.value["ceiling"]) if entry is not None else 0
            new = max(old, observed) + block
            self.kv.commit(self.table, [Put(self.key, {"ceiling": new}, expect=entry.version if entry else ABSENT)])
            return old, new

        return cas_retry(attempt, what=f"the fence mark of {self.key}", attempts=FENCE_CAS_ATTEMPTS)


class RedisBackend:
    """The Redis side of ``RedisCoordinator`` (see the module docstring for the keys)."""

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        fence_kv: DurableKv | None = None,
        socket_timeout_s: float = 10.0,
        fence_block: int = FENCE_BLOCK,
    ) -> None:
        import redis
        import redis.cluster

        if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):
            raise ValidationError("prefix", "must be 1-63 characters of a-z, 0-9, '_', '.' or '-'")
        self.url = url
        self.prefix = prefix
        self.cluster = url.lower().startswith("redis+cluster://")
        self._errors_t = (redis.RedisError, redis.cluster.RedisClusterException)
        self._connection_errors = (redis.ConnectionError, redis.TimeoutError)
        options: dict[str, Any] = {"socket_connect_timeout": 5, "socket_timeout": socket_timeout_s}
        with self._errors():
            if self.cluster:
                parsed = _parse_cluster_url(url)
                self.client: Any = redis.cluster.RedisCluster(
                    startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in parsed["nodes"]],
                    username=parsed["username"],
                    password=parsed["password"],
                    **options,
                )
            elif url.lower().startswith(("redis://", "rediss://", "unix://")):
                self.client = redis.Redis.from_url(url, **options)
            else:
                raise ValidationError("url", "expected a redis://, rediss:// or redis+cluster:// URL")
        self.watermark = FenceWatermark(fence_kv, prefix)
        self._fence_block = fence_block
        self._fence_lock = threading.Lock()
        self._known_leads: set[str] = set()
        register = self.client.register_script
        self._fence_next = register(FENCE_NEXT_LUA)
        self._fence_seed = register(FENCE_SEED_LUA)
        self._turn_acquire = register(TURN_ACQUIRE_LUA)
        self._turn_release = register(TURN_RELEASE_LUA)
        self._turn_withdraw = register(TURN_WITHDRAW_LUA)
        self._renew = register(RENEW_LUA)
        self._lead_acquire = register(LEAD_ACQUIRE_LUA)
        self._holder_release = register(HOLDER_RELEASE_LUA)
        self._lock_acquire = register(LOCK_ACQUIRE_LUA)
        self._lock_renew = register(LOCK_RENEW_LUA)
        self._heartbeat = register(HEARTBEAT_LUA)
        self._replicas = register(REPLICAS_LUA)
        self._leader = register(LEADER_LUA)

    # -- keys ----------------------------------------------------------------

    def _turn_keys(self, key: str) -> tuple[list[str], str]:
        tag = f"{{{self.prefix}:t:{key}}}"
        return [f"{tag}:q", f"{tag}:d", f"{tag}:h", f"{tag}:m"], f"{tag}:w:"

    def _lead_keys(self, name: str) -> list[str]:
        tag = f"{{{self.prefix}:l:{name}}}"
        return [f"{tag}:h", f"{tag}:m"]

    def _lock_keys(self, key: str) -> list[str]:
        tag = f"{{{self.prefix}:k:{key}}}"
        return [tag, f"{tag}:m"]

    def _global(self, name: str) -> str:
        return f"{{{self.prefix}}}:{name}"

    # -- plumbing ------------------------------------------------------------

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except ValidationError:
            raise
        except self._errors_t as exc:
            raise StoreUnavailable(f"Redis coordinator: {type(exc).__name__}") from exc

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)``; retry connection errors briefly (a restarted Redis); wrap driver errors."""
        for attempt in range(4):
            try:
                with self._errors():
                    return fn(*args, **kwargs)
            except StoreUnavailable as exc:
                if attempt == 3 or not isinstance(exc.__cause__, self._connection_errors):
                    raise
                time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    def next_fence(self) -> int:
        """Return a new fence from the prefix's counter, raising the durable mark when needed."""
        key = self._global("fence")
        for _ in range(10):
            fence = int(self._call(lambda: self._fence_next(keys=[key])))
            if fence > 0:
                return fence
            self._raise_ceiling()
        raise StoreUnavailable("Redis coordinator: could not obtain a fence")

    def _raise_ceiling(self) -> None:
        """Raise the durable mark past the counter's ceiling, then the ceiling (seeding a lost counter)."""
        key = self._global("fence")
        with self._fence_lock:
            ceiling = self._call(lambda: self.client.hget(key, "ceil"))
            old, new = self.watermark.raise_past(int(ceiling or 0), self._fence_block)
            self._call(lambda: self._fence_seed(keys=[key], args=[old, new]))

    # -- turns ---------------------------------------------------------------

    def turn_acquire(self, key: str, owner: str, ticket: str | None, lease_ms: int) -> Granted | Queued:
        keys, _ = self._turn_keys(key)
        if not self.cluster:
            keys.append(self._global("fence"))
        # In a cluster the fence counter is on another node: fetch one first, optimistically.
        fence = str(self.next_fence()) if ticket is None and self.cluster else ""
        ticket = ticket or ""
        while True:
            reply = self._call(self._turn_acquire, keys=keys, args=[owner, ticket, lease_ms, fence, IDLE_MS])
            status, ticket = int(reply[0]), reply[1].decode()
            if status == 0:
                return Queued(ticket)
            if status == 1:
                return Granted(ticket, int(reply[2]), reply[3].decode() or None)
            if status == 4:
                self._raise_ceiling()
                continue
            fence = str(self.next_fence())  # 2: too low (a race), 3: grantable — fetch one

    def turn_wait(self, key: str, ticket: str, timeout_s: float) -> None:
        _, wake = self._turn_keys(key)
        timeout = max(0.01, round(timeout_s, 3))
        self._call(lambda: self.client.blpop([wake + ticket], timeout=timeout))

    def turn_withdraw(self, key: str, ticket: str) -> None:
        keys, wake = self._turn_keys(key)
        self._call(lambda: self._turn_withdraw(keys=keys[:3], args=[ticket, wake, 60000]))

    def turn_release(self, key: str, ticket: str) -> bool:
        keys, wake = self._turn_keys(key)
        return bool(self._call(lambda: self._turn_release(keys=keys[:3], args=[ticket, wake, 60000])))

    # -- leadership ----------------------------------------------------------

    def lead_acquire(self, name: str, owner: str, ticket: str, lease_ms: int) -> Granted | Held:
        keys = self._lead_keys(name)
        if name not in self._known_leads:
            self._call(lambda: self.client.sadd(self._global("leads"), name))
            self._known_leads.add(name)
        fence = ""
        while True:
            reply = self._call(self._lead_acquire, keys=keys, args=[owner, ticket, lease_ms, fence, IDLE_MS])
            status = int(reply[0])
            if status == 0:
                return Held(reply[1].decode(), int(reply[2]))
            if status == 1:
                silent = int(reply[3]) if len(reply) > 3 else -1
                return Granted(ticket, int(reply[1]), reply[2].decode() or None, silent if silent >= 0 else None)
            fence = str(self.next_fence())

    def lead_release(self, name: str, ticket: str) -> bool:
        keys = self._lead_keys(name)
        return bool(self._call(lambda: self._holder_release(keys=keys[:1], args=[ticket])))

    def renew(self, items: list[tuple[str, str, str]], lease_ms: int) -> list[bool]:
        def run() -> list[Any]:
            if self.cluster:  # one call per key: each may live on another node
                return [self._renew(keys=[self._holder_key(*i)], args=[i[2], lease_ms, IDLE_MS]) for i in items]
            pipe = self.client.pipeline(transaction=False)
            for item in items:
                self._renew(keys=[self._holder_key(*item)], args=[item[2], lease_ms, IDLE_MS], client=pipe)
            return pipe.execute()

        return [bool(r) for r in self._call(run)]

    def _holder_key(self, kind: str, key: str, ticket: str) -> str:
        return self._turn_keys(key)[0][2] if kind == "turn" else self._lead_keys(key)[0]

    # -- locks ---------------------------------------------------------------

    def lock_acquire(self, key: str, token: str, ttl_ms: int) -> int | None:
        keys = self._lock_keys(key)
        while True:
            fence = self.next_fence()
            reply = self._call(self._lock_acquire, keys=keys, args=[token, ttl_ms, fence, IDLE_MS])
            if int(reply[0]) == 0:
                return None
            if int(reply[0]) == 1:
                return fence

    def lock_renew(self, key: str, token: str, ttl_ms: int) -> bool:
        keys = self._lock_keys(key)
        return bool(self._call(lambda: self._lock_renew(keys=keys[:1], args=[token, ttl_ms])))

    def lock_release(self, key: str, token: str) -> bool:
        keys = self._lock_keys(key)
        return bool(self._call(lambda: self._holder_release(keys=keys[:1], args=[token])))

    def lock_ttl_ms(self, key: str) -> int | None:
        """Return the lock's remaining milliseconds (``PTTL``), or None if it is free."""
        ttl = int(self._call(lambda: self.client.pttl(self._lock_keys(key)[0])))
        return None if ttl < 0 else ttl

    # -- replicas, events ----------------------------------------------------

    def heartbeat(self, owner: str, info: dict[str, Any]) -> None:
        keys = [self._global("replicas"), self._global("beats")]
        self._call(lambda: self._heartbeat(keys=keys, args=[owner, json.dumps(info, sort_keys=True)]))

    def unregister(self, owner: str) -> None:
        def run() -> None:
            self.client.hdel(self._global("replicas"), owner)
            self.client.zrem(self._global("beats"), owner)

        self._call(run)

    def publish(self, event: CoordinationEvent) -> None:
        key = self._global("events")

        def run() -> None:
            self.client.lpush(key, json.dumps(event.to_json(), sort_keys=True))
            self.client.ltrim(key, 0, EVENTS_KEPT - 1)

        self._call(run)

    def snapshot(self, live_ms: int) -> CoordinationSnapshot:
        keys = [self._global("replicas"), self._global("beats")]
        reply = self._call(lambda: self._replicas(keys=keys, args=[live_ms, 10 * live_ms]))
        replicas = []
        for i in range(1, len(reply), 3):
            try:  # a bot process's JSON (any language): a malformed one shows as unreadable, never fails the rest
                info: object = json.loads(reply[i + 2])
            except ValueError:
                info = None
            replicas.append(replica_status_from_info(info, int(reply[i + 1])))
        leaders = []
        names = sorted(n.decode() for n in self._call(lambda: self.client.smembers(self._global("leads"))))
        for name in names:
            found = self._call(lambda n=name: self._leader(keys=self._lead_keys(n)[:1]))
            if found:
                replica_id, _, incarnation = found[0].decode().partition("/")
                leaders.append(LeaderStatus(name, replica_id, incarnation, int(found[1]), int(found[2])))
        raw_events = self._call(lambda: self.client.lrange(self._global("events"), 0, EVENTS_KEPT - 1))
        events = []
        for raw in raw_events:
            data = json.loads(raw)
            if data.get("kind") in SHOWN_EVENT_KINDS:
                events.append(CoordinationEvent(**data))
        replicas.sort(key=lambda r: (r.role, r.replica_id))
        return CoordinationSnapshot(replicas, leaders, events)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 (closing is best effort)
            pass


class RedisCoordinator(Coordinator):
    """A coordinator over Redis (``redis://``) or Redis Cluster (``redis+cluster://h:p,…``).

    ``prefix`` namespaces every key (several deployments may share one Redis);
    ``fence_kv`` holds the durable fence high-water mark (default: the
    configured Kv, ``default_kv()``). Raise ``ValidationError`` for a bad URL,
    prefix, lease or replica id and ``StoreUnavailable`` when Redis is down.
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        lease_ms: int = 15000,
        replica_id: str | None = None,
        *,
        role: str = "web",
        fence_kv: DurableKv | None = None,
    ) -> None:
        socket_timeout_s = max(2.0, lease_ms / 1000 + 2)
        self.backend = RedisBackend(url, prefix, fence_kv=fence_kv, socket_timeout_s=socket_timeout_s)
        super().__init__(self.backend, replica_id=replica_id, lease_ms=lease_ms, role=role)
