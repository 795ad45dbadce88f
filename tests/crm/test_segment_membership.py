"""Materialized segment membership (issue 16, item 3): kept in each contact's commit, built online.

A saved segment's count, preview and campaign plan are read from its
membership index once it is built; they must equal the definition computed by
a full scan of the contacts after any history of contact writes (erasure
included), segment creations, rule changes and deletions, and builds killed
midway and resumed.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from botmesh_admin.config import ConfigError, load
from botmesh_admin.errors import ValidationError
from botmesh_admin.kv import Put, TenantKv
from botmesh_admin.kv.memory import MemoryKv
from campaigns import selectors as campaign_selectors
from campaigns.domain import CHANNELS as CAMPAIGN_CHANNELS
from campaigns.domain.planning import Planner
from crm import selectors, services
from crm.domain import PLAN_CHANNELS, Identity, Segment, rules_match
from crm.stores import default_store
from crm.stores.kv import CONTACTS, KvContactStore

from .test_indexed_reads import CountingKv, _apply, _contact, crm_tenant, op_st, rules_st


class Killed(Exception):
    """A build stopped after its first batch (the process was killed)."""


def _kill_after_first_batch(done: int) -> None:
    raise Killed


def _built(store: KvContactStore, tenant: str, segment: Segment) -> bool:
    return segment.id in store.membership_counts(tenant, [segment], [("member",)])


def _check_segments(kv: MemoryKv, store: KvContactStore, tenant: str) -> None:
    """Every saved segment's reads equal the definition; the indexes and the membership have no drift."""
    everyone = sorted(selectors.contact_iter(tenant), key=lambda c: c.id)
    segments = selectors.segment_list(tenant)
    for segment in segments:
        members = [c.id for c in everyone if rules_match(segment.rules, c)]
        assert selectors.segment_count(tenant, segment.id) == len(members)
        preview = selectors.segment_preview(tenant, segment.id, limit=3)
        assert (preview.count, [c.id for c in preview.sample]) == (len(members), members[:3])
        for channel in CAMPAIGN_CHANNELS:
            quick = campaign_selectors.campaign_plan(tenant, segment_id=segment.id, channel=channel)
            full = Planner(tenant).plan(
                rules=segment.rules, channel=channel, keep=campaign_selectors.CONVERSATION_CHECK_PAGE
            )
            assert quick.counts == full.counts, (segment.rules, channel)
            assert quick.examples == full.examples, (segment.rules, channel)
            # The quick plan holds the recipients among the first members (a page): the walk's first ones.
            held = [r.contact_id for r in quick.recipients]
            assert held == [r.contact_id for r in full.recipients][: len(held)]
            assert len(held) >= min(10, full.counts.recipients)
    expected = {s.id: sum(rules_match(s.rules, c) for c in everyone) for s in segments}
    assert selectors.segment_counts(tenant, segments) == expected
    table = TenantKv(kv, "crm").table(tenant, "contacts")
    layout = CONTACTS.layout(kv)
    drift = {n: layout.check(table, n) for n in layout.index_names()}
    assert {n: r for n, r in drift.items() if any(r.values())} == {}
    assert store.membership_check(tenant)["wrong"] == 0


segment_op_st = st.one_of(
    st.tuples(st.just("segment_create"), rules_st),
    st.tuples(st.just("segment_rules"), st.integers(0, 5), rules_st),
    st.tuples(st.just("segment_rename"), st.integers(0, 5)),
    st.tuples(st.just("segment_delete"), st.integers(0, 5)),
    st.tuples(st.just("build"), st.booleans()),
)


def _apply_segment_op(store: KvContactStore, tenant: str, op: tuple[Any, ...]) -> None:
    segments = selectors.segment_list(tenant)
    if op[0] == "segment_create":
        services.segment_create(tenant, name="s", rules=op[1])
    elif op[0] == "build":
        try:
            # A batch of 2 contacts; a killed build continues from its cursor on the next one.
            default_store().membership_build(tenant, batch=2, progress=_kill_after_first_batch if op[1] else None)
        except Killed:
            pass
    elif segments:
        segment = segments[op[1] % len(segments)]
        if op[0] == "segment_rules":
            services.segment_update(tenant, segment.id, expected_version=segment.version, rules=op[2])
        elif op[0] == "segment_rename":
            services.segment_update(tenant, segment.id, expected_version=segment.version, name="renamed")
            assert _built(store, tenant, segment) == _built(store, tenant, selectors.segment_get(tenant, segment.id))
        else:
            services.segment_delete(tenant, segment.id)


@given(ops=st.lists(st.one_of(op_st, segment_op_st), min_size=1, max_size=50))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_segment_reads_equal_a_full_scan_after_random_histories(ops: list[tuple[Any, ...]]) -> None:
    """Contact writes (erasure too), segment saves, rule changes, deletes and killed builds, in any order."""
    kv = MemoryKv()
    store = KvContactStore(kv)
    with crm_tenant(store) as tenant:
        ids: list[str] = []
        for op in ops:
            if op[0] in ("segment_create", "segment_rules", "segment_rename", "segment_delete", "build"):
                _apply_segment_op(store, tenant, op)
            else:
                _apply(tenant, op, ids)
        _check_segments(kv, store, tenant)  # built or not, every read is exact
        services.segment_membership_build(tenant)
        assert store.membership_pending(tenant) == []
        assert all(_built(store, tenant, s) for s in selectors.segment_list(tenant))
        _check_segments(kv, store, tenant)


def _seed(tenant: str, n: int) -> None:
    for i in range(n):
        services.contact_create(
            tenant,
            identities=[{"channel": "whatsapp", "address": f"+57300222{i:04d}"}],
            tags=["vip", "pro"] if i % 3 == 0 else ["vip"],
            attributes={"n": i % 4},
            consent={"whatsapp": "granted" if i % 2 == 0 else "denied"},
        )


def test_a_built_segment_counts_in_one_counter_and_previews_one_page() -> None:
    """At 300 contacts, a three-rule segment's count reads a few entries once built (before: its lists)."""
    kv = CountingKv()
    store = KvContactStore(kv)  # type: ignore[arg-type]
    with crm_tenant(store) as tenant:
        _seed(tenant, 300)
        rules = {"tags_all": ["vip", "pro"], "attributes": {"n": 0}, "consent_required": "whatsapp"}
        segment = services.segment_create(tenant, name="vip pro", rules=rules)
        want = sum(1 for i in range(300) if i % 12 == 0)

        def cost(read: Callable[[], Any]) -> tuple[Any, int]:
            kv.read = 0
            answer = read()
            return answer, kv.read

        count, before = cost(lambda: selectors.segment_count(tenant, segment.id))
        assert count == want and before > 50  # not built yet: the posting lists
        assert services.segment_membership_build(tenant) == 300
        count, after = cost(lambda: selectors.segment_count(tenant, segment.id))
        assert count == want and after < 8
        preview, read = cost(lambda: selectors.segment_preview(tenant, segment.id, limit=5))
        assert preview.count == want and len(preview.sample) == 5 and read < 30
        counts, read = cost(lambda: selectors.segment_counts(tenant, selectors.segment_list(tenant)))
        assert counts == {segment.id: want} and read < 12
        plan, read = cost(lambda: campaign_selectors.campaign_plan(tenant, segment_id=segment.id, channel="whatsapp"))
        assert plan.counts.recipients == want and read < 120  # counters, ≤ 50 members and ≤ 50 contacts


def test_a_segment_saved_in_a_tenant_without_contacts_is_built_at_once_and_kept_by_writes() -> None:
    kv = MemoryKv()
    store = KvContactStore(kv)
    with crm_tenant(store) as tenant:
        segment = services.segment_create(tenant, name="vip", rules={"tags_all": ["vip"]})
        assert store.membership_pending(tenant) == []
        _seed(tenant, 20)
        assert store.membership_counts(tenant, [segment], [("member",)]) == {segment.id: [20]}
        _check_segments(kv, store, tenant)


def test_membership_stays_exact_while_writers_run_during_the_build() -> None:
    """Four threads change tags and consent while the membership builds in batches of 5."""
    kv = MemoryKv()
    store = KvContactStore(kv)
    with crm_tenant(store) as tenant:
        _seed(tenant, 80)
        services.segment_create(tenant, name="pro", rules={"tags_all": ["pro"], "consent_required": "whatsapp"})
        ids = [c.id for c in selectors.contact_iter(tenant)]
        errors: list[BaseException] = []

        def writer(k: int) -> None:
            try:
                for n, contact_id in enumerate(ids[k::4]):
                    if n % 2:
                        services.contact_tags_add(tenant, contact_id, tags=["pro"])
                    else:
                        services.consent_set(tenant, contact_id, channel="whatsapp", status="granted", source="test")
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        store.membership_build(tenant, batch=5)
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        assert store.membership_pending(tenant) == []
        _check_segments(kv, store, tenant)


def test_segments_are_capped_by_botmesh_crm_max_segments(memory_crm: str) -> None:
    with override_settings(BOTMESH_CRM_MAX_SEGMENTS=2):
        services.segment_create(memory_crm, name="a", rules={})
        services.segment_create(memory_crm, name="b", rules={})
        with pytest.raises(ValidationError) as caught:
            services.segment_create(memory_crm, name="c", rules={})
    assert caught.value.field == "segment"
    assert "at most 2 segments" in caught.value.message


@pytest.mark.parametrize("raw", ["0", "501", "many"])
def test_a_bad_botmesh_crm_max_segments_is_refused_at_start(raw: str, tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match="BOTMESH_CRM_MAX_SEGMENTS"):
        load({"BOTMESH_CRM_MAX_SEGMENTS": raw, "BOTMESH_DATA_DIR": str(tmp_path)}, base_dir=tmp_path)


def test_the_campaign_channels_are_the_ones_membership_judges() -> None:
    assert PLAN_CHANNELS == CAMPAIGN_CHANNELS


@pytest.mark.django_db
def test_check_indexes_reports_and_repairs_wrong_membership(tenant_id: str) -> None:
    """A contact whose stored membership disagrees with the rules is drift (exit 1); --repair rebuilds it."""
    from botmesh_admin.kv.runtime import default_kv
    from botmesh_admin.tenancy.models import Tenant

    Tenant.objects.create(id=tenant_id, name="Segments")
    kv = default_kv()
    store = KvContactStore(kv)
    with crm_tenant(store) as tenant:
        tenant = tenant_id  # the Django tenant, whose tables the commands walk
        selectors._regions[tenant] = ("CO", float("inf"))
        segment = services.segment_create(tenant, name="vip", rules={"tags_all": ["vip"]})
        contact = store.contact_insert(tenant, _contact(Identity("telegram", "4242"), tags=("vip",)))
        table = TenantKv(kv, "crm").table(tenant, "contacts")
        entry = kv.get(table, f"m/{contact.id}")
        assert entry is not None
        kv.commit(table, [Put(f"m/{contact.id}", {"k": []}, entry.version)])  # by hand: no upkeep
        with pytest.raises(CommandError, match="drift"):
            _run("botmesh_check_indexes", "--tenant", tenant)
        out = _run("botmesh_check_indexes", "--tenant", tenant, "--repair")
        assert "1 contacts with wrong segment membership); rebuilt" in out
        assert "0 drifting" in _run("botmesh_check_indexes", "--tenant", tenant)
        assert selectors.segment_count(tenant, segment.id) == 1


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_segments_saved_before_membership_existed_are_built_by_botmesh_reindex(tenant_id: str) -> None:
    """An upgraded installation: segments without definitions read the posting lists until the command ran."""
    from botmesh_admin.kv.runtime import default_kv
    from botmesh_admin.tenancy.models import Tenant
    from crm.domain import SegmentRules, new_id

    Tenant.objects.create(id=tenant_id, name="Upgraded")
    store = KvContactStore(default_kv())
    with crm_tenant(store):
        selectors._regions[tenant_id] = ("CO", float("inf"))
        for i in range(30):
            store.contact_insert(tenant_id, _contact(Identity("telegram", str(500 + i)), tags=("vip",) * (i % 2)))
        segment = store.segment_insert(tenant_id, Segment(new_id("s"), "vip", SegmentRules(tags_all=("vip",))))
        assert not _built(store, tenant_id, segment)
        assert selectors.segment_count(tenant_id, segment.id) == 15  # from the posting list meanwhile
        out = _run("botmesh_reindex", "--tenant", tenant_id)
        assert f"{tenant_id} crm/contacts (derived): 30 records read, built" in out
        assert _built(store, tenant_id, segment)
        assert selectors.segment_count(tenant_id, segment.id) == 15
        assert "(derived)" not in _run("botmesh_reindex", "--tenant", tenant_id)  # nothing left to do
