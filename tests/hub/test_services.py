"""Install, grant, enable per tenant over every store: the rules an admin relies on."""

from __future__ import annotations

import json
import threading

import pytest

from botmesh_admin.errors import Conflict, NotFound, ValidationError
from hub import selectors, services
from hub.domain import IncompatibleRuntime, PermissionsPending
from hub.stores.base import PluginStore

ADMIN = "user:ana"
FOUR = ["messages:read", "messages:send", "contacts:read", "http:fetch"]


def test_install_records_digest_and_starts_disabled(hub: PluginStore, tenant_id: str, order_status: bytes) -> None:
    inst, created = services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    assert created and not inst.enabled and inst.granted == ()
    assert inst.digest.startswith("sha256:") and inst.manifest.version == "1.4.0"
    assert inst.status(selectors.hub_runtime()) == "pending-approval"
    assert inst.pending_permissions == tuple(FOUR)
    again, created = services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    assert not created and again == inst, "the same manifest again is a no-op"


def test_enable_needs_every_permission_granted(hub: PluginStore, tenant_id: str, order_status: bytes) -> None:
    services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    services.plugin_grant(tenant_id, "acme.order-status", permissions=FOUR[:3], actor=ADMIN)
    with pytest.raises(PermissionsPending) as info:
        services.plugin_enable(tenant_id, "acme.order-status", actor=ADMIN)
    assert info.value.status == 409 and info.value.details["pending"] == ["http:fetch"]
    services.plugin_grant(tenant_id, "acme.order-status", permissions=["http:fetch"], actor=ADMIN)
    enabled = services.plugin_enable(tenant_id, "acme.order-status", actor=ADMIN)
    assert enabled.enabled and enabled.status(selectors.hub_runtime()) == "enabled"


def test_grant_refuses_permissions_the_manifest_does_not_ask_for(
    hub: PluginStore, tenant_id: str, order_status: bytes
) -> None:
    services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    with pytest.raises(ValidationError) as info:
        services.plugin_grant(
            tenant_id,
            "acme.order-status",
            permissions=["messages:read", "storage:write"],
            actor=ADMIN,
        )
    assert info.value.field == "permissions[1]"
    with pytest.raises(ValidationError) as info:
        services.plugin_grant(tenant_id, "acme.order-status", permissions=["root:everything"], actor=ADMIN)
    assert info.value.field == "permissions[0]"
    assert selectors.plugin_get(tenant_id, "acme.order-status").granted == ()


def test_upgrade_with_more_permissions_is_disabled_pending_approval(
    hub: PluginStore, tenant_id: str, order_status: bytes, order_status_more: bytes
) -> None:
    services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    services.plugin_grant(tenant_id, "acme.order-status", permissions=FOUR, actor=ADMIN)
    services.plugin_enable(tenant_id, "acme.order-status", actor=ADMIN)
    upgraded, created = services.plugin_install(tenant_id, manifest=order_status_more, actor="token:ci")
    assert not created
    assert not upgraded.enabled and upgraded.status(selectors.hub_runtime()) == "pending-approval"
    assert upgraded.previous_version == "1.4.0" and upgraded.manifest.version == "1.5.0"
    assert upgraded.added_permissions == ("contacts:write",)
    assert upgraded.pending_permissions == ("contacts:write",)
    assert upgraded.granted == tuple(FOUR), "approved permissions stay approved"
    with pytest.raises(PermissionsPending):
        services.plugin_enable(tenant_id, "acme.order-status", actor=ADMIN)
    services.plugin_grant(tenant_id, "acme.order-status", permissions=["contacts:write"], actor=ADMIN)
    assert services.plugin_enable(tenant_id, "acme.order-status", actor=ADMIN).enabled
    actions = [e.action for e in selectors.plugin_audit_list(tenant_id, plugin_id="acme.order-status")]
    assert actions == [
        "enabled",
        "granted",
        "disabled",
        "upgraded",
        "enabled",
        "granted",
        "installed",
    ]


def test_upgrade_without_new_permissions_stays_enabled(hub: PluginStore, tenant_id: str, order_status: bytes) -> None:
    services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    services.plugin_grant(tenant_id, "acme.order-status", permissions=FOUR, actor=ADMIN)
    services.plugin_enable(tenant_id, "acme.order-status", actor=ADMIN)
    patch = {**json.loads(order_status), "version": "1.4.1", "permissions": FOUR[:2]}
    upgraded, _ = services.plugin_install(tenant_id, manifest=json.dumps(patch), actor=ADMIN)
    assert upgraded.enabled and upgraded.granted == tuple(FOUR[:2]), "grants no longer asked for are dropped"
    assert upgraded.removed_permissions == tuple(FOUR[2:])


def test_incompatible_plugin_installs_but_cannot_be_enabled(hub: PluginStore, tenant_id: str, settings) -> None:
    body = {
        "id": "acme.future",
        "name": "Future",
        "version": "1.0.0",
        "runtime": "^2.0.0",
        "permissions": [],
    }
    inst, _ = services.plugin_install(tenant_id, manifest=json.dumps(body), actor=ADMIN)
    assert inst.status(selectors.hub_runtime()) == "incompatible"
    assert inst.compatibility(selectors.hub_runtime()) == (False, "needs runtime ^2.0.0, running 1.6.2")
    with pytest.raises(IncompatibleRuntime) as info:
        services.plugin_enable(tenant_id, "acme.future", actor=ADMIN)
    assert "needs runtime ^2.0.0, running 1.6.2" in info.value.message
    settings.BOTMESH_HUB_RUNTIME_VERSION = "2.1.0"  # a newer runtime, the same permissions
    assert services.plugin_enable(tenant_id, "acme.future", actor=ADMIN).enabled


def test_revoke_disables_an_enabled_plugin_that_needs_it(hub: PluginStore, tenant_id: str, order_status: bytes) -> None:
    services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    services.plugin_grant(tenant_id, "acme.order-status", permissions=FOUR, actor=ADMIN)
    services.plugin_enable(tenant_id, "acme.order-status", actor=ADMIN)
    after = services.plugin_revoke(tenant_id, "acme.order-status", permissions=["http:fetch"], actor=ADMIN)
    assert not after.enabled and after.pending_permissions == ("http:fetch",)
    assert [e.action for e in selectors.plugin_audit_list(tenant_id, limit=2)] == ["disabled", "revoked"]


def test_expected_revision_protects_what_the_admin_saw(
    hub: PluginStore, tenant_id: str, order_status: bytes, order_status_more: bytes
) -> None:
    seen, _ = services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    services.plugin_install(tenant_id, manifest=order_status_more, actor="token:ci")
    with pytest.raises(Conflict) as info:
        services.plugin_grant(
            tenant_id,
            "acme.order-status",
            permissions=FOUR,
            actor=ADMIN,
            expected_revision=seen.revision,
        )
    assert info.value.current_version == seen.revision + 1
    assert selectors.plugin_get(tenant_id, "acme.order-status").granted == ()


def test_disable_and_uninstall_are_audited(hub: PluginStore, tenant_id: str, hub_fixtures) -> None:
    minimal = (hub_fixtures / "valid" / "minimal.json").read_bytes()
    services.plugin_install(tenant_id, manifest=minimal, actor=ADMIN)
    services.plugin_enable(tenant_id, "x.y", actor=ADMIN)
    services.plugin_disable(tenant_id, "x.y", actor="user:bo")
    services.plugin_uninstall(tenant_id, "x.y", actor="user:bo")
    with pytest.raises(NotFound):
        selectors.plugin_get(tenant_id, "x.y")
    events = selectors.plugin_audit_list(tenant_id)
    assert [(e.action, e.actor) for e in events] == [
        ("uninstalled", "user:bo"),
        ("disabled", "user:bo"),
        ("enabled", ADMIN),
        ("installed", ADMIN),
    ]
    assert all(e.at > 0 for e in events)


def test_another_tenants_plugin_is_not_found(hub: PluginStore, tenant_id: str, order_status: bytes) -> None:
    services.plugin_install(tenant_id, manifest=order_status, actor=ADMIN)
    other = tenant_id + "-b"
    with pytest.raises(NotFound):
        selectors.plugin_get(other, "acme.order-status")
    with pytest.raises(NotFound):
        services.plugin_enable(other, "acme.order-status", actor=ADMIN)
    assert selectors.plugin_list(other) == [] and selectors.plugin_audit_list(other) == []


ROUNDS = 25


def _race(tenant: str, plugin: str, new_manifest: str) -> object:
    """Run ``install(new_manifest)`` and ``enable`` in two threads released together; return enable's outcome."""
    barrier = threading.Barrier(2)
    outcome: list[object] = []

    def reinstall() -> None:
        barrier.wait(timeout=10)
        services.plugin_install(tenant, manifest=new_manifest, actor="token:ci")

    def enable() -> None:
        barrier.wait(timeout=10)
        try:
            outcome.append(services.plugin_enable(tenant, plugin, actor=ADMIN))
        except PermissionsPending as exc:
            outcome.append(exc)

    threads = [threading.Thread(target=t) for t in (reinstall, enable)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a racer hung"
    (result,) = outcome
    return result


def test_reinstall_with_more_permissions_racing_enable_never_enables_without_grants(
    hub: PluginStore, tenant_id: str, order_status: bytes, order_status_more: bytes
) -> None:
    """Threads race ``install(1.5.0)`` against ``enable``: whoever wins, never enabled without grants."""
    for round_ in range(ROUNDS):
        plugin = f"acme.race-{round_}"
        services.plugin_install(tenant_id, manifest=json.dumps({**json.loads(order_status), "id": plugin}), actor=ADMIN)
        services.plugin_grant(tenant_id, plugin, permissions=FOUR, actor=ADMIN)
        new = json.dumps({**json.loads(order_status_more), "id": plugin})
        result = _race(tenant_id, plugin, new)
        final = selectors.plugin_get(tenant_id, plugin)
        assert final.manifest.version == "1.5.0"
        assert not final.enabled, "enabled without contacts:write granted"
        assert final.pending_permissions == ("contacts:write",)
        if not isinstance(result, PermissionsPending):  # enable won: it enabled the fully granted 1.4.0
            assert result.manifest.version == "1.4.0" and not result.pending_permissions
        for event in selectors.plugin_audit_list(tenant_id, plugin_id=plugin):
            if event.action == "enabled":
                assert event.detail["version"] == "1.4.0", "an enable is only ever of a fully granted manifest"
