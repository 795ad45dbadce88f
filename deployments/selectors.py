"""Reads of deployments: bots, versions (newest first), the active pointer, the audit trail."""

from __future__ import annotations

import re
from dataclasses import dataclass

from botmesh_admin.cursors import cursor_check
from botmesh_admin.kv.tenant import ID_RE

from .domain import ActivePointer, AuditEvent, BotVersion
from .services import default_registry

BOT_CURSOR = ID_RE  # the page's last bot id (the tenant id rule, see ``validate_bot``)
VERSION_CURSOR = re.compile(r"[0-9]{1,18}")  # the ``seq`` of the page's last version
AUDIT_CURSOR = re.compile(r"[0-9]{15}-[0-9]{12}-[0-9a-f]{6}")  # the last event's id (``new_audit_id``)


@dataclass(frozen=True)
class BotSummary:
    """A bot of the tenant with its active deployment (``None`` if nothing is live)."""

    bot: str
    active: ActivePointer | None


def bot_list(tenant: str, *, limit: int = 50, after: str | None = None) -> list[BotSummary]:
    """Return the tenant's bots (that published at least once) with their active version."""
    registry = default_registry()
    return [
        BotSummary(bot=b, active=registry.active(tenant, b))
        for b in registry.bots(tenant, limit=limit, after=cursor_check(after, BOT_CURSOR))
    ]


def deployment_active_list(tenant: str, *, limit: int = 50, after: str | None = None) -> list[ActivePointer]:
    """Return the tenant's live deployments by bot id (``after``: the page's last bot id)."""
    return default_registry().active_list(tenant, limit=limit, after=cursor_check(after, BOT_CURSOR))


def deployment_active_count(tenant: str) -> int:
    """Return how many of the tenant's bots have a live deployment (one counter read)."""
    return default_registry().active_count(tenant)


def version_list(tenant: str, bot: str, *, limit: int = 50, after: str | None = None) -> list[BotVersion]:
    """Return up to ``limit`` retained versions, newest first (``after``: previous page's cursor)."""
    return default_registry().list(tenant, bot, limit, cursor_check(after, VERSION_CURSOR))


def version_get(tenant: str, bot: str, version: str) -> BotVersion:
    """Return one retained version; ``NotFound`` if absent, pruned or foreign."""
    return default_registry().get(tenant, bot, version)


def deployment_active(tenant: str, bot: str) -> ActivePointer | None:
    """Return the bot's active deployment, or ``None``."""
    return default_registry().active(tenant, bot)


def deployment_audit_list(tenant: str, bot: str, *, limit: int = 50, after: str | None = None) -> list[AuditEvent]:
    """Return the bot's audit trail, newest first (``after``: the last event id seen)."""
    return default_registry().audit(tenant, bot, limit=limit, after=cursor_check(after, AUDIT_CURSOR))
