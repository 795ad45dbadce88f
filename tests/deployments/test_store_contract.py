"""The DeploymentStore contract, over the memory store and the Kv store on every DurableKv backend."""

from __future__ import annotations

from dataclasses import replace

import pytest

from botmesh_admin.errors import Conflict
from deployments.domain import (
    ActivePointer,
    Artifact,
    AuditEvent,
    BotVersion,
    GateState,
    VersionSpec,
    new_audit_id,
)
from deployments.stores.base import DeploymentStore, IndexEntry


def _version(version: str, bot: str = "tienda-bot") -> BotVersion:
    spec = VersionSpec(
        bot=bot,
        version=version,
        gates=("unit-tests",),
        notes="n",
        created_by="ci@example.com",
        artifact=Artifact(digest="sha256:" + "0" * 64, url=f"oci://registry.example.com/{bot}:{version}"),
    )
    return BotVersion(
        spec=spec,
        seq=0,
        digest=spec.digest,
        published_at=1,
        published_by="token:ci",
        gates=(GateState(name="unit-tests"),),
    )


def _audit(action: str, bot: str = "tienda-bot", at: int = 1):
    return lambda v: [
        AuditEvent(
            id=new_audit_id(at),
            at=at,
            actor="token:ci",
            action=action,
            bot=bot,
            version=v.version,
            detail={"seq": v.seq},
        )
    ]


def _event(action: str, at: int, bot: str = "tienda-bot") -> AuditEvent:
    return AuditEvent(id=new_audit_id(at), at=at, actor="user:ana", action=action, bot=bot, version=None)


def _pointer(v: BotVersion) -> ActivePointer:
    return ActivePointer(bot=v.bot, version=v.version, seq=v.seq, activated_at=5, activated_by="user:ana")


def test_store_implements_the_protocol(deployment_store: DeploymentStore) -> None:
    assert isinstance(deployment_store, DeploymentStore)


def test_publish_assigns_per_bot_sequence(deployment_store: DeploymentStore, tenant_id: str) -> None:
    a = deployment_store.publish(tenant_id, _version("1.0.0"), audit=_audit("published"))
    b = deployment_store.publish(tenant_id, _version("1.1.0"), audit=_audit("published"))
    other = deployment_store.publish(
        tenant_id, _version("1.0.0", bot="soporte-bot"), audit=_audit("published", "soporte-bot")
    )
    assert (a.seq, b.seq, other.seq) == (1, 2, 1)
    assert a.revision == 1
    assert deployment_store.get_version(tenant_id, "tienda-bot", "1.0.0") == a
    assert deployment_store.index_get(tenant_id, "tienda-bot", "1.1.0") == IndexEntry(seq=2, digest=b.digest)
    assert deployment_store.list_bots(tenant_id) == ["soporte-bot", "tienda-bot"]
    assert [e.detail for e in deployment_store.audit_list(tenant_id, "tienda-bot")] == [
        {"seq": 2},
        {"seq": 1},
    ]


def test_publishing_a_published_version_string_conflicts(deployment_store: DeploymentStore, tenant_id: str) -> None:
    deployment_store.publish(tenant_id, _version("1.0.0"), audit=_audit("published"))
    with pytest.raises(Conflict):
        deployment_store.publish(tenant_id, _version("1.0.0"), audit=_audit("published"))
    nxt = deployment_store.publish(tenant_id, _version("1.0.1"), audit=_audit("published"))
    assert nxt.seq == 2, "a refused publish does not consume a sequence number"
    assert len(deployment_store.audit_list(tenant_id, "tienda-bot")) == 2


def test_list_is_newest_first_with_a_seq_cursor(deployment_store: DeploymentStore, tenant_id: str) -> None:
    for v in ("1.0.0", "1.1.0", "1.2.0", "2.0.0"):
        deployment_store.publish(tenant_id, _version(v), audit=_audit("published"))
    page = deployment_store.list_versions(tenant_id, "tienda-bot", limit=3)
    assert [v.version for v in page] == ["2.0.0", "1.2.0", "1.1.0"]
    rest = deployment_store.list_versions(tenant_id, "tienda-bot", limit=3, after_seq=page[-1].seq)
    assert [v.version for v in rest] == ["1.0.0"]
    assert deployment_store.list_versions(tenant_id, "no-bot") == []


def test_update_version_is_compare_and_set(deployment_store: DeploymentStore, tenant_id: str) -> None:
    v = deployment_store.publish(tenant_id, _version("1.0.0"), audit=_audit("published"))
    running = v.with_gate(GateState(name="unit-tests", status="running", run_id="run_1", expires_at=99))
    updated = deployment_store.update_version(
        tenant_id, running, expect_revision=1, audit=[_event("gate_run_started", 2)]
    )
    assert updated.revision == 2 and updated.gate("unit-tests").run_id == "run_1"
    with pytest.raises(Conflict) as info:
        deployment_store.update_version(tenant_id, running, expect_revision=1, audit=[_event("x", 3)])
    assert info.value.current_version == 2
    assert deployment_store.get_version(tenant_id, "tienda-bot", "1.0.0") == updated
    assert [e.action for e in deployment_store.audit_list(tenant_id, "tienda-bot")][0] == "gate_run_started"


def test_set_active_is_compare_and_set_guarded_by_the_version(
    deployment_store: DeploymentStore, tenant_id: str
) -> None:
    v1 = deployment_store.publish(tenant_id, _version("1.0.0"), audit=_audit("published"))
    v2 = deployment_store.publish(tenant_id, _version("1.1.0"), audit=_audit("published"))
    assert deployment_store.get_active(tenant_id, "tienda-bot") is None
    p1 = deployment_store.set_active(tenant_id, _pointer(v1), expect_revision=None, version=v1)
    assert p1.revision == 1 and deployment_store.get_active(tenant_id, "tienda-bot") == p1
    with pytest.raises(Conflict):
        deployment_store.set_active(tenant_id, _pointer(v2), expect_revision=None, version=v2)
    stale_v2 = v2
    deployment_store.update_version(tenant_id, v2, expect_revision=1)
    with pytest.raises(Conflict):
        deployment_store.set_active(tenant_id, _pointer(v2), expect_revision=1, version=stale_v2)
    assert deployment_store.get_active(tenant_id, "tienda-bot") == p1
    fresh = deployment_store.get_version(tenant_id, "tienda-bot", "1.1.0")
    p2 = deployment_store.set_active(
        tenant_id, _pointer(fresh), expect_revision=1, version=fresh, audit=[_event("activated", 9)]
    )
    assert (p2.version, p2.revision) == ("1.1.0", 2)


def test_delete_versions_tombstones_and_checks_the_pointer(deployment_store: DeploymentStore, tenant_id: str) -> None:
    vs = [
        deployment_store.publish(tenant_id, _version(v), audit=_audit("published")) for v in ("1.0.0", "1.1.0", "1.2.0")
    ]
    deployment_store.set_active(tenant_id, _pointer(vs[2]), expect_revision=None, version=vs[2])
    with pytest.raises(Conflict):
        deployment_store.delete_versions(tenant_id, "tienda-bot", vs[:2], active_revision=None)
    with pytest.raises(Conflict):
        deployment_store.delete_versions(
            tenant_id, "tienda-bot", [vs[0], replace(vs[1], revision=9)], active_revision=1
        )
    assert len(deployment_store.list_versions(tenant_id, "tienda-bot")) == 3, "all or nothing"
    deployment_store.delete_versions(tenant_id, "tienda-bot", vs[:2], active_revision=1, audit=[_event("pruned", 7)])
    assert [v.version for v in deployment_store.list_versions(tenant_id, "tienda-bot")] == ["1.2.0"]
    assert deployment_store.get_version(tenant_id, "tienda-bot", "1.0.0") is None
    assert deployment_store.index_get(tenant_id, "tienda-bot", "1.0.0") == IndexEntry(
        seq=1, digest=vs[0].digest, pruned=True
    )
    with pytest.raises(Conflict):
        deployment_store.publish(tenant_id, _version("1.0.0"), audit=_audit("published"))


def test_another_tenant_sees_nothing(deployment_store: DeploymentStore, tenant_id: str) -> None:
    v = deployment_store.publish(tenant_id, _version("1.0.0"), audit=_audit("published"))
    deployment_store.set_active(tenant_id, _pointer(v), expect_revision=None, version=v)
    other = tenant_id + "-b"
    assert deployment_store.get_version(other, "tienda-bot", "1.0.0") is None
    assert deployment_store.index_get(other, "tienda-bot", "1.0.0") is None
    assert deployment_store.get_active(other, "tienda-bot") is None
    assert deployment_store.list_versions(other, "tienda-bot") == []
    assert deployment_store.list_bots(other) == [] and deployment_store.audit_list(other, "tienda-bot") == []
    assert deployment_store.publish(other, _version("1.0.0"), audit=_audit("published")).seq == 1


def test_drop_tenant_erases_everything(deployment_store: DeploymentStore, tenant_id: str) -> None:
    deployment_store.publish(tenant_id, _version("1.0.0"), audit=_audit("published"))
    deployment_store.drop_tenant(tenant_id)
    assert deployment_store.list_bots(tenant_id) == []
    assert deployment_store.index_get(tenant_id, "tienda-bot", "1.0.0") is None
