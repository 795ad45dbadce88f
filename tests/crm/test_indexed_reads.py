"""CRM reads through the Kv's secondary indexes (issue 16): lists, search, counts, segments, imports.

Every indexed read is compared with its definition computed by a full scan of
the contacts, and ``IndexedTable.check`` must find the indexes exactly as the
contacts define them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from botmesh_admin.errors import NotFound, ValidationError
from botmesh_admin.kv import ABSENT, Put, TenantKv
from botmesh_admin.kv.indexes import IndexNotBuilt
from botmesh_admin.kv.memory import MemoryKv
from crm import selectors, services
from crm.domain import (
    ALL,
    CHANNELS,
    CONSENT_STATUSES,
    Consent,
    Contact,
    Identity,
    IdentityTaken,
    ImportJob,
    SegmentRules,
    attribute_term,
    consent_term,
    new_id,
    reachable_term,
    rules_match,
    search_index_keys,
    search_keys,
    search_match,
    search_terms,
    segment_rules_from_input,
    strict_equal,
    tag_term,
)
from crm.stores import use_store
from crm.stores.base import ContactStore
from crm.stores.kv import CONTACTS, KvContactStore
from crm.stores.memory import MemoryContactStore
from tests.backends import unique_id

TAGS = ["vip", "lead", "es", "b2b x"]
NAMES = ["Ana García", "José Núñez", "ana maría", "Luis", None, "Zoë O'Neil", "Ánа-Lu 24"]
ATTR_VALUES: list[Any] = [1, 1.0, "1", True, False, None, 1.5, "pro", "x" * 200, "a\tb", 2**53 - 1]
QUERIES = [
    "ana",
    "garc",
    "GARCÍA",
    "300111",
    "+57 300",
    "ana@",
    "example",
    "o'neil",
    "zoe",
    "nunez",
    "jo nu",
    "24",
    "7000",
    "lu",
    "-",
    "e",
]


def _contact(*identities: Identity, **kw: Any) -> Contact:
    return Contact(id=new_id("c"), identities=identities, name=kw.pop("name", "Ana"), created_at=1, updated_at=1, **kw)


@contextmanager
def crm_tenant(store: ContactStore) -> Iterator[str]:
    """Make ``store`` the services' store for a fresh tenant (region CO)."""
    tenant = unique_id()
    selectors._regions[tenant] = ("CO", float("inf"))
    try:
        with use_store(store):
            yield tenant
    finally:
        selectors.tenant_region_forget(tenant)


def all_pages(tenant: str, limit: int, **filters: Any) -> list[Contact]:
    """Follow ``next`` to the end; return every contact listed."""
    out: list[Contact] = []
    after = None
    for _ in range(10_000):
        page = selectors.contact_list(tenant, limit=limit, after=after, **filters)
        assert len(page.items) <= limit
        out += page.items
        if page.next is None:
            return out
        after = page.next
    raise AssertionError("the pages never ended")


# -- definitions by a full scan -----------------------------------------------------------


def keeps(
    c: Contact,
    *,
    tag: str | None = None,
    consent: str | None = None,
    attributes: dict[str, Any] | None = None,
    q: str | None = None,
) -> bool:
    """The definition of ``contact_list``'s filters, on one contact."""
    if tag is not None and tag not in c.tags:
        return False
    if consent is not None:
        channel, status = consent.split(":")
        if c.consent_status(channel) != status:
            return False
    for name, want in (attributes or {}).items():
        if name not in c.attributes or not strict_equal(c.attributes[name], want):
            return False
    if q is not None:
        terms = search_terms(q)
        keys = search_keys(c.name, [(i.channel, i.address) for i in c.identities])
        if not terms or not search_match(terms, keys):
            return False
    return True


def text_orders(contacts: list[Contact], q: str) -> list[list[str]]:
    """The orders a text search read from the index may have: by first key matching the word walked, then id.

    With several search words the one with the fewest entries is walked, so
    each word gives a possible order.
    """
    orders = []
    for term in search_terms(q):
        prefix = term[:40]

        def first(c: Contact, prefix: str = prefix) -> str:
            keys = search_index_keys(c.name, [(i.channel, i.address) for i in c.identities])
            return min(k for k in keys if k.startswith(prefix))

        orders.append([c.id for c in sorted(contacts, key=lambda c: (first(c), c.id))])
    return orders


# -- the store contract over every store ------------------------------------------------------


def test_terms_list_and_count_contacts_by_id(contact_store: ContactStore, tenant_id: str) -> None:
    wa = [Identity("whatsapp", f"+5730011122{i:02d}") for i in range(6)]
    made = []
    for i, ident in enumerate(wa):
        c = _contact(ident, tags=("vip",) if i % 2 else (), attributes={"plan": [1, "1", True][i % 3]})
        if i < 2:
            c = c.with_consent(Consent("whatsapp", "granted", 1, "test"))
        made.append(contact_store.contact_insert(tenant_id, c))
    vip = [c.id for c in made if "vip" in c.tags]
    assert contact_store.contact_term_scan(tenant_id, tag_term("vip")) == vip
    assert contact_store.contact_term_scan(tenant_id, tag_term("vip"), after=vip[0], limit=1) == vip[1:2]
    counts = contact_store.contact_count(
        tenant_id,
        [
            ALL,
            tag_term("vip"),
            tag_term("lead"),
            attribute_term("plan", 1),
            attribute_term("plan", 1.0),
            attribute_term("plan", "1"),
            attribute_term("plan", True),
            consent_term("whatsapp", "granted"),
            consent_term("whatsapp", "denied"),
            reachable_term("whatsapp"),
            reachable_term("email"),
        ],
    )
    assert counts == [6, 3, 0, 2, 2, 2, 2, 2, 0, 2, 0]
    assert contact_store.contact_count(tenant_id + "-b", [ALL, tag_term("vip")]) == [0, 0]
    got = contact_store.contact_get_many(tenant_id, [made[1].id, "c_" + "0" * 22, made[0].id])
    assert got == [made[1], None, made[0]]
    ids = [c.id for c in made[:3]] + ["c_" + "0" * 22]
    assert contact_store.contact_has_term(tenant_id, tag_term("vip"), ids) == [False, True, False, False]
    assert contact_store.contact_has_term(tenant_id, attribute_term("plan", True), ids) == [False, False, True, False]
    assert contact_store.contact_has_term(tenant_id, reachable_term("whatsapp"), ids) == [True, True, False, False]


def test_terms_follow_replace_and_delete(contact_store: ContactStore, tenant_id: str) -> None:
    c = contact_store.contact_insert(tenant_id, _contact(Identity("email", "ana@example.com"), tags=("vip",)))
    c2 = contact_store.contact_replace(
        tenant_id,
        replace(c, tags=("lead",), attributes={"n": 1.5}).with_consent(Consent("email", "granted", 1, "t")),
        expected_version=1,
    )
    assert contact_store.contact_term_scan(tenant_id, tag_term("vip")) == []
    assert contact_store.contact_term_scan(tenant_id, tag_term("lead")) == [c.id]
    assert contact_store.contact_term_scan(tenant_id, attribute_term("n", 1.5)) == [c.id]
    assert contact_store.contact_count(tenant_id, [reachable_term("email"), consent_term("email", "granted")]) == [1, 1]
    contact_store.contact_delete(tenant_id, c.id, expected_version=c2.version)
    assert contact_store.contact_count(tenant_id, [ALL, tag_term("lead"), consent_term("email", "granted")]) == [
        0,
        0,
        0,
    ]
    assert contact_store.contact_search_scan(tenant_id, "ana") == []


def test_search_scan_lists_keys_by_prefix(contact_store: ContactStore, tenant_id: str) -> None:
    a = contact_store.contact_insert(tenant_id, _contact(Identity("whatsapp", "+573001112233"), name="Ana García"))
    b = contact_store.contact_insert(tenant_id, _contact(Identity("email", "anabel@example.com"), name="Luis"))
    hits = contact_store.contact_search_scan(tenant_id, "ana")
    assert hits == [("ana", a.id), ("anabel", b.id), ("anabel@example.com", b.id)]
    assert contact_store.contact_search_scan(tenant_id, "ana", after=hits[0], limit=1) == hits[1:2]
    assert contact_store.contact_search_scan(tenant_id, "300111") == [("3001112233", a.id)]
    assert contact_store.contact_search_scan(tenant_id, "57300") == [("573001112233", a.id)]
    with pytest.raises(ValidationError) as info:
        contact_store.contact_search_scan(tenant_id, "lu", after=hits[0])
    assert info.value.field == "after"


def test_term_and_search_pages_carry_the_contacts_they_list(contact_store: ContactStore, tenant_id: str) -> None:
    """contact_term_page / contact_search_page list what the scans list, each id with its stored contact."""
    made = [
        contact_store.contact_insert(
            tenant_id, _contact(Identity("telegram", str(500 + i)), name=f"Ana {i}", tags=("vip",) if i % 2 else ())
        )
        for i in range(5)
    ]
    changed = contact_store.contact_replace(tenant_id, replace(made[1], name="Anabel"), expected_version=1)
    vip = contact_store.contact_term_scan(tenant_id, tag_term("vip"))
    page = contact_store.contact_term_page(tenant_id, tag_term("vip"))
    assert page == list(zip(vip, contact_store.contact_get_many(tenant_id, vip), strict=True))
    assert page[0] == (changed.id, changed)
    assert contact_store.contact_term_page(tenant_id, tag_term("vip"), after=vip[0], limit=1) == page[1:2]
    hits = contact_store.contact_search_scan(tenant_id, "ana")
    found = contact_store.contact_search_page(tenant_id, "ana")
    assert [h for h, _ in found] == hits
    assert all(c is not None and c.id == h[1] for h, c in found)
    assert contact_store.contact_search_page(tenant_id, "ana", after=hits[0], limit=2) == found[1:3]
    assert contact_store.contact_term_page(tenant_id + "-b", tag_term("vip")) == []
    with pytest.raises(ValidationError) as info:
        contact_store.contact_term_page(tenant_id, tag_term("vip"), limit=1001)
    assert info.value.field == "limit"


def test_match_tests_rules_on_the_given_contacts(contact_store: ContactStore, tenant_id: str) -> None:
    made = [
        contact_store.contact_insert(tenant_id, _contact(Identity("telegram", str(100 + i)), attributes={"n": i % 2}))
        for i in range(4)
    ]
    ids = [c.id for c in made] + ["c_" + "f" * 22]
    rules = SegmentRules(attributes={"n": 0})
    assert contact_store.contact_match(tenant_id, ids, rules) == [made[0], made[2]]
    assert contact_store.contact_match_count(tenant_id, ids, rules) == 2
    assert contact_store.contact_match_count(tenant_id, ids, SegmentRules(attributes={"n": False})) == 0


def test_import_jobs_newest_first(contact_store: ContactStore, tenant_id: str) -> None:
    jobs = [
        contact_store.import_job_insert(tenant_id, ImportJob(new_id("imp"), "queued", f"{i}.csv"), "a,b\n")
        for i in range(5)
    ]
    contact_store.import_job_replace(tenant_id, replace(jobs[2], status="done"), expected_version=1)
    newest = contact_store.import_job_newest(tenant_id, limit=3)
    assert [j.id for j in newest] == [j.id for j in reversed(jobs)][:3]
    assert [j.status for j in contact_store.import_job_newest(tenant_id)][2] == "done"


# -- selectors on every store -----------------------------------------------------------------


def _seed(tenant: str) -> list[Contact]:
    rows = [
        (
            "Ana García",
            [{"channel": "whatsapp", "address": "3001112233"}, {"channel": "email", "address": "ana@example.com"}],
            ["vip"],
            {"plan": "pro"},
            {"whatsapp": "granted"},
        ),
        ("José Núñez", [{"channel": "whatsapp", "address": "3001114455"}], ["vip", "lead"], {"plan": 1}, {}),
        ("Luis", [{"channel": "email", "address": "luis@tienda.co"}], [], {"plan": "1"}, {"email": "granted"}),
        (None, [{"channel": "telegram", "address": "700001004"}], ["lead"], {"plan": True}, {"whatsapp": "granted"}),
    ]
    return [
        services.contact_create(
            tenant, name=n, identities=i, tags=t, attributes=a, consent={ch: {"status": s} for ch, s in c.items()}
        )
        for n, i, t, a, c in rows
    ]


def test_contact_list_filters_by_consent_attribute_and_text(crm: str) -> None:
    ana, jose, luis, anon = _seed(crm)
    assert [c.id for c in all_pages(crm, 2, consent="whatsapp:granted")] == [ana.id, anon.id]
    assert [c.id for c in all_pages(crm, 2, consent="whatsapp:unknown")] == [jose.id, luis.id]
    assert [c.id for c in all_pages(crm, 2, attributes={"plan": 1})] == [jose.id]
    assert [c.id for c in all_pages(crm, 2, attributes={"plan": "1"})] == [luis.id]
    assert [c.id for c in all_pages(crm, 2, attributes={"plan": 1.0}, tag="vip")] == [jose.id]
    assert [c.id for c in all_pages(crm, 1, q="nunez")] == [jose.id]
    assert [c.id for c in all_pages(crm, 1, q="300 111")] == [ana.id, jose.id]
    assert [c.id for c in all_pages(crm, 1, q="+57 300 111 44")] == [jose.id]
    assert [c.id for c in all_pages(crm, 1, q="ana@exa")] == [ana.id]
    assert [c.id for c in all_pages(crm, 1, q="tienda")] == [luis.id]
    assert [c.id for c in all_pages(crm, 1, q="7000010")] == [anon.id]
    assert [c.id for c in all_pages(crm, 1, q="ana gar", tag="vip")] == [ana.id]
    assert [c.id for c in all_pages(crm, 1, q="jose 300")] == [jose.id]
    assert all_pages(crm, 1, q="ana", tag="lead") == []
    assert all_pages(crm, 5, q="--") == []
    for bad, field in [
        ({"consent": "sms:granted"}, "consent"),
        ({"consent": "whatsapp"}, "consent"),
        ({"attributes": {"Plan": 1}}, "attributes.Plan"),
        ({"after": "qxx!"}, "after"),
    ]:
        with pytest.raises(ValidationError) as info:
            selectors.contact_list(crm, **bad)
        assert info.value.field == field
    text_next = selectors.contact_list(crm, limit=1, q="300").next
    assert text_next is not None and text_next.startswith("q")
    with pytest.raises(ValidationError):
        selectors.contact_list(crm, limit=1, after=text_next)  # a search cursor without the search
    assert selectors.contact_count(crm) == 4


def test_segment_counts_and_preview_follow_the_rules(crm: str) -> None:
    ana, jose, luis, anon = _seed(crm)
    cases = [
        ({}, 4),
        ({"tags_all": ["vip"]}, 2),
        ({"tags_none": ["vip"]}, 2),
        ({"tags_none": ["vip", "lead"]}, 1),
        ({"tags_any": ["vip", "lead"]}, 3),
        ({"consent_required": "whatsapp"}, 1),
        ({"attributes": {"plan": 1}}, 1),
        ({"tags_all": ["vip"], "consent_required": "whatsapp"}, 1),
        ({"tags_any": ["lead"], "tags_none": ["vip"]}, 1),
        ({"tags_all": ["vip", "lead"]}, 1),
    ]
    for rules, want in cases:
        assert selectors.segment_count(crm, rules) == want, rules
        preview = selectors.segment_preview(crm, rules, limit=2)
        everyone = [c for c in (ana, jose, luis, anon) if rules_match(segment_rules_from_input(rules), c)]
        assert preview.count == want and [c.id for c in preview.sample] == [c.id for c in everyone][:2]
        assert [c.id for c in selectors.segment_members(crm, rules)] == [c.id for c in everyone]
    segments = [services.segment_create(crm, name=str(rules), rules=rules) for rules, _ in cases]
    assert selectors.segment_counts(crm, segments) == {s.id: want for s, (_, want) in zip(segments, cases, strict=True)}


def test_import_list_is_newest_first(crm: str) -> None:
    jobs = [
        services.contact_import_start(crm, filename=f"{i}.csv", data="name,phone\nA,3001112233\n") for i in range(4)
    ]
    assert [j.id for j in selectors.import_job_list(crm, limit=3)] == [j.id for j in reversed(jobs)][:3]


# -- what a read costs ------------------------------------------------------------------------


class CountingKv:
    """A MemoryKv that counts the entries reads return (a page read must touch O(page))."""

    def __init__(self) -> None:
        self.inner = MemoryKv()
        self.read = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, table: str, key: str):  # type: ignore[no-untyped-def]
        self.read += 1
        return self.inner.get(table, key)

    def get_many(self, table: str, keys):  # type: ignore[no-untyped-def]
        self.read += len(keys)
        return self.inner.get_many(table, keys)

    def scan(self, table: str, prefix: str = "", after: str | None = None, limit: int = 100):  # type: ignore[no-untyped-def]
        found = self.inner.scan(table, prefix=prefix, after=after, limit=limit)
        self.read += len(found) + 1
        return found

    def scan_follow(
        self, table: str, prefix: str = "", after: str | None = None, limit: int = 100, *, field: str = "pk"
    ):  # type: ignore[no-untyped-def]
        pairs = self.inner.scan_follow(table, prefix=prefix, after=after, limit=limit, field=field)
        self.read += len(pairs) + sum(1 for _, target in pairs if target is not None) + 1
        return pairs


def test_reads_touch_a_page_not_the_tenant() -> None:
    """At 600 contacts, a filtered page, a search, a count and a single-rule segment read a few dozen entries."""
    kv = CountingKv()
    store = KvContactStore(kv)  # type: ignore[arg-type]
    tenant = unique_id()
    rng = random.Random(5)
    for i in range(600):
        tags = ("rare",) if i % 100 == 7 else ("common",)
        c = _contact(Identity("telegram", str(1000 + i)), name=f"Name{i} Surname", tags=tags, attributes={"n": i % 3})
        if rng.random() < 0.5:
            c = c.with_consent(Consent("telegram", "granted", 1, "t"))
        store.contact_insert(tenant, c)
    with use_store(store):

        def cost(read: Any) -> int:
            kv.read = 0
            read()
            return kv.read

        assert cost(lambda: selectors.contact_list(tenant, limit=20, tag="rare")) < 40
        assert cost(lambda: selectors.contact_list(tenant, limit=20, tag="common")) < 60
        assert cost(lambda: selectors.contact_list(tenant, limit=20, q="name12")) < 60
        assert cost(lambda: selectors.contact_list(tenant, limit=20, tag="common", q="name12")) < 60
        assert cost(lambda: selectors.contact_list(tenant, limit=20, tag="common", attributes={"n": 1})) < 200
        assert cost(lambda: selectors.contact_count(tenant)) < 5
        assert cost(lambda: selectors.segment_count(tenant, {"tags_all": ["common"]})) < 10
        assert cost(lambda: selectors.segment_count(tenant, {"tags_none": ["rare"]})) < 10
        assert cost(lambda: selectors.segment_count(tenant, {"consent_required": "telegram"})) < 10
        assert cost(lambda: selectors.segment_count(tenant, {"tags_all": ["rare"], "attributes": {"n": 1}})) < 40
        assert cost(lambda: selectors.segment_preview(tenant, {"tags_all": ["common"]}, limit=20)) < 60


def test_a_page_with_sparse_matches_stops_at_its_budget(memory_crm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter that few contacts of the walked list pass returns short pages with ``next``; all are found."""
    monkeypatch.setattr(selectors, "PAGE_BUDGET_MIN", 5)
    monkeypatch.setattr(selectors, "PAGE_BUDGET_PER_ITEM", 1)
    made = [
        services.contact_create(
            memory_crm,
            identities=[{"channel": "telegram", "address": str(10 + i)}],
            tags=["common"],
            attributes={"n": int(i % 7 == 0)},
        )
        for i in range(40)
    ]
    first = selectors.contact_list(memory_crm, limit=2, tag="common", attributes={"n": 1})
    assert len(first.items) <= 2 and first.next is not None
    found = all_pages(memory_crm, 2, tag="common", attributes={"n": 1})
    assert [c.id for c in found] == [c.id for i, c in enumerate(made) if i % 7 == 0]


def test_concurrent_writers_leave_counts_and_lists_exact(crm: str, contact_store: ContactStore) -> None:
    """4 threads add/remove tags and set consent on the same contacts: counters and lists match a scan."""
    import threading

    made = [
        services.contact_create(crm, identities=[{"channel": "whatsapp", "address": f"+57300111{i:04d}"}])
        for i in range(6)
    ]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(25):
                c = rng.choice(made)
                roll = rng.random()
                if roll < 0.4:
                    services.contact_tags_add(crm, c.id, tags=[rng.choice(TAGS)])
                elif roll < 0.7:
                    services.contact_tags_remove(crm, c.id, tags=[rng.choice(TAGS)])
                else:
                    services.consent_set(
                        crm, c.id, channel="whatsapp", status=rng.choice(CONSENT_STATUSES), source="test"
                    )
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    everyone = list(selectors.contact_iter(crm))
    for tag in TAGS:
        want = [c.id for c in everyone if tag in c.tags]
        assert selectors.segment_count(crm, {"tags_all": [tag]}) == len(want)
        assert [c.id for c in all_pages(crm, 2, tag=tag)] == want
    granted = [c.id for c in everyone if c.consent_status("whatsapp") == "granted"]
    assert selectors.segment_count(crm, {"consent_required": "whatsapp"}) == len(granted)
    if isinstance(contact_store, KvContactStore):
        table = TenantKv(contact_store.kv, "crm").table(crm, "contacts")
        layout = CONTACTS.layout(contact_store.kv)
        assert {n: layout.check(table, n) for n in layout.index_names()} == {
            n: {"missing": 0, "extra": 0, "wrong": 0} for n in layout.index_names()
        }


# -- upgrade: a table written before the indexes ------------------------------------------------


def test_contacts_written_before_the_indexes_are_indexed_by_the_online_build() -> None:
    kv = MemoryKv()
    tenant = unique_id()
    table = TenantKv(kv, "crm").table(tenant, "contacts")
    made = [_contact(Identity("telegram", str(500 + i)), tags=("vip",) if i % 2 else ()) for i in range(30)]
    for c in made:  # the layout of an installation from before the indexes
        kv.commit(
            table,
            [
                Put(f"c/{c.id}", c.to_json(), ABSENT),
                Put(f"i/telegram:{c.identities[0].address}", {"contact": c.id}, ABSENT),
            ],
        )
    store = KvContactStore(kv)
    with use_store(store), pytest.raises(IndexNotBuilt) as info:
        selectors.segment_count(tenant, {"tags_all": ["vip"]})
    assert "botmesh_reindex" in str(info.value)
    layout = CONTACTS.layout(kv)
    for name in layout.index_names():
        layout.build(table, name, batch=7)
    with use_store(store):
        assert selectors.segment_count(tenant, {"tags_all": ["vip"]}) == 15
        assert selectors.contact_count(tenant) == 30
    assert {name: sum(layout.check(table, name).values()) for name in layout.index_names()} == {
        name: 0 for name in layout.index_names()
    }


# -- the property: indexed reads equal their definition after random histories ------------------


channels_st = st.sampled_from(CHANNELS)
op_st = st.one_of(
    st.tuples(
        st.just("create"),
        st.sampled_from(NAMES),
        st.lists(st.sampled_from(TAGS), max_size=3),
        st.dictionaries(st.sampled_from(["plan", "n"]), st.sampled_from(ATTR_VALUES), max_size=2),
        st.integers(0, 40),
        st.booleans(),
    ),
    st.tuples(st.just("tag"), st.integers(0, 30), st.sampled_from(TAGS), st.booleans()),
    st.tuples(
        st.just("attr"), st.integers(0, 30), st.sampled_from(["plan", "n"]), st.sampled_from([*ATTR_VALUES, "remove"])
    ),
    st.tuples(st.just("consent"), st.integers(0, 30), channels_st, st.sampled_from(CONSENT_STATUSES)),
    st.tuples(st.just("rename"), st.integers(0, 30), st.sampled_from(NAMES)),
    st.tuples(st.just("erase"), st.integers(0, 30)),
)
rules_st = st.fixed_dictionaries(
    {
        "tags_all": st.lists(st.sampled_from(TAGS), max_size=2),
        "tags_any": st.lists(st.sampled_from(TAGS), max_size=2),
        "tags_none": st.lists(st.sampled_from(TAGS), max_size=2),
        "attributes": st.dictionaries(st.sampled_from(["plan", "n"]), st.sampled_from(ATTR_VALUES), max_size=1),
        "consent_required": st.one_of(st.none(), channels_st),
    }
)


def _ascii_word(name: str | None) -> str:
    return "".join(ch for ch in (name or "x").split()[0].lower() if ch.isascii() and ch.isalnum()) or "x"


def _apply(tenant: str, op: tuple[Any, ...], ids: list[str]) -> None:
    kind = op[0]
    if kind == "create":
        _, name, tags, attrs, n, with_email = op
        identities = [{"channel": "whatsapp", "address": f"+57300111{n:04d}"}]
        if with_email:
            identities.append({"channel": "email", "address": f"{_ascii_word(name)}{n}@example.com"})
        try:
            ids.append(
                services.contact_create(tenant, name=name, identities=identities, tags=tags, attributes=attrs).id
            )
        except (ValidationError, IdentityTaken):
            pass
        return
    if not ids:
        return
    contact_id = ids[op[1] % len(ids)]
    try:
        if kind == "tag":
            _, _, tag, add = op
            (services.contact_tags_add if add else services.contact_tags_remove)(tenant, contact_id, tags=[tag])
        elif kind == "attr":
            current = selectors.contact_get(tenant, contact_id)
            if op[3] == "remove":
                services.contact_update(tenant, contact_id, expected_version=current.version, remove_attributes=[op[2]])
            else:
                services.contact_update(tenant, contact_id, expected_version=current.version, attributes={op[2]: op[3]})
        elif kind == "consent":
            services.consent_set(tenant, contact_id, channel=op[2], status=op[3], source="test")
        elif kind == "rename":
            current = selectors.contact_get(tenant, contact_id)
            services.contact_update(tenant, contact_id, expected_version=current.version, name=op[2])
        elif kind == "erase":
            services.contact_erase(tenant, contact_id)
    except NotFound:
        pass  # erased before


def _check_reads(tenant: str, rules_list: list[dict[str, Any]]) -> None:
    everyone = sorted(selectors.contact_iter(tenant), key=lambda c: c.id)
    assert selectors.contact_count(tenant) == len(everyone)
    filters: list[dict[str, Any]] = [{"tag": t} for t in TAGS]
    filters += [{"consent": f"{ch}:{s}"} for ch in CHANNELS for s in CONSENT_STATUSES]
    filters += [{"attributes": {"plan": v}} for v in ATTR_VALUES]
    filters += [{"q": q} for q in QUERIES]
    filters += [
        {"tag": "vip", "q": "ana"},
        {"tag": "lead", "consent": "whatsapp:granted", "attributes": {"n": 1}},
        {"q": "ana", "attributes": {"plan": "pro"}},
        {"consent": "email:unknown", "q": "300"},
        {"tag": "vip", "consent": "whatsapp:unknown"},
        {"consent": "telegram:unknown", "attributes": {"n": 1}},
    ]
    for f in filters:
        want = [c for c in everyone if keeps(c, **f)]
        for limit in (1, 3):
            got = all_pages(tenant, limit, **f)
            got_ids = [c.id for c in got]
            assert len(got_ids) == len(set(got_ids)), f"listed twice: {f}"
            assert sorted(got_ids) == [c.id for c in want], f
            by_id = [c.id for c in want]
            if "q" not in f:
                assert got_ids == by_id, f"by id: {f}"
            elif not want:
                assert got_ids == []
            elif set(f) == {"q"}:
                assert got_ids in text_orders(want, f["q"]), f"by matching word: {f}"
            else:  # by id when a filter's list is short, else by matching word
                assert got_ids in [by_id, *text_orders(want, f["q"])], f
    segments = []
    for raw in rules_list:
        rules = segment_rules_from_input(raw)
        members = [c.id for c in everyone if rules_match(rules, c)]
        assert selectors.segment_count(tenant, raw) == len(members), raw
        assert [c.id for c in selectors.segment_members(tenant, raw)] == members, raw
        preview = selectors.segment_preview(tenant, raw, limit=3)
        assert (preview.count, [c.id for c in preview.sample]) == (len(members), members[:3]), raw
        segments.append(services.segment_create(tenant, name="s", rules=raw))
    expected = {s.id: sum(rules_match(s.rules, c) for c in everyone) for s in segments}
    assert selectors.segment_counts(tenant, segments) == expected


@pytest.mark.parametrize("store_name", ["kv-memory", "memory"])
@given(
    ops=st.lists(op_st, min_size=1, max_size=40),
    rules_list=st.lists(rules_st, min_size=1, max_size=4),
    small_budget=st.booleans(),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_indexed_reads_equal_a_full_scan_after_random_histories(
    store_name: str, ops: list[tuple[Any, ...]], rules_list: list[dict[str, Any]], small_budget: bool
) -> None:
    """Creates, tag/attribute/consent/name changes and erasures: every read equals its definition."""
    kv = MemoryKv()
    store: ContactStore = KvContactStore(kv) if store_name == "kv-memory" else MemoryContactStore()
    saved = (selectors.PAGE_BUDGET_MIN, selectors.PAGE_BUDGET_PER_ITEM)
    if small_budget:  # short pages with a next: the budget path and its cursors
        selectors.PAGE_BUDGET_MIN, selectors.PAGE_BUDGET_PER_ITEM = 2, 1
    try:
        with crm_tenant(store) as tenant:
            ids: list[str] = []
            for op in ops:
                _apply(tenant, op, ids)
            _check_reads(tenant, rules_list)
            if isinstance(store, KvContactStore):
                table = TenantKv(kv, "crm").table(tenant, "contacts")
                layout = CONTACTS.layout(kv)
                drift = {n: layout.check(table, n) for n in layout.index_names()}
                assert {n: r for n, r in drift.items() if any(r.values())} == {}
    finally:
        selectors.PAGE_BUDGET_MIN, selectors.PAGE_BUDGET_PER_ITEM = saved
