"""An inbox written before its indexes existed: ``botmesh_reindex`` builds them, ``inbox.tick`` backfills.

The legacy table is what the previous version of the Kv store left: the
records, an activity copy per conversation under ``a/`` and read markers
without ``seen_inbound``, and no index at all.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from botmesh_admin.coordination.registry import declared_jobs
from botmesh_admin.kv import Delete, Put
from botmesh_admin.kv import indexes as kv_indexes
from botmesh_admin.kv.indexes import IndexNotBuilt, declared
from botmesh_admin.kv.runtime import default_kv
from inbox import selectors, services
from inbox.services import conversation_assign, message_project, read_marker_set
from inbox.stores import use_store
from inbox.stores.base import InboxStore
from inbox.stores.kv import CONVERSATIONS, KvInboxStore, activity_key

pytestmark = pytest.mark.django_db

T0 = 1_764_489_600_000
CHATS = ("whatsapp:573001112233", "whatsapp:573001112244", "telegram:700000001")


def ledger(tenant: str, mid: str, ts: int, chat: str, direction: str = "in") -> dict:
    return {
        "id": mid,
        "tenantId": tenant,
        "channel": chat.split(":")[0],
        "chatId": chat,
        "senderId": "user:1" if direction == "in" else "bot",
        "direction": direction,
        "type": "text",
        "body": "hola",
        "timestamp": T0 + ts,
    }


def make_legacy(store: KvInboxStore, tenant: str) -> None:
    """Turn the tenant's table into what the previous version of the store wrote."""
    table = store._table(tenant)
    kv = store.kv
    for e in kv.scan(table, prefix="x/", limit=10_000):
        kv.commit(table, [Delete(e.key)])
    for name in CONVERSATIONS.layout(kv).index_names():
        kv_indexes._built.forget(kv, table, name)  # as a process started after the upgrade
    for e in kv.scan(table, prefix="r/", limit=10_000):
        if isinstance(e.value, dict):
            legacy = {k: v for k, v in e.value.items() if k not in ("seen_inbound", "assignee")}
            kv.commit(table, [Put(e.key, legacy)])
        else:
            kv.commit(table, [Delete(e.key)])  # the markers' counter is new too
    for e in kv.scan(table, prefix="k/", limit=10_000):
        copy = dict(e.value, _revision=e.version)
        kv.commit(table, [Put(activity_key(e.value["id"], e.value["last_activity_ms"]), copy)])


@pytest.fixture
def legacy(tenant_id: str) -> tuple[InboxStore, str]:
    from botmesh_admin.tenancy.models import Tenant

    Tenant.objects.create(id=tenant_id, name="Legacy")
    inbox = KvInboxStore(default_kv())
    with use_store(inbox):
        for i in range(12):
            message_project(None, ledger(tenant_id, f"m{i}", i * 10, CHATS[i % 3], "in" if i % 4 else "out"))
        for n, chat in enumerate(CHATS):
            conv = inbox.conversation_by_chat(tenant_id, chat)
            assert conv is not None
            read_marker_set(tenant_id, conv.id, agent="ana", message_id=f"m{n}")
            if n == 0:
                conversation_assign(tenant_id, conv.id, agent="ana", expected_version=conv.version)
        message_project(None, ledger(tenant_id, "late", 5, CHATS[1]))  # before ana's marker there
    make_legacy(inbox, tenant_id)  # type: ignore[arg-type]
    return inbox, tenant_id


def unread_definition(inbox: InboxStore, tenant: str, view: str) -> int:
    total = 0
    for chat in CHATS:
        conv = inbox.conversation_by_chat(tenant, chat)
        assert conv is not None
        if view == "mine" and conv.assignee != "ana" or view == "unassigned" and conv.assignee is not None:
            continue
        marker = inbox.marker_get(tenant, conv.id, "ana")
        after = "" if marker is None else marker.message_sort_key
        messages = inbox.message_page(tenant, conv.id, limit=1000)
        total += sum(1 for m in messages if m.direction == "in" and m.sort_key > after)
    return total


def test_the_inbox_declares_its_collection_and_its_tick() -> None:
    """``botmesh_reindex`` finds the inbox's indexes; the wake-up runs as a durable job."""
    assert any(c.package == "inbox" and c.collection == "conversations" for c in declared())
    job = next(j for j in declared_jobs() if j.id == "inbox.tick")
    assert job.defaults.schedule.every_s == services.TICK_EVERY_S and job.durable


def test_reindex_then_tick_upgrade_a_legacy_inbox_exactly(legacy: tuple[InboxStore, str]) -> None:
    """Before the reindex the lists say which command to run; after it every count is exact."""
    inbox, tenant = legacy
    with pytest.raises(IndexNotBuilt) as err:
        selectors.conversation_list(tenant, agent="ana", store=inbox)
    assert "botmesh_reindex" in str(err.value)
    out = io.StringIO()
    call_command("botmesh_reindex", "--tenant", tenant, stdout=out)
    assert f"{tenant} inbox/conversations conv_list: 3 records indexed, built" in out.getvalue()
    expected = {v: unread_definition(inbox, tenant, v) for v in ("all", "mine", "unassigned")}
    assert expected["all"] > 0
    # Markers without a count yet: rows and totals are counted by reading the messages (exact).
    assert inbox.unread_sum(tenant, agent="ana") is None
    for view, total in expected.items():
        assert selectors.unread_total(tenant, agent="ana", view=view, store=inbox) == total
    rows, _ = selectors.conversation_list(tenant, agent="ana", store=inbox)
    assert len(rows) == 3
    counts = services.inbox_tick()
    assert counts["backfilled"] == 3 + 3  # three markers counted, three activity copies removed
    table = inbox._table(tenant)  # type: ignore[attr-defined]
    assert default_kv().scan(table, prefix="a/", limit=10) == []
    for view, total in expected.items():
        assert inbox.unread_sum(tenant, agent="ana", view=view) == total
        assert selectors.unread_total(tenant, agent="ana", view=view, store=inbox) == total
    layout = CONVERSATIONS.layout(default_kv())
    assert {n: layout.check(table, n) for n in layout.index_names()} == {
        n: {"missing": 0, "extra": 0, "wrong": 0} for n in layout.index_names()
    }
    assert services.inbox_tick()["backfilled"] == 0
