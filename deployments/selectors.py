"""Reads of deployments: bots, versions (newest first), the active pointer, the audit trail.

Over ``stores.default_store()``; every list reads one page (``limit`` 1..200).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from botmesh_admin.errors import NotFound
from botmesh_admin.kv.tenant import ID_RE, validate_id
from botmesh_admin.pagination import cursor_check, validate_limit

from .domain import ActivePointer, AuditEvent, BotVersion, validate_bot, validate_version
from .stores import default_store

BOT_CURSOR = ID_RE  # the page's last bot id (the tenant id rule, see ``validate_bot``)
VERSION_CURSOR = re.compile(r"[0-9]{1,18}")  # the ``seq`` of the page's last version
AUDIT_CURSOR = re.compile(r"[0-9]{15}-[0-9]{12}-[0-9a-f]{6}")  # the last event's id (``new_audit_id``)


@dataclass(frozen=True)
class BotSummary:
    """A bot of the tenant with its active deployment (``None`` if nothing is live)."""

    bot: str
    active: ActivePointer | None


def _ids(tenant: str, bot: str) -> None:
    validate_id(tenant, "tenant")
    validate_bot(bot)


def bot_list(tenant: str, *, limit: int = 50, after: str | None = None) -> list[BotSummary]:
    """Return the tenant's bots (that published at least once) with their active version."""
    after = cursor_check(after, BOT_CURSOR)
    validate_id(tenant, "tenant")
    store = default_store()
    return [
        BotSummary(bot=b, active=store.get_active(tenant, b)) for b in store.list_bots(tenant, limit=limit, after=after)
    ]


def deployment_active_list(tenant: str, *, limit: int = 50, after: str | None = None) -> list[ActivePointer]:
    """Return up to ``limit`` (1..200) live deployments by bot id (``after``: the page's last bot id)."""
    after = cursor_check(after, BOT_CURSOR)
    validate_id(tenant, "tenant")
    return default_store().list_active(tenant, limit=validate_limit(limit), after=after)


def deployment_active_count(tenant: str) -> int:
    """Return how many of the tenant's bots have a live deployment (one counter read)."""
    validate_id(tenant, "tenant")
    return default_store().count_active(tenant)


def version_list(tenant: str, bot: str, *, limit: int = 50, after: str | None = None) -> list[BotVersion]:
    """Return up to ``limit`` (1..200) retained versions, newest first.

    ``after`` is the ``seq`` of the last version of the previous page (the API's
    ``next`` cursor); raise ``ValidationError`` naming ``after`` for a malformed one.
    """
    cursor = cursor_check(after, VERSION_CURSOR)
    _ids(tenant, bot)
    limit = validate_limit(limit)
    return default_store().list_versions(tenant, bot, limit=limit, after_seq=None if cursor is None else int(cursor))


def version_get(tenant: str, bot: str, version: str) -> BotVersion:
    """Return one retained version; ``NotFound`` if never published, pruned or foreign."""
    _ids(tenant, bot)
    validate_version(version)
    found = default_store().get_version(tenant, bot, version)
    if found is None:
        raise NotFound(f"version {version!r} of bot {bot!r} not found")
    return found


def deployment_active(tenant: str, bot: str) -> ActivePointer | None:
    """Return the bot's active deployment, or ``None`` if none was ever activated."""
    _ids(tenant, bot)
    return default_store().get_active(tenant, bot)


def deployment_audit_list(tenant: str, bot: str, *, limit: int = 50, after: str | None = None) -> list[AuditEvent]:
    """Return the bot's audit trail, newest first (``after``: the last event id seen)."""
    after = cursor_check(after, AUDIT_CURSOR)
    _ids(tenant, bot)
    return default_store().audit_list(tenant, bot, limit=limit, after=after)
