"""Writes of the hub: install, grant, revoke, enable, disable, uninstall (ARCHITECTURE §5).

Every write reads the installation, decides, and stores the result with a
compare-and-set on its ``revision``; a lost race re-reads and decides again, so
``enable`` never stores ``enabled`` over a record whose permissions changed since
it checked them. Every change is audited (who, when, what) in the same commit.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Mapping
from typing import Any

import semver

from botmesh_admin.errors import Conflict, NotFound, ValidationError
from botmesh_admin.kv.tenant import validate_id
from botmesh_admin.kv.validation import now_ms

from .domain import (
    AuditEvent,
    Installation,
    Manifest,
    PluginCounts,
    RuntimeInfo,
    current_runtime,
    new_audit_id,
    parse_manifest,
    validate_permission_list,
    validate_plugin_id,
)
from .stores.base import PluginStore

log = logging.getLogger(__name__)

CAS_ATTEMPTS = 20
"""How often a write re-reads and retries after losing a compare-and-set race."""


class PluginHub:
    """Per-tenant plugin installations over a ``PluginStore``.

    ``runtime`` defaults to the configured one (``hub.domain.current_runtime``);
    ``clock`` returns epoch milliseconds.
    """

    def __init__(
        self,
        store: PluginStore,
        *,
        runtime: RuntimeInfo | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.store = store
        self._runtime = runtime
        self.clock = clock

    @property
    def runtime(self) -> RuntimeInfo:
        """The runtime manifests are checked against."""
        return self._runtime or current_runtime()

    # ------------------------------------------------------------ reads

    def get(self, tenant: str, plugin_id: str) -> Installation:
        """Return the installation; raise ``NotFound`` if ``plugin_id`` is not installed in ``tenant``."""
        validate_id(tenant, "tenant")
        validate_plugin_id(plugin_id)
        found = self.store.get(tenant, plugin_id)
        if found is None:
            raise NotFound(f"plugin {plugin_id!r} is not installed")
        return found

    def list(self, tenant: str, *, limit: int = 50, after: str | None = None) -> builtins.list[Installation]:
        """Return up to ``limit`` installations ordered by plugin id, after the id ``after``."""
        validate_id(tenant, "tenant")
        return self.store.list(tenant, limit=limit, after=after)

    def counts(self, tenant: str) -> PluginCounts:
        """Return how many plugins ``tenant`` has installed and how many are enabled."""
        validate_id(tenant, "tenant")
        return self.store.counts(tenant)

    def audit(
        self,
        tenant: str,
        *,
        plugin_id: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> builtins.list[AuditEvent]:
        """Return audit events newest first (only ``plugin_id``'s when given)."""
        validate_id(tenant, "tenant")
        if plugin_id is not None:
            validate_plugin_id(plugin_id)
        return self.store.audit_list(tenant, plugin_id=plugin_id, limit=limit, after=after)

    # ------------------------------------------------------------ writes

    def _event(self, at: int, actor: str, action: str, plugin_id: str, **detail: Any) -> AuditEvent:
        return AuditEvent(
            id=new_audit_id(at),
            at=at,
            actor=actor,
            action=action,
            plugin_id=plugin_id,
            detail=detail,
        )

    def install(
        self, tenant: str, manifest: bytes | str | Mapping[str, Any], *, actor: str
    ) -> tuple[Installation, bool]:
        """Validate ``manifest`` (untrusted JSON) and install or replace it in ``tenant``.

        Return ``(installation, created)``; ``created`` is True for a first install.

        A first install is disabled with nothing granted. Re-installing the same
        content is a no-op. A different manifest replaces the old one: grants it
        no longer asks for are dropped, and if it asks for a permission not
        granted yet (or no longer fits the runtime) the plugin is disabled,
        pending approval. An incompatible plugin can be installed, not enabled.
        Raise ``ValidationError`` (field ``manifest…``) for a bad manifest.
        """
        validate_id(tenant, "tenant")
        parsed = parse_manifest(manifest, runtime=self.runtime)
        for _ in range(CAS_ATTEMPTS):
            current = self.store.get(tenant, parsed.id)
            try:
                if current is None:
                    return self._first_install(tenant, parsed, actor), True
                if current.digest == parsed.digest:
                    return current, False
                return self._replace(tenant, current, parsed, actor), False
            except Conflict:
                continue
        raise Conflict(f"plugin {parsed.id!r} keeps changing; try again")

    def _first_install(self, tenant: str, manifest: Manifest, actor: str) -> Installation:
        now = self.clock()
        installation = Installation(
            plugin_id=manifest.id,
            manifest=manifest,
            digest=manifest.digest,
            granted=(),
            enabled=False,
            installed_at=now,
            installed_by=actor,
            updated_at=now,
        )
        event = self._event(
            now,
            actor,
            "installed",
            manifest.id,
            version=manifest.version,
            digest=manifest.digest,
            permissions=list(manifest.permissions),
        )
        return self.store.save(tenant, installation, expect_revision=None, audit=[event])

    def _replace(self, tenant: str, current: Installation, manifest: Manifest, actor: str) -> Installation:
        now = self.clock()
        old = current.manifest
        order = semver.Version.parse(manifest.version).compare(old.version)
        action = {1: "upgraded", -1: "downgraded"}.get(order, "reinstalled")
        replaced = current.evolve(
            manifest=manifest,
            digest=manifest.digest,
            granted=tuple(p for p in manifest.permissions if p in current.granted),
            installed_at=now,
            installed_by=actor,
            updated_at=now,
            previous_version=old.version,
            previous_permissions=old.permissions,
        )
        refusal = replaced.enable_refusal(self.runtime)
        replaced = replaced.evolve(enabled=current.enabled and refusal is None)
        events = [
            self._event(
                now,
                actor,
                action,
                manifest.id,
                version=manifest.version,
                previous_version=old.version,
                digest=manifest.digest,
                added_permissions=list(replaced.added_permissions),
                removed_permissions=list(replaced.removed_permissions),
            )
        ]
        if current.enabled and not replaced.enabled:
            events.append(
                self._event(
                    now,
                    actor,
                    "disabled",
                    manifest.id,
                    version=manifest.version,
                    reason=refusal.message if refusal else "",
                )
            )
        return self.store.save(tenant, replaced, expect_revision=current.revision, audit=events)

    def _update(
        self,
        tenant: str,
        plugin_id: str,
        change: Callable[[Installation, int], tuple[Installation, builtins.list[AuditEvent]] | None],
        *,
        expected_revision: int | None = None,
    ) -> Installation:
        """Run ``change`` on a fresh read and compare-and-set its result, retrying lost races.

        ``change`` returns ``None`` for "nothing to do" and may raise a domain
        error. With ``expected_revision`` the caller acts on what it saw: a
        different revision is a ``Conflict`` and there is no retry.
        """
        for _ in range(CAS_ATTEMPTS):
            current = self.get(tenant, plugin_id)
            if expected_revision is not None and current.revision != expected_revision:
                raise Conflict(
                    f"plugin {plugin_id!r} changed since revision {expected_revision}",
                    current_version=current.revision,
                )
            decided = change(current, self.clock())
            if decided is None:
                return current
            updated, events = decided
            try:
                return self.store.save(tenant, updated, expect_revision=current.revision, audit=events)
            except Conflict:
                if expected_revision is not None:
                    raise
        raise Conflict(f"plugin {plugin_id!r} keeps changing; try again")

    def grant(
        self,
        tenant: str,
        plugin_id: str,
        *,
        permissions: builtins.list[str] | tuple[str, ...],
        actor: str,
        expected_revision: int | None = None,
    ) -> Installation:
        """Grant ``permissions`` (each requested by the installed manifest) to the plugin.

        Raise ``ValidationError`` (field ``permissions[i]``) for an unknown
        permission or one the manifest does not ask for; ``NotFound`` if not installed.
        """
        perms = validate_permission_list(list(permissions), "permissions", self.runtime)

        def change(current: Installation, now: int) -> tuple[Installation, builtins.list[AuditEvent]] | None:
            for i, perm in enumerate(perms):
                if perm not in current.manifest.permissions:
                    raise ValidationError(
                        f"permissions[{i}]",
                        f"{perm!r} is not requested by {plugin_id} {current.manifest.version}",
                    )
            new = [p for p in perms if p not in current.granted]
            if not new:
                return None
            granted = tuple(p for p in current.manifest.permissions if p in current.granted or p in new)
            event = self._event(
                now,
                actor,
                "granted",
                plugin_id,
                permissions=new,
                version=current.manifest.version,
                digest=current.digest,
            )
            return current.evolve(granted=granted, updated_at=now), [event]

        return self._update(tenant, plugin_id, change, expected_revision=expected_revision)

    def revoke(
        self,
        tenant: str,
        plugin_id: str,
        *,
        permissions: builtins.list[str] | tuple[str, ...],
        actor: str,
        expected_revision: int | None = None,
    ) -> Installation:
        """Withdraw granted ``permissions``; an enabled plugin that needs one is disabled too."""
        perms = validate_permission_list(list(permissions), "permissions", self.runtime)

        def change(current: Installation, now: int) -> tuple[Installation, builtins.list[AuditEvent]] | None:
            gone = [p for p in perms if p in current.granted]
            if not gone:
                return None
            updated = current.evolve(granted=tuple(p for p in current.granted if p not in gone), updated_at=now)
            events = [
                self._event(
                    now,
                    actor,
                    "revoked",
                    plugin_id,
                    permissions=gone,
                    version=current.manifest.version,
                )
            ]
            if current.enabled and updated.pending_permissions:
                updated = updated.evolve(enabled=False)
                events.append(
                    self._event(
                        now,
                        actor,
                        "disabled",
                        plugin_id,
                        version=current.manifest.version,
                        reason="revoked " + ", ".join(gone),
                    )
                )
            return updated, events

        return self._update(tenant, plugin_id, change, expected_revision=expected_revision)

    def enable(self, tenant: str, plugin_id: str, *, actor: str, expected_revision: int | None = None) -> Installation:
        """Enable the plugin if every requested permission is granted and the runtime fits.

        The check and the write are one compare-and-set on the installation, so
        a concurrent re-install asking for more permissions wins or loses as a
        whole: the plugin is never enabled without its grants. Raise
        ``PermissionsPending`` / ``IncompatibleRuntime`` (409) when refused,
        ``Conflict`` for a stale ``expected_revision``, ``NotFound`` if not installed.
        """

        def change(current: Installation, now: int) -> tuple[Installation, builtins.list[AuditEvent]] | None:
            refusal = current.enable_refusal(self.runtime)
            if refusal is not None:
                raise refusal
            if current.enabled:
                return None
            event = self._event(
                now,
                actor,
                "enabled",
                plugin_id,
                version=current.manifest.version,
                digest=current.digest,
                granted=list(current.granted),
            )
            return current.evolve(enabled=True, updated_at=now), [event]

        return self._update(tenant, plugin_id, change, expected_revision=expected_revision)

    def disable(self, tenant: str, plugin_id: str, *, actor: str, expected_revision: int | None = None) -> Installation:
        """Disable the plugin (a no-op if it is not enabled)."""

        def change(current: Installation, now: int) -> tuple[Installation, builtins.list[AuditEvent]] | None:
            if not current.enabled:
                return None
            event = self._event(
                now,
                actor,
                "disabled",
                plugin_id,
                version=current.manifest.version,
                reason="disabled by an admin",
            )
            return current.evolve(enabled=False, updated_at=now), [event]

        return self._update(tenant, plugin_id, change, expected_revision=expected_revision)

    def uninstall(self, tenant: str, plugin_id: str, *, actor: str) -> None:
        """Remove the plugin from ``tenant`` (its audit trail stays). Raise ``NotFound`` if absent."""
        for _ in range(CAS_ATTEMPTS):
            current = self.get(tenant, plugin_id)
            now = self.clock()
            event = self._event(
                now,
                actor,
                "uninstalled",
                plugin_id,
                version=current.manifest.version,
                was_enabled=current.enabled,
            )
            try:
                self.store.delete(tenant, plugin_id, expect_revision=current.revision, audit=[event])
                return
            except Conflict:
                continue
        raise Conflict(f"plugin {plugin_id!r} keeps changing; try again")


# ---------------------------------------------------------------- module-level services


def default_hub() -> PluginHub:
    """Return a hub over the process-wide DurableKv (``BOTMESH_KV_URL``)."""
    from botmesh_admin.kv.runtime import default_kv

    from .stores.kv import KvPluginStore

    return PluginHub(KvPluginStore(default_kv()))


def plugin_install(tenant: str, *, manifest: bytes | str | Mapping[str, Any], actor: str) -> tuple[Installation, bool]:
    """Install or replace a plugin from its manifest; return ``(installation, created)``."""
    return default_hub().install(tenant, manifest, actor=actor)


def plugin_grant(
    tenant: str,
    plugin_id: str,
    *,
    permissions: builtins.list[str],
    actor: str,
    expected_revision: int | None = None,
) -> Installation:
    """Grant permissions to an installed plugin (see ``PluginHub.grant``)."""
    return default_hub().grant(
        tenant, plugin_id, permissions=permissions, actor=actor, expected_revision=expected_revision
    )


def plugin_revoke(
    tenant: str,
    plugin_id: str,
    *,
    permissions: builtins.list[str],
    actor: str,
    expected_revision: int | None = None,
) -> Installation:
    """Withdraw permissions (see ``PluginHub.revoke``)."""
    return default_hub().revoke(
        tenant, plugin_id, permissions=permissions, actor=actor, expected_revision=expected_revision
    )


def plugin_enable(tenant: str, plugin_id: str, *, actor: str, expected_revision: int | None = None) -> Installation:
    """Enable a plugin after re-checking its grants atomically (see ``PluginHub.enable``)."""
    return default_hub().enable(tenant, plugin_id, actor=actor, expected_revision=expected_revision)


def plugin_disable(tenant: str, plugin_id: str, *, actor: str, expected_revision: int | None = None) -> Installation:
    """Disable a plugin (see ``PluginHub.disable``)."""
    return default_hub().disable(tenant, plugin_id, actor=actor, expected_revision=expected_revision)


def plugin_uninstall(tenant: str, plugin_id: str, *, actor: str) -> None:
    """Uninstall a plugin (see ``PluginHub.uninstall``)."""
    default_hub().uninstall(tenant, plugin_id, actor=actor)
