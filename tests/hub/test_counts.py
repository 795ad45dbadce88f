"""Installed and enabled counts (the overview's plugins card) and O(page) hub lists (issue 16, item 5).

The counts must equal a walk of the installations after every kind of write,
on every store; on the Kv store they are a count index kept in each write's
commit (``IndexedTable.check`` finds no drift, also after concurrent writers),
and every hub list touches one page of entries however many plugins and audit
events the tenant has.
"""

from __future__ import annotations

import contextlib
import json
import threading

import pytest

from botmesh_admin.errors import Conflict, NotFound
from botmesh_admin.kv import Put
from botmesh_admin.kv.indexes import IndexNotBuilt
from botmesh_admin.kv.memory import MemoryKv
from hub import selectors, services
from hub.domain import PluginCounts
from hub.stores import use_store
from hub.stores.base import PluginStore
from hub.stores.kv import PLUGINS, KvPluginStore
from tests import backends

from .test_services import ADMIN, FOUR


def manifest(order_status: bytes, n: int) -> str:
    """Return order-status under another plugin id (``acme.p<n>``)."""
    return json.dumps({**json.loads(order_status), "id": f"acme.p{n}"})


def walk(tenant: str) -> PluginCounts:
    """Return the counts by their definition: every installation, page by page."""
    items, after = [], None
    while page := selectors.plugin_list(tenant, limit=7, after=after):
        items += page
        after = page[-1].plugin_id
    return PluginCounts(installed=len(items), enabled=sum(1 for i in items if i.enabled))


def install_enabled(tenant: str, order_status: bytes, n: int) -> None:
    services.plugin_install(tenant, manifest=manifest(order_status, n), actor=ADMIN)
    services.plugin_grant(tenant, f"acme.p{n}", permissions=FOUR, actor=ADMIN)
    services.plugin_enable(tenant, f"acme.p{n}", actor=ADMIN)


def test_counts_follow_every_write(hub: PluginStore, tenant_id: str, order_status: bytes) -> None:
    assert selectors.plugin_counts(tenant_id) == PluginCounts(installed=0, enabled=0)
    for n in range(5):
        services.plugin_install(tenant_id, manifest=manifest(order_status, n), actor=ADMIN)
    for n in (1, 2, 3):
        services.plugin_grant(tenant_id, f"acme.p{n}", permissions=FOUR, actor=ADMIN)
        services.plugin_enable(tenant_id, f"acme.p{n}", actor=ADMIN)
    assert selectors.plugin_counts(tenant_id) == walk(tenant_id) == PluginCounts(installed=5, enabled=3)
    services.plugin_disable(tenant_id, "acme.p1", actor=ADMIN)
    services.plugin_revoke(tenant_id, "acme.p2", permissions=["http:fetch"], actor=ADMIN)  # disables it
    services.plugin_uninstall(tenant_id, "acme.p3", actor=ADMIN)  # an enabled one
    services.plugin_uninstall(tenant_id, "acme.p0", actor=ADMIN)
    assert selectors.plugin_counts(tenant_id) == walk(tenant_id) == PluginCounts(installed=3, enabled=0)
    install_enabled(tenant_id, order_status, 3)  # the same id again
    upgrade = {**json.loads(manifest(order_status, 3)), "version": "1.9.0"}
    services.plugin_install(tenant_id, manifest=json.dumps(upgrade), actor=ADMIN)  # same permissions: stays enabled
    assert selectors.plugin_counts(tenant_id) == walk(tenant_id) == PluginCounts(installed=4, enabled=1)
    assert selectors.plugin_counts(tenant_id + "x") == PluginCounts(installed=0, enabled=0)


def test_a_refused_write_changes_no_count(hub: PluginStore, tenant_id: str, order_status: bytes) -> None:
    install_enabled(tenant_id, order_status, 1)
    stale = selectors.plugin_get(tenant_id, "acme.p1").revision - 1
    with pytest.raises(Conflict):
        services.plugin_disable(tenant_id, "acme.p1", actor=ADMIN, expected_revision=stale)
    assert selectors.plugin_counts(tenant_id) == PluginCounts(installed=1, enabled=1)


@pytest.mark.parametrize("backend", ["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.services)])
def test_concurrent_writers_leave_the_count_index_exact(
    backend: str, request: pytest.FixtureRequest, tenant_id: str, order_status: bytes
) -> None:
    kv = backends.open_kv(backend, request)
    store = KvPluginStore(kv)
    stack = contextlib.ExitStack()
    stack.enter_context(use_store(store))
    request.addfinalizer(stack.close)
    for n in range(4):
        services.plugin_install(tenant_id, manifest=manifest(order_status, n), actor=ADMIN)
        services.plugin_grant(tenant_id, f"acme.p{n}", permissions=FOUR, actor=ADMIN)
    errors: list[BaseException] = []

    def flip(n: int) -> None:
        try:
            for r in range(6):
                for plugin in (f"acme.p{n}", f"acme.p{(n + 1) % 4}"):  # two threads per plugin
                    try:
                        if r % 2 == 0:
                            services.plugin_enable(tenant_id, plugin, actor=ADMIN)
                        else:
                            services.plugin_disable(tenant_id, plugin, actor=ADMIN)
                    except (Conflict, NotFound):
                        pass  # lost a race, or p0 is being re-installed: the other write stands
            if n == 0:
                services.plugin_uninstall(tenant_id, "acme.p0", actor=ADMIN)
                services.plugin_install(tenant_id, manifest=manifest(order_status, 0), actor=ADMIN)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=flip, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    table = store.tables.table(tenant_id, "plugins")
    assert PLUGINS.layout(kv).check(table, "plugins") == {"missing": 0, "extra": 0, "wrong": 0}
    assert selectors.plugin_counts(tenant_id) == walk(tenant_id)


def test_a_table_from_before_the_count_index_needs_the_reindex(tenant_id: str, order_status: bytes) -> None:
    """Installations written before the index: the count names ``botmesh_reindex`` until it ran."""
    then = MemoryKv()
    with use_store(KvPluginStore(then)):
        install_enabled(tenant_id, order_status, 1)
        services.plugin_install(tenant_id, manifest=manifest(order_status, 2), actor=ADMIN)
    kv = MemoryKv()
    table = KvPluginStore(kv).tables.table(tenant_id, "plugins")
    old = [e for e in then.scan(table, limit=1000) if not e.key.startswith("x/")]
    kv.commit(table, [Put(e.key, e.value) for e in old])  # what the store wrote at that time
    with use_store(KvPluginStore(kv)):
        with pytest.raises(IndexNotBuilt, match="botmesh_reindex"):
            selectors.plugin_counts(tenant_id)
        services.plugin_install(tenant_id, manifest=manifest(order_status, 3), actor=ADMIN)  # writes go on meanwhile
        assert PLUGINS.layout(kv).build(table, "plugins") == 3
        assert selectors.plugin_counts(tenant_id) == PluginCounts(installed=3, enabled=1)


@pytest.mark.parametrize("size", [30, 300])
def test_each_hub_read_touches_one_page(
    size: int, request: pytest.FixtureRequest, tenant_id: str, order_status: bytes
) -> None:
    kv = backends.CountingKv()
    stack = contextlib.ExitStack()
    stack.enter_context(use_store(KvPluginStore(kv)))
    request.addfinalizer(stack.close)
    for n in range(size):
        services.plugin_install(tenant_id, manifest=manifest(order_status, n), actor=ADMIN)
    reads = {
        "plugins page": (lambda: selectors.plugin_list(tenant_id, limit=10), 10),
        "next plugins page": (lambda: selectors.plugin_list(tenant_id, limit=10, after="acme.p15"), 10),
        "audit page": (lambda: selectors.plugin_audit_list(tenant_id, limit=10), 10),
        "one plugin's audit": (lambda: selectors.plugin_audit_list(tenant_id, plugin_id="acme.p7", limit=10), 1),
        "overview counts": (lambda: selectors.plugin_counts(tenant_id), 3),  # an index state, two counters
    }
    for name, (read, most) in reads.items():
        kv.touched = 0
        read()
        assert kv.touched <= most, (name, kv.touched)
