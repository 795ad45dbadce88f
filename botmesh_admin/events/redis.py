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
``P:ic:<tenant>:<ch>``     … by tenant and channel (``<ch>`` empty: the default channel)
``P:isc:<t>:<state>:<ch>`` … by tenant, state and channel
``P:c:<tenant>``           hash ``"<state>|<channel>"`` → count
``P:d``                    sorted set of done ids, score = when done (``prune`` visits it)
=========================  =============================================================

Every script keeps every set and count of the records it changes, so each
filter of ``list`` within a tenant is one ``ZREVRANGEBYLEX`` of one page and
``counts`` one ``HGETALL`` of a hash of at most states × channels fields. The
channel sets came after the others: a journal that has records from before
them builds them once (``build_indexes``, run by the hourly ``prune`` and
marked done by ``P:ic:v1``); until then a channel filter reads the tenant's
set and skips other channels, as it always did. A new journal is marked built
on its first open.

Run Redis with AOF persistence (``appendonly yes``, ``appendfsync always`` for
no loss at all) when it holds the journal: a server restart must not lose the
counter or the records. Redis errors are raised as ``StoreUnavailable``.
"""

from __future__ import annotations

import builtins
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from botmesh_admin.errors import Conflict, NotFound, StoreUnavailable

from ..kv.redis import RedisCalls
from .base import (
    Clock,
    Envelope,
    EventRecord,
    RetryPolicy,
    StaleLeaseError,
    clip_error,
    first_of_keys,
    lease_expired_error,
    not_replayable,
    now_ms,
    validate_batch_limit,
    validate_channel,
    validate_envelope,
    validate_envelopes,
    validate_erase_args,
    validate_event_id,
    validate_export_args,
    validate_imported,
    validate_lease,
    validate_list_args,
    validate_prune_args,
    validate_settlements,
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
  if from then redis.call('ZREM', P .. ':isc:' .. t .. ':' .. from .. ':' .. ch, id) end
  redis.call('ZADD', P .. ':i:' .. t .. ':' .. to, 0, id)
  redis.call('ZADD', P .. ':s:' .. to, 0, id)
  redis.call('ZADD', P .. ':isc:' .. t .. ':' .. to .. ':' .. ch, 0, id)
  redis.call('HINCRBY', P .. ':c:' .. t, to .. '|' .. ch, 1)
  if from == 'done' then redis.call('ZREM', P .. ':d', id) end
  if to == 'done' then redis.call('ZADD', P .. ':d', redis.call('HGET', r, 'available_at'), id) end
end
-- Delete record r; h = {state, tenant, channel, idempotency_key} as stored.
local function forget(r, id, h)
  local state, t, ch = h[1], h[2], h[3]
  redis.call('ZREM', P .. ':i', id)
  redis.call('ZREM', P .. ':i:' .. t, id)
  redis.call('ZREM', P .. ':i:' .. t .. ':' .. state, id)
  redis.call('ZREM', P .. ':s:' .. state, id)
  redis.call('ZREM', P .. ':ic:' .. t .. ':' .. ch, id)
  redis.call('ZREM', P .. ':isc:' .. t .. ':' .. state .. ':' .. ch, id)
  redis.call('HINCRBY', P .. ':c:' .. t, state .. '|' .. ch, -1)
  redis.call('ZREM', P .. ':q:' .. ch, id)
  redis.call('ZREM', P .. ':d', id)
  if redis.call('HGET', P .. ':k:' .. t, h[4]) == id then redis.call('HDEL', P .. ':k:' .. t, h[4]) end
  redis.call('DEL', r)
end
"""

APPEND_LUA = (
    _COMMON
    + """
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
redis.call('ZADD', P .. ':ic:' .. t .. ':' .. ch, 0, id)
move(r, id, nil, 'pending')
return {1, id}
"""
)

APPEND_MANY_LUA = (
    _COMMON
    + """
-- ARGV: P, then 8 per record: id, type, channel, tenant, payload, idempotency_key, created_at, now
-- (one record per key: the caller keeps the first of a repeated key). Checks every new record's
-- id first: {-1, id} and nothing written. Else {status, id, ...}: 1 stored, 0 the key's record.
local n = (#ARGV - 1) / 8
local new_ids = {}
for i = 0, n - 1 do
  local b = 1 + i * 8
  if not redis.call('HGET', P .. ':k:' .. ARGV[b + 4], ARGV[b + 6]) then
    if new_ids[ARGV[b + 1]] or redis.call('EXISTS', P .. ':r:' .. ARGV[b + 1]) == 1 then
      return {-1, ARGV[b + 1]}
    end
    new_ids[ARGV[b + 1]] = true
  end
end
local out = {}
for i = 0, n - 1 do
  local b = 1 + i * 8
  local id, ch, t, key, now = ARGV[b + 1], ARGV[b + 3], ARGV[b + 4], ARGV[b + 6], ARGV[b + 8]
  local existing = redis.call('HGET', P .. ':k:' .. t, key)
  if existing then
    out[#out + 1] = 0
    out[#out + 1] = existing
  else
    local r = P .. ':r:' .. id
    redis.call('HSET', r, 'id', id, 'type', ARGV[b + 2], 'channel', ch, 'tenant', t, 'payload', ARGV[b + 5],
      'idempotency_key', key, 'created_at', ARGV[b + 7], 'state', 'pending', 'attempts', 0,
      'available_at', now, 'fencing_token', 0)
    redis.call('HSET', P .. ':k:' .. t, key, id)
    redis.call('ZADD', P .. ':q:' .. ch, now, id)
    redis.call('ZADD', P .. ':i', 0, id)
    redis.call('ZADD', P .. ':i:' .. t, 0, id)
    redis.call('ZADD', P .. ':ic:' .. t .. ':' .. ch, 0, id)
    move(r, id, nil, 'pending')
    out[#out + 1] = 1
    out[#out + 1] = id
  end
end
return out
"""
)

CLAIM_MANY_LUA = (
    _COMMON
    + """
-- ARGV: P, channel, now, until, max_attempts, lease error text, limit. Leases up to limit ready
-- records, oldest first; an expired lease that was the record's last attempt dead-letters it
-- and the next is tried. Reply: {the HGETALL of each leased one, in claim order; the HGETALL of
-- each dead-lettered one}. claim is this script with limit 1 (one Lua step for both).
local q, now, till, max = P .. ':q:' .. ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local limit = tonumber(ARGV[7])
-- A record attempted before (attempts > 0) is claimed alone: first in line it comes back by
-- itself, else the batch ends before it (a poison record does not take its neighbours along).
local out, dead = {}, {}
local alone = false
while #out < limit and not alone do
  local ids = redis.call('ZRANGEBYSCORE', q, '-inf', now, 'LIMIT', 0, limit - #out)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    local r = P .. ':r:' .. id
    local h = redis.call('HMGET', r, 'state', 'attempts')
    local last = h[1] == 'leased' and tonumber(h[2]) >= max
    if not last and tonumber(h[2]) > 0 and limit > 1 then
      alone = true
      if #out > 0 then break end
    end
    local token = redis.call('INCR', P .. ':fence')
    if last then
      redis.call('HSET', r, 'state', 'dead', 'fencing_token', token, 'available_at', now,
        'last_error', ARGV[6])
      redis.call('HDEL', r, 'leased_until')
      redis.call('ZREM', q, id)
      move(r, id, 'leased', 'dead')
      dead[#dead + 1] = redis.call('HGETALL', r)
    else
      redis.call('HSET', r, 'state', 'leased', 'attempts', tonumber(h[2]) + 1,
        'fencing_token', token, 'leased_until', till, 'available_at', till)
      redis.call('ZADD', q, till, id)
      if h[1] ~= 'leased' then move(r, id, h[1], 'leased') end
      out[#out + 1] = redis.call('HGETALL', r)
      if alone then break end
    end
  end
end
return {out, dead}
"""
)

# ack_many / fail_many: each (id, token) checked as _SETTLE_HEAD checks one, in one script.
_SETTLE_MANY_HEAD = (
    _COMMON
    + """
-- ARGV: P, now, then per record: id, token[, jitter factor, error]. Reply: per record the
-- HGETALL of the settled record, or false (refused: not the live lease, or no such record).
local now = tonumber(ARGV[2])
local function live(id, token)
  local r = P .. ':r:' .. id
  local h = redis.call('HMGET', r, 'state', 'fencing_token', 'leased_until', 'attempts', 'channel')
  if not h[1] or h[1] ~= 'leased' or tonumber(h[2]) ~= token or tonumber(h[3]) <= now then return nil end
  return r, P .. ':q:' .. h[5], tonumber(h[4])
end
local out = {}
"""
)

ACK_MANY_LUA = (
    _SETTLE_MANY_HEAD
    + """
for b = 3, #ARGV, 2 do
  local id = ARGV[b]
  local r, q = live(id, tonumber(ARGV[b + 1]))
  if r then
    redis.call('HSET', r, 'state', 'done', 'available_at', now)
    redis.call('HDEL', r, 'leased_until')
    redis.call('ZREM', q, id)
    move(r, id, 'leased', 'done')
    out[#out + 1] = redis.call('HGETALL', r)
  else
    out[#out + 1] = false
  end
end
return out
"""
)

FAIL_MANY_LUA = (
    _SETTLE_MANY_HEAD
    + """
-- ARGV[3..6] (max_attempts, cap ms, base ms, unused) then per record: id, token, factor, error.
local max, cap, base = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
for b = 7, #ARGV, 4 do
  local id = ARGV[b]
  local r, q, attempts = live(id, tonumber(ARGV[b + 1]))
  if r then
    redis.call('HDEL', r, 'leased_until')
    redis.call('HSET', r, 'last_error', ARGV[b + 3])
    if attempts >= max then
      redis.call('HSET', r, 'state', 'dead', 'available_at', now)
      redis.call('ZREM', q, id)
      move(r, id, 'leased', 'dead')
    else
      local shift = math.min(math.max(attempts - 1, 0), 40)
      local at = now + math.floor(math.min(cap, base * 2 ^ shift) * tonumber(ARGV[b + 2]))
      redis.call('HSET', r, 'state', 'pending', 'available_at', string.format('%d', at))
      redis.call('ZADD', q, at, id)
      move(r, id, 'leased', 'pending')
    end
    out[#out + 1] = redis.call('HGETALL', r)
  else
    out[#out + 1] = false
  end
end
return out
"""
)

# Shared head of ack / fail / release: find the record and check the token.
_SETTLE_HEAD = (
    _COMMON
    + """
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
)

ACK_LUA = (
    _SETTLE_HEAD
    + """
redis.call('HSET', r, 'state', 'done', 'available_at', now)
redis.call('HDEL', r, 'leased_until')
redis.call('ZREM', q, id)
move(r, id, 'leased', 'done')
return {3, redis.call('HGETALL', r)}
"""
)

FAIL_LUA = (
    _SETTLE_HEAD
    + """
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
)

EXTEND_LUA = (
    _SETTLE_HEAD
    + """
-- ARGV[6]: the new leased_until (ms)
redis.call('HSET', r, 'leased_until', ARGV[6], 'available_at', ARGV[6])
redis.call('ZADD', q, tonumber(ARGV[6]), id)
return {3, redis.call('HGETALL', r)}
"""
)

RELEASE_LUA = (
    _SETTLE_HEAD
    + """
redis.call('HSET', r, 'state', 'pending', 'attempts', math.max(attempts - 1, 0), 'available_at', now)
redis.call('HDEL', r, 'leased_until')
redis.call('ZADD', q, now, id)
move(r, id, 'leased', 'pending')
return {3, redis.call('HGETALL', r)}
"""
)

REPLAY_LUA = (
    _COMMON
    + """
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
)

IMPORT_LUA = (
    _COMMON
    + """
-- ARGV: P, then 14 per record: id, type, channel, tenant, payload, idempotency_key, created_at,
-- state, attempts, available_at, leased_until ('' none), fencing_token, last_error, has_error.
-- Checks every idempotency key first: {-1, id, owner} and nothing written, else {1, n}.
local n = (#ARGV - 1) / 14
for i = 0, n - 1 do
  local b = 1 + i * 14
  local owner = redis.call('HGET', P .. ':k:' .. ARGV[b + 4], ARGV[b + 6])
  if owner and owner ~= ARGV[b + 1] then return {-1, ARGV[b + 1], owner} end
end
local fence = tonumber(redis.call('GET', P .. ':fence') or '0')
for i = 0, n - 1 do
  local b = 1 + i * 14
  local id, ch, t, key, state = ARGV[b + 1], ARGV[b + 3], ARGV[b + 4], ARGV[b + 6], ARGV[b + 8]
  local r = P .. ':r:' .. id
  local old = redis.call('HMGET', r, 'state', 'tenant', 'channel', 'idempotency_key')
  if old[1] then forget(r, id, old) end
  redis.call('HSET', r, 'id', id, 'type', ARGV[b + 2], 'channel', ch, 'tenant', t,
    'payload', ARGV[b + 5], 'idempotency_key', key, 'created_at', ARGV[b + 7], 'state', state,
    'attempts', ARGV[b + 9], 'available_at', ARGV[b + 10], 'fencing_token', ARGV[b + 12])
  if ARGV[b + 11] ~= '' then redis.call('HSET', r, 'leased_until', ARGV[b + 11]) end
  if ARGV[b + 14] == '1' then redis.call('HSET', r, 'last_error', ARGV[b + 13]) end
  redis.call('HSET', P .. ':k:' .. t, key, id)
  if state == 'pending' or state == 'leased' then
    redis.call('ZADD', P .. ':q:' .. ch, ARGV[b + 10], id)
  end
  redis.call('ZADD', P .. ':i', 0, id)
  redis.call('ZADD', P .. ':i:' .. t, 0, id)
  redis.call('ZADD', P .. ':ic:' .. t .. ':' .. ch, 0, id)
  move(r, id, nil, state)
  fence = math.max(fence, tonumber(ARGV[b + 12]))
end
return {1, n, fence}
"""
)

FENCE_LUA = """
-- KEYS[1] the fencing counter. ARGV[1]: raise it to at least this value. Reply: the counter.
local f = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if want > f then redis.call('SET', KEYS[1], ARGV[1]); return want end
return f
"""

PRUNE_LUA = (
    _COMMON
    + """
-- ARGV: P, before, limit. Reply: {records deleted, done-index members visited}.
local before = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', P .. ':d', '-inf', '(' .. ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local n = 0
for _, id in ipairs(ids) do
  local r = P .. ':r:' .. id
  local h = redis.call('HMGET', r, 'state', 'tenant', 'channel', 'idempotency_key', 'available_at')
  if h[1] == 'done' and tonumber(h[5]) < before then
    forget(r, id, h)
    n = n + 1
  elseif h[1] ~= 'done' then
    redis.call('ZREM', P .. ':d', id)  -- replayed since, or gone
  end
end
return {n, #ids}
"""
)

ERASE_LUA = (
    _COMMON
    + """
-- ARGV: P, tenant, limit. Forgets up to limit records of the tenant (any state); once none is
-- left, drops its counts and idempotency hash too. Reply: records deleted.
local t = ARGV[2]
local ids = redis.call('ZRANGEBYLEX', P .. ':i:' .. t, '-', '+', 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  local r = P .. ':r:' .. id
  local h = redis.call('HMGET', r, 'state', 'tenant', 'channel', 'idempotency_key')
  if h[1] then forget(r, id, h) else redis.call('ZREM', P .. ':i:' .. t, id) end
end
if #ids < tonumber(ARGV[3]) then
  redis.call('DEL', P .. ':c:' .. t, P .. ':k:' .. t)
end
return #ids
"""
)

BUILD_LUA = """
-- ARGV: P, batch. Adds the next batch of records (by id, after the cursor P:ic:at) to their
-- channel sets; marks the sets built (P:ic:v1) once past the last record. Reply: records added.
local P, batch = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', P .. ':ic:v1') == 1 then return 0 end
local at = redis.call('GET', P .. ':ic:at')
local ids = redis.call('ZRANGEBYLEX', P .. ':i', at and ('(' .. at) or '-', '+', 'LIMIT', 0, batch)
for _, id in ipairs(ids) do
  local h = redis.call('HMGET', P .. ':r:' .. id, 'tenant', 'state', 'channel')
  if h[1] then
    redis.call('ZADD', P .. ':ic:' .. h[1] .. ':' .. h[3], 0, id)
    redis.call('ZADD', P .. ':isc:' .. h[1] .. ':' .. h[2] .. ':' .. h[3], 0, id)
  end
end
if #ids < batch then
  redis.call('SET', P .. ':ic:v1', 1)
  redis.call('DEL', P .. ':ic:at')
else
  redis.call('SET', P .. ':ic:at', ids[#ids])
end
return #ids
"""

FRESH_LUA = """
-- ARGV: P. A journal without records has complete channel sets: mark them built. Reply: 1 if built.
local P = ARGV[1]
if redis.call('EXISTS', P .. ':ic:v1') == 1 then return 1 end
if redis.call('ZCARD', P .. ':i') == 0 then redis.call('SET', P .. ':ic:v1', 1); return 1 end
return 0
"""

_IMPORT_CHUNK = 200
_BUILD_BATCH = 1000
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

    def __init__(self, url: str, *, policy: RetryPolicy | None = None, clock: Clock | None = None) -> None:
        import redis

        self.url = url
        self.policy = policy or RetryPolicy()
        self.clock: Clock = clock or now_ms
        conn_url, table = split_namespace(url)
        self.prefix = "{" + table.replace("botmesh_events", "botmesh:events", 1) + "}"
        self._calls = RedisCalls((redis.RedisError,), "Redis journal")
        self._done_indexed = False
        self._client: Any = redis.Redis.from_url(conn_url, socket_timeout=10, socket_connect_timeout=10)
        self._scripts = {
            name: self._client.register_script(lua)
            for name, lua in (
                ("append", APPEND_LUA), ("append_many", APPEND_MANY_LUA), ("ack", ACK_LUA),
                ("claim_many", CLAIM_MANY_LUA), ("ack_many", ACK_MANY_LUA), ("fail_many", FAIL_MANY_LUA),
                ("fail", FAIL_LUA),
                ("release", RELEASE_LUA), ("extend", EXTEND_LUA), ("replay", REPLAY_LUA), ("import", IMPORT_LUA),
                ("prune", PRUNE_LUA), ("erase", ERASE_LUA), ("fence", FENCE_LUA), ("build", BUILD_LUA),
                ("fresh", FRESH_LUA),
            )
        }  # fmt: skip
        self.ping()
        self._channels_indexed = bool(self._run("fresh"))

    def __repr__(self) -> str:
        return f"<RedisEventJournal {self.prefix}>"

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return self._calls.guard()

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

    def append_many(self, envelopes: Sequence[Envelope]) -> builtins.list[EventRecord]:
        """Store every envelope (or answer its key's record) in one script; read the others back."""
        firsts, where = first_of_keys(validate_envelopes(envelopes, self.clock()))
        if not firsts:
            return []
        args: builtins.list[Any] = []
        for r in firsts:
            payload = json.dumps(r.payload, ensure_ascii=False, separators=(",", ":"))
            args += [r.id, r.type, r.channel or "", r.tenant, payload, r.idempotency_key, r.created_at, r.available_at]
        reply = self._run("append_many", *args)
        if reply[0] == -1:
            raise Conflict(f"event id {reply[1].decode()!r} is taken by another record")
        stored: builtins.list[EventRecord | None] = []
        missing: builtins.list[tuple[int, str]] = []
        for i, record in enumerate(firsts):
            status, event_id = reply[2 * i], reply[2 * i + 1].decode()
            stored.append(record if status == 1 else None)
            if status != 1:
                missing.append((i, event_id))
        if missing:
            with self._errors():
                pipe = self._client.pipeline(transaction=False)
                for _, event_id in missing:
                    pipe.hgetall(f"{self.prefix}:r:{event_id}")
                flats = pipe.execute()
            for (i, _), flat in zip(missing, flats, strict=True):
                if not flat:  # pragma: no cover - pruned between the script and the read
                    raise StoreUnavailable("journal record vanished")
                stored[i] = _record(flat)
        return [stored[i] for i in where]  # type: ignore[misc]

    def get(self, event_id: str) -> EventRecord | None:
        """Return the record ``event_id``, or ``None``."""
        validate_event_id(event_id)
        with self._errors():
            flat = self._client.hgetall(f"{self.prefix}:r:{event_id}")
        return _record(flat) if flat else None

    def claim(self, now: int, lease_ms: int, channel: str | None = None) -> EventRecord | None:
        """Lease the oldest ready record of ``channel`` until ``now + lease_ms``: ``claim_many`` with limit 1."""
        claimed = self.claim_many(now, lease_ms, channel, limit=1)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        now: int,
        lease_ms: int,
        channel: str | None = None,
        limit: int = 100,
        *,
        dead_lettered: builtins.list[EventRecord] | None = None,
    ) -> builtins.list[EventRecord]:
        """Lease up to ``limit`` oldest ready records of ``channel`` in one script, oldest first."""
        validate_lease(now, lease_ms)
        channel = validate_channel(channel, "channel")
        leased, dead = self._run(
            "claim_many", channel or "", now, now + lease_ms, self.policy.max_attempts,
            lease_expired_error(self.policy.max_attempts), validate_batch_limit(limit),
        )  # fmt: skip
        if dead_lettered is not None:
            dead_lettered += [_record(flat) for flat in dead]
        return [_record(flat) for flat in leased]

    def ack_many(self, now: int, claims: Sequence[tuple[str, int]]) -> builtins.list[EventRecord | None]:
        """``ack`` every live claim in one script; ``None`` for a refused one."""
        items = validate_settlements(now, claims, "claims", errors=False)
        if not items:
            return []
        args: builtins.list[Any] = [now]
        for event_id, token, _ in items:
            args += [event_id, token]
        return [_record(flat) if flat else None for flat in self._run("ack_many", *args)]

    def fail_many(self, now: int, failures: Sequence[tuple[str, int, str]]) -> builtins.list[EventRecord | None]:
        """``fail`` every live claim in one script (each its own jitter); ``None`` for a refused one."""
        items = validate_settlements(now, failures, "failures", errors=True)
        if not items:
            return []
        p = self.policy
        args: builtins.list[Any] = [now, p.max_attempts, p.max_delay_ms, p.base_delay_ms, 0]
        for event_id, token, error in items:
            args += [event_id, token, repr(p.jitter_factor()), error]
        return [_record(flat) if flat else None for flat in self._run("fail_many", *args)]

    def _settle(self, name: str, event_id: str, now: int, fencing_token: int, live: bool, *extra: Any) -> EventRecord:
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

    def extend(self, event_id: str, now: int, fencing_token: int, lease_ms: int) -> EventRecord:
        """Renew the live lease ``fencing_token`` until ``now + lease_ms``."""
        validate_lease(now, lease_ms)
        return self._settle("extend", event_id, now, fencing_token, True, str(now + lease_ms))

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
        skip = channel is not None  # True: the set also holds other channels' records
        if tenant and channel is not None and self._channel_sets_built():
            index = f"{p}:isc:{tenant}:{state}:{channel}" if state else f"{p}:ic:{tenant}:{channel}"
            skip = False
        elif tenant and state:
            index = f"{p}:i:{tenant}:{state}"
        elif tenant:
            index = f"{p}:i:{tenant}"
        elif state:
            index = f"{p}:s:{state}"
        else:
            index = f"{p}:i"
        want = channel or None
        out: list[EventRecord] = []
        upper = f"({after}" if after is not None else "+"
        batch = max(limit, 100) if skip else limit
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
                    if not skip or record.channel == want:
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

    # -- optional capabilities: export/import (backups), prune (retention) -------------

    def export_records(self, *, after: str | None = None, limit: int = 1000) -> builtins.list[EventRecord]:
        """Return up to ``limit`` records of every tenant, ascending by id, ids above ``after``."""
        validate_export_args(after, limit)
        lower = f"({after}" if after else "-"
        with self._errors():
            ids = self._client.zrangebylex(f"{self.prefix}:i", lower, "+", start=0, num=limit)
            pipe = self._client.pipeline(transaction=False)
            for event_id in ids:
                pipe.hgetall(f"{self.prefix}:r:{event_id.decode()}")
            rows = pipe.execute() if ids else []
        return [_record(flat) for flat in rows if flat]

    def fencing_counter(self) -> int:
        """Return the highest fencing token handed out so far."""
        with self._errors():
            return int(self._client.get(f"{self.prefix}:fence") or 0)

    def import_records(self, records: Sequence[EventRecord], *, fencing_counter: int = 0) -> int:
        """Store ``records`` as given (restore), a chunk per script; raise the fencing counter."""
        records = validate_imported(records, fencing_counter)
        for start in range(0, len(records), _IMPORT_CHUNK):
            args: list[Any] = []
            for r in records[start : start + _IMPORT_CHUNK]:
                args += (
                    r.id, r.type, r.channel or "", r.tenant,
                    json.dumps(r.payload, ensure_ascii=False, separators=(",", ":")),
                    r.idempotency_key, r.created_at, r.state, r.attempts, r.available_at,
                    "" if r.leased_until is None else r.leased_until, r.fencing_token,
                    r.last_error or "", "0" if r.last_error is None else "1",
                )  # fmt: skip
            reply = self._run("import", *args)
            if reply[0] == -1:
                raise Conflict(
                    f"event {reply[1].decode()!r}: idempotency key already used by event {reply[2].decode()!r}"
                )
        with self._errors():
            fence_key = f"{self.prefix}:fence"
            self._scripts["fence"](keys=[fence_key], args=[fencing_counter])
        return len(records)

    def _channel_sets_built(self) -> bool:
        """Return True once the channel sets hold every record (``P:ic:v1``; then cached)."""
        if not self._channels_indexed:
            with self._errors():
                self._channels_indexed = bool(self._client.exists(f"{self.prefix}:ic:v1"))
        return self._channels_indexed

    def build_indexes(self, *, batch: int = _BUILD_BATCH) -> int:
        """Add the records of a journal older than the channel sets to them; return how many.

        A background job's cost (a pass over every record, ``batch`` per
        script); resumable after a kill, and safe while writers run: each batch
        is one script, and every other script keeps the sets of the records it
        changes. Returns 0 at once when the sets are built.
        """
        added = 0
        while not self._channel_sets_built():
            added += int(self._run("build", batch))
        return added

    def prune(self, before: int, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` records done before ``before``, oldest first; return how many."""
        validate_prune_args(before, limit)
        self._index_done_records()
        self.build_indexes()
        removed = 0
        while removed < limit:
            batch = min(limit - removed, 500)
            gone, visited = self._run("prune", before, batch)
            removed += gone
            if visited < batch:
                break
        return removed

    def erase_tenant(self, tenant: str, *, limit: int = 1000) -> int:
        """Delete up to ``limit`` records of ``tenant`` (any state), 500 per script call; return how many."""
        validate_erase_args(tenant, limit)
        removed = 0
        while removed < limit:
            batch = min(limit - removed, 500)
            gone = int(self._run("erase", tenant, batch))
            removed += gone
            if gone < batch:
                break
        return removed

    def _index_done_records(self) -> None:
        """Fill ``P:d`` once from the done records of a journal older than that index."""
        if self._done_indexed:
            return
        p = self.prefix
        with self._errors():
            if not self._client.exists(f"{p}:d:v1"):
                lower = "-"
                while ids := self._client.zrangebylex(f"{p}:s:done", lower, "+", start=0, num=500):
                    pipe = self._client.pipeline(transaction=False)
                    for event_id in ids:
                        pipe.hget(f"{p}:r:{event_id.decode()}", "available_at")
                    times = pipe.execute()
                    mapping = {i: int(float(t)) for i, t in zip(ids, times, strict=True) if t}
                    if mapping:
                        self._client.zadd(f"{p}:d", mapping)
                    lower = f"({ids[-1].decode()}"
                self._client.set(f"{p}:d:v1", 1)
        self._done_indexed = True

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` if Redis cannot be reached."""
        with self._errors():
            self._client.ping()

    def close(self) -> None:
        """Close the connection pool once the calls in flight are done (``RedisCalls.close``); later calls raise
        ``StoreUnavailable``."""
        self._calls.close(self._client)
