"""Process counters in one Redis hash (``HINCRBY`` in a MULTI/EXEC transaction)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_KEY = "botmesh-admin:metrics:counters"
STARTED_AT_FIELD = b"~started_at"  # when the counters started (no counter name holds "~")


class RedisCounterStore:
    """Counters as fields of the hash ``key``; ``add`` is one command or one MULTI/EXEC transaction."""

    def __init__(self, url: str, key: str = DEFAULT_KEY) -> None:
        import redis

        self.key = key
        self._client: Any = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)

    def add(self, deltas: Mapping[str, int]) -> None:
        items = [(name, delta) for name, delta in deltas.items() if delta]
        if len(items) == 1:
            self._client.hincrby(self.key, *items[0])  # one command is atomic by itself
            return
        pipe = self._client.pipeline(transaction=True)
        for name, delta in items:
            pipe.hincrby(self.key, name, delta)
        pipe.execute()

    def read(self) -> dict[str, int]:
        raw = self._client.hgetall(self.key)
        return {k.decode(): int(v) for k, v in raw.items() if k != STARTED_AT_FIELD and int(v)}

    def started_at(self, now_ms: int) -> int:
        # HSETNX: the first process to ask stores the start; the field lives and dies with the counters
        self._client.hsetnx(self.key, STARTED_AT_FIELD, now_ms)
        stored = self._client.hget(self.key, STARTED_AT_FIELD)
        return int(stored) if stored is not None else now_ms

    def reset(self) -> None:
        self._client.delete(self.key)

    def close(self) -> None:
        self._client.close()
