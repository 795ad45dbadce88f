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


def make_generation_1(store: KvInboxStore, tenant: str) -> int:
    """Rewrite ``conv_text``, ``conv_contact`` and ``conv_list`` as generation 1 left them.

    Return how many ``conv_contact`` entries there are.
    """
    from botmesh_admin.kv.indexes import encode

    table = store._table(tenant)
    kv = store.kv
    records = {e.key: e.value for e in kv.scan(table, prefix="k/", limit=1000)}
    for e in kv.scan(table, prefix="x/conv_text/", limit=1000):
        r = records[e.value["pk"]]
        kv.commit(table, [Put(e.key, {"pk": e.value["pk"], "at": r["last_activity_ms"], "id": r["id"]})])
    linked = 0
    for e in kv.scan(table, prefix="x/conv_contact/", limit=1000):
        r = records[e.value["pk"]]
        old_key = "x/conv_contact/" + encode((r["contact_id"], -r["last_activity_ms"])) + e.value["pk"]
        position = {"pk": e.value["pk"], "at": r["last_activity_ms"], "id": r["id"]}
        kv.commit(table, [Delete(e.key), Put(old_key, position)])
        linked += 1
    for e in kv.scan(table, prefix="x/conv_list/", limit=1000):  # no inbound count in the entries
        kv.commit(table, [Put(e.key, {k: v for k, v in e.value.items() if k != "n"})])
    for name in ("conv_text", "conv_contact", "conv_list"):
        kv.commit(table, [Put(f"x/{name}", {"state": "built"})])  # built, at generation 1 (no "generation")
    kv_indexes.forget_cached_states(kv, table)  # as a process of this release, started after the upgrade
    return linked


def test_a_table_built_at_generation_1_upgrades_the_list_in_place_and_rebuilds_search(tenant_id: str) -> None:
    """Search and a contact's conversations name the command until it runs; the lists answer throughout."""
    from botmesh_admin.channels.domain import InboundMessage
    from botmesh_admin.tenancy.models import Tenant
    from inbox.services import event_project

    def inbound(chat: str, pid: str, ts: int) -> InboundMessage:
        channel = chat.split(":")[0]
        return InboundMessage(
            channel=channel, chat_key=chat, sender_id=chat, provider_message_id=pid, type="text", text="hola",
            timestamp_ms=T0 + ts, sender_name="Ana María",
        )  # fmt: skip

    Tenant.objects.create(id=tenant_id, name="Generations")
    inbox = KvInboxStore(default_kv())
    with use_store(inbox):
        for i in range(9):  # the channels' path: each sender becomes (and is linked to) a CRM contact
            event_project(tenant_id, inbound(CHATS[i % 3], f"wamid.g{i}", i * 10))
    linked = [c for c in (inbox.conversation_by_chat(tenant_id, chat) for chat in CHATS) if c and c.contact_id]
    assert linked, "projection links senders to CRM contacts"
    contact_id = linked[0].contact_id
    assert make_generation_1(inbox, tenant_id) == len(linked)
    layout = CONVERSATIONS.layout(default_kv())
    table = inbox._table(tenant_id)
    assert layout.state(table, "conv_text") == "stale" and layout.state(table, "conv_list") == "stale"
    rows, _ = selectors.conversation_list(tenant_id, agent="ana", store=inbox)
    assert len(rows) == 3  # the main list never waits: generation 2 reads generation 1's entries
    unread, _ = selectors.conversation_list(tenant_id, agent="ana", unread_only=True, store=inbox)
    assert [r.unread for r in unread] == [3, 3, 3]  # entries without their inbound count: records read
    with pytest.raises(IndexNotBuilt, match="botmesh_reindex"):
        selectors.conversation_search(tenant_id, "573001112233", agent="ana", store=inbox)
    with pytest.raises(IndexNotBuilt, match="botmesh_reindex"):
        selectors.conversation_list(tenant_id, agent="ana", contact_id=contact_id, store=inbox)
    with use_store(inbox):  # a message meanwhile: writers keep maintaining the stale indexes
        event_project(tenant_id, inbound(CHATS[0], "wamid.late", 500))
    out = io.StringIO()
    call_command("botmesh_reindex", "--tenant", tenant_id, stdout=out)
    assert f"{tenant_id} inbox/conversations conv_text: 3 records indexed, built" in out.getvalue()
    assert f"{tenant_id} inbox/conversations conv_list: 3 records indexed, built" in out.getvalue()  # in place
    assert f"{tenant_id} inbox/conversations conv_channel:" not in out.getvalue()  # built: left alone
    assert layout.state(table, "conv_list") == "built"
    assert all(isinstance(e.value.get("n"), int) for e in default_kv().scan(table, prefix="x/conv_list/"))
    found, _ = selectors.conversation_search(tenant_id, "573001112233", agent="ana", store=inbox)
    assert [r.conversation.chat_key for r in found] == [CHATS[0]]
    mine, _ = selectors.conversation_list(tenant_id, agent="ana", contact_id=contact_id, store=inbox)
    assert {r.conversation.id for r in mine} == {c.id for c in linked if c.contact_id == contact_id}
    assert {n: layout.check(table, n) for n in layout.index_names()} == {
        n: {"missing": 0, "extra": 0, "wrong": 0} for n in layout.index_names()
    }


def make_generation_2_lists(store: KvInboxStore, tenant: str) -> None:
    """Rewrite ``conv_list`` and ``conv_channel`` as generations 2 and 1 left them; drop ``conv_names``.

    ``conv_list`` then also held ``("sc", status, channel)`` and ``("asc", …)``
    entries; ``conv_channel`` keyed ``(status, channel_name)`` without the kind.
    """
    from botmesh_admin.kv.indexes import encode

    table = store._table(tenant)
    kv = store.kv
    for e in kv.scan(table, prefix="x/conv_channel/", limit=1000) + kv.scan(table, prefix="x/conv_names/"):
        kv.commit(table, [Delete(e.key)])
    for key, r in ((e.key, e.value) for e in kv.scan(table, prefix="k/", limit=1000)):
        at, entry = -r["last_activity_ms"], {"pk": key, "at": r["last_activity_ms"], "id": r["id"]}
        listed = dict(entry, n=r["inbound_count"])
        status, channel, name, assignee = r["status"], r["channel"], r["channel_name"], r["assignee"]
        kv.commit(
            table,
            [
                Put("x/conv_list/" + encode(("sc", status, channel, at)) + key, listed),
                Put("x/conv_list/" + encode(("asc", assignee, status, channel, at)) + key, listed),
                Put("x/conv_channel/" + encode(("sn", status, name, at)) + key, entry),
                Put("x/conv_channel/" + encode(("asn", assignee, status, name, at)) + key, entry),
            ],
        )
    kv.commit(
        table,
        [
            Put("x/conv_list", {"state": "built", "generation": 2}),
            Put("x/conv_channel", {"state": "built"}),
            Delete("x/conv_names"),
        ],
    )
    kv_indexes.forget_cached_states(kv, table)  # as a process of this release, started after the upgrade


def test_lists_of_generation_2_upgrade_in_place_and_filtered_lists_name_the_command(tenant_id: str) -> None:
    """conv_list's status × channel entries are swept in place; conv_channel is rebuilt with the kind."""
    from botmesh_admin.channels.domain import InboundMessage
    from botmesh_admin.kv.indexes import encode
    from botmesh_admin.tenancy.models import Tenant
    from inbox.services import event_project

    def inbound(chat: str, pid: str, ts: int) -> InboundMessage:
        return InboundMessage(
            channel=chat.split(":")[0], chat_key=chat, sender_id=chat, provider_message_id=pid, type="text",
            text="hola", timestamp_ms=T0 + ts,
        )  # fmt: skip

    Tenant.objects.create(id=tenant_id, name="Lists")
    inbox = KvInboxStore(default_kv())
    with use_store(inbox):
        for i in range(6):
            event_project(tenant_id, inbound(CHATS[i % 3], f"wamid.l{i}", i * 10))
        whatsapp = inbox.conversation_by_chat(tenant_id, CHATS[0])
        assert whatsapp is not None
        conversation_assign(tenant_id, whatsapp.id, agent="ana", expected_version=whatsapp.version)
    make_generation_2_lists(inbox, tenant_id)
    layout = CONVERSATIONS.layout(default_kv())
    table = inbox._table(tenant_id)
    assert (layout.state(table, "conv_list"), layout.state(table, "conv_channel")) == ("stale", "stale")
    assert layout.state(table, "conv_names") is None
    rows, _ = selectors.conversation_list(tenant_id, agent="ana", store=inbox)
    assert [r.conversation.chat_key for r in rows] == [CHATS[2], CHATS[1], CHATS[0]]  # the main list answers
    mine, _ = selectors.conversation_list(tenant_id, agent="ana", view="mine", store=inbox)
    assert [r.conversation.chat_key for r in mine] == [CHATS[0]]
    with pytest.raises(IndexNotBuilt, match="botmesh_reindex"):
        selectors.conversation_list(tenant_id, agent="ana", status="open", store=inbox)
    with use_store(inbox):  # a message meanwhile: writers keep maintaining what is readable
        event_project(tenant_id, inbound(CHATS[1], "wamid.late", 500))
    out = io.StringIO()
    call_command("botmesh_reindex", "--tenant", tenant_id, stdout=out)
    for name in ("conv_list", "conv_channel", "conv_names"):
        assert f"{tenant_id} inbox/conversations {name}: 3 records indexed, built" in out.getvalue()
    entries = default_kv().scan(table, prefix="x/conv_list/", limit=100)
    assert len(entries) == 3 * 2  # "-" and "a" per conversation: the status × channel entries swept
    dropped = tuple("x/conv_list/" + encode([tag]) for tag in ("sc", "asc"))
    assert not [e.key for e in entries if e.key.startswith(dropped)]
    open_rows, _ = selectors.conversation_list(tenant_id, agent="ana", status="open", store=inbox)
    assert [r.conversation.chat_key for r in open_rows] == [CHATS[1], CHATS[2], CHATS[0]]
    telegram, _ = selectors.conversation_list(tenant_id, agent="ana", channel="telegram", store=inbox)
    assert [r.conversation.chat_key for r in telegram] == [CHATS[2]]
    mine_whatsapp, _ = selectors.conversation_list(
        tenant_id, agent="ana", view="mine", status="open", channel="whatsapp", store=inbox
    )
    assert [r.conversation.chat_key for r in mine_whatsapp] == [CHATS[0]]
    assert {n: layout.check(table, n) for n in layout.index_names()} == {
        n: {"missing": 0, "extra": 0, "wrong": 0} for n in layout.index_names()
    }
