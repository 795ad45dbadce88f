"""The InboxStore contract, over the memory store and the Kv store on every Kv backend."""

from __future__ import annotations

import pytest

from botmesh_admin.errors import Conflict, NotFound, ValidationError
from inbox.domain import Conversation, Message, Note, ReadMarker, new_conversation_id, replace
from inbox.stores.base import Change, InboxStore


def conversation(chat_key: str = "whatsapp:573001112233", at: int = 1000, **kw) -> Conversation:
    return Conversation(
        id=new_conversation_id(),
        chat_key=chat_key,
        channel="whatsapp",
        created_at_ms=at,
        last_activity_ms=at,
        **kw,
    )


def message(conv: Conversation, mid: str, ts: int, direction: str = "in", **kw) -> Message:
    return Message(
        id=mid, conversation_id=conv.id, direction=direction, type="text", timestamp_ms=ts, text=f"text {mid}", **kw
    )


def test_store_is_an_inbox_store(inbox_store):
    assert isinstance(inbox_store, InboxStore)


def test_write_creates_conversation_and_message_atomically(inbox_store, tenant_id):
    conv = conversation()
    done = inbox_store.write(tenant_id, Change(conversation=conv, messages=(message(conv, "m1", 5),)))
    assert done.conversation.revision == 1
    assert done.messages[0].revision == 1
    assert inbox_store.conversation_get(tenant_id, conv.id) == done.conversation
    assert inbox_store.conversation_by_chat(tenant_id, conv.chat_key).id == conv.id
    assert inbox_store.message_get(tenant_id, "m1").text == "text m1"


def test_second_conversation_for_one_chat_key_conflicts(inbox_store, tenant_id):
    inbox_store.write(tenant_id, Change(conversation=conversation()))
    with pytest.raises(Conflict):
        inbox_store.write(tenant_id, Change(conversation=conversation()))


def test_stale_revision_conflicts_and_writes_nothing(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    inbox_store.write(tenant_id, Change(conversation=replace(conv, status="pending")))
    with pytest.raises(Conflict):
        inbox_store.write(
            tenant_id, Change(conversation=replace(conv, status="resolved"), messages=(message(conv, "m1", 5),))
        )
    assert inbox_store.conversation_get(tenant_id, conv.id).status == "pending"
    assert inbox_store.message_get(tenant_id, "m1") is None


def test_a_message_id_is_claimed_once(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    conv = inbox_store.write(tenant_id, Change(conversation=conv, messages=(message(conv, "m1", 5),))).conversation
    with pytest.raises(Conflict):
        inbox_store.write(tenant_id, Change(conversation=conv, messages=(message(conv, "m1", 9),)))
    assert [m.timestamp_ms for m in inbox_store.message_page(tenant_id, conv.id)] == [5]


def test_messages_are_ordered_by_timestamp_then_id(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    for mid, ts in (("b", 30), ("a", 10), ("late", 20), ("c", 30)):
        conv = inbox_store.write(tenant_id, Change(conversation=conv, messages=(message(conv, mid, ts),))).conversation
    assert [m.id for m in inbox_store.message_page(tenant_id, conv.id)] == ["a", "late", "b", "c"]
    first = inbox_store.message_page(tenant_id, conv.id, limit=2)
    rest = inbox_store.message_page(tenant_id, conv.id, after=first[-1].sort_key)
    assert [m.id for m in rest] == ["b", "c"]


def test_message_update_expects_its_revision(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    m = inbox_store.write(tenant_id, Change(conversation=conv, messages=(message(conv, "m1", 5),))).messages[0]
    updated = inbox_store.write(tenant_id, Change(messages=(replace(m, status="read"),))).messages[0]
    assert updated.revision == m.revision + 1
    with pytest.raises(Conflict):
        inbox_store.write(tenant_id, Change(messages=(replace(m, status="delivered"),)))
    assert inbox_store.message_get(tenant_id, "m1").status == "read"


def test_provider_id_and_aliases_find_the_message(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    m = message(conv, "msg_1", 5, provider_message_id="wamid.A")
    m = inbox_store.write(tenant_id, Change(conversation=conv, messages=(m,))).messages[0]
    assert inbox_store.message_by_provider_id(tenant_id, "wamid.A").id == "msg_1"
    inbox_store.write(tenant_id, Change(messages=(replace(m, aliases=("wamid.A",)),), aliases=(("wamid.A", m),)))
    assert inbox_store.message_get(tenant_id, "wamid.A").id == "msg_1"
    with pytest.raises(Conflict):
        again = inbox_store.message_get(tenant_id, "msg_1")
        inbox_store.write(tenant_id, Change(messages=(again,), aliases=(("wamid.A", again),)))


def test_removing_a_placeholder_and_putting_its_successor_is_one_write(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    ph = message(
        conv, "wamid.X", 50, direction="out", provider_message_id="wamid.X", placeholder=True, aliases=("wamid.R",)
    )
    done = inbox_store.write(tenant_id, Change(conversation=conv, messages=(ph,)))
    conv, ph = done.conversation, done.messages[0]
    real = message(conv, "msg_9", 40, direction="out", provider_message_id="wamid.X", aliases=("wamid.R",))
    inbox_store.write(tenant_id, Change(conversation=conv, messages=(real,), removed=(ph,)))
    assert [m.id for m in inbox_store.message_page(tenant_id, conv.id)] == ["msg_9"]
    assert inbox_store.message_by_provider_id(tenant_id, "wamid.X").id == "msg_9"
    assert inbox_store.message_get(tenant_id, "wamid.R").id == "msg_9"
    assert inbox_store.message_get(tenant_id, "wamid.X") is None


def test_conversations_list_newest_activity_first_with_cursor(inbox_store, tenant_id):
    ids = []
    for i, at in enumerate((300, 100, 200)):
        conv = conversation(chat_key=f"whatsapp:57300000000{i}", at=at)
        ids.append(inbox_store.write(tenant_id, Change(conversation=conv)).conversation.id)
    page, cursor = inbox_store.conversation_page(tenant_id, limit=2)
    assert [c.last_activity_ms for c in page] == [300, 200]
    rest, end = inbox_store.conversation_page(tenant_id, after=cursor, limit=2)
    assert [c.last_activity_ms for c in rest] == [100] and end is None
    # Activity moves a conversation to the top; the listing keeps one row per conversation.
    oldest = inbox_store.conversation_get(tenant_id, ids[1])
    inbox_store.write(tenant_id, Change(conversation=replace(oldest, last_activity_ms=999)))
    page, _ = inbox_store.conversation_page(tenant_id, limit=10)
    assert [c.last_activity_ms for c in page] == [999, 300, 200]
    assert page[0].revision == inbox_store.conversation_get(tenant_id, ids[1]).revision


def test_tenants_are_isolated(inbox_store, tenant_id):
    other = tenant_id + "-b"
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    inbox_store.write(tenant_id, Change(conversation=conv, messages=(message(conv, "m1", 5),)))
    assert inbox_store.conversation_get(other, conv.id) is None
    assert inbox_store.conversation_by_chat(other, conv.chat_key) is None
    assert inbox_store.message_get(other, "m1") is None
    assert inbox_store.conversation_page(other) == ([], None)


def test_notes_page_by_id(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    for i in range(5):
        inbox_store.note_add(tenant_id, Note(f"n_{i:013d}_aaaaaa", conv.id, "ana", f"note {i}", i))
    first = inbox_store.note_page(tenant_id, conv.id, limit=2)
    second = inbox_store.note_page(tenant_id, conv.id, after=first[-1].id, limit=2)
    assert [n.text for n in first + second] == ["note 0", "note 1", "note 2", "note 3"]
    with pytest.raises(NotFound):
        inbox_store.note_add(tenant_id, Note("n_x", new_conversation_id(), "ana", "x", 1))


def test_read_marker_compare_and_set(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    marker = inbox_store.marker_put(tenant_id, ReadMarker(conv.id, "ana", "m1", "0000000000005/m1", 1))
    assert inbox_store.marker_get(tenant_id, conv.id, "ana") == marker
    assert inbox_store.marker_get(tenant_id, conv.id, "bob") is None
    with pytest.raises(Conflict):
        inbox_store.marker_put(tenant_id, ReadMarker(conv.id, "ana", "m2", "0000000000006/m2", 2))


def test_delete_and_purge_remove_everything(inbox_store, tenant_id):
    conv = inbox_store.write(tenant_id, Change(conversation=conversation())).conversation
    msgs = tuple(message(conv, f"m{i}", i, provider_message_id=f"p{i}") for i in range(7))
    conv = inbox_store.write(tenant_id, Change(conversation=conv, messages=msgs)).conversation
    inbox_store.note_add(tenant_id, Note("n_1", conv.id, "ana", "private", 1))
    inbox_store.marker_put(tenant_id, ReadMarker(conv.id, "ana", "m1", msgs[1].sort_key, 1))
    inbox_store.conversation_delete(tenant_id, conv)
    assert inbox_store.conversation_get(tenant_id, conv.id) is None
    assert inbox_store.conversation_by_chat(tenant_id, conv.chat_key) is None
    assert inbox_store.erasure_pending(tenant_id, conv.id)
    removed = 0
    while (n := inbox_store.conversation_purge(tenant_id, conv.id, limit=3)) > 0:
        removed += n
    assert removed == 9
    assert not inbox_store.erasure_pending(tenant_id, conv.id)
    assert inbox_store.message_page(tenant_id, conv.id) == []
    assert inbox_store.message_get(tenant_id, "m3") is None
    assert inbox_store.message_by_provider_id(tenant_id, "p3") is None
    assert inbox_store.note_page(tenant_id, conv.id) == []
    assert inbox_store.marker_get(tenant_id, conv.id, "ana") is None
    assert inbox_store.conversation_page(tenant_id) == ([], None)


def test_limits_are_validated(inbox_store, tenant_id):
    with pytest.raises(ValidationError):
        inbox_store.conversation_page(tenant_id, limit=0)
    with pytest.raises(ValidationError):
        inbox_store.message_page(tenant_id, new_conversation_id(), limit=100_000)


def test_settings_default_then_compare_and_set(inbox_store, tenant_id):
    from inbox.domain import InboxSettings

    assert inbox_store.settings_get(tenant_id) == InboxSettings(reply_takes_over=True, reply_to_others=False)
    stored = inbox_store.settings_put(tenant_id, InboxSettings(reply_to_others=True))
    assert stored.revision >= 1 and inbox_store.settings_get(tenant_id) == stored
    with pytest.raises(Conflict):
        inbox_store.settings_put(tenant_id, InboxSettings(reply_takes_over=False))  # revision 0: stale
    assert inbox_store.settings_put(tenant_id, replace(stored, reply_takes_over=False)).reply_takes_over is False
    assert inbox_store.settings_get("other-" + tenant_id).reply_to_others is False


def test_a_page_larger_than_one_get_many_lists_every_conversation_in_order(tenant_id):
    """A store page of 1,050 (more than a Kv get_many holds), merged over statuses, on the in-memory Kv."""
    from botmesh_admin.kv.memory import MemoryKv
    from inbox.stores.kv import KvInboxStore

    store = KvInboxStore(MemoryKv())
    for i in range(1_060):
        status = ("open", "pending", "resolved")[i % 3]
        store.write(tenant_id, Change(conversation=conversation(f"whatsapp:5730{i:08d}", at=10_000 + i, status=status)))
    page, cursor = store.conversation_page(tenant_id, limit=1_050, channel="whatsapp")
    assert [c.last_activity_ms for c in page] == list(range(11_059, 10_009, -1))
    rest, end = store.conversation_page(tenant_id, limit=1_050, channel="whatsapp", after=cursor)
    assert [c.last_activity_ms for c in rest] == list(range(10_009, 9_999, -1)) and end is None
