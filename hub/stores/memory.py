"""MemoryPluginStore: the reference plugin store, in one process's memory."""

from __future__ import annotations

import bisect
import builtins
import threading
from collections.abc import Sequence
from typing import Any

from hub.domain import AuditEvent, Installation, PluginCounts

from .base import StaleRevision


class _Tenant:
    def __init__(self) -> None:
        self.plugins: dict[str, tuple[dict[str, Any], int]] = {}
        self.audit_ids: builtins.list[str] = []  # sorted: audit ids sort newest first
        self.audit: dict[str, AuditEvent] = {}


class MemoryPluginStore:
    """Plugin store in dicts behind one lock; revisions count up by one per write."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, _Tenant] = {}

    def _tenant(self, tenant: str) -> _Tenant:
        return self._tenants.setdefault(tenant, _Tenant())

    def get(self, tenant: str, plugin_id: str) -> Installation | None:
        """Return the installation or ``None``."""
        with self._lock:
            found = self._tenant(tenant).plugins.get(plugin_id)
        return Installation.from_json(found[0], found[1]) if found else None

    def list(self, tenant: str, *, limit: int = 50, after: str | None = None) -> builtins.list[Installation]:
        """Return installations by plugin id after ``after``."""
        with self._lock:
            plugins = self._tenant(tenant).plugins
            ids = sorted(p for p in plugins if after is None or p > after)[:limit]
            rows = [plugins[p] for p in ids]
        return [Installation.from_json(record, rev) for record, rev in rows]

    def counts(self, tenant: str) -> PluginCounts:
        """Count the installations and the enabled ones (the reference: a walk)."""
        with self._lock:
            records = [record for record, _ in self._tenant(tenant).plugins.values()]
        return PluginCounts(installed=len(records), enabled=sum(1 for r in records if r["enabled"]))

    def _check(self, t: _Tenant, plugin_id: str, expect: int | None) -> int | None:
        current = t.plugins.get(plugin_id)
        current_rev = current[1] if current else None
        if current_rev != expect:
            raise StaleRevision(
                f"plugin {plugin_id!r} changed concurrently",
                current_version=current_rev,
            )
        return current_rev

    def _append_audit(self, t: _Tenant, audit: Sequence[AuditEvent]) -> None:
        for event in audit:
            bisect.insort(t.audit_ids, event.id)
            t.audit[event.id] = event

    def save(
        self,
        tenant: str,
        installation: Installation,
        *,
        expect_revision: int | None,
        audit: Sequence[AuditEvent] = (),
    ) -> Installation:
        """Compare-and-set the record and append ``audit`` (see the contract)."""
        with self._lock:
            t = self._tenant(tenant)
            current = self._check(t, installation.plugin_id, expect_revision)
            revision = (current or 0) + 1
            t.plugins[installation.plugin_id] = (installation.to_json(), revision)
            self._append_audit(t, audit)
        return installation.evolve(revision=revision)

    def delete(self, tenant: str, plugin_id: str, *, expect_revision: int, audit: Sequence[AuditEvent] = ()) -> None:
        """Delete the record if its revision matches; append ``audit``."""
        with self._lock:
            t = self._tenant(tenant)
            self._check(t, plugin_id, expect_revision)
            del t.plugins[plugin_id]
            self._append_audit(t, audit)

    def audit_list(
        self,
        tenant: str,
        *,
        plugin_id: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> builtins.list[AuditEvent]:
        """Return audit events newest first."""
        with self._lock:
            t = self._tenant(tenant)
            start = 0 if after is None else bisect.bisect_right(t.audit_ids, after)
            out: builtins.list[AuditEvent] = []
            for audit_id in t.audit_ids[start:]:
                event = t.audit[audit_id]
                if plugin_id is None or event.plugin_id == plugin_id:
                    out.append(event)
                    if len(out) >= limit:
                        break
        return out

    def drop_tenant(self, tenant: str) -> None:
        """Forget everything of ``tenant``."""
        with self._lock:
            self._tenants.pop(tenant, None)
