"""``/api/v1/tenants/{tenant}/plugins…`` — the plugin hub (ARCHITECTURE §5, §11).

Reads need the agent role; install, grant, revoke, enable, disable and
uninstall need admin (403 otherwise). The install body is the manifest itself,
untrusted JSON validated by the hub: a bad one is 422 with the field path
(``manifest.permissions[1]``). Times are epoch milliseconds. A plugin of another
tenant is 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from botmesh_admin.api import (
    BodyIn,
    CursorParams,
    ErrorOut,
    Page,
    expected_version_field,
    principal,
    requires,
)
from botmesh_admin.errors import ValidationError

from . import selectors, services
from .domain import MAX_MANIFEST_BYTES, AuditEvent, Installation, RuntimeInfo

router = Router(tags=["hub"])

ERRORS: dict[int, type[Schema]] = {403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


class ManifestOut(Schema):
    id: str
    name: str
    version: str
    runtime: str = Field(..., description="npm-style semver range of supported runtimes")
    permissions: list[str]
    description: str | None = None
    entry: str | None = None
    author: dict[str, str] | None = None


class PluginOut(Schema):
    plugin_id: str
    status: str = Field(..., description="enabled, disabled, pending-approval or incompatible")
    enabled: bool
    revision: int = Field(..., description="pass back as expected_version for compare-and-set")
    version: str
    digest: str = Field(..., description="sha256 of the canonical manifest")
    manifest: ManifestOut
    granted: list[str]
    pending_permissions: list[str] = Field(..., description="requested and not granted yet")
    previous_version: str | None
    added_permissions: list[str] = Field(..., description="new since the previous manifest")
    removed_permissions: list[str]
    compatible: bool
    incompatibility: str | None
    runtime_version: str
    installed_at: int = Field(..., description="epoch milliseconds")
    installed_by: str
    updated_at: int = Field(..., description="epoch milliseconds")


class PermissionsIn(BodyIn):
    permissions: list[str]
    expected_version: int | None = expected_version_field()


class PluginRevisionIn(BodyIn):
    expected_version: int | None = expected_version_field()


class PluginAuditOut(Schema):
    id: str
    at: int = Field(..., description="epoch milliseconds")
    actor: str
    action: str
    plugin_id: str
    detail: dict[str, Any]


class PluginAuditParams(CursorParams):
    after: str | None = Field(None, max_length=64)


class RuntimeOut(Schema):
    runtime_version: str
    known_permissions: list[str]


def plugin_out(installation: Installation, runtime: RuntimeInfo) -> dict[str, Any]:
    """Return the API shape of an installation."""
    compatible, reason = installation.compatibility(runtime)
    return {
        "plugin_id": installation.plugin_id,
        "status": installation.status(runtime),
        "enabled": installation.enabled,
        "revision": installation.revision,
        "version": installation.manifest.version,
        "digest": installation.digest,
        "manifest": installation.manifest.to_json(),
        "granted": list(installation.granted),
        "pending_permissions": list(installation.pending_permissions),
        "previous_version": installation.previous_version,
        "added_permissions": list(installation.added_permissions),
        "removed_permissions": list(installation.removed_permissions),
        "compatible": compatible,
        "incompatibility": reason,
        "runtime_version": runtime.version,
        "installed_at": installation.installed_at,
        "installed_by": installation.installed_by,
        "updated_at": installation.updated_at,
    }


def audit_out(event: AuditEvent) -> dict[str, Any]:
    """Return the API shape of an audit event."""
    return event.to_json()


def _page(items: list[Any], limit: int, cursor: str | None) -> str | None:
    return cursor if len(items) == limit else None


@router.get("plugins", response={200: Page[PluginOut], **ERRORS})
@requires("agent")
def plugin_list(request: HttpRequest, tenant: str, page: Query[CursorParams]) -> dict[str, Any]:
    """List installed plugins by id with their status (pass ``next`` back as ``after``)."""
    items = selectors.plugin_list(tenant, limit=page.limit, after=page.after)
    runtime = selectors.hub_runtime()
    return {
        "items": [plugin_out(i, runtime) for i in items],
        "next": _page(items, page.limit, items[-1].plugin_id if items else None),
    }


@router.post(
    "plugins",
    response={200: PluginOut, 201: PluginOut, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "the plugin manifest (JSON object; at most 256 KiB)",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
)
@requires("admin")
def plugin_install(request: HttpRequest, tenant: str) -> Status:
    """Install (201) or replace (200) a plugin from its manifest; it starts disabled.

    A replacement asking for more permissions is disabled, pending approval.
    """
    p = principal(request)
    length = int(request.headers.get("Content-Length") or 0)
    if length > MAX_MANIFEST_BYTES:
        raise ValidationError("manifest", f"body larger than {MAX_MANIFEST_BYTES} bytes")
    installation, created = services.plugin_install(tenant, manifest=request.body, actor=p.actor)
    return Status(201 if created else 200, plugin_out(installation, selectors.hub_runtime()))


@router.get("plugin-runtime", response={200: RuntimeOut, **ERRORS})
@requires("agent")
def plugin_runtime(request: HttpRequest, tenant: str) -> dict[str, Any]:
    """Return the runtime version plugins are checked against and the permissions that exist."""
    runtime = selectors.hub_runtime()
    return {
        "runtime_version": runtime.version,
        "known_permissions": list(runtime.known_permissions),
    }


@router.get("plugin-audit", response={200: Page[PluginAuditOut], **ERRORS})
@requires("agent")
def plugin_audit_all(request: HttpRequest, tenant: str, page: Query[PluginAuditParams]) -> dict[str, Any]:
    """The tenant's plugin audit trail, newest first."""
    items = selectors.plugin_audit_list(tenant, limit=page.limit, after=page.after)
    return {
        "items": [audit_out(e) for e in items],
        "next": _page(items, page.limit, items[-1].id if items else None),
    }


@router.get("plugins/{plugin_id}", response={200: PluginOut, **ERRORS})
@requires("agent")
def plugin_get(request: HttpRequest, tenant: str, plugin_id: str) -> dict[str, Any]:
    """One installed plugin: manifest, status, grants and the permission diff of the last upgrade."""
    return plugin_out(selectors.plugin_get(tenant, plugin_id), selectors.hub_runtime())


@router.delete("plugins/{plugin_id}", response={204: None, **ERRORS})
@requires("admin")
def plugin_uninstall(request: HttpRequest, tenant: str, plugin_id: str) -> Status:
    """Uninstall the plugin (its audit trail stays)."""
    p = principal(request)
    services.plugin_uninstall(tenant, plugin_id, actor=p.actor)
    return Status(204, None)


@router.post("plugins/{plugin_id}/grants", response={200: PluginOut, **ERRORS})
@requires("admin")
def plugin_grant(request: HttpRequest, tenant: str, plugin_id: str, body: PermissionsIn) -> dict[str, Any]:
    """Grant permissions the manifest asks for."""
    p = principal(request)
    installation = services.plugin_grant(
        tenant,
        plugin_id,
        permissions=body.permissions,
        actor=p.actor,
        expected_revision=body.expected_version,
    )
    return plugin_out(installation, selectors.hub_runtime())


@router.post("plugins/{plugin_id}/revocations", response={200: PluginOut, **ERRORS})
@requires("admin")
def plugin_revoke(request: HttpRequest, tenant: str, plugin_id: str, body: PermissionsIn) -> dict[str, Any]:
    """Withdraw granted permissions (an enabled plugin that needs one is disabled)."""
    p = principal(request)
    installation = services.plugin_revoke(
        tenant,
        plugin_id,
        permissions=body.permissions,
        actor=p.actor,
        expected_revision=body.expected_version,
    )
    return plugin_out(installation, selectors.hub_runtime())


@router.post("plugins/{plugin_id}/enable", response={200: PluginOut, **ERRORS})
@requires("admin")
def plugin_enable(
    request: HttpRequest, tenant: str, plugin_id: str, body: PluginRevisionIn | None = None
) -> dict[str, Any]:
    """Enable the plugin: 409 ``permissions_pending`` or ``incompatible_runtime`` when refused."""
    p = principal(request)
    installation = services.plugin_enable(
        tenant, plugin_id, actor=p.actor, expected_revision=body.expected_version if body else None
    )
    return plugin_out(installation, selectors.hub_runtime())


@router.post("plugins/{plugin_id}/disable", response={200: PluginOut, **ERRORS})
@requires("admin")
def plugin_disable(
    request: HttpRequest, tenant: str, plugin_id: str, body: PluginRevisionIn | None = None
) -> dict[str, Any]:
    """Disable the plugin."""
    p = principal(request)
    installation = services.plugin_disable(
        tenant, plugin_id, actor=p.actor, expected_revision=body.expected_version if body else None
    )
    return plugin_out(installation, selectors.hub_runtime())


@router.get("plugins/{plugin_id}/audit", response={200: Page[PluginAuditOut], **ERRORS})
@requires("agent")
def plugin_audit(request: HttpRequest, tenant: str, plugin_id: str, page: Query[PluginAuditParams]) -> dict[str, Any]:
    """The plugin's audit trail (who installed, granted, enabled, disabled it, and when), newest first."""
    items = selectors.plugin_audit_list(tenant, plugin_id=plugin_id, limit=page.limit, after=page.after)
    return {
        "items": [audit_out(e) for e in items],
        "next": _page(items, page.limit, items[-1].id if items else None),
    }
