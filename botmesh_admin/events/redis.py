"""RedisEventJournal: the journal on a standalone Redis (``redis://``, ``rediss://``).

Every change is one Lua script, so a token check and the change it guards are
atomic; ``claim`` and ``replay`` take their token with ``INCR`` inside the script.
Keys share the hash tag ``{botmesh:events}`` (``{botmesh:events_<namespace>}``; ``P`` below):

=========================  =============================================================
``P:r:<id>``               hash: the record's fields (``payload`` as JSON text)
``P:k:<tenant>``           hash: idempotency key → id
``P:fence``                the fencing counter (only ever ``INCR``)
``P:q:<channel>``          sorted set of pending and leased ids, score ``available_at``
``P:i``, ``P:i:<tenant>``  sorted sets (score 0, ``ZREVRANGEBYLEX``) for listing
``P:i:<tenant>:<state>``   … by tenant and state; ``P:s:<state>`` by state
``P:c:<tenant>``           hash ``"<state>|<channel>"`` → count
=========================  =============================================================

Run Redis with AOF persistence (``appendonly yes``, ``appendfsync always`` for
no loss at all) when it holds the journal: a server restart must not lose the
counter or the records. Redis errors are raised as ``StoreUnavailable``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from botmesh_admin.errors import Conflict, NotFound, StoreUnavailable

from .base import (
    Clock,
    Envelope,
    EventRecord,
    RetryPolicy,
    StaleLeaseError,
    clip_error,
    lease_expired_error,
    not_replayable,
    now_ms,
    validate_channel,
    validate_envelope,
    validate_event_id,
    validate_lease,
    validate_list_args,
    validate_time,
    validate_token,
)
from .sql import split_namespace

_COMMON = """
local P = ARGV[1]
local function move(r, id, from, to)
  local t, ch = redis.call('HGET', r, 'tenant'), redis.call('HGET', r, 'channel')
  if from then
    redis.call('ZREM', P .. ':i:' .. t .. ':' .. from, id)
    redis.call('ZREM', P .. ':s:' .. from, id)
    redis.call('HINCRBY', P .. ':c:' .. t, from .. '|' .. ch, -1)
  end
  redis.call('ZADD', P .. ':i:' .. t .. ':' .. to, 0, id)
  redis.call('ZADD', P .. ':s:' .. to, 0, id)
  redis.call('HINCRBY', P .. ':c:' .. t, to .. '|' .. ch, 1)
end
"""

APPEND_LUA = _COMMON + """
-- ARGV: P, id, type, channel, tenant, payload, idempotency_key, created_at, now
local id, ch, t, key, now = ARGV[2], ARGV[4], ARGV[5], ARGV[7], ARGV[9]
local existing = redis.call('HGET', P .. ':k:' .. t, key)
if existing then return {0, existing} end
local r = P .. ':r:' .. id
if redis.call('EXISTS', r) == 1 then return {-1, id} end
redis.call('HSET', r, 'id', id, 'type', ARGV[3], 'channel', ch, 'tenant', t, 'payload', ARGV[6],
  'idempotency_key', key, 'created_at', ARGV[8], 'state', 'pending', 'attempts', 0,
  'available_at', now, 'fencing_token', 0)
redis.call('HSET', P .. ':k:' .. t, key, id)
redis.call('ZADD', P .. ':q:' .. ch, now, id)
redis.call('ZADD', P .. ':i', 0, id)
redis.call('ZADD', P .. ':i:' .. t, 0, id)
move(r, id, nil, 'pending')
return {1, id}
"""

CLAIM_LUA = _COMMON + """
-- ARGV: P, channel, now, until, max_attempts, lease error text
local q, now, till, max = P .. ':q:' .. ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
while true do
  local ids = redis.call('ZRANGEBYSCORE', q, '-inf', now, 'LIMIT', 0, 1)
  if #ids == 0 then return false end
  local id = ids[1]
  local r = P .. ':r:' .. id
  local h = redis.call('HMGET', r, 'state', 'attempts')
  local token = redis.call('INCR', P .. ':fence')
  if h[1] == 'leased' and tonumber(h[2]) >= max then
    -- The worker died on its last attempt: dead-letter, then try the next record.
    redis.call('HSET', r, 'state', 'dead', 'fencing_token', token, 'available_at', now,
      'last_error', ARGV[6])
    redis.call('HDEL', r, 'leased_until')
    redis.call('ZREM', q, id)
    move(r, id, 'leased', 'dead')
  else
    redis.call('HSET', r, 'state', 'leased', 'attempts', tonumber(h[2]) + 1,
      'fencing_token', token, 'leased_until', till, 'available_at', till)
    redis.call('ZADD', q, till, id)
    if h[1] ~= 'leased' then move(r, id, h[1], 'leased') end
    return redis.call('HGETALL', r)
  end
end
"""

# Shared head of ack / fail / release: find the record and check the token.
_SETTLE_HEAD = _COMMON + """
-- ARGV: P, id, now, token, live ('1': the lease must not have expired at now), ...
local id, now, token = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local r = P .. ':r:' .. id
local h = redis.call('HMGET', r, 'state', 'fencing_token', 'leased_until', 'attempts', 'channel')
if not h[1] then return {0} end
if h[1] ~= 'leased' or tonumber(h[2]) ~= token then return {1} end
if ARGV[5] == '1' and tonumber(h[3]) <= now then return {2} end
local q = P .. ':q:' .. h[5]
local attempts = tonumber(h[4])
"""

ACK_LUA = _SETTLE_HEAD + """
redis.call('HSET', r, 'state', 'done', 'available_at', now)
redis.call('HDEL', r, 'leased_until')
redis.call('ZREM', q, id)
move(r, id, 'leased', 'done')
return {3, redis.call('HGETALL', r)}
"""

FAIL_LUA = _SETTLE_HEAD + """
-- ARGV[6..10]: max_attempts, cap ms, base ms, jitter factor, error
redis.call('HDEL', r, 'leased_until')
redis.call('HSET', r, 'last_error', ARGV[10])
if attempts >= tonumber(ARGV[6]) then
  redis.call('HSET', r, 'state', 'dead', 'available_at', now)
  redis.call('ZREM', q, id)
  move(r, id, 'leased', 'dead')
else
  local shift = math.min(math.max(attempts - 1, 0), 40)
  local delay = math.floor(math.min(tonumber(ARGV[7]), tonumber(ARGV[8]) * 2 ^ shift) * tonumber(ARGV[9]))
  local at = now + delay
  redis.call('HSET', r, 'state', 'pending', 'available_at', string.format('%d', at))
  redis.call('ZADD', q, at, id)
  move(r, id, 'leased', 'pending')
end
return {3, redis.call('HGETALL', r)}
"""

RELEASE_LUA = _SETTLE_HEAD + """
redis.call('HSET', r, 'state', 'pending', 'attempts', math.max(attempts - 1, 0), 'available_at', now)
redis.call('HDEL', r, 'leased_until')
redis.call('ZADD', q, now, id)
move(r, id, 'leased', 'pending')
return {3, redis.call('HGETALL', r)}
"""

REPLAY_LUA = _COMMON + """
-- ARGV: P, id, now
local id, now = ARGV[2], ARGV[3]
local r = P .. ':r:' .. id
local h = redis.call('HMGET', r, 'state', 'channel')
if not h[1] then return {0} end
if h[1] ~= 'dead' and h[1] ~= 'done' then return {1, h[1]} end
local token = redis.call('INCR', P .. ':fence')
redis.call('HSET', r, 'state', 'pending', 'attempts', 0, 'fencing_token', token, 'available_at', now)
redis.call('HDEL', r, 'leased_until')
redis.call('ZADD', P .. ':q:' .. h[2], now, id)
move(r, id, h[1], 'pending')
return {3, redis.call('HGETALL', r)}
"""

_INTS = ("created_at", "attempts", "available_at", "leased_until", "fencing_token")


def _record(flat: Any) -> EventRecord:
    """Return the record of an ``HGETALL`` reply (flat list or dict of bytes)."""
    if isinstance(flat, dict):
        h = {k.decode(): v.decode() for k, v in flat.items()}
    else:
        h = {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}
    return EventRecord(
        id=h["id"],
        type=h["type"],
        channel=h["channel"] or None,
        tenant=h["tenant"],
        payload=json.loads(h["payload"]),
        idempotency_key=h["idempotency_key"],
        created_at=int(h["created_at"]),
        state=h["state"],
        attempts=int(h["attempts"]),
        available_at=int(float(h["available_at"])),
        leased_until=int(float(h["leased_until"])) if "leased_until" in h else None,
        fencing_token=int(h["fencing_token"]),
        last_error=h.get("last_error"),
    )


class RedisEventJournal:
    """EventJournal on a standalone Redis; ``?namespace=x`` keeps tests apart on one server."""

    def __init__(
        self, url: str, *, policy: RetryPolicy | None = None, clock: Clock | None = None
    ) -> None:
        import redis

        self.url = url
        self.policy = policy or RetryPolicy()
        self.clock: Clock = clock or now_ms
        conn_url, table = split_namespace(url)
        self.prefix = "{" + table.replace("botmesh_events", "botmesh:events", 1) + "}"
        self._redis_errors = redis.RedisError
        self._client: Any = redis.Redis.from_url(conn_url, socket_timeout=10, socket_connect_timeout=10)
        self._scripts = {
            name: self._client.register_script(lua)
            for name, lua in (
                ("append", APPEND_LUA), ("claim", CLAIM_LUA), ("ack", ACK_LUA), ("fail", FAIL_LUA),
                ("release", RELEASE_LUA), ("replay", REPLAY_LUA),
            )
        }  # fmt: skip
        self.ping()

    def __repr__(self) -> str:
        return f"<RedisEventJournal {self.prefix}>"

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except self._redis_errors as exc:
            raise StoreUnavailable(f"Redis journal: {exc}") from exc

    def _run(self, name: str, *args: Any) -> Any:
        with self._errors():
            return self._scripts[name](keys=[f"{self.prefix}:fence"], args=[self.prefix, *args])

    def append(self, envelope: Envelope) -> EventRecord:
        """Store ``envelope`` as a ``pending`` record, or return the tenant's record with its key."""
        record = validate_envelope(envelope, self.clock())
        payload = json.dumps(record.payload, ensure_ascii=False, separators=(",", ":"))
        status, event_id = self._run(
            "append", record.id, record.type, record.channel or "", record.tenant, payload,
            record.idempotency_key, record.created_at, record.available_at,
        )  # fmt: skip
        if status == -1:
            raise Conflict(f"event id {record.id!r} is taken by another record")
        if status == 1:
            return record
        existing = self.get(event_id.decode())
        if existing is None:  # pragma: no cover - records are never deleted
            raise StoreUnavailable("journal record vanished")
        return existing

    def get(self, event_id: str) -> EventRecord | None:
        """Return the record ``event_id``, or ``None``."""
        validate_event_id(event_id)
        with self._errors():
            flat = self._client.hgetall(f"{self.prefix}:r:{event_id}")
        return _record(flat) if flat else None

    def claim(self, now: int, lease_ms: int, channel: str | None = None) -> EventRecord | None:
        """Lease the oldest ready record of ``channel`` until ``now + lease_ms``."""
        validate_lease(now, lease_ms)
        channel = validate_channel(channel, "channel")
        flat = self._run(
            "claim", channel or "", now, now + lease_ms, self.policy.max_attempts,
            lease_expired_error(self.policy.max_attempts),
        )  # fmt: skip
        return _record(flat) if flat else None

    def _settle(
        self, name: str, event_id: str, now: int, fencing_token: int, live: bool, *extra: Any
    ) -> EventRecord:
        validate_event_id(event_id)
        validate_time(now, "now")
        validate_token(fencing_token)
        reply = self._run(name, event_id, now, fencing_token, "1" if live else "0", *extra)
        if reply[0] == 0:
            raise NotFound(f"event {event_id!r} not found")
        if reply[0] in (1, 2):
            raise StaleLeaseError(event_id, fencing_token, "superseded" if reply[0] == 1 else "expired")
        return _record(reply[1])

    def ack(self, event_id: str, now: int, fencing_token: int) -> EventRecord:
        """Mark the leased record ``done`` if ``fencing_token`` is its live lease."""
        return self._settle("ack", event_id, now, fencing_token, True)

    def fail(self, event_id: str, now: int, fencing_token: int, error: str) -> EventRecord:
        """Retry the record after the backoff, or dead-letter it after ``max_attempts``."""
        p = self.policy
        return self._settle(
            "fail", event_id, now, fencing_token, True, p.max_attempts, p.max_delay_ms,
            p.base_delay_ms, repr(p.jitter_factor()), clip_error(error),
        )  # fmt: skip

    def release(self, event_id: str, now: int, fencing_token: int) -> EventRecord:
        """Give the lease back without spending an attempt."""
        return self._settle("release", event_id, now, fencing_token, False)

    def replay(self, event_id: str) -> EventRecord:
        """Put a ``dead`` or ``done`` record back to ``pending`` with a fresh token."""
        validate_event_id(event_id)
        reply = self._run("replay", event_id, self.clock())
        if reply[0] == 0:
            raise NotFound(f"event {event_id!r} not found")
        if reply[0] == 1:
            current = self.get(event_id)
            assert current is not None
            raise not_replayable(current)
        return _record(reply[1])

    def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        channel: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> list[EventRecord]:
        """Return up to ``limit`` records, newest id first, ids below ``after``."""
        validate_list_args(tenant, state, channel, limit, after)
        p = self.prefix
        if tenant and state:
            index = f"{p}:i:{tenant}:{state}"
        elif tenant:
            index = f"{p}:i:{tenant}"
        elif state:
            index = f"{p}:s:{state}"
        else:
            index = f"{p}:i"
        want = None if channel is None else (channel or None)
        out: list[EventRecord] = []
        upper = f"({after}" if after is not None else "+"
        batch = limit if channel is None else max(limit, 100)
        while len(out) < limit:
            with self._errors():
                ids = self._client.zrevrangebylex(index, upper, "-", start=0, num=batch)
                if not ids:
                    break
                pipe = self._client.pipeline(transaction=False)
                for event_id in ids:
                    pipe.hgetall(f"{p}:r:{event_id.decode()}")
                rows = pipe.execute()
            for flat in rows:
                if flat:
                    record = _record(flat)
                    if channel is None or record.channel == want:
                        out.append(record)
                        if len(out) == limit:
                            break
            upper = f"({ids[-1].decode()}"
            if len(ids) < batch:
                break
        return out

    def counts(self, tenant: str) -> dict[tuple[str, str | None], int]:
        """Return ``{(state, channel): n}`` for ``tenant``."""
        validate_list_args(tenant, None, None, 1, None)
        with self._errors():
            raw = self._client.hgetall(f"{self.prefix}:c:{tenant}")
        out: dict[tuple[str, str | None], int] = {}
        for field, value in raw.items():
            n = int(value)
            if n > 0:
                state, _, channel = field.decode().partition("|")
                out[(state, channel or None)] = n
        return out

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` if Redis cannot be reached."""
        with self._errors():
            self._client.ping()

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
