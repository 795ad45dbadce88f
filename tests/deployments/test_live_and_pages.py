"""Live deployments listed and counted (the overview's card), every deployments read O(page) (issue 16, item 5).

On every store the count of bots with a live deployment and the list of those
deployments must match a walk of the bots; on the Kv store the count is a
count index kept in each activation's commit (``IndexedTable.check`` finds no
drift, also after concurrent activations), and the bots, versions, audit and
live pages touch one page of entries however many the tenant has.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from botmesh_admin.errors import Conflict
from botmesh_admin.kv import Put
from botmesh_admin.kv.indexes import IndexNotBuilt
from botmesh_admin.kv.memory import MemoryKv
from deployments import selectors, services
from deployments.stores import default_store, use_store
from deployments.stores.base import DeploymentStore
from deployments.stores.kv import REGISTRY, KvDeploymentStore
from tests import backends

DIGEST = "sha256:" + "a" * 64


def spec(bot: str, version: str) -> dict[str, Any]:
    """A version without gates (so it can be activated at once)."""
    return {
        "bot": bot,
        "version": version,
        "artifact": {"digest": DIGEST, "url": "oci://r/x"},
        "gates": [],
    }


def _use(request: pytest.FixtureRequest, store: DeploymentStore) -> None:
    """Make ``store`` the deployments store until the test ends."""
    stack = contextlib.ExitStack()
    stack.enter_context(use_store(store))
    request.addfinalizer(stack.close)


def publish_and_activate(tenant: str, bot: str, version: str) -> None:
    services.version_publish(tenant, spec=spec(bot, version), actor="token:ci")
    services.deployment_activate(tenant, bot, version, actor="user:ana")


def walk(tenant: str) -> list[tuple[str, str]]:
    """Return ``(bot, live version)`` by their definition: every bot, page by page."""
    live, after = [], None
    while bots := [b.bot for b in selectors.bot_list(tenant, limit=3, after=after)]:
        for bot in bots:
            pointer = selectors.deployment_active(tenant, bot)
            if pointer is not None:
                live.append((bot, pointer.version))
        after = bots[-1]
    return live


def listed(tenant: str, limit: int) -> list[tuple[str, str]]:
    out, after = [], None
    while page := selectors.deployment_active_list(tenant, limit=limit, after=after):
        out += [(p.bot, p.version) for p in page]
        after = page[-1].bot
    return out


def test_live_deployments_are_counted_and_listed_by_bot(registry: DeploymentStore, tenant_id: str) -> None:
    assert selectors.deployment_active_count(tenant_id) == 0 and selectors.deployment_active_list(tenant_id) == []
    for n in (4, 1, 3, 0, 2):
        services.version_publish(tenant_id, spec=spec(f"bot-{n}", "1.0.0"), actor="token:ci")
    for n in (3, 0, 4):
        services.deployment_activate(tenant_id, f"bot-{n}", "1.0.0", actor="user:ana")
    assert selectors.deployment_active_count(tenant_id) == 3
    assert listed(tenant_id, 2) == walk(tenant_id)
    assert walk(tenant_id) == [("bot-0", "1.0.0"), ("bot-3", "1.0.0"), ("bot-4", "1.0.0")]
    for bot in ("bot-3", "bot-0"):
        services.version_publish(tenant_id, spec=spec(bot, "1.1.0"), actor="token:ci")
        services.deployment_activate(tenant_id, bot, "1.1.0", actor="user:ana")
    services.deployment_rollback(tenant_id, "bot-0", to="1.0.0", actor="user:ana")
    assert selectors.deployment_active_count(tenant_id) == 3
    assert listed(tenant_id, 5) == walk(tenant_id)
    assert ("bot-3", "1.1.0") in listed(tenant_id, 5)
    assert selectors.deployment_active_count(tenant_id + "x") == 0


def test_a_refused_activation_changes_no_count(registry: DeploymentStore, tenant_id: str) -> None:
    publish_and_activate(tenant_id, "bot-1", "1.0.0")
    services.version_publish(tenant_id, spec=spec("bot-1", "1.1.0"), actor="token:ci")
    with pytest.raises(Conflict):
        services.deployment_activate(tenant_id, "bot-1", "1.1.0", actor="user:ana", expected_revision=99)
    assert selectors.deployment_active_count(tenant_id) == 1


@pytest.mark.parametrize("backend", ["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def test_concurrent_activations_leave_the_count_index_exact(
    backend: str, request: pytest.FixtureRequest, tenant_id: str
) -> None:
    kv = backends.open_kv(backend, request)
    _use(request, KvDeploymentStore(kv))
    for n in range(4):
        for v in ("1.0.0", "1.1.0"):
            services.version_publish(tenant_id, spec=spec(f"bot-{n}", v), actor="token:ci")
    errors: list[BaseException] = []

    def flip(n: int) -> None:
        try:
            for r in range(6):
                for bot in (f"bot-{n}", f"bot-{(n + 1) % 4}"):  # two threads per bot
                    try:
                        services.deployment_activate(tenant_id, bot, ("1.0.0", "1.1.0")[r % 2], actor="user:ana")
                    except Conflict:
                        pass  # lost a race: the other activation stands
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=flip, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    table = KvDeploymentStore(kv).tables.table(tenant_id, "registry")
    assert REGISTRY.layout(kv).check(table, "live") == {"missing": 0, "extra": 0, "wrong": 0}
    assert selectors.deployment_active_count(tenant_id) == 4 == len(listed(tenant_id, 3))


def test_a_registry_from_before_the_count_index_needs_the_reindex(
    request: pytest.FixtureRequest, tenant_id: str
) -> None:
    then = MemoryKv()
    with use_store(KvDeploymentStore(then)):
        publish_and_activate(tenant_id, "bot-1", "1.0.0")
        services.version_publish(tenant_id, spec=spec("bot-2", "1.0.0"), actor="token:ci")
    kv = MemoryKv()
    table = KvDeploymentStore(kv).tables.table(tenant_id, "registry")
    rows = [e for e in then.scan(table, limit=1000) if not e.key.startswith("x/")]
    kv.commit(table, [Put(e.key, e.value) for e in rows])  # what the store wrote at that time
    _use(request, KvDeploymentStore(kv))
    with pytest.raises(IndexNotBuilt, match="botmesh_reindex"):
        selectors.deployment_active_count(tenant_id)
    assert [p.bot for p in selectors.deployment_active_list(tenant_id)] == ["bot-1"]  # a scan: no index needed
    services.deployment_activate(tenant_id, "bot-2", "1.0.0", actor="user:ana")  # writes go on meanwhile
    assert REGISTRY.layout(kv).build(table, "live") == 2
    assert selectors.deployment_active_count(tenant_id) == 2


@pytest.mark.parametrize("size", [30, 300])
def test_each_deployments_read_touches_one_page(size: int, request: pytest.FixtureRequest, tenant_id: str) -> None:
    kv = backends.CountingKv()
    _use(request, KvDeploymentStore(kv))
    for n in range(size):
        publish_and_activate(tenant_id, f"bot-{n:04d}", "1.0.0")
        services.version_publish(tenant_id, spec=spec("big-bot", f"1.{n}.0"), actor="token:ci")
    reads = {
        "bots page": (lambda: default_store().list_bots(tenant_id, limit=10), 10),  # bot_list adds each pointer
        "versions page": (lambda: selectors.version_list(tenant_id, "big-bot", limit=10), 10),
        "next versions page": (
            lambda: selectors.version_list(tenant_id, "big-bot", limit=10, after=str(size - 10)),
            10,
        ),
        "audit page": (lambda: selectors.deployment_audit_list(tenant_id, "big-bot", limit=10), 10),
        "live page": (lambda: selectors.deployment_active_list(tenant_id, limit=10, after="bot-0007"), 10),
        "live count": (lambda: selectors.deployment_active_count(tenant_id), 2),  # an index state, a counter
    }
    for name, (read, most) in reads.items():
        kv.touched = 0
        read()
        assert kv.touched <= most, (name, kv.touched)
