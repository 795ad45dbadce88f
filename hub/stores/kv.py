"""KvPluginStore: the plugin store over any DurableKv.

One table per tenant (``hub/<tenant>/plugins``) so a write and its audit events
commit in one atomic batch:

- ``plugin/<plugin id>`` — the installation record; the entry version is its revision;
- ``audit/<audit id>`` and ``plugin-audit/<plugin id>/<audit id>`` — each audit
  event, tenant-wide and per plugin (audit ids sort newest first), written once
  with the change they record;
- ``x/…`` — the count index ``plugins`` (installations by ``enabled``), kept in
  each write's commit by ``botmesh_admin.kv.indexes``.

Every page reads one ``scan`` of a page: installations by id, the audit trail
newest first, one plugin's trail; the overview's counts are two counters.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from botmesh_admin.kv import ABSENT, ConflictError, Delete, DurableKv, Entry, Op, Put, TenantKv
from botmesh_admin.kv.indexes import CountIndex, RecordChange, RecordType, declare
from hub.domain import AuditEvent, Installation, PluginCounts

from .base import StaleRevision

COLLECTION = "plugins"
# A plugin id comes back after an uninstall (``reuses_keys``, the default): the
# kernel reads the stored record itself for ``old`` (so the store passes ``None``).
PLUGIN = RecordType("plugin", "plugin/", (CountIndex("plugins", fields=("enabled",)),))
PLUGINS = declare("hub", COLLECTION, [PLUGIN])


class KvPluginStore:
    """Plugin store over ``kv`` (see the module docstring for the key layout)."""

    def __init__(self, kv: DurableKv) -> None:
        self.kv = kv
        self.tables = TenantKv(kv, "hub")
        self.layout = PLUGINS.layout(kv)

    def _table(self, tenant: str) -> str:
        return self.tables.table(tenant, COLLECTION)

    def get(self, tenant: str, plugin_id: str) -> Installation | None:
        """Return the installation or ``None``."""
        entry = self.kv.get(self._table(tenant), f"plugin/{plugin_id}")
        return Installation.from_json(entry.value, entry.version) if entry else None

    def list(self, tenant: str, *, limit: int = 50, after: str | None = None) -> builtins.list[Installation]:
        """Return installations by plugin id after ``after``."""
        entries = self.kv.scan(
            self._table(tenant),
            prefix="plugin/",
            after=f"plugin/{after}" if after else None,
            limit=limit,
        )
        return [Installation.from_json(e.value, e.version) for e in entries]

    @staticmethod
    def _audit_ops(audit: Sequence[AuditEvent]) -> builtins.list[Op]:
        ops: builtins.list[Op] = []
        for event in audit:
            record = event.to_json()
            ops.append(Put(f"audit/{event.id}", record, expect=ABSENT))
            ops.append(Put(f"plugin-audit/{event.plugin_id}/{event.id}", record, expect=ABSENT))
        return ops

    def counts(self, tenant: str) -> PluginCounts:
        """Return the installed and enabled counts (two counters of ``plugins``)."""
        enabled, disabled = self.layout.count(self._table(tenant), "plugins", [(True,), (False,)])
        return PluginCounts(installed=enabled + disabled, enabled=enabled)

    def _commit(
        self, tenant: str, plugin_id: str, ops: builtins.list[Op], new: Installation | None
    ) -> builtins.list[Entry | None]:
        key = f"plugin/{plugin_id}"
        change = RecordChange(PLUGIN, key, None, None if new is None else new.to_json())
        try:
            return self.layout.commit(self._table(tenant), ops, [change])
        except ConflictError as exc:
            raise StaleRevision(
                f"plugin {plugin_id!r} changed concurrently", current_version=exc.current_version
            ) from None

    def save(
        self,
        tenant: str,
        installation: Installation,
        *,
        expect_revision: int | None,
        audit: Sequence[AuditEvent] = (),
    ) -> Installation:
        """Compare-and-set the record and store ``audit`` in the same batch."""
        put = Put(
            f"plugin/{installation.plugin_id}",
            installation.to_json(),
            expect=ABSENT if expect_revision is None else expect_revision,
        )
        ops = [put, *self._audit_ops(audit)]
        entry = self._commit(tenant, installation.plugin_id, ops, installation)[0]
        assert entry is not None  # a Put returns the written entry
        return installation.evolve(revision=entry.version)

    def delete(self, tenant: str, plugin_id: str, *, expect_revision: int, audit: Sequence[AuditEvent] = ()) -> None:
        """Delete the record if its revision matches, storing ``audit`` in the same batch."""
        ops: builtins.list[Op] = [
            Delete(f"plugin/{plugin_id}", expect=expect_revision),
            *self._audit_ops(audit),
        ]
        self._commit(tenant, plugin_id, ops, None)

    def audit_list(
        self,
        tenant: str,
        *,
        plugin_id: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> builtins.list[AuditEvent]:
        """Return audit events newest first."""
        prefix = "audit/" if plugin_id is None else f"plugin-audit/{plugin_id}/"
        entries = self.kv.scan(self._table(tenant), prefix=prefix, after=prefix + after if after else None, limit=limit)
        return [AuditEvent.from_json(e.value) for e in entries]

    def drop_tenant(self, tenant: str) -> None:
        """Drop the tenant's table."""
        self.tables.drop_tenant(tenant, [COLLECTION])
