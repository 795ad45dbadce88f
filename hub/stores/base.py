"""The plugin store contract (ARCHITECTURE §5, hub).

A store persists ``Installation`` records and their ``AuditEvent`` trail per
tenant. Every write is a compare-and-set on the record's ``revision`` and
commits its audit events atomically with it: either both are stored or neither.
Stores persist only what the hub has already validated.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from botmesh_admin.errors import Conflict
from hub.domain import AuditEvent, Installation, PluginCounts


class StaleRevision(Conflict):
    """A write's expected revision no longer matches: the record changed since it was read.

    Nothing was written. Services re-read and decide again (``cas_retry(..., retry_on=StaleRevision)``);
    a domain refusal is another ``Conflict`` subclass and is never retried. HTTP 409 ``conflict``.
    """


@runtime_checkable
class PluginStore(Protocol):
    """Persistence of plugin installations; tested by ``tests/hub/test_store_contract.py``."""

    def get(self, tenant: str, plugin_id: str) -> Installation | None:
        """Return the installation of ``plugin_id`` in ``tenant`` with its revision, or ``None``."""
        ...

    def list(self, tenant: str, *, limit: int = 50, after: str | None = None) -> builtins.list[Installation]:
        """Return up to ``limit`` installations of ``tenant`` ordered by plugin id, ids ``> after``."""
        ...

    def counts(self, tenant: str) -> PluginCounts:
        """Return how many plugins ``tenant`` has installed and enabled.

        Exact after every write; a store over a Kv reads two counters (O(1)),
        never the installations.
        """
        ...

    def save(
        self,
        tenant: str,
        installation: Installation,
        *,
        expect_revision: int | None,
        audit: Sequence[AuditEvent] = (),
    ) -> Installation:
        """Store ``installation`` and ``audit`` atomically; return it with its new revision.

        ``expect_revision`` is the revision the caller read (``None``: the plugin
        must not be installed). Raise ``StaleRevision`` (with ``current_version``, the
        current revision or ``None``) if it does not match; then nothing is written.
        """
        ...

    def delete(self, tenant: str, plugin_id: str, *, expect_revision: int, audit: Sequence[AuditEvent] = ()) -> None:
        """Delete the installation if its revision is ``expect_revision``, and store ``audit``.

        Raise ``StaleRevision`` if the revision differs or the plugin is not installed.
        """
        ...

    def audit_list(
        self,
        tenant: str,
        *,
        plugin_id: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> builtins.list[AuditEvent]:
        """Return up to ``limit`` audit events, newest first, with ids ``> after``.

        With ``plugin_id``, only that plugin's events.
        """
        ...

    def drop_tenant(self, tenant: str) -> None:
        """Delete every installation and audit event of ``tenant`` (tenant erasure)."""
        ...
