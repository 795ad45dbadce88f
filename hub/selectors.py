"""Reads of the hub: installations, their status and the audit trail."""

from __future__ import annotations

import re

from botmesh_admin.cursors import cursor_check

from .domain import ID_RE, AuditEvent, Installation, PluginCounts, RuntimeInfo
from .services import default_hub

AUDIT_CURSOR = re.compile(r"[0-9]{15}-[0-9]{12}-[0-9a-f]{6}")  # the last event's id (``new_audit_id``)


def plugin_get(tenant: str, plugin_id: str) -> Installation:
    """Return the installation of ``plugin_id`` in ``tenant``; ``NotFound`` if absent or foreign."""
    return default_hub().get(tenant, plugin_id)


def plugin_list(tenant: str, *, limit: int = 50, after: str | None = None) -> list[Installation]:
    """Return up to ``limit`` installations by plugin id, after the id ``after``."""
    return default_hub().list(tenant, limit=limit, after=cursor_check(after, ID_RE))


def plugin_counts(tenant: str) -> PluginCounts:
    """Return how many plugins ``tenant`` has installed and enabled (two counter reads)."""
    return default_hub().counts(tenant)


def plugin_audit_list(
    tenant: str, *, plugin_id: str | None = None, limit: int = 50, after: str | None = None
) -> list[AuditEvent]:
    """Return audit events, newest first (pass the last event's id as ``after``)."""
    return default_hub().audit(tenant, plugin_id=plugin_id, limit=limit, after=cursor_check(after, AUDIT_CURSOR))


def hub_runtime() -> RuntimeInfo:
    """Return the runtime plugins are checked against."""
    return default_hub().runtime
