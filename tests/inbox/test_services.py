"""Assignment, handoff, status, notes, unread counts and erasure over every store."""

from __future__ import annotations

import threading

import pytest

from botmesh_admin.clock import now_ms
from botmesh_admin.errors import Conflict, NotFound, ValidationError
from inbox import selectors
from inbox.selectors import conversation_unread, note_list
from inbox.services import (
    conversation_assign,
    conversation_erase,
    conversation_handoff,
    conversation_status_set,
    message_project,
    note_add,
    read_marker_set,
)
from inbox.stores.base import InboxStore

CHAT = "whatsapp:573001112233"
T0 = 1_764_489_600_000  # 2025-11-30: a ledger refuses times before 2000


def record(mid: str, ts: int, direction: str = "in", chat: str = CHAT, **kw) -> dict:
    """Return a ledger record ``ts`` ms after ``T0``."""
    return {
        "id": mid,
        "channel": chat.split(":")[0],
        "chatId": chat,
        "senderId": chat if direction == "in" else "bot",
        "direction": direction,
        "type": "text",
        "body": f"body {mid}",
        "timestamp": T0 + ts,
        **kw,
    }


def seeded(inbox: InboxStore, tenant: str, n_in: int = 3, n_out: int = 2, chat: str = CHAT) -> str:
    """Project ``n_in`` inbound then ``n_out`` outbound messages (no CRM: unknown channel prefix)."""
    result = None
    for i in range(n_in):
        result = message_project(tenant, record(f"{chat}-i{i}".replace(":", "_"), 1000 + i, chat=chat))
    for i in range(n_out):
        result = message_project(tenant, record(f"{chat}-o{i}".replace(":", "_"), 2000 + i, "out", chat=chat))
    assert result is not None
    return result.conversation_id


@pytest.fixture(autouse=True)
def _db(db):
    """CRM contact upserts read the tenant's region from the database."""


def test_assign_is_compare_and_set(inbox, tenant_id):
    cid = seeded(inbox, tenant_id)
    conv = inbox.conversation_get(tenant_id, cid)
    assigned = conversation_assign(tenant_id, cid, agent="ana", expected_version=conv.version)
    assert assigned.assignee == "ana" and assigned.version == conv.version + 1


def test_assign_with_stale_version_conflicts_with_current_assignee(inbox, tenant_id):
    cid = seeded(inbox, tenant_id)
    v = inbox.conversation_get(tenant_id, cid).version
    conversation_assign(tenant_id, cid, agent="ana", expected_version=v)
    with pytest.raises(Conflict) as err:
        conversation_assign(tenant_id, cid, agent="bob", expected_version=v)
    assert err.value.current_version == v + 1
    assert err.value.details["assignee"] == "ana"
    assert inbox.conversation_get(tenant_id, cid).assignee == "ana"


def test_new_message_does_not_make_assign_stale(inbox, tenant_id):
    cid = seeded(inbox, tenant_id)
    v = inbox.conversation_get(tenant_id, cid).version
    message_project(tenant_id, record("late-in", 5000))
    assert conversation_assign(tenant_id, cid, agent="ana", expected_version=v).assignee == "ana"


def test_assign_validates_agent_and_finds_only_own_tenant(inbox, tenant_id):
    cid = seeded(inbox, tenant_id)
    with pytest.raises(ValidationError) as err:
        conversation_assign(tenant_id, cid, agent="not an agent!", expected_version=1)
    assert err.value.field == "agent"
    with pytest.raises(NotFound):
        conversation_assign(tenant_id + "-other", cid, agent="ana", expected_version=1)


def test_handoff_is_stored_with_who_and_when_and_given_back(inbox, tenant_id):
    cid = seeded(inbox, tenant_id)
    taken = conversation_handoff(tenant_id, cid, active=True, actor="ana")
    assert taken.handed_off and taken.handoff.taken_by == "ana" and taken.handoff.taken_at_ms > 0
    assert taken.assignee == "ana"
    state = selectors.handoff_get(tenant_id, CHAT, store=inbox)
    assert state.handed_off and state.taken_by == "ana"
    back = conversation_handoff(tenant_id, cid, active=False, actor="bob")
    assert not back.handed_off and back.handoff.released_by == "bob" and back.handoff.taken_by == "ana"
    assert not selectors.handoff_get(tenant_id, CHAT, store=inbox).handed_off
    assert not selectors.handoff_get(tenant_id, "telegram:1", store=inbox).handed_off


def test_status_snooze_and_reopen_on_new_inbound_message(inbox, tenant_id):
    cid = seeded(inbox, tenant_id)
    resolved = conversation_status_set(tenant_id, cid, status="resolved")
    assert selectors.effective_status(resolved) == "resolved"
    message_project(tenant_id, record("again", 9000))
    assert inbox.conversation_get(tenant_id, cid).status == "open"
    with pytest.raises(ValidationError) as past:
        conversation_status_set(tenant_id, cid, status="pending", snoozed_until_ms=1)
    assert past.value.field == "snoozed_until_ms" and "future" in past.value.message
    until = now_ms() + 60_000
    snoozed = conversation_status_set(tenant_id, cid, status="pending", snoozed_until_ms=until)
    assert selectors.effective_status(snoozed) == "pending"
    assert selectors.effective_status(snoozed, now=until) == "open"  # its time has come
    with pytest.raises(ValidationError):
        conversation_status_set(tenant_id, cid, status="resolved", snoozed_until_ms=until)
    with pytest.raises(ValidationError):
        conversation_status_set(tenant_id, cid, status="closed")


def test_notes_paginate_by_last_note_id(inbox, tenant_id):
    cid = seeded(inbox, tenant_id)
    for i in range(5):
        note_add(tenant_id, cid, author="ana", text=f"note {i}")
    page, after = note_list(tenant_id, cid, limit=2)
    seen = [n.text for n in page]
    while after is not None:
        page, after = note_list(tenant_id, cid, limit=2, after=after)
        seen += [n.text for n in page]
    assert seen == [f"note {i}" for i in range(5)]
    assert all(n.author == "ana" for n in page)
    with pytest.raises(ValidationError) as err:
        note_add(tenant_id, cid, author="ana", text="   ")
    assert err.value.field == "note.text"


def test_unread_is_exact_per_agent_and_only_moves_forward(inbox, tenant_id):
    cid = seeded(inbox, tenant_id, n_in=3, n_out=2)
    assert conversation_unread(tenant_id, cid, agent="ana") == 3
    read_marker_set(tenant_id, cid, agent="ana", message_id="whatsapp_573001112233-i1")
    assert conversation_unread(tenant_id, cid, agent="ana") == 1
    assert conversation_unread(tenant_id, cid, agent="bob") == 3
    # marking an older message does not move the marker back
    read_marker_set(tenant_id, cid, agent="ana", message_id="whatsapp_573001112233-i0")
    assert conversation_unread(tenant_id, cid, agent="ana") == 1
    read_marker_set(tenant_id, cid, agent="ana")  # the newest
    assert conversation_unread(tenant_id, cid, agent="ana") == 0
    message_project(tenant_id, record("new-in", 3000))
    message_project(tenant_id, record("new-out", 3001, "out"))
    assert conversation_unread(tenant_id, cid, agent="ana") == 1
    other = seeded(inbox, tenant_id, n_in=2, n_out=0, chat="whatsapp:573009998877")
    assert selectors.unread_total(tenant_id, agent="ana", store=inbox) == 3
    rows, _ = selectors.conversation_list(tenant_id, agent="ana", unread_only=True, store=inbox)
    assert {r.conversation.id: r.unread for r in rows} == {cid: 1, other: 2}
    with pytest.raises(NotFound):
        read_marker_set(tenant_id, cid, agent="ana", message_id="whatsapp_573009998877-i0")


def test_list_filters(inbox, tenant_id):
    a = seeded(inbox, tenant_id, chat="whatsapp:573000000001")
    b = seeded(inbox, tenant_id, chat="telegram:700000001")
    c = seeded(inbox, tenant_id, chat="whatsapp:573000000002")
    conversation_assign(tenant_id, a, agent="ana", expected_version=1)
    conversation_assign(tenant_id, b, agent="bob", expected_version=1)
    conversation_status_set(tenant_id, c, status="resolved")

    def ids(**kw):
        return {r.conversation.id for r in selectors.conversation_list(tenant_id, agent="ana", store=inbox, **kw)[0]}

    assert ids(view="mine") == {a}
    assert ids(view="unassigned") == {c}
    assert ids(status="resolved") == {c}
    assert ids(channel="telegram") == {b}
    assert ids() == {a, b, c}
    first, cursor = selectors.conversation_list(tenant_id, agent="ana", limit=2, store=inbox)
    rest, end = selectors.conversation_list(tenant_id, agent="ana", limit=2, after=cursor, store=inbox)
    assert len(first) == 2 and len(rest) == 1 and end is None
    assert {r.conversation.id for r in first + rest} == {a, b, c}


def test_erase_removes_conversation_messages_notes_and_markers(inbox, tenant_id):
    cid = seeded(inbox, tenant_id, n_in=4, n_out=3)
    note_add(tenant_id, cid, author="ana", text="call back tomorrow")
    read_marker_set(tenant_id, cid, agent="ana")
    removed = conversation_erase(tenant_id, cid)
    assert removed == 1 + 7 + 1 + 1
    with pytest.raises(NotFound):
        selectors.conversation_get(tenant_id, cid, store=inbox)
    assert inbox.message_get(tenant_id, "whatsapp_573001112233-i0") is None
    assert inbox.note_page(tenant_id, cid) == []
    assert inbox.marker_get(tenant_id, cid, "ana") is None
    with pytest.raises(NotFound):
        conversation_erase(tenant_id, cid)
    # the same chat writing again starts a fresh conversation
    again = message_project(tenant_id, record("after-erase", 9999))
    assert again.conversation_id != cid


def test_concurrent_assign_with_one_version_has_one_winner(inbox, tenant_id):
    cid = seeded(inbox, tenant_id, n_in=1, n_out=0)
    version = inbox.conversation_get(tenant_id, cid).version
    winners, losers = [], []
    barrier = threading.Barrier(6)

    def attempt(agent: str) -> None:
        barrier.wait(timeout=10)
        try:
            winners.append(conversation_assign(tenant_id, cid, agent=agent, expected_version=version).assignee)
        except Conflict:
            losers.append(agent)

    threads = [threading.Thread(target=attempt, args=(f"agent{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(winners) == 1 and len(losers) == 5
    assert inbox.conversation_get(tenant_id, cid).assignee == winners[0]


def test_concurrent_projection_of_one_chat_loses_nothing_and_duplicates_nothing(inbox, tenant_id):
    records = [record(f"m{i}", 1000 + i, "in" if i % 3 else "out") for i in range(24)]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker(offset: int) -> None:
        barrier.wait(timeout=10)
        try:
            # every worker projects every record (redeliveries), in a different order
            for r in records[offset:] + records[:offset]:
                message_project(tenant_id, r)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i * 6,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    conv = inbox.conversation_by_chat(tenant_id, CHAT)
    messages = selectors.message_latest(tenant_id, conv.id, limit=100, store=inbox)
    assert [m.id for m in messages] == [r["id"] for r in records]
    assert conv.message_count == 24 and conv.inbound_count == sum(r["direction"] == "in" for r in records)


def test_thread_view_reads_the_newest_messages_without_reading_a_long_conversation_whole(inbox, tenant_id):
    """600 messages over 25 days: the newest 40, in order, from a window of the last days only."""
    records = [record(f"m{i:04d}", i * 3_600_000, "in" if i % 3 else "out") for i in range(600)]
    for r in records:
        message_project(tenant_id, r)
    conv = inbox.conversation_by_chat(tenant_id, CHAT)
    read: list[int] = []
    page = inbox.message_page

    def counting_page(*args, **kwargs):
        got = page(*args, **kwargs)
        read.append(len(got))
        return got

    inbox.message_page = counting_page
    try:
        newest = selectors.message_latest(tenant_id, conv.id, limit=40, store=inbox)
        read_for_newest = sum(read)
        everything = selectors.message_latest(tenant_id, conv.id, limit=1000, store=inbox)
    finally:
        del inbox.message_page
    assert [m.id for m in newest] == [r["id"] for r in records[-40:]]
    assert [m.id for m in everything] == [r["id"] for r in records]
    # windows of 1, 8 and 64 hours: 2 + 9 + 65 messages read instead of 600
    assert read_for_newest == 76, read


def test_assign_retries_when_a_message_lands_between_its_read_and_its_write(inbox, tenant_id):
    """A projection moves the stored conversation (not its agent-facing version): the assignment is redone."""
    cid = seeded(inbox, tenant_id)
    version = inbox.conversation_get(tenant_id, cid).version
    write, raced = inbox.write, []

    def racing_write(tenant, change):
        if not raced and change.conversation is not None and not change.messages:
            raced.append(message_project(tenant, record("late-1", 5000)).outcome)
        return write(tenant, change)

    inbox.write = racing_write
    try:
        assigned = conversation_assign(tenant_id, cid, agent="ana", expected_version=version)
    finally:
        del inbox.write
    assert raced == ["created"]
    assert (assigned.assignee, assigned.version, assigned.message_count) == ("ana", version + 1, 6)
    assert inbox.conversation_get(tenant_id, cid).assignee == "ana"
