"""Journal URLs for the tests: a fresh namespace per test on the shared servers.

Kept free of pytest imports so worker subprocesses can import it quickly.
"""

from __future__ import annotations

import uuid

from botmesh_admin.events.sql import split_namespace

LOCAL = ("memory", "file", "sqlite")
SERVERS = ("postgresql", "redis")
ALL = LOCAL + SERVERS
SHARED = ("sqlite", "postgresql", "redis")
"""Backends several processes can open at once."""


def with_namespace(url: str, namespace: str | None = None) -> str:
    """Return ``url`` with a fresh ``?namespace=`` (unique across xdist workers)."""
    namespace = namespace or f"t{uuid.uuid4().hex[:12]}"
    return f"{url}{'&' if '?' in url else '?'}namespace={namespace}"


def drop(url: str) -> None:
    """Delete the journal at ``url`` from its server (PostgreSQL table, Redis keys)."""
    conn_url, table = split_namespace(url)
    if url.startswith("postgres"):
        import psycopg

        with psycopg.connect(conn_url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"DROP TABLE IF EXISTS {table}_counts")
            conn.execute(f"DROP SEQUENCE IF EXISTS {table}_fence")
    elif url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(conn_url)
        prefix = "{" + table.replace("botmesh_events", "botmesh:events", 1) + "}"
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
        client.close()
