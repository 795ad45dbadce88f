"""Reads of the hub: installations, their status and the audit trail (over ``stores.default_store()``)."""

from __future__ import annotations

import re

from botmesh_admin.errors import NotFound
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.pagination import cursor_check

from .domain import ID_RE, AuditEvent, Installation, PluginCounts, RuntimeInfo, current_runtime, validate_plugin_id
from .stores import default_store

AUDIT_CURSOR = re.compile(r"[0-9]{15}-[0-9]{12}-[0-9a-f]{6}")  # the last event's id (``new_audit_id``)


def plugin_get(tenant: str, plugin_id: str) -> Installation:
    """Return the installation of ``plugin_id`` in ``tenant``; ``NotFound`` if absent or foreign."""
    validate_id(tenant, "tenant")
    validate_plugin_id(plugin_id)
    found = default_store().get(tenant, plugin_id)
    if found is None:
        raise NotFound(f"plugin {plugin_id!r} is not installed")
    return found


def plugin_list(tenant: str, *, limit: int = 50, after: str | None = None) -> list[Installation]:
    """Return up to ``limit`` installations by plugin id, after the id ``after``."""
    after = cursor_check(after, ID_RE)
    validate_id(tenant, "tenant")
    return default_store().list(tenant, limit=limit, after=after)


def plugin_counts(tenant: str) -> PluginCounts:
    """Return how many plugins ``tenant`` has installed and enabled (two counter reads)."""
    validate_id(tenant, "tenant")
    return default_store().counts(tenant)


def plugin_audit_list(
    tenant: str, *, plugin_id: str | None = None, limit: int = 50, after: str | None = None
) -> list[AuditEvent]:
    """Return audit events, newest first, only ``plugin_id``'s when given (pass the last event's id as ``after``)."""
    after = cursor_check(after, AUDIT_CURSOR)
    validate_id(tenant, "tenant")
    if plugin_id is not None:
        validate_plugin_id(plugin_id)
    return default_store().audit_list(tenant, plugin_id=plugin_id, limit=limit, after=after)


def hub_runtime() -> RuntimeInfo:
    """Return the runtime plugins are checked against (``domain.current_runtime``)."""
    return current_runtime()
