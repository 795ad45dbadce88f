"""Demo data for the hub, loaded through the real API (``botmesh_admin.demo``).

Installs the valid fixture manifests in the demo tenant: ``x.y`` (no
permissions) enabled, ``acme.order-status`` 1.4.0 granted and enabled, then its
1.5.0 upgrade that asks for ``contacts:write`` and so waits for approval.
"""

from __future__ import annotations

from typing import Any

from botmesh_admin.demo import DEMO_TENANT


def _ok(response: tuple[int, Any], what: str) -> Any:
    status, body = response
    if status >= 400:
        raise RuntimeError(f"hub demo: {what} failed with {status}: {body}")
    return body


def load(ctx: Any) -> str:
    """Install, grant and enable the fixture plugins; return a one-line summary."""
    base = f"/api/v1/tenants/{DEMO_TENANT}/plugins"
    valid = ctx.fixtures / "hub" / "valid"

    def install(name: str) -> dict[str, Any]:
        return _ok(ctx.request("POST", base, (valid / name).read_bytes()), f"install {name}")

    def enable(plugin: dict[str, Any]) -> None:
        pid = plugin["plugin_id"]
        if plugin["pending_permissions"]:
            body = {"permissions": plugin["pending_permissions"]}
            _ok(ctx.request("POST", f"{base}/{pid}/grants", body), f"grant {pid}")
        _ok(ctx.request("POST", f"{base}/{pid}/enable", {}), f"enable {pid}")

    enable(install("minimal.json"))
    enable(install("order-status.json"))
    upgraded = install("order-status-1.5.0-more-perms.json")
    status, listing = ctx.request("GET", base + "?limit=200")
    _ok((status, listing), "list plugins")
    states = ", ".join(f"{p['plugin_id']} {p['version']} {p['status']}" for p in listing["items"])
    pending = ", ".join(upgraded["pending_permissions"]) or "nothing"
    return f"hub: {len(listing['items'])} plugins ({states}); upgrade awaits approval of {pending}"
