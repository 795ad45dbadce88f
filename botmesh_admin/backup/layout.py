"""Where this installation keeps its three stores, and how each one is backed up.

``layout()`` reads the configuration (``DATABASES``, ``BOTMESH_KV_URL``,
``BOTMESH_JOURNAL_URL``) and returns one ``Store`` per role. ``plan(stores)``
turns them into the *parts* of a backup: stores that share a file or a
PostgreSQL database share one part (the first role owns it, the others say
``{"format": "with", "part": owner}``), so nothing is copied twice and what
shares a database is copied in one snapshot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

ROLES = ("database", "kv", "journal")
VARIABLES = {"database": "DATABASE_URL", "kv": "BOTMESH_KV_URL", "journal": "BOTMESH_JOURNAL_URL"}


@dataclass(frozen=True)
class PgTarget:
    """A PostgreSQL database; ``password`` goes to ``PGPASSWORD``, never on a command line."""

    host: str
    port: int
    dbname: str
    user: str
    password: str | None = field(default=None, repr=False)
    options: tuple[tuple[str, str], ...] = ()

    @property
    def identity(self) -> tuple[str, int, str]:
        return (self.host, self.port, self.dbname)

    def conninfo(self) -> str:
        """Return a libpq URI without the password."""
        query = f"?{urlencode(self.options)}" if self.options else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{self.user}@{host}:{self.port}/{self.dbname}{query}"

    def env(self) -> dict[str, str]:
        """Return the environment for ``pg_dump``/``pg_restore`` (the password, if any)."""
        env = dict(os.environ)
        if self.password:
            env["PGPASSWORD"] = self.password
        return env

    @classmethod
    def from_url(cls, url: str) -> PgTarget:
        parts = urlsplit(url)
        options = tuple((k, v) for k, v in parse_qsl(parts.query) if k != "namespace")
        return cls(
            host=parts.hostname or "localhost",
            port=parts.port or 5432,
            dbname=unquote(parts.path.lstrip("/")) or unquote(parts.username or "postgres"),
            user=unquote(parts.username or "") or os.environ.get("PGUSER", "postgres"),
            password=unquote(parts.password) if parts.password else None,
            options=options,
        )

    @classmethod
    def from_django(cls, db: dict[str, Any]) -> PgTarget:
        options = tuple((k, str(v)) for k, v in (db.get("OPTIONS") or {}).items() if k in ("sslmode", "sslrootcert"))
        return cls(
            host=db.get("HOST") or "localhost",
            port=int(db.get("PORT") or 5432),
            dbname=db["NAME"],
            user=db.get("USER") or os.environ.get("PGUSER", "postgres"),
            password=db.get("PASSWORD") or None,
            options=options,
        )


@dataclass(frozen=True)
class Store:
    """One store of the installation: ``role`` (database, kv, journal) and where it lives."""

    role: str
    kind: str  # sqlite | postgresql | file | redis | memory
    url: str = field(repr=False)  # may hold a password: never print it
    path: Path | None = None  # sqlite and file stores
    pg: PgTarget | None = None
    tables: tuple[str, ...] = ()  # PostgreSQL tables of a Kv or journal

    @property
    def variable(self) -> str:
        return VARIABLES[self.role]

    @property
    def group(self) -> tuple[Any, ...]:
        """Stores with the same group share one backup part."""
        if self.kind == "sqlite":
            return ("sqlite", str(self.path))
        if self.kind == "postgresql":
            assert self.pg is not None
            return ("postgresql", *self.pg.identity)
        return (self.kind, self.role)


def _scheme(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    return {"postgres": "postgresql", "rediss": "redis", "redis+cluster": "redis"}.get(scheme, scheme)


def _sqlite_path(url: str) -> Path:
    from botmesh_admin.kv.sql import sqlite_path_from_url

    return Path(sqlite_path_from_url(url.split("?", 1)[0])).resolve()


def _url_store(role: str, url: str) -> Store:
    kind = _scheme(url)
    if kind == "sqlite":
        return Store(role, kind, url, path=_sqlite_path(url))
    if kind == "file":
        from botmesh_admin.kv.file import path_from_url

        return Store(role, kind, url, path=path_from_url(url).resolve())
    if kind == "postgresql":
        if role == "kv":
            tables: tuple[str, ...] = ("botmesh_kv",)
        else:
            from botmesh_admin.events.sql import split_namespace

            table = split_namespace(url)[1]
            tables = (table, f"{table}_fence")
        return Store(role, kind, url, pg=PgTarget.from_url(url), tables=tables)
    return Store(role, kind, url)


def layout() -> dict[str, Store]:
    """Return this installation's stores by role, from the settings."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        database = Store("database", "sqlite", str(db["NAME"]), path=Path(db["NAME"]).resolve())
    elif db["ENGINE"].endswith("postgresql"):
        database = Store("database", "postgresql", "", pg=PgTarget.from_django(db))
    else:  # pragma: no cover - config.py allows only these two
        raise ValueError(f"unsupported database engine {db['ENGINE']}")
    return {
        "database": database,
        "kv": _url_store("kv", settings.BOTMESH_KV_URL),
        "journal": _url_store("journal", settings.BOTMESH_JOURNAL_URL),
    }


SUFFIX = {"sqlite": ".sqlite3", "postgresql": ".pgdump", "file": ".json", "redis": ".jsonl", "memory": ".jsonl"}
FORMATS = {"sqlite": "sqlite", "postgresql": "pg_dump", "file": "file", "redis": "jsonl", "memory": "jsonl"}


def plan(stores: dict[str, Store]) -> dict[str, dict[str, Any]]:
    """Return the backup part of every role: ``{"format", "file"}``, or ``{"format": "with", "part"}``."""
    owners: dict[tuple[Any, ...], str] = {}
    parts: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        store = stores[role]
        owner = owners.get(store.group)
        if owner is not None:
            parts[role] = {"format": "with", "part": owner}
            if store.kind == "postgresql" and "tables" in parts[owner]:
                parts[owner]["tables"] = sorted({*parts[owner]["tables"], *store.tables})
            continue
        owners[store.group] = role
        part: dict[str, Any] = {"format": FORMATS[store.kind], "file": f"{role}{SUFFIX[store.kind]}"}
        if store.kind == "postgresql" and role != "database":
            part["tables"] = sorted(store.tables)  # only this store's tables, not the whole database
        parts[role] = part
    return parts


def describe(part: dict[str, Any]) -> str:
    """Return a short phrase for a part's format (error messages)."""
    if part["format"] == "with":
        return f"inside the {part['part']} part"
    return {"sqlite": "an SQLite file", "pg_dump": "a PostgreSQL dump", "file": "a file snapshot",
            "jsonl": "a logical export"}[part["format"]]  # fmt: skip
