"""Install, grant, enable per tenant over every store: the rules an admin relies on."""

from __future__ import annotations

import json
import threading

import pytest

from botmesh_admin.errors import Conflict, NotFound, ValidationError
from hub.domain import IncompatibleRuntime, PermissionsPending, RuntimeInfo
from hub.services import PluginHub

ADMIN = "user:ana"
FOUR = ["messages:read", "messages:send", "contacts:read", "http:fetch"]


def test_install_records_digest_and_starts_disabled(hub: PluginHub, tenant_id: str, order_status: bytes) -> None:
    inst, created = hub.install(tenant_id, order_status, actor=ADMIN)
    assert created and not inst.enabled and inst.granted == ()
    assert inst.digest.startswith("sha256:") and inst.manifest.version == "1.4.0"
    assert inst.status(hub.runtime) == "pending-approval"
    assert inst.pending_permissions == tuple(FOUR)
    again, created = hub.install(tenant_id, order_status, actor=ADMIN)
    assert not created and again == inst, "the same manifest again is a no-op"


def test_enable_needs_every_permission_granted(hub: PluginHub, tenant_id: str, order_status: bytes) -> None:
    hub.install(tenant_id, order_status, actor=ADMIN)
    hub.grant(tenant_id, "acme.order-status", permissions=FOUR[:3], actor=ADMIN)
    with pytest.raises(PermissionsPending) as info:
        hub.enable(tenant_id, "acme.order-status", actor=ADMIN)
    assert info.value.status == 409 and info.value.details["pending"] == ["http:fetch"]
    hub.grant(tenant_id, "acme.order-status", permissions=["http:fetch"], actor=ADMIN)
    enabled = hub.enable(tenant_id, "acme.order-status", actor=ADMIN)
    assert enabled.enabled and enabled.status(hub.runtime) == "enabled"


def test_grant_refuses_permissions_the_manifest_does_not_ask_for(
    hub: PluginHub, tenant_id: str, order_status: bytes
) -> None:
    hub.install(tenant_id, order_status, actor=ADMIN)
    with pytest.raises(ValidationError) as info:
        hub.grant(
            tenant_id,
            "acme.order-status",
            permissions=["messages:read", "storage:write"],
            actor=ADMIN,
        )
    assert info.value.field == "permissions[1]"
    with pytest.raises(ValidationError) as info:
        hub.grant(tenant_id, "acme.order-status", permissions=["root:everything"], actor=ADMIN)
    assert info.value.field == "permissions[0]"
    assert hub.get(tenant_id, "acme.order-status").granted == ()


def test_upgrade_with_more_permissions_is_disabled_pending_approval(
    hub: PluginHub, tenant_id: str, order_status: bytes, order_status_more: bytes
) -> None:
    hub.install(tenant_id, order_status, actor=ADMIN)
    hub.grant(tenant_id, "acme.order-status", permissions=FOUR, actor=ADMIN)
    hub.enable(tenant_id, "acme.order-status", actor=ADMIN)
    upgraded, created = hub.install(tenant_id, order_status_more, actor="token:ci")
    assert not created
    assert not upgraded.enabled and upgraded.status(hub.runtime) == "pending-approval"
    assert upgraded.previous_version == "1.4.0" and upgraded.manifest.version == "1.5.0"
    assert upgraded.added_permissions == ("contacts:write",)
    assert upgraded.pending_permissions == ("contacts:write",)
    assert upgraded.granted == tuple(FOUR), "approved permissions stay approved"
    with pytest.raises(PermissionsPending):
        hub.enable(tenant_id, "acme.order-status", actor=ADMIN)
    hub.grant(tenant_id, "acme.order-status", permissions=["contacts:write"], actor=ADMIN)
    assert hub.enable(tenant_id, "acme.order-status", actor=ADMIN).enabled
    actions = [e.action for e in hub.audit(tenant_id, plugin_id="acme.order-status")]
    assert actions == [
        "enabled",
        "granted",
        "disabled",
        "upgraded",
        "enabled",
        "granted",
        "installed",
    ]


def test_upgrade_without_new_permissions_stays_enabled(hub: PluginHub, tenant_id: str, order_status: bytes) -> None:
    hub.install(tenant_id, order_status, actor=ADMIN)
    hub.grant(tenant_id, "acme.order-status", permissions=FOUR, actor=ADMIN)
    hub.enable(tenant_id, "acme.order-status", actor=ADMIN)
    patch = {**json.loads(order_status), "version": "1.4.1", "permissions": FOUR[:2]}
    upgraded, _ = hub.install(tenant_id, json.dumps(patch), actor=ADMIN)
    assert upgraded.enabled and upgraded.granted == tuple(FOUR[:2]), "grants no longer asked for are dropped"
    assert upgraded.removed_permissions == tuple(FOUR[2:])


def test_incompatible_plugin_installs_but_cannot_be_enabled(hub: PluginHub, tenant_id: str) -> None:
    body = {
        "id": "acme.future",
        "name": "Future",
        "version": "1.0.0",
        "runtime": "^2.0.0",
        "permissions": [],
    }
    inst, _ = hub.install(tenant_id, json.dumps(body), actor=ADMIN)
    assert inst.status(hub.runtime) == "incompatible"
    assert inst.compatibility(hub.runtime) == (False, "needs runtime ^2.0.0, running 1.6.2")
    with pytest.raises(IncompatibleRuntime) as info:
        hub.enable(tenant_id, "acme.future", actor=ADMIN)
    assert "needs runtime ^2.0.0, running 1.6.2" in info.value.message
    newer = PluginHub(hub.store, runtime=RuntimeInfo("2.1.0", hub.runtime.known_permissions))
    assert newer.enable(tenant_id, "acme.future", actor=ADMIN).enabled


def test_revoke_disables_an_enabled_plugin_that_needs_it(hub: PluginHub, tenant_id: str, order_status: bytes) -> None:
    hub.install(tenant_id, order_status, actor=ADMIN)
    hub.grant(tenant_id, "acme.order-status", permissions=FOUR, actor=ADMIN)
    hub.enable(tenant_id, "acme.order-status", actor=ADMIN)
    after = hub.revoke(tenant_id, "acme.order-status", permissions=["http:fetch"], actor=ADMIN)
    assert not after.enabled and after.pending_permissions == ("http:fetch",)
    assert [e.action for e in hub.audit(tenant_id, limit=2)] == ["disabled", "revoked"]


def test_expected_revision_protects_what_the_admin_saw(
    hub: PluginHub, tenant_id: str, order_status: bytes, order_status_more: bytes
) -> None:
    seen, _ = hub.install(tenant_id, order_status, actor=ADMIN)
    hub.install(tenant_id, order_status_more, actor="token:ci")
    with pytest.raises(Conflict) as info:
        hub.grant(
            tenant_id,
            "acme.order-status",
            permissions=FOUR,
            actor=ADMIN,
            expected_revision=seen.revision,
        )
    assert info.value.current_version == seen.revision + 1
    assert hub.get(tenant_id, "acme.order-status").granted == ()


def test_disable_and_uninstall_are_audited(hub: PluginHub, tenant_id: str, hub_fixtures) -> None:
    minimal = (hub_fixtures / "valid" / "minimal.json").read_bytes()
    hub.install(tenant_id, minimal, actor=ADMIN)
    hub.enable(tenant_id, "x.y", actor=ADMIN)
    hub.disable(tenant_id, "x.y", actor="user:bo")
    hub.uninstall(tenant_id, "x.y", actor="user:bo")
    with pytest.raises(NotFound):
        hub.get(tenant_id, "x.y")
    events = hub.audit(tenant_id)
    assert [(e.action, e.actor) for e in events] == [
        ("uninstalled", "user:bo"),
        ("disabled", "user:bo"),
        ("enabled", ADMIN),
        ("installed", ADMIN),
    ]
    assert all(e.at > 0 for e in events)


def test_another_tenants_plugin_is_not_found(hub: PluginHub, tenant_id: str, order_status: bytes) -> None:
    hub.install(tenant_id, order_status, actor=ADMIN)
    other = tenant_id + "-b"
    with pytest.raises(NotFound):
        hub.get(other, "acme.order-status")
    with pytest.raises(NotFound):
        hub.enable(other, "acme.order-status", actor=ADMIN)
    assert hub.list(other) == [] and hub.audit(other) == []


ROUNDS = 25


def _race(hub: PluginHub, tenant: str, plugin: str, new_manifest: str) -> object:
    """Run ``install(new_manifest)`` and ``enable`` in two threads released together; return enable's outcome."""
    barrier = threading.Barrier(2)
    outcome: list[object] = []

    def reinstall() -> None:
        barrier.wait(timeout=10)
        hub.install(tenant, new_manifest, actor="token:ci")

    def enable() -> None:
        barrier.wait(timeout=10)
        try:
            outcome.append(hub.enable(tenant, plugin, actor=ADMIN))
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
    hub: PluginHub, tenant_id: str, order_status: bytes, order_status_more: bytes
) -> None:
    """Threads race ``install(1.5.0)`` against ``enable``: whoever wins, never enabled without grants."""
    for round_ in range(ROUNDS):
        plugin = f"acme.race-{round_}"
        hub.install(tenant_id, json.dumps({**json.loads(order_status), "id": plugin}), actor=ADMIN)
        hub.grant(tenant_id, plugin, permissions=FOUR, actor=ADMIN)
        new = json.dumps({**json.loads(order_status_more), "id": plugin})
        result = _race(hub, tenant_id, plugin, new)
        final = hub.get(tenant_id, plugin)
        assert final.manifest.version == "1.5.0"
        assert not final.enabled, "enabled without contacts:write granted"
        assert final.pending_permissions == ("contacts:write",)
        if not isinstance(result, PermissionsPending):  # enable won: it enabled the fully granted 1.4.0
            assert result.manifest.version == "1.4.0" and not result.pending_permissions
        for event in hub.audit(tenant_id, plugin_id=plugin):
            if event.action == "enabled":
                assert event.detail["version"] == "1.4.0", "an enable is only ever of a fully granted manifest"
