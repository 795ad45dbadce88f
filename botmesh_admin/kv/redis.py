"""RedisKv: DurableKv on a standalone Redis (``redis://``) or Redis Cluster (``redis+cluster://``).

Layout of a table ``T`` (every key carries the hash tag ``{T}``, so a table lives
in one cluster slot and a commit is one Lua script on one node):

=======================  ==========================================================
``bmkv:{T}:e:<key>``     hash ``v`` (JSON text), ``ver`` (version), ``exp`` (epoch ms)
``bmkv:{T}:i``           sorted set of keys, score 0: ``ZRANGEBYLEX`` gives byte order
``bmkv:{T}:x``           sorted set of keys with a TTL, score ``exp``: what ``sweep`` visits
``bmkv:ttl-tables``      set of tables that have had TTL entries (a hint for ``sweep``)
=======================  ==========================================================

A commit is one ``EVALSHA``: the script checks every expectation, then applies
every op, so it is atomic without ``WATCH``; an ``Add`` reads and sums its
counter inside it, so concurrent adds queue in Redis and never conflict.
``get_many`` is one script call as well. Expiry uses the Redis server's clock
(``TIME``). An entry with a TTL also gets ``PEXPIREAT``, so Redis reclaims its
memory by itself; index members left behind are removed lazily by ``scan`` and
by ``sweep``. Redis errors are raised as ``StoreUnavailable``.

Durability is Redis's own: run it with AOF persistence and
``maxmemory-policy noeviction``, or evicted entries are simply lost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn
from urllib.parse import unquote

from botmesh_admin.errors import StoreUnavailable, ValidationError

from .base import ANY, MAX_COUNTER, Add, Check, ConflictError, Delete, Entry, Op, Put
from .encoding import dump_value, load_value, prefix_end, scan_start
from .validation import (
    added,
    now_ms,
    validate_commit,
    validate_get_many,
    validate_import,
    validate_key,
    validate_scan,
    validate_scan_follow,
    validate_scan_merge,
    validate_sweep_limit,
    validate_table,
    validate_table_prefix,
)

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

COMMIT_LUA = (
    _NOW
    + """
-- KEYS[1] index, KEYS[2] expiry index, KEYS[2 + i] entry hash of op i.
-- ARGV, five per op: kind (p put, d delete, c check, a add), key, expect (a any,
-- x absent, or a version), value JSON (an add: its delta), ttl_ms ('' for none).
-- Reply: {0, i, version or -1} for the first failed expectation, {2, i, stored
-- integer text or ''} for the first refused add (nothing written in either case),
-- else {1, then per op: version or -1, expires_at or -1, value or ''}.
"""
    + f"local MAX = {MAX_COUNTER}\n"
    + """-- Return s + d exactly (s: the stored JSON text, d: an integer within ±MAX), or
-- nil, why ('type' or 'range'). Lua numbers are doubles: s may exceed 2^53 and
-- still come back within ±MAX, so it is read as hi * 1e8 + lo, parts a double
-- holds exactly; hi * 1e8 is exact too (a multiple of 2^8 below 2^57), and the
-- last addition is correctly rounded, so the range test is exact.
local function add_exact(s, d)
  local sign, digits = string.match(s, '^(%-?)(%d+)$')
  if not digits then return nil, 'type' end
  if #digits > 17 then return nil, 'range' end  -- |s| >= 1e17 > 2 * MAX
  local hi = tonumber(string.sub(digits, 1, -9)) or 0
  local lo = tonumber(string.sub(digits, -8))
  if sign == '-' then hi, lo = -hi, -lo end
  local dlo = math.fmod(d, 1e8)
  local total = (hi + (d - dlo) / 1e8) * 1e8 + (lo + dlo)
  if total > MAX or total < -MAX then return nil, 'range' end
  return total
end
local n = #KEYS - 2
local present, had_ttl, vers, exps, vals = {}, {}, {}, {}, {}
for i = 1, n do
  local b = (i - 1) * 5
  local kind, expect = ARGV[b + 1], ARGV[b + 3]
  local h
  if kind == 'c' or kind == 'a' then
    h = redis.call('HMGET', KEYS[2 + i], 'ver', 'exp', 'v')
  else
    h = redis.call('HMGET', KEYS[2 + i], 'ver', 'exp')
  end
  local ver, exp = tonumber(h[1]), tonumber(h[2])
  present[i] = ver ~= nil
  had_ttl[i] = exp ~= nil
  if ver and exp and exp <= now then ver = nil end
  if kind == 'a' then  -- no expectation: an add fails only on what it adds to
    local total, why = add_exact(ver and h[3] or '0', tonumber(ARGV[b + 4]))
    if not total then return {2, i, why == 'range' and h[3] or ''} end
    h[3] = string.format('%d', total)
  elseif expect == 'x' then
    if ver then return {0, i, ver} end
  elseif expect ~= 'a' and ver ~= tonumber(expect) then
    return {0, i, ver or -1}
  end
  if not ver then exp = nil end
  vers[i], exps[i], vals[i] = ver or 0, exp or -1, h[3] or ''
end
local out = {1}
for i = 1, n do
  local b = (i - 1) * 5
  local kind, member, key = ARGV[b + 1], ARGV[b + 2], KEYS[2 + i]
  if kind == 'a' and exps[i] >= 0 then  -- a live counter with a TTL keeps it
    redis.call('HSET', key, 'v', vals[i], 'ver', vers[i] + 1)
    out[#out + 1], out[#out + 2], out[#out + 3] = vers[i] + 1, exps[i], vals[i]
  elseif kind == 'p' or kind == 'a' then
    local ver, exp = vers[i] + 1, -1
    local value = kind == 'a' and vals[i] or ARGV[b + 4]
    if kind == 'a' or ARGV[b + 5] == '' then
      redis.call('HSET', key, 'v', value, 'ver', ver)
      if had_ttl[i] then
        redis.call('HDEL', key, 'exp')
        redis.call('PERSIST', key)
      end
      if had_ttl[i] or not present[i] then  -- a reclaimed entry may have left its member
        redis.call('ZREM', KEYS[2], member)
      end
    else
      exp = now + tonumber(ARGV[b + 5])
      redis.call('HSET', key, 'v', value, 'ver', ver, 'exp', string.format('%d', exp))
      -- Redis drops a key once now > its expiry time; exp - 1 makes it vanish at exp,
      -- matching "live while expires_at > now".
      redis.call('PEXPIREAT', key, string.format('%d', exp - 1))
      redis.call('ZADD', KEYS[2], exp, member)
    end
    if not present[i] then  -- an existing entry is always in the index already
      redis.call('ZADD', KEYS[1], 0, member)
    end
    out[#out + 1], out[#out + 2], out[#out + 3] = ver, exp, kind == 'a' and value or ''
  elseif kind == 'd' then
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZREM', KEYS[2], member)
    out[#out + 1], out[#out + 2], out[#out + 3] = -1, -1, ''
  elseif vers[i] == 0 then
    out[#out + 1], out[#out + 2], out[#out + 3] = -1, -1, ''
  else
    out[#out + 1], out[#out + 2], out[#out + 3] = vers[i], exps[i], vals[i]
  end
end
return out
"""
)

# Shared by the scan scripts: ``live_range`` visits up to ``limit`` live entries of a lex range in
# key order (members whose entry expired or was reclaimed by Redis are removed on the way);
# ``push_target`` appends the target of an entry: the key its value's field holds when that is a
# string (pcall: a value cjson cannot read names no key), read like GET_MANY_LUA, or four ''.
_SCAN_FUNCTIONS = """
local function live_range(prefix, min, max, limit, visit)
  local found = 0
  while found < limit do
    local want = limit - found
    local members = redis.call('ZRANGEBYLEX', KEYS[1], min, max, 'LIMIT', 0, want)
    for _, m in ipairs(members) do
      local h = redis.call('HMGET', prefix .. m, 'v', 'ver', 'exp')
      local exp = tonumber(h[3])
      if h[2] and (not exp or exp > now) then
        visit(m, h)
        found = found + 1
      else
        redis.call('DEL', prefix .. m)
        redis.call('ZREM', KEYS[1], m)
        redis.call('ZREM', KEYS[2], m)
      end
    end
    if #members < want then break end
    min = '(' .. members[#members]
  end
end
local function push_target(out, prefix, value, field)
  local ok, doc = pcall(cjson.decode, value)
  local t = ok and type(doc) == 'table' and doc[field] or nil
  local th = type(t) == 'string' and redis.call('HMGET', prefix .. t, 'v', 'ver', 'exp') or {}
  local texp = tonumber(th[3])
  if th[2] and (not texp or texp > now) then
    out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = t, th[1], th[2], th[3] or ''
  else
    out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = '', '', '', ''
  end
end
"""

SCAN_LUA = (
    _NOW
    + """
-- KEYS[1] index, KEYS[2] expiry index. ARGV: entry key prefix, lex min, lex max, limit.
-- Reply: flat {key, value, version, expires_at or '', ...} of up to limit live entries.
-- Members whose entry expired or was reclaimed by Redis are removed on the way.
"""
    + _SCAN_FUNCTIONS
    + """
local out = {}
live_range(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), function(m, h)
  out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = m, h[1], h[2], h[3] or ''
end)
return out
"""
)

SCAN_FOLLOW_LUA = (
    _NOW
    + """
-- As SCAN_LUA, with ARGV[5] a field name: after each entry its target's
-- {key, value, version, expires_at or ''}, all '' when there is none.
"""
    + _SCAN_FUNCTIONS
    + """
local out = {}
live_range(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), function(m, h)
  out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = m, h[1], h[2], h[3] or ''
  push_target(out, ARGV[1], h[1], ARGV[5])
end)
return out
"""
)

SCAN_MERGE_LUA = (
    _NOW
    + """
-- KEYS[1] index, KEYS[2] expiry index. ARGV: entry key prefix, limit, field name,
-- then per range: lex min, lex max, prefix length. Each range is scanned as
-- SCAN_LUA scans (up to limit live entries); the union is ordered by the part of
-- each key after its range's prefix, then by key (byte order: Redis runs Lua in
-- the C locale), and cut at limit. Reply as SCAN_FOLLOW_LUA's.
"""
    + _SCAN_FUNCTIONS
    + """
local prefix, limit, field = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local rows = {}
for r = 4, #ARGV, 3 do
  local plen = tonumber(ARGV[r + 2])
  live_range(prefix, ARGV[r], ARGV[r + 1], limit, function(m, h)
    rows[#rows + 1] = {string.sub(m, plen + 1), m, h[1], h[2], h[3] or ''}
  end)
end
table.sort(rows, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
local out = {}
for i = 1, math.min(limit, #rows) do
  local row = rows[i]
  out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = row[2], row[3], row[4], row[5]
  push_target(out, prefix, row[3], field)
end
return out
"""
)

GET_MANY_LUA = (
    _NOW
    + """
-- KEYS: the entry hashes to read. Reply: flat {value, version, expires_at} per key,
-- '' for each of them when the entry is absent or expired.
local out = {}
for i = 1, #KEYS do
  local h = redis.call('HMGET', KEYS[i], 'v', 'ver', 'exp')
  local exp = tonumber(h[3])
  if h[2] and (not exp or exp > now) then
    out[#out + 1], out[#out + 2], out[#out + 3] = h[1], h[2], h[3] or ''
  else
    out[#out + 1], out[#out + 2], out[#out + 3] = '', '', ''
  end
end
return out
"""
)

SWEEP_LUA = (
    _NOW
    + """
-- KEYS[1] index, KEYS[2] expiry index. ARGV: entry key prefix, limit.
-- Reply: {entries removed, expiry-index members visited}.
local prefix = ARGV[1]
local members = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local removed = 0
for _, m in ipairs(members) do
  local h = redis.call('HMGET', prefix .. m, 'ver', 'exp')
  local exp = tonumber(h[2])
  if h[1] and exp and exp > now then
    redis.call('ZADD', KEYS[2], exp, m)
  elseif h[1] and not exp then
    redis.call('ZREM', KEYS[2], m)
  else
    redis.call('DEL', prefix .. m)
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', KEYS[2], m)
    removed = removed + 1
  end
end
return {removed, #members}
"""
)

DROP_LUA = """
-- KEYS[1] index, KEYS[2] expiry index. ARGV: entry key prefix, chunk size.
-- Delete up to one chunk of entries; reply how many. Below a full chunk, the table is gone.
local chunk = tonumber(ARGV[2])
local members = redis.call('ZRANGE', KEYS[1], 0, chunk - 1)
for _, m in ipairs(members) do redis.call('DEL', ARGV[1] .. m) end
if #members > 0 then redis.call('ZREM', KEYS[1], unpack(members)) end
if #members < chunk then redis.call('DEL', KEYS[1], KEYS[2]) end
return #members
"""

IMPORT_LUA = """
-- KEYS[1] index, KEYS[2] expiry index, KEYS[2 + i] entry hash of entry i.
-- ARGV, four per entry: key, value JSON, version, expires_at ('' for none).
-- Writes each entry exactly as given (a restore); reply: how many.
local n = #KEYS - 2
for i = 1, n do
  local b = (i - 1) * 4
  local key, member, exp = KEYS[2 + i], ARGV[b + 1], ARGV[b + 4]
  redis.call('DEL', key)
  redis.call('HSET', key, 'v', ARGV[b + 2], 'ver', ARGV[b + 3])
  if exp == '' then
    redis.call('ZREM', KEYS[2], member)
  else
    redis.call('HSET', key, 'exp', exp)
    redis.call('PEXPIREAT', key, string.format('%d', tonumber(exp) - 1))
    redis.call('ZADD', KEYS[2], tonumber(exp), member)
  end
  redis.call('ZADD', KEYS[1], 0, member)
end
return n
"""

TTL_TABLES = b"bmkv:ttl-tables"
_INDEX_HEAD, _INDEX_TAIL = b"bmkv:{", b"}:i"
_IMPORT_CHUNK = 500
_DROP_CHUNK = 500
_REGISTER_EVERY_S = 60.0


def _refuse_add(ops: Sequence[Op], i: int, stored: bytes | None) -> NoReturn:
    """Raise the ``ValidationError`` of the ``Add`` at ``ops[i]`` that the script refused.

    ``stored`` is the JSON text of the stored integer (the sum left ``±MAX_COUNTER``),
    or ``None`` if the stored value is not an integer. ``added`` words the error,
    so RedisKv refuses exactly as MemoryKv does.
    """
    op = ops[i]
    assert isinstance(op, Add)
    added("not an integer" if stored is None else load_value(stored), op.delta, f"ops[{i}]")
    raise StoreUnavailable(f"Redis Kv refused ops[{i}] (an Add) for no reason MemoryKv knows")


def table_keys(table: str) -> tuple[bytes, bytes, bytes]:
    """Return (index, expiry index, entry key prefix) of ``table``."""
    tag = b"bmkv:{" + table.encode() + b"}:"
    return tag + b"i", tag + b"x", tag + b"e:"


def _parse_cluster_url(url: str) -> dict[str, Any]:
    """Return RedisCluster arguments for ``redis+cluster://[user:password@]host:port,host:port``."""
    netloc = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
    auth, _, hosts = netloc.rpartition("@")
    nodes = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValidationError("url", f"cluster nodes must be host:port, got {item!r}")
        nodes.append((host.strip("[]"), int(port)))
    username, _, password = auth.partition(":") if auth else ("", "", "")
    return {
        "nodes": nodes,
        "username": unquote(username) or None,
        "password": unquote(password) or None,
    }


def _scan_args(table: str, prefix: str, after: str | None, limit: int) -> tuple[list[bytes], list[bytes | int]]:
    """Return the keys and arguments of ``SCAN_LUA`` for a scan of ``table``."""
    start, inclusive = scan_start(prefix, after)
    end = prefix_end(prefix)
    if inclusive:
        lex_min = b"[" + start.encode() if start else b"-"
    else:
        lex_min = b"(" + start.encode()
    lex_max = b"(" + end.encode() if end is not None else b"+"
    index, expiry, entry_prefix = table_keys(table)
    return [index, expiry], [entry_prefix, lex_min, lex_max, limit]


def _entry(flat: Sequence[bytes], i: int) -> Entry:
    """Return the entry of a script reply at ``flat[i : i + 4]`` (key, value, version, expires_at)."""
    return Entry(flat[i].decode(), load_value(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]) if flat[i + 3] else None)


class RedisCalls:
    """The calls of one Redis store (the Kv, the journal): their errors, and ``close`` waiting for them.

    ``guard()`` wraps each call: ``errors`` become ``StoreUnavailable``
    ("<what>: …"), and a call after ``close`` raises it before reaching the
    client (whose pool would reconnect). ``close`` waits for the calls in
    flight, at most ``close_wait_s`` seconds, before it closes the client:
    redis-py's ``close`` disconnects connections other threads are using,
    which left a thread waiting for a reply until its socket timeout (30 s), or
    failing inside the client (an ``AttributeError`` on the dropped parser).
    A call still running after the wait and cut off is read as the store
    being closed (``StoreUnavailable``).
    """

    close_wait_s = 10.0

    def __init__(self, errors: tuple[type[BaseException], ...], what: str) -> None:
        self.errors, self.what = errors, what
        self.closed = False
        self._in_flight = 0
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Run one call of the store (see the class)."""
        with self._idle:
            if self.closed:
                raise StoreUnavailable(f"{self.what}: closed")
            self._in_flight += 1
        try:
            yield
        except self.errors as exc:
            raise StoreUnavailable(f"{self.what}: {exc}") from exc
        except Exception as exc:
            if self.closed:
                raise StoreUnavailable(f"{self.what}: closed") from exc
            raise
        finally:
            with self._idle:
                self._in_flight -= 1
                if not self._in_flight:
                    self._idle.notify_all()

    def close(self, client: Any) -> None:
        """Refuse new calls, wait for those in flight (at most ``close_wait_s`` s), then close ``client``."""
        with self._idle:
            self.closed = True
            self._idle.wait_for(lambda: not self._in_flight, timeout=self.close_wait_s)
        with contextlib.suppress(*self.errors):
            client.close()


class RedisKv:
    """DurableKv over Redis; every table stays in one hash slot.

    Raise ``ValidationError`` (field ``url``) for a malformed URL and
    ``StoreUnavailable`` when Redis cannot be reached.
    """

    def __init__(self, url: str) -> None:
        import redis
        import redis.cluster

        self.url = url
        self._calls = RedisCalls((redis.RedisError, redis.cluster.RedisClusterException), "Redis Kv")
        self._registered: dict[str, float] = {}  # table -> monotonic time of last SADD
        self._registered_lock = threading.Lock()
        options: dict[str, Any] = {"socket_connect_timeout": 10, "socket_timeout": 30}
        with self._errors():
            if url.lower().startswith("redis+cluster://"):
                parsed = _parse_cluster_url(url)
                self._client: Any = redis.cluster.RedisCluster(
                    startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in parsed["nodes"]],
                    username=parsed["username"],
                    password=parsed["password"],
                    **options,
                )
            else:
                try:
                    self._client = redis.Redis.from_url(url, **options)
                except ValueError as exc:
                    raise ValidationError("url", f"not a Redis URL: {exc}") from None
            self._client.ping()  # fail at connect time, like the other backends
        self._commit = self._client.register_script(COMMIT_LUA)
        self._scan = self._client.register_script(SCAN_LUA)
        self._scan_follow = self._client.register_script(SCAN_FOLLOW_LUA)
        self._scan_merge = self._client.register_script(SCAN_MERGE_LUA)
        self._get_many = self._client.register_script(GET_MANY_LUA)
        self._sweep = self._client.register_script(SWEEP_LUA)
        self._drop = self._client.register_script(DROP_LUA)
        self._import = self._client.register_script(IMPORT_LUA)

    def __repr__(self) -> str:
        return f"<RedisKv {self.url.split('://', 1)[0]}>"

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return self._calls.guard()

    def get(self, table: str, key: str) -> Entry | None:
        """Return the live entry at ``key`` in ``table``, or ``None`` if absent or expired.

        One ``HMGET``: Redis itself hides an entry from its ``expires_at`` on.
        """
        validate_table(table)
        validate_key(key)
        entry_key = table_keys(table)[2] + key.encode()
        with self._errors():
            value, version, expires_at = self._client.hmget(entry_key, (b"v", b"ver", b"exp"))
        if version is None:
            return None
        return Entry(key, load_value(value), int(version), expires_at and int(expires_at))

    def get_many(self, table: str, keys: Sequence[str]) -> list[Entry | None]:
        """Return the live entry (or ``None``) of each of ``keys``, in order: one script call.

        The script reads every entry at one instant, like ``commit`` (and, being
        one call, one round trip on a cluster too: the keys share the table's slot).
        """
        keys = validate_get_many(table, keys)
        if not keys:
            return []
        entry_prefix = table_keys(table)[2]
        unique = list(dict.fromkeys(keys))
        with self._errors():
            flat = self._get_many(keys=[entry_prefix + key.encode() for key in unique])
        found: dict[str, Entry] = {}
        for key, i in zip(unique, range(0, len(flat), 3), strict=True):
            value, version, expires_at = flat[i : i + 3]
            if version:
                found[key] = Entry(key, load_value(value), int(version), int(expires_at) if expires_at else None)
        return [found.get(key) for key in keys]

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Entry]:
        """Return up to ``limit`` live entries with ``prefix``, by byte order, after ``after``."""
        validate_scan(table, prefix, after, limit)
        keys, args = _scan_args(table, prefix, after, limit)
        with self._errors():
            flat = self._scan(keys=keys, args=args)
        return [_entry(flat, i) for i in range(0, len(flat), 4)]

    def scan_follow(
        self, table: str, prefix: str = "", after: str | None = None, limit: int = 100, *, field: str = "pk"
    ) -> list[tuple[Entry, Entry | None]]:
        """Return a scan's entries with the live entry each one's ``field`` names: one script (``ScanFollow``)."""
        validate_scan_follow(table, prefix, after, limit, field)
        keys, args = _scan_args(table, prefix, after, limit)
        with self._errors():
            flat = self._scan_follow(keys=keys, args=[*args, field])
        return [(_entry(flat, i), _entry(flat, i + 4) if flat[i + 6] else None) for i in range(0, len(flat), 8)]

    def scan_merge(
        self,
        table: str,
        prefixes: Sequence[str],
        after: str | None = None,
        limit: int = 100,
        *,
        field: str = "pk",
    ) -> list[tuple[Entry, Entry | None]]:
        """Return several prefixes' scans merged by suffix, with targets: one script (``ScanMerge``)."""
        found = validate_scan_merge(table, prefixes, after, limit, field)
        keys: list[bytes] = []
        ranges: list[bytes | int] = []
        for prefix in found:
            keys, args = _scan_args(table, prefix, None if after is None else prefix + after, limit)
            ranges += [args[1], args[2], len(prefix.encode())]
        with self._errors():
            flat = self._scan_merge(keys=keys, args=[args[0], limit, field, *ranges])
        return [(_entry(flat, i), _entry(flat, i + 4) if flat[i + 6] else None) for i in range(0, len(flat), 8)]

    def commit(self, table: str, ops: Sequence[Op]) -> list[Entry | None]:
        """Apply ``ops`` in one Lua script; raise ``ConflictError`` if an expectation fails."""
        validate_commit(table, ops)
        index, expiry, entry_prefix = table_keys(table)
        keys = [index, expiry]
        args: list[bytes | str | int] = []
        has_ttl = False
        for op in ops:
            key = op.key.encode()
            keys.append(entry_prefix + key)
            expect: bytes | int
            if isinstance(op.expect, int):
                expect = op.expect
            else:
                expect = b"a" if op.expect is ANY else b"x"
            if isinstance(op, Put):
                ttl: bytes | int = b"" if op.ttl_ms is None else op.ttl_ms
                has_ttl = has_ttl or op.ttl_ms is not None
                args += (b"p", key, expect, dump_value(op.value), ttl)
            elif isinstance(op, Add):
                args += (b"a", key, expect, op.delta, b"")
            else:
                args += (b"d" if isinstance(op, Delete) else b"c", key, expect, b"", b"")
        with self._errors():
            if has_ttl:  # before the write: a failure here must leave nothing applied
                self._register_ttl_table(table)
            reply = self._commit(keys=keys, args=args)
        if reply[0] == 0:
            op = ops[reply[1] - 1]
            raise ConflictError(table, op.key, op.expect, None if reply[2] < 0 else reply[2])
        if reply[0] == 2:
            _refuse_add(ops, reply[1] - 1, reply[2] or None)
        results: list[Entry | None] = []
        for i, op in enumerate(ops):
            version, expires_at, value = reply[1 + 3 * i : 4 + 3 * i]
            if isinstance(op, Put):
                results.append(Entry(op.key, op.value, version, None if expires_at < 0 else expires_at))
            elif isinstance(op, Add):
                results.append(Entry(op.key, int(value), version, None if expires_at < 0 else expires_at))
            elif isinstance(op, Check) and version > 0:
                results.append(Entry(op.key, load_value(value), version, None if expires_at < 0 else expires_at))
            else:
                results.append(None)
        return results

    def _register_ttl_table(self, table: str) -> None:
        """Record ``table`` in the set ``sweep`` visits (at most once a minute per process)."""
        now = time.monotonic()
        with self._registered_lock:
            if now - self._registered.get(table, -_REGISTER_EVERY_S) < _REGISTER_EVERY_S:
                return
        self._client.sadd(TTL_TABLES, table.encode())
        with self._registered_lock:
            if len(self._registered) > 10_000:
                self._registered.clear()
            self._registered[table] = now

    def drop(self, table: str) -> None:
        """Delete every entry of ``table``, a chunk of entries per script call."""
        validate_table(table)
        index, expiry, entry_prefix = table_keys(table)
        with self._errors():
            while self._drop(keys=[index, expiry], args=[entry_prefix, _DROP_CHUNK]) == _DROP_CHUNK:
                pass
            self._client.srem(TTL_TABLES, table.encode())
        with self._registered_lock:
            self._registered.pop(table, None)

    def sweep(self, limit: int = 1000) -> int:
        """Remove up to ``limit`` expired entries (and stale index members); return how many."""
        validate_sweep_limit(limit)
        removed = 0
        with self._errors():
            for raw in self._client.sscan_iter(TTL_TABLES, count=500):
                index, expiry, entry_prefix = table_keys(raw.decode())
                while removed < limit:
                    batch = limit - removed
                    gone, visited = self._sweep(keys=[index, expiry], args=[entry_prefix, batch])
                    removed += gone
                    if visited < batch:  # no more expired members in this table
                        break
                if removed >= limit:
                    break
        return removed

    def tables(self, prefix: str = "") -> list[str]:
        """Return the tables starting with ``prefix`` that hold a live entry, by name.

        ``SCAN`` (``TYPE zset``) for the table indexes, on every primary of a
        cluster; so tables written by any earlier version are found too. Cost:
        one pass over the keyspace (a backup-time operation, not a hot path).
        """
        validate_table_prefix(prefix)
        escaped = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)
        pattern = _INDEX_HEAD + escaped.encode() + b"*" + _INDEX_TAIL
        with self._errors():
            found = {
                raw[len(_INDEX_HEAD) : -len(_INDEX_TAIL)].decode()
                for raw in self._client.scan_iter(match=pattern, count=1000, _type="zset")
            }
        return sorted(t for t in found if t.startswith(prefix) and self.scan(t, limit=1))

    def import_entries(self, table: str, entries: Sequence[Entry]) -> int:
        """Store ``entries`` as given (restore), a chunk per script call; return how many were live."""
        now = now_ms()
        live = [e for e in validate_import(table, entries) if e.expires_at is None or e.expires_at > now]
        index, expiry, entry_prefix = table_keys(table)
        with self._errors():
            if any(e.expires_at is not None for e in live):
                self._register_ttl_table(table)
            for start in range(0, len(live), _IMPORT_CHUNK):
                chunk = live[start : start + _IMPORT_CHUNK]
                args: list[bytes | str | int] = []
                for e in chunk:
                    exp: bytes | int = b"" if e.expires_at is None else e.expires_at
                    args += (e.key.encode(), dump_value(e.value), e.version, exp)
                keys = [index, expiry, *(entry_prefix + e.key.encode() for e in chunk)]
                self._import(keys=keys, args=args)
        return len(live)

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` if Redis cannot be reached."""
        with self._errors():
            self._client.ping()

    def close(self) -> None:
        """Close the connection pool(s) once the calls in flight are done (``RedisCalls.close``); later calls
        raise ``StoreUnavailable``."""
        self._calls.close(self._client)


__all__ = ["RedisCalls", "RedisKv"]
