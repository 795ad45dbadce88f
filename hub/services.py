"""Writes of the hub: install, grant, revoke, enable, disable, uninstall (ARCHITECTURE §5).

Every write reads the installation, decides, and stores the result with a
compare-and-set on its ``revision``; a lost race re-reads and decides again
(``cas_retry``), so ``plugin_enable`` never stores ``enabled`` over a record
whose permissions changed since it checked them. Every change is audited (who,
when, what) in the same commit. The store is ``stores.default_store()``, the
time ``botmesh_admin.clock.now_ms()`` (epoch ms) and the runtime manifests are
checked against ``domain.current_runtime()``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import semver

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import Conflict, NotFound, ValidationError
from botmesh_admin.kv.cas import CONTENDED_ATTEMPTS, cas_retry
from botmesh_admin.kv.tenant import validate_id

from .domain import (
    AuditEvent,
    Installation,
    Manifest,
    current_runtime,
    new_audit_id,
    parse_manifest,
    validate_permission_list,
    validate_plugin_id,
)
from .stores import default_store
from .stores.base import StaleRevision

Decision = tuple[Installation, list[AuditEvent]] | None
"""What a change decides: the installation to store and its audit events, or ``None`` (nothing to do)."""


def _event(at: int, actor: str, action: str, plugin_id: str, **detail: Any) -> AuditEvent:
    return AuditEvent(id=new_audit_id(at), at=at, actor=actor, action=action, plugin_id=plugin_id, detail=detail)


def _installed(tenant: str, plugin_id: str) -> Installation:
    """Return the installation; raise ``NotFound`` if ``plugin_id`` is not installed in ``tenant``."""
    validate_id(tenant, "tenant")
    validate_plugin_id(plugin_id)
    found = default_store().get(tenant, plugin_id)
    if found is None:
        raise NotFound(f"plugin {plugin_id!r} is not installed")
    return found


def plugin_install(tenant: str, *, manifest: bytes | str | Mapping[str, Any], actor: str) -> tuple[Installation, bool]:
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
    parsed = parse_manifest(manifest, runtime=current_runtime())

    def attempt() -> tuple[Installation, bool]:
        current = default_store().get(tenant, parsed.id)
        if current is None:
            return _first_install(tenant, parsed, actor), True
        if current.digest == parsed.digest:
            return current, False
        return _replace(tenant, current, parsed, actor), False

    return cas_retry(attempt, what=f"plugin {parsed.id!r}", retry_on=StaleRevision, attempts=CONTENDED_ATTEMPTS)


def _first_install(tenant: str, manifest: Manifest, actor: str) -> Installation:
    now = now_ms()
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
    event = _event(
        now,
        actor,
        "installed",
        manifest.id,
        version=manifest.version,
        digest=manifest.digest,
        permissions=list(manifest.permissions),
    )
    return default_store().save(tenant, installation, expect_revision=None, audit=[event])


def _replace(tenant: str, current: Installation, manifest: Manifest, actor: str) -> Installation:
    now = now_ms()
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
    refusal = replaced.enable_refusal(current_runtime())
    replaced = replaced.evolve(enabled=current.enabled and refusal is None)
    events = [
        _event(
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
            _event(
                now,
                actor,
                "disabled",
                manifest.id,
                version=manifest.version,
                reason=refusal.message if refusal else "",
            )
        )
    return default_store().save(tenant, replaced, expect_revision=current.revision, audit=events)


def _update(
    tenant: str,
    plugin_id: str,
    change: Callable[[Installation, int], Decision],
    *,
    expected_revision: int | None = None,
) -> Installation:
    """Run ``change(installation, now_ms)`` on a fresh read and compare-and-set its result.

    ``change`` returns ``None`` for "nothing to do" and may raise a domain
    error. Without ``expected_revision`` a lost race re-reads and decides again;
    with it the caller acts on what it saw: a different revision is a
    ``Conflict`` and there is no retry.
    """

    def attempt() -> Installation:
        current = _installed(tenant, plugin_id)
        if expected_revision is not None and current.revision != expected_revision:
            raise Conflict(
                f"plugin {plugin_id!r} changed since revision {expected_revision}",
                current_version=current.revision,
            )
        decided = change(current, now_ms())
        if decided is None:
            return current
        updated, events = decided
        return default_store().save(tenant, updated, expect_revision=current.revision, audit=events)

    if expected_revision is not None:
        return attempt()  # a lost race is the caller's Conflict (StaleRevision), never retried
    return cas_retry(attempt, what=f"plugin {plugin_id!r}", retry_on=StaleRevision, attempts=CONTENDED_ATTEMPTS)


def plugin_grant(
    tenant: str,
    plugin_id: str,
    *,
    permissions: list[str] | tuple[str, ...],
    actor: str,
    expected_revision: int | None = None,
) -> Installation:
    """Grant ``permissions`` (each requested by the installed manifest) to the plugin.

    Raise ``ValidationError`` (field ``permissions[i]``) for an unknown
    permission or one the manifest does not ask for; ``NotFound`` if not installed.
    """
    perms = validate_permission_list(list(permissions), "permissions", current_runtime())

    def change(current: Installation, now: int) -> Decision:
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
        event = _event(
            now,
            actor,
            "granted",
            plugin_id,
            permissions=new,
            version=current.manifest.version,
            digest=current.digest,
        )
        return current.evolve(granted=granted, updated_at=now), [event]

    return _update(tenant, plugin_id, change, expected_revision=expected_revision)


def plugin_revoke(
    tenant: str,
    plugin_id: str,
    *,
    permissions: list[str] | tuple[str, ...],
    actor: str,
    expected_revision: int | None = None,
) -> Installation:
    """Withdraw granted ``permissions``; an enabled plugin that needs one is disabled too."""
    perms = validate_permission_list(list(permissions), "permissions", current_runtime())

    def change(current: Installation, now: int) -> Decision:
        gone = [p for p in perms if p in current.granted]
        if not gone:
            return None
        updated = current.evolve(granted=tuple(p for p in current.granted if p not in gone), updated_at=now)
        events = [_event(now, actor, "revoked", plugin_id, permissions=gone, version=current.manifest.version)]
        if current.enabled and updated.pending_permissions:
            updated = updated.evolve(enabled=False)
            events.append(
                _event(
                    now,
                    actor,
                    "disabled",
                    plugin_id,
                    version=current.manifest.version,
                    reason="revoked " + ", ".join(gone),
                )
            )
        return updated, events

    return _update(tenant, plugin_id, change, expected_revision=expected_revision)


def plugin_enable(tenant: str, plugin_id: str, *, actor: str, expected_revision: int | None = None) -> Installation:
    """Enable the plugin if every requested permission is granted and the runtime fits.

    The check and the write are one compare-and-set on the installation, so
    a concurrent re-install asking for more permissions wins or loses as a
    whole: the plugin is never enabled without its grants. Raise
    ``PermissionsPending`` / ``IncompatibleRuntime`` (409) when refused,
    ``Conflict`` for a stale ``expected_revision``, ``NotFound`` if not installed.
    """

    def change(current: Installation, now: int) -> Decision:
        refusal = current.enable_refusal(current_runtime())
        if refusal is not None:
            raise refusal
        if current.enabled:
            return None
        event = _event(
            now,
            actor,
            "enabled",
            plugin_id,
            version=current.manifest.version,
            digest=current.digest,
            granted=list(current.granted),
        )
        return current.evolve(enabled=True, updated_at=now), [event]

    return _update(tenant, plugin_id, change, expected_revision=expected_revision)


def plugin_disable(tenant: str, plugin_id: str, *, actor: str, expected_revision: int | None = None) -> Installation:
    """Disable the plugin (a no-op if it is not enabled)."""

    def change(current: Installation, now: int) -> Decision:
        if not current.enabled:
            return None
        event = _event(
            now, actor, "disabled", plugin_id, version=current.manifest.version, reason="disabled by an admin"
        )
        return current.evolve(enabled=False, updated_at=now), [event]

    return _update(tenant, plugin_id, change, expected_revision=expected_revision)


def plugin_uninstall(tenant: str, plugin_id: str, *, actor: str) -> None:
    """Remove the plugin from ``tenant`` (its audit trail stays). Raise ``NotFound`` if absent."""

    def attempt() -> None:
        current = _installed(tenant, plugin_id)
        event = _event(
            now_ms(),
            actor,
            "uninstalled",
            plugin_id,
            version=current.manifest.version,
            was_enabled=current.enabled,
        )
        default_store().delete(tenant, plugin_id, expect_revision=current.revision, audit=[event])

    cas_retry(attempt, what=f"plugin {plugin_id!r}", retry_on=StaleRevision, attempts=CONTENDED_ATTEMPTS)


__all__ = [
    "plugin_disable",
    "plugin_enable",
    "plugin_grant",
    "plugin_install",
    "plugin_revoke",
    "plugin_uninstall",
]
