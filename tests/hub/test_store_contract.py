"""The PluginStore contract, over the memory store and the Kv store on every DurableKv backend."""

from __future__ import annotations

import pytest

from botmesh_admin.errors import Conflict
from hub.domain import AuditEvent, Installation, Manifest, new_audit_id
from hub.stores.base import PluginStore


def _installation(plugin_id: str = "acme.a", **kw) -> Installation:
    manifest = Manifest(id=plugin_id, name="A", version="1.0.0", runtime="^1.0.0", permissions=("messages:read",))
    base = dict(
        plugin_id=plugin_id,
        manifest=manifest,
        digest=manifest.digest,
        granted=(),
        enabled=False,
        installed_at=1000,
        installed_by="user:ana",
        updated_at=1000,
    )
    return Installation(**{**base, **kw})


def _event(plugin_id: str, action: str, at: int) -> AuditEvent:
    return AuditEvent(
        id=new_audit_id(at),
        at=at,
        actor="user:ana",
        action=action,
        plugin_id=plugin_id,
        detail={"version": "1.0.0", "permissions": ["messages:read"]},
    )


def test_store_implements_the_protocol(plugin_store: PluginStore) -> None:
    assert isinstance(plugin_store, PluginStore)


def test_save_then_get_round_trips_every_field(plugin_store: PluginStore, tenant_id: str) -> None:
    inst = _installation(
        granted=("messages:read",),
        enabled=True,
        previous_version="0.9.0",
        previous_permissions=("http:fetch",),
    )
    saved = plugin_store.save(tenant_id, inst, expect_revision=None)
    assert saved.revision == 1
    assert plugin_store.get(tenant_id, "acme.a") == saved
    assert plugin_store.get(tenant_id, "acme.b") is None


def test_save_is_compare_and_set(plugin_store: PluginStore, tenant_id: str) -> None:
    first = plugin_store.save(tenant_id, _installation(), expect_revision=None)
    with pytest.raises(Conflict) as info:
        plugin_store.save(tenant_id, _installation(), expect_revision=None)
    assert info.value.current_version == 1
    second = plugin_store.save(tenant_id, first.evolve(enabled=True), expect_revision=1)
    assert second.revision == 2
    with pytest.raises(Conflict) as info:
        plugin_store.save(tenant_id, first.evolve(granted=("messages:read",)), expect_revision=1)
    assert info.value.current_version == 2
    assert plugin_store.get(tenant_id, "acme.a") == second, "a refused write changes nothing"


def test_audit_commits_with_the_write_or_not_at_all(plugin_store: PluginStore, tenant_id: str) -> None:
    plugin_store.save(tenant_id, _installation(), expect_revision=None, audit=[_event("acme.a", "installed", 1)])
    with pytest.raises(Conflict):
        plugin_store.save(tenant_id, _installation(), expect_revision=5, audit=[_event("acme.a", "enabled", 2)])
    assert [e.action for e in plugin_store.audit_list(tenant_id)] == ["installed"]


def test_audit_is_newest_first_paginated_and_filterable(plugin_store: PluginStore, tenant_id: str) -> None:
    inst = plugin_store.save(
        tenant_id,
        _installation("acme.a"),
        expect_revision=None,
        audit=[_event("acme.a", "installed", 10)],
    )
    plugin_store.save(
        tenant_id,
        _installation("acme.b"),
        expect_revision=None,
        audit=[_event("acme.b", "installed", 20)],
    )
    plugin_store.save(
        tenant_id,
        inst.evolve(enabled=True),
        expect_revision=1,
        audit=[_event("acme.a", "granted", 30), _event("acme.a", "enabled", 30)],
    )
    events = plugin_store.audit_list(tenant_id)
    assert [(e.plugin_id, e.action) for e in events] == [
        ("acme.a", "enabled"),
        ("acme.a", "granted"),
        ("acme.b", "installed"),
        ("acme.a", "installed"),
    ]
    assert events[0].detail == {"version": "1.0.0", "permissions": ["messages:read"]}
    page1 = plugin_store.audit_list(tenant_id, limit=2)
    page2 = plugin_store.audit_list(tenant_id, limit=2, after=page1[-1].id)
    assert page1 + page2 == events
    mine = plugin_store.audit_list(tenant_id, plugin_id="acme.a")
    assert [e.action for e in mine] == ["enabled", "granted", "installed"]


def test_list_is_ordered_by_plugin_id_with_a_cursor(plugin_store: PluginStore, tenant_id: str) -> None:
    for pid in ("zz.last", "acme.b", "acme.a", "acme.a-b"):
        plugin_store.save(tenant_id, _installation(pid), expect_revision=None)
    ids = [i.plugin_id for i in plugin_store.list(tenant_id)]
    assert ids == ["acme.a", "acme.a-b", "acme.b", "zz.last"]
    page = plugin_store.list(tenant_id, limit=2)
    rest = plugin_store.list(tenant_id, limit=10, after=page[-1].plugin_id)
    assert [i.plugin_id for i in page + rest] == ids


def test_delete_is_compare_and_set_and_keeps_the_audit(plugin_store: PluginStore, tenant_id: str) -> None:
    plugin_store.save(tenant_id, _installation(), expect_revision=None)
    with pytest.raises(Conflict):
        plugin_store.delete(tenant_id, "acme.a", expect_revision=7)
    plugin_store.delete(tenant_id, "acme.a", expect_revision=1, audit=[_event("acme.a", "uninstalled", 5)])
    assert plugin_store.get(tenant_id, "acme.a") is None
    assert [e.action for e in plugin_store.audit_list(tenant_id)] == ["uninstalled"]
    with pytest.raises(Conflict):
        plugin_store.delete(tenant_id, "acme.a", expect_revision=1)
    again = plugin_store.save(tenant_id, _installation(), expect_revision=None)
    assert again.revision == 1


def test_another_tenant_sees_nothing(plugin_store: PluginStore, tenant_id: str) -> None:
    plugin_store.save(tenant_id, _installation(), expect_revision=None, audit=[_event("acme.a", "installed", 1)])
    other = tenant_id + "-b"
    assert plugin_store.get(other, "acme.a") is None
    assert plugin_store.list(other) == []
    assert plugin_store.audit_list(other) == []
    assert plugin_store.save(other, _installation(), expect_revision=None).revision == 1


def test_drop_tenant_erases_everything(plugin_store: PluginStore, tenant_id: str) -> None:
    plugin_store.save(tenant_id, _installation(), expect_revision=None, audit=[_event("acme.a", "installed", 1)])
    plugin_store.drop_tenant(tenant_id)
    assert plugin_store.get(tenant_id, "acme.a") is None
    assert plugin_store.audit_list(tenant_id) == []
