"""The ContactStore contract, over the memory store and the Kv store on every DurableKv backend."""

from __future__ import annotations

from dataclasses import replace

import pytest

from botmesh_admin.errors import Conflict, NotFound
from crm.domain import Contact, Identity, IdentityTaken, ImportJob, Segment, SegmentRules, new_id
from crm.stores.base import ContactStore

WA = Identity("whatsapp", "+573001112233")
MAIL = Identity("email", "ana@example.com")
TG = Identity("telegram", "700001004")


def _contact(*identities: Identity, **kw) -> Contact:
    return Contact(id=new_id("c"), identities=identities, name=kw.pop("name", "Ana"), created_at=1, updated_at=1, **kw)


def test_store_implements_the_protocol(contact_store: ContactStore) -> None:
    assert isinstance(contact_store, ContactStore)


def test_insert_then_get_and_find_by_every_identity(contact_store: ContactStore, tenant_id: str) -> None:
    c = contact_store.contact_insert(tenant_id, _contact(WA, MAIL, tags=("vip",), attributes={"n": 1.5, "b": False}))
    assert c.version == 1
    got = contact_store.contact_get(tenant_id, c.id)
    assert got == c and got.attributes == {"n": 1.5, "b": False}
    assert contact_store.contact_find(tenant_id, WA) == c
    assert contact_store.contact_find(tenant_id, MAIL) == c
    assert contact_store.contact_find(tenant_id, TG) is None


def test_an_identity_belongs_to_one_contact(contact_store: ContactStore, tenant_id: str) -> None:
    first = contact_store.contact_insert(tenant_id, _contact(WA))
    with pytest.raises(IdentityTaken) as info:
        contact_store.contact_insert(tenant_id, _contact(TG, WA))
    assert info.value.contact_id == first.id
    assert contact_store.contact_find(tenant_id, TG) is None, "a refused insert claims nothing"
    assert [c.id for c in contact_store.contact_scan(tenant_id)] == [first.id]


def test_another_tenant_sees_nothing(contact_store: ContactStore, tenant_id: str) -> None:
    c = contact_store.contact_insert(tenant_id, _contact(WA))
    other = tenant_id + "-b"
    assert contact_store.contact_get(other, c.id) is None
    assert contact_store.contact_find(other, WA) is None
    assert contact_store.contact_scan(other) == []
    assert contact_store.contact_insert(other, _contact(WA)).version == 1, "identities are unique per tenant"


def test_replace_is_compare_and_set(contact_store: ContactStore, tenant_id: str) -> None:
    c = contact_store.contact_insert(tenant_id, _contact(WA))
    c2 = contact_store.contact_replace(tenant_id, replace(c, tags=("a",)), expected_version=1)
    assert c2.version == 2 and c2.tags == ("a",)
    with pytest.raises(Conflict) as info:
        contact_store.contact_replace(tenant_id, replace(c, tags=("b",)), expected_version=1)
    assert info.value.current_version == 2
    assert contact_store.contact_get(tenant_id, c.id).tags == ("a",)
    with pytest.raises(NotFound):
        contact_store.contact_replace(tenant_id, _contact(TG), expected_version=1)


def test_replace_moves_identities_in_the_index(contact_store: ContactStore, tenant_id: str) -> None:
    c = contact_store.contact_insert(tenant_id, _contact(WA, MAIL))
    other = contact_store.contact_insert(tenant_id, _contact(Identity("email", "o@x.co")))
    c2 = contact_store.contact_replace(tenant_id, replace(c, identities=(WA, TG)), expected_version=1)
    assert contact_store.contact_find(tenant_id, TG) == c2
    assert contact_store.contact_find(tenant_id, MAIL) is None
    with pytest.raises(IdentityTaken):
        contact_store.contact_replace(tenant_id, replace(c2, identities=(WA, *other.identities)), expected_version=2)
    assert contact_store.contact_get(tenant_id, c.id) == c2, "a refused replace writes nothing"
    # the released identity can be claimed by someone else
    assert contact_store.contact_insert(tenant_id, _contact(MAIL)).version == 1


def test_delete_releases_identities_and_writes_suppressions(contact_store: ContactStore, tenant_id: str) -> None:
    c = contact_store.contact_insert(tenant_id, _contact(WA, MAIL))
    with pytest.raises(Conflict) as info:
        contact_store.contact_delete(tenant_id, c.id, expected_version=7)
    assert info.value.current_version == 1
    contact_store.contact_delete(
        tenant_id, c.id, expected_version=1, suppressions={"ab" * 32: {"channel": "whatsapp", "status": "denied"}}
    )
    assert contact_store.contact_get(tenant_id, c.id) is None
    assert contact_store.contact_find(tenant_id, WA) is None
    assert contact_store.suppression_get(tenant_id, "ab" * 32) == {"channel": "whatsapp", "status": "denied"}
    assert contact_store.suppression_get(tenant_id, "cd" * 32) is None
    with pytest.raises(NotFound):
        contact_store.contact_delete(tenant_id, c.id, expected_version=1)
    assert contact_store.contact_insert(tenant_id, _contact(WA)).version == 1


def test_replace_can_release_suppressions(contact_store: ContactStore, tenant_id: str) -> None:
    gone = contact_store.contact_insert(tenant_id, _contact(TG))
    contact_store.contact_delete(tenant_id, gone.id, expected_version=1, suppressions={"k1": {"channel": "telegram"}})
    c = contact_store.contact_insert(tenant_id, _contact(WA))
    contact_store.contact_replace(tenant_id, replace(c, name="B"), expected_version=1, release_suppressions=("k1",))
    assert contact_store.suppression_get(tenant_id, "k1") is None


def test_scan_pages_by_id(contact_store: ContactStore, tenant_id: str) -> None:
    ids = [contact_store.contact_insert(tenant_id, _contact(Identity("telegram", str(100 + i)))).id for i in range(7)]
    assert ids == sorted(ids), "ids sort by creation"
    first = contact_store.contact_scan(tenant_id, limit=3)
    rest = contact_store.contact_scan(tenant_id, after=first[-1].id, limit=10)
    assert [c.id for c in first + rest] == ids


def test_segments_crud(contact_store: ContactStore, tenant_id: str) -> None:
    rules = SegmentRules(tags_all=("vip",), attributes={"score": 1, "flag": None}, consent_required="whatsapp")
    s = contact_store.segment_insert(tenant_id, Segment(new_id("s"), "VIP", rules, created_at=1, updated_at=1))
    assert s.version == 1 and contact_store.segment_get(tenant_id, s.id) == s
    s2 = contact_store.segment_replace(tenant_id, replace(s, name="VIPs"), expected_version=1)
    assert s2.version == 2
    with pytest.raises(Conflict) as info:
        contact_store.segment_replace(tenant_id, replace(s, name="x"), expected_version=1)
    assert info.value.current_version == 2
    assert [x.name for x in contact_store.segment_scan(tenant_id)] == ["VIPs"]
    assert contact_store.segment_get(tenant_id + "-b", s.id) is None
    assert contact_store.segment_delete(tenant_id, s.id) is True
    assert contact_store.segment_delete(tenant_id, s.id) is False
    with pytest.raises(NotFound):
        contact_store.segment_replace(tenant_id, s, expected_version=2)


def test_import_jobs_keep_their_file_until_released(contact_store: ContactStore, tenant_id: str) -> None:
    data = "name,phone\n" + "x,+573001112233\n" * 150_000  # larger than one Kv chunk
    job = contact_store.import_job_insert(tenant_id, ImportJob(new_id("imp"), "queued", "a.csv", total_rows=3), data)
    assert job.version == 1 and contact_store.import_data_get(tenant_id, job.id) == data
    done = contact_store.import_job_replace(
        tenant_id,
        replace(job, status="done", errors=({"row": 4, "field": "phone", "message": "bad"},)),
        expected_version=1,
    )
    assert contact_store.import_job_get(tenant_id, job.id) == done
    with pytest.raises(Conflict):
        contact_store.import_job_replace(tenant_id, job, expected_version=1)
    contact_store.import_data_delete(tenant_id, job.id)
    assert contact_store.import_data_get(tenant_id, job.id) is None
    assert [j.id for j in contact_store.import_job_scan(tenant_id)] == [job.id]


def test_scan_matching_returns_members_and_a_cursor(contact_store: ContactStore, tenant_id: str) -> None:
    made = [
        contact_store.contact_insert(
            tenant_id,
            _contact(Identity("telegram", str(100 + i)), tags=("vip",) if i % 3 == 0 else (), attributes={"n": i % 2}),
        )
        for i in range(10)
    ]
    rules = SegmentRules(tags_all=("vip",), attributes={"n": 0})
    found, cursor = [], None
    while True:
        page, cursor = contact_store.contact_scan_matching(tenant_id, rules, after=cursor, limit=4)
        found += page
        if cursor is None:
            break
    assert [c.id for c in found] == [c.id for i, c in enumerate(made) if i % 3 == 0 and i % 2 == 0]
    assert found[0] == made[0]
    strict = SegmentRules(attributes={"n": False})
    assert contact_store.contact_scan_matching(tenant_id, strict, limit=100) == ([], None)
