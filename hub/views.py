"""Admin pages of the hub: the catalogue, one plugin (manifest, permission diff,
grant / enable buttons) and the audit trail.

Pages read with the agent role; every write needs admin. Writes are plain
POST forms that redirect back (they work without JavaScript) and carry the
``revision`` the admin saw, so an approval applies to exactly that manifest:
if it changed meanwhile, the admin gets a conflict message and the new diff.
"""

from __future__ import annotations

import dataclasses
import json

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from botmesh_admin import confirmation
from botmesh_admin.errors import DomainError, ValidationError
from botmesh_admin.formerrors import FormError, form_error
from botmesh_admin.tenancy.decorators import page_principal, tenant_page

from . import selectors, services
from .domain import MAX_MANIFEST_BYTES

PAGE = 50


def _revision(request: HttpRequest) -> int | None:
    raw = request.POST.get("expected_revision", "")
    try:
        return int(raw) if raw else None
    except ValueError:
        raise ValidationError("expected_revision", "not a number") from None


@tenant_page("agent")
def plugins(request: HttpRequest, tenant: str) -> HttpResponse:
    """The catalogue of installed plugins with their status, and the install form."""
    return _plugins_page(request, tenant)


def _plugins_page(request: HttpRequest, tenant: str, refused: FormError | None = None) -> HttpResponse:
    after = request.GET.get("after") or None
    items = selectors.plugin_list(tenant, limit=PAGE, after=after)
    runtime = selectors.hub_runtime()
    rows = [{"i": i, "status": i.status(runtime), "compat": i.compatibility(runtime)} for i in items]
    return render(
        request,
        "hub/plugins.html",
        {
            "tenant": tenant,
            "rows": rows,
            "runtime": runtime,
            "next": items[-1].plugin_id if len(items) == PAGE else None,
            "can_write": page_principal(request).can("admin"),
            "form_error": refused,
        },
        status=refused.status if refused else 200,
    )


@require_POST
@tenant_page("admin")
def install(request: HttpRequest, tenant: str) -> HttpResponse:
    """Install a plugin from a pasted or uploaded manifest."""
    upload = request.FILES.get("file")
    if upload is not None:
        if upload.size and upload.size > MAX_MANIFEST_BYTES:
            too_big = ValidationError("manifest", f"the file is larger than {MAX_MANIFEST_BYTES} bytes")
            return _plugins_page(request, tenant, form_error(too_big, form="install", fields=["manifest"]))
        raw: bytes = upload.read(MAX_MANIFEST_BYTES + 1)
    else:
        raw = request.POST.get("manifest", "").encode("utf-8")
    try:
        installation, created = services.plugin_install(tenant, manifest=raw, actor=page_principal(request).actor)
    except DomainError as exc:
        # The pasted manifest stays in the box, the problem (its path inside the manifest) under it.
        typed = request.POST if upload is None else {}
        return _plugins_page(request, tenant, form_error(exc, form="install", fields=["manifest"], typed=typed))
    verb = "Installed" if created else "Updated"
    messages.success(request, f"{verb} {installation.plugin_id} {installation.manifest.version}.")
    return redirect("hub:plugin", tenant=tenant, plugin_id=installation.plugin_id)


@tenant_page("agent")
def plugin(request: HttpRequest, tenant: str, plugin_id: str) -> HttpResponse:
    """One plugin: status, permission diff, grant and enable buttons, manifest and audit."""
    return _plugin_page(request, tenant, plugin_id)


def _plugin_page(request: HttpRequest, tenant: str, plugin_id: str, refused: FormError | None = None) -> HttpResponse:
    """Render the plugin page; ``refused``: a refused action's error (above the buttons), its status the page's."""
    installation = selectors.plugin_get(tenant, plugin_id)
    runtime = selectors.hub_runtime()
    compatible, reason = installation.compatibility(runtime)
    permissions = [
        {
            "name": p,
            "granted": p in installation.granted,
            "new": p in installation.added_permissions,
        }
        for p in installation.manifest.permissions
    ]
    return render(
        request,
        "hub/plugin.html",
        {
            "tenant": tenant,
            "i": installation,
            "status": installation.status(runtime),
            "compatible": compatible,
            "reason": reason,
            "runtime": runtime,
            "permissions": permissions,
            "manifest_json": json.dumps(installation.manifest.to_json(), indent=2, ensure_ascii=False),
            "audit": selectors.plugin_audit_list(tenant, plugin_id=plugin_id, limit=20),
            "can_write": page_principal(request).can("admin"),
            "form_error": refused,
        },
        status=refused.status if refused else 200,
    )


def _act(request: HttpRequest, tenant: str, plugin_id: str, action: str) -> HttpResponse:
    actor = page_principal(request).actor
    try:
        revision = _revision(request)
        if action == "grant":
            services.plugin_grant(
                tenant,
                plugin_id,
                permissions=request.POST.getlist("permission"),
                actor=actor,
                expected_revision=revision,
            )
            messages.success(request, "Permissions granted.")
        elif action == "revoke":
            services.plugin_revoke(
                tenant,
                plugin_id,
                permissions=request.POST.getlist("permission"),
                actor=actor,
                expected_revision=revision,
            )
            messages.success(request, "Permissions revoked.")
        elif action == "enable":
            services.plugin_enable(tenant, plugin_id, actor=actor, expected_revision=revision)
            messages.success(request, f"{plugin_id} enabled.")
        elif action == "disable":
            services.plugin_disable(tenant, plugin_id, actor=actor, expected_revision=revision)
            messages.success(request, f"{plugin_id} disabled.")
        else:  # uninstall
            services.plugin_uninstall(tenant, plugin_id, actor=actor)
            messages.success(request, f"{plugin_id} uninstalled.")
            return confirmation.done(request, reverse("hub:plugins", kwargs={"tenant": tenant}))
    except DomainError as exc:
        if exc.status == 404:
            raise
        # The page again as it is now, with the refusal above the buttons: 409 for a stale revision (someone
        # changed the plugin meanwhile), 422 for bad input — never a redirect that answers 200.
        refused = form_error(exc, form="action")
        if exc.status == 409:
            refused = dataclasses.replace(
                refused,
                message=f"Someone changed this plugin meanwhile; the page shows it as it is now. {refused.message}",
            )
        return _plugin_page(request, tenant, plugin_id, refused)
    return redirect("hub:plugin", tenant=tenant, plugin_id=plugin_id)


@require_POST
@tenant_page("admin")
def grant(request: HttpRequest, tenant: str, plugin_id: str) -> HttpResponse:
    """Grant the checked permissions."""
    return _act(request, tenant, plugin_id, "grant")


@require_POST
@tenant_page("admin")
def revoke(request: HttpRequest, tenant: str, plugin_id: str) -> HttpResponse:
    """Revoke the checked permissions."""
    return _act(request, tenant, plugin_id, "revoke")


@require_POST
@tenant_page("admin")
def enable(request: HttpRequest, tenant: str, plugin_id: str) -> HttpResponse:
    """Enable the plugin (refused with the reason while permissions are pending)."""
    return _act(request, tenant, plugin_id, "enable")


@require_POST
@tenant_page("admin")
def disable(request: HttpRequest, tenant: str, plugin_id: str) -> HttpResponse:
    """Disable the plugin."""
    return _act(request, tenant, plugin_id, "disable")


@require_POST
@tenant_page("admin")
def uninstall(request: HttpRequest, tenant: str, plugin_id: str) -> HttpResponse:
    """Uninstall the plugin once confirmed (``botmesh_admin.confirmation``)."""
    if not confirmation.confirmed(request):
        return confirmation.confirm_page(
            request,
            question=f"Uninstall {plugin_id}?",
            consequences=[
                "Its install, granted permissions and settings for this tenant go; installing it again starts with"
                " no permission granted. The audit trail keeps the uninstall."
            ],
            button=f"Uninstall {plugin_id}",
            cancel_url=reverse("hub:plugin", kwargs={"tenant": tenant, "plugin_id": plugin_id}),
        )
    return _act(request, tenant, plugin_id, "uninstall")


@tenant_page("agent")
def audit(request: HttpRequest, tenant: str) -> HttpResponse:
    """The tenant's plugin audit trail, newest first."""
    after = request.GET.get("after") or None
    events = selectors.plugin_audit_list(tenant, limit=PAGE, after=after)
    return render(
        request,
        "hub/audit.html",
        {
            "tenant": tenant,
            "events": events,
            "next": events[-1].id if len(events) == PAGE else None,
        },
    )
