"""TenantKv: table names per (package, tenant, collection), ids validated."""

from __future__ import annotations

from typing import Any

import pytest

from botmesh_admin.errors import ValidationError
from botmesh_admin.kv import Entry, Put, TenantKv, validate_id
from botmesh_admin.kv.memory import MemoryKv


@pytest.fixture
def crm() -> TenantKv:
    return TenantKv(MemoryKv(), "crm")


def test_table_name_is_package_tenant_collection(crm: TenantKv) -> None:
    assert crm.table("acme", "contacts") == "crm/acme/contacts"
    assert crm.tables("acme-2", ["contacts", "segments"]) == {
        "contacts": "crm/acme-2/contacts",
        "segments": "crm/acme-2/segments",
    }


@pytest.mark.parametrize(
    "bad",
    ["", "../x", "A", "acme/other", "-acme", "_acme", "a" * 64, "acmé", " acme", "acme\n", None, 7],
)
def test_bad_tenant_ids_are_refused(crm: TenantKv, bad: Any) -> None:
    """No tenant id can reach outside its own table namespace."""
    with pytest.raises(ValidationError) as info:
        crm.table(bad, "contacts")
    assert info.value.field == "tenant"
    with pytest.raises(ValidationError) as info:
        crm.table("acme", bad)
    assert info.value.field == "collection"


def test_bad_package_is_refused() -> None:
    with pytest.raises(ValidationError) as info:
        TenantKv(MemoryKv(), "../crm")
    assert info.value.field == "package"


def test_longest_valid_id_is_accepted() -> None:
    assert validate_id("a" * 63, "tenant") == "a" * 63


def test_two_tenants_have_distinct_tables_and_data(crm: TenantKv) -> None:
    one, two = crm.table("one", "contacts"), crm.table("two", "contacts")
    assert one != two
    crm.kv.commit(one, [Put("c1", {"name": "Ann"})])
    assert crm.kv.scan(two) == []
    assert crm.kv.get(two, "c1") is None


def test_two_packages_have_distinct_tables() -> None:
    kv = MemoryKv()
    assert TenantKv(kv, "crm").table("acme", "items") != TenantKv(kv, "hub").table("acme", "items")


def test_drop_tenant_erases_only_that_tenant(crm: TenantKv) -> None:
    for tenant in ("one", "two"):
        for collection in ("contacts", "segments"):
            crm.kv.commit(crm.table(tenant, collection), [Put("k", tenant)])
    crm.drop_tenant("one", ["contacts", "segments"])
    assert crm.kv.scan(crm.table("one", "contacts")) == []
    assert crm.kv.scan(crm.table("one", "segments")) == []
    assert crm.kv.get(crm.table("two", "contacts"), "k") == Entry("k", "two", 1, None)
