"""Batched projection (issue 21, item 2): a claimed batch is one commit per conversation, and gives what
projecting its records one by one gives — over every Kv backend.

Commits are counted on the real store's Kv (a wrapper that forwards every call
and counts ``commit``); the comparison projects the same records one by one into
a second store and compares what a user sees: each conversation, its thread, the
list counts and unread totals, and the indexes against their records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from botmesh_admin.channels.domain import InboundMessage, MemberUpdate, Reaction, StatusUpdate
from botmesh_admin.kv import DurableKv
from botmesh_admin.kv.base import commit_groups
from botmesh_admin.kv.memory import MemoryKv
from inbox import selectors
from inbox.services import event_project, message_project, project_batched
from inbox.stores import use_store
from inbox.stores.kv import CONVERSATIONS, KvInboxStore
from tests import backends

pytestmark = pytest.mark.django_db

T0 = 1_764_000_000_000  # epoch ms (a ledger record must carry a plausible time)
CHATS = ["whatsapp:573001110001", "whatsapp:573001110002", "whatsapp:573001110003"]


class CountingKv:
    """A DurableKv that forwards to ``kv`` and counts its commits (the real store, counted).

    ``commits``: commits, a group of a group commit counted as one; ``calls``: calls that write.
    """

    def __init__(self, kv: DurableKv) -> None:
        self.kv, self.url, self.commits, self.calls = kv, kv.url, 0, 0

    def commit(self, table: str, ops: Sequence[Any]) -> list[Any]:
        self.commits += 1
        self.calls += 1
        return self.kv.commit(table, ops)

    def commit_groups(self, table: str, groups: Sequence[Sequence[Any]]) -> list[Any]:
        self.commits += sum(1 for ops in groups if ops)
        self.calls += 1
        return commit_groups(self.kv, table, groups)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


def inbound(chat: str, pid: str, ts: int, text: str = "hola", **kw: Any) -> InboundMessage:
    return InboundMessage(
        channel="whatsapp", chat_key=chat, sender_id=chat, provider_message_id=pid, type="text",
        text=text, timestamp_ms=ts, **kw,
    )  # fmt: skip


def ledger(chat: str, mid: str, ts: int, direction: str = "in", pid: str | None = None) -> dict[str, Any]:
    return {
        "id": mid, "channel": "whatsapp", "chatId": chat, "senderId": chat if direction == "in" else "bot",
        "direction": direction, "type": "text", "body": f"{direction} {mid}", "timestamp": T0 + ts,
        "providerMessageId": pid,
    }  # fmt: skip


def test_a_batch_of_n_messages_for_k_conversations_is_k_commits(any_kv: DurableKv, tenant_id: str) -> None:
    counted = CountingKv(any_kv)
    store = KvInboxStore(counted)  # type: ignore[arg-type]
    units = [
        partial(event_project, tenant_id, inbound(CHATS[i % 3], f"wamid.b{i}", 1_000 + i, f"m{i}")) for i in range(12)
    ]
    with use_store(store):
        # The tenant's first write creates its table's index states (every commit of that batch checks them).
        event_project(tenant_id, inbound("whatsapp:573009990000", "wamid.first", 999))
        before, calls = counted.commits, counted.calls
        assert project_batched(units) == [None] * 12
        assert counted.commits - before == 3, "one commit per conversation"
        assert counted.calls - calls == 1, "the batch's commits written in one call"
        rows, _ = selectors.conversation_list(tenant_id, agent="ana", limit=10, store=store)
    assert sorted((r.conversation.chat_key, r.conversation.message_count) for r in rows)[:3] == [(c, 4) for c in CHATS]
    conv = store.conversation_by_chat(tenant_id, CHATS[0])
    assert conv is not None and conv.inbound_count == 4 and conv.last_text == "m9"
    assert [m.text for m in selectors.message_latest(tenant_id, conv.id, store=store)] == ["m0", "m3", "m6", "m9"]
    assert store.unread_sum(tenant_id, agent="ana") == 13
    layout = CONVERSATIONS.layout(any_kv)
    table = store._table(tenant_id)
    assert all(layout.check(table, index) == {"missing": 0, "extra": 0, "wrong": 0} for index in layout.index_names())


def test_a_redelivered_batch_changes_nothing_and_commits_nothing(any_kv: DurableKv, tenant_id: str) -> None:
    counted = CountingKv(any_kv)
    store = KvInboxStore(counted)  # type: ignore[arg-type]
    units = [partial(event_project, tenant_id, inbound(CHATS[i % 2], f"wamid.r{i}", 2_000 + i)) for i in range(6)]
    with use_store(store):
        project_batched(units)
        seen = snapshot(store, tenant_id)
        before = counted.commits
        assert project_batched(units) == [None] * 6
        assert counted.commits == before
        assert snapshot(store, tenant_id) == seen


def test_a_failing_record_in_a_batch_fails_alone_and_the_others_are_written(tenant_id: str) -> None:
    store = KvInboxStore(MemoryKv())

    def poisoned() -> None:
        raise RuntimeError("poisoned record")

    units = [
        partial(event_project, tenant_id, inbound(CHATS[0], "wamid.p1", 3_000)),
        poisoned,
        partial(message_project, tenant_id, dict(ledger(CHATS[1], "m-p2", 3_001), tenantId="someone-else")),
        partial(event_project, tenant_id, inbound(CHATS[0], "wamid.p3", 3_002)),
    ]
    with use_store(store):
        outcomes = project_batched(units)
    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], RuntimeError) and "tenantId" in str(outcomes[2])
    assert snapshot(store, tenant_id)["conversations"] == {
        CHATS[0]: snapshot(store, tenant_id)["conversations"][CHATS[0]]
    }
    assert [m["text"] for m in snapshot(store, tenant_id)["threads"][CHATS[0]]] == ["hola", "hola"]


def test_a_conversation_changed_during_the_batch_is_projected_again_record_by_record(tenant_id: str) -> None:
    """A writer that commits between the batch's reads and its commit makes that conversation's commit fail;
    its records are projected again against the store, the other conversations' commits stand."""
    kv = MemoryKv()
    store = KvInboxStore(kv)
    with use_store(store):
        project_batched([partial(event_project, tenant_id, inbound(CHATS[0], "wamid.c0", 4_000))])

    def meanwhile() -> None:  # an agent (through the real store) resolves the conversation mid-batch
        from inbox.services import conversation_status_set

        conv = store.conversation_by_chat(tenant_id, CHATS[0])
        assert conv is not None
        with use_store(store):
            conversation_status_set(tenant_id, conv.id, status="resolved")

    units: list[Callable[[], object]] = [
        partial(event_project, tenant_id, inbound(CHATS[0], "wamid.c1", 4_001, "again")),
        meanwhile,
        partial(event_project, tenant_id, inbound(CHATS[1], "wamid.c2", 4_002)),
    ]
    with use_store(store):
        assert project_batched(units)[0] is None
    seen = snapshot(store, tenant_id)
    assert [m["text"] for m in seen["threads"][CHATS[0]]] == ["hola", "again"]
    assert seen["conversations"][CHATS[0]]["status"] == "open", "the customer wrote after the agent resolved it"
    assert CHATS[1] in seen["conversations"]


def test_a_marker_written_after_the_batch_read_the_markers_still_counts_the_late_message(
    any_kv: DurableKv, tenant_id: str
) -> None:
    """The batch reads its conversations' markers ahead (one merged scan); a marker written after that read
    makes the conversation's commit fail, and its record is projected again: every unread count stays exact."""
    from inbox.services import read_marker_set

    store = KvInboxStore(any_kv)
    with use_store(store):
        event_project(tenant_id, inbound(CHATS[0], "wamid.k1", 5_000))
        event_project(tenant_id, inbound(CHATS[0], "wamid.k3", 5_003))
        conv = store.conversation_by_chat(tenant_id, CHATS[0])
        assert conv is not None
        read_marker_set(tenant_id, conv.id, agent="ana")

        def prefetch(over: Any) -> None:
            over.prefetch(tenant_id, chats=[(CHATS[0], None)], message_ids=["wamid.k2"])
            read_marker_set(tenant_id, conv.id, agent="ben")  # another writer, after the markers were read

        # Sent before the agents read the newest message, delivered after: it counts as read for both.
        late = partial(event_project, tenant_id, inbound(CHATS[0], "wamid.k2", 5_002, "late"))
        assert project_batched([late], prefetch=prefetch) == [None]
    assert [store.unread_sum(tenant_id, agent=a) for a in ("ana", "ben", "cleo")] == [0, 0, 3]
    seen = snapshot(store, tenant_id)
    assert [m["text"] for m in seen["threads"][CHATS[0]]] == ["hola", "late", "hola"]
    layout = CONVERSATIONS.layout(any_kv)
    assert all(not any(layout.check(store._table(tenant_id), i).values()) for i in layout.index_names())


def test_a_message_whose_id_a_placeholder_holds_in_another_chat_is_refused_alone_and_in_a_batch(
    tenant_id: str,
) -> None:
    """An edit seen first makes a placeholder in its chat; the same id arriving in another chat can never
    take that claim: refused at once, naming the field (it used to retry until "too busy", every time)."""
    from botmesh_admin.errors import ValidationError

    for batched in (False, True):
        tenant = f"{tenant_id}-{int(batched)}"
        store = KvInboxStore(MemoryKv())
        edit = partial(event_project, tenant, inbound(CHATS[0], "wamid.e1", 1_012, "edited", edit_of="wamid.z"))
        original = partial(event_project, tenant, inbound(CHATS[1], "wamid.z", 1_000, "original"))
        with use_store(store):
            if batched:
                outcomes = project_batched([edit, original])
            else:
                edit()
                with pytest.raises(ValidationError) as refused:
                    original()
                outcomes = [None, refused.value]
            seen = snapshot(store, tenant)
        assert outcomes[0] is None and isinstance(outcomes[1], ValidationError)
        assert outcomes[1].field == "provider_message_id"
        assert list(seen["threads"]) == [CHATS[0]], "nothing written for the refused message's chat"
        assert [m["placeholder"] for m in seen["threads"][CHATS[0]]] == [True]


def _meanwhile_resolve(tenant: str, store: KvInboxStore, chat: str) -> Callable[[], None]:
    """A unit that is another writer: an agent resolves ``chat`` through the real store, mid-batch."""

    def meanwhile() -> None:
        from inbox.services import conversation_status_set

        conv = store.conversation_by_chat(tenant, chat)
        assert conv is not None
        with use_store(store):
            conversation_status_set(tenant, conv.id, status="resolved")

    return meanwhile


def _one_by_one(units: Sequence[Callable[[], object]]) -> list[Exception | None]:
    outcomes: list[Exception | None] = []
    for unit in units:
        try:
            unit()
            outcomes.append(None)
        except Exception as exc:  # noqa: BLE001 - compared with the batch's outcome
            outcomes.append(exc)
    return outcomes


def test_a_redone_record_does_not_see_what_a_later_record_of_the_batch_wrote(tenant_id: str) -> None:
    """A record whose conversation's commit failed is redone after the batch's other commits landed; one
    that read a key a later record writes is written (or redone) together with it, so it still decides
    as it did in its place: a status of an outbound message not known yet is ignored, not applied."""
    results = {}
    for batched in (False, True):
        tenant = f"{tenant_id}-{int(batched)}"
        store = KvInboxStore(MemoryKv())
        with use_store(store):
            event_project(tenant, inbound(CHATS[0], "wamid.seed", 900, "seed"))

        def webhook(tenant: str = tenant) -> None:  # one webhook: a message in chat 0, a status with no chat
            event_project(tenant, inbound(CHATS[0], "wamid.w1", 1_000, "to chat 0"))
            event_project(
                tenant,
                StatusUpdate(
                    channel="whatsapp", provider_message_id="wamid.o1", status="delivered", timestamp_ms=1_005
                ),
            )

        units = [
            webhook,
            _meanwhile_resolve(tenant, store, CHATS[0]),
            partial(message_project, tenant, ledger(CHATS[1], "out-1", 1_001, "out", "wamid.o1")),
        ]
        with use_store(store):
            outcomes = project_batched(units) if batched else _one_by_one(units)
        sent = store.message_by_provider_id(tenant, "wamid.o1")
        assert sent is not None
        results[batched] = ([o for o in outcomes], sent.status, snapshot(store, tenant)["threads"])
    assert results[True][:2] == results[False][:2] == ([None, None, None], "sent")
    assert results[True][2] == results[False][2]


def test_a_failing_record_that_is_redone_reports_its_failure_once(
    tenant_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collections import Counter

    from botmesh_admin.events import EventRecord
    from botmesh_admin.observability import metrics
    from inbox import handlers

    counted: Counter[str] = Counter()
    monkeypatch.setattr(metrics, "count", lambda name, *a, **k: counted.update([name]))
    seen = {}
    for batched in (False, True):
        counted.clear()
        tenant = f"{tenant_id}-{int(batched)}"
        store = KvInboxStore(MemoryKv())
        with use_store(store):
            event_project(tenant, inbound(CHATS[0], "wamid.seed", 900, "seed"))
        records = [
            EventRecord(
                id=f"ev{n}",
                type="whatsapp.webhook",
                channel="inbound",
                tenant=tenant,
                payload={"events": [event.to_json()]},
                idempotency_key=f"k{n}",
                created_at=0,
            )  # fmt: skip
            for n, event in enumerate(
                [
                    inbound(CHATS[0], "wamid.e1", 1_012, "edited", edit_of="wamid.z"),  # a placeholder in chat 0
                    inbound(CHATS[1], "wamid.z", 1_000, "original"),  # refused: the id is chat 0's
                ]
            )
        ]
        units = [
            partial(handlers.project_whatsapp_webhook, records[0]),
            _meanwhile_resolve(tenant, store, CHATS[0]),  # chat 0's commit fails: the refused record is redone
            partial(handlers.project_whatsapp_webhook, records[1]),
        ]
        with use_store(store):
            outcomes = project_batched(units) if batched else _one_by_one(units)
        seen[batched] = ([type(o).__name__ if o else None for o in outcomes], counted["errors"])
    assert seen[True] == seen[False] == ([None, None, "ValidationError"], 1)


def test_a_malformed_record_fails_alone_in_a_batch(tenant_id: str) -> None:
    from botmesh_admin.events import EventRecord
    from inbox import handlers

    store = KvInboxStore(MemoryKv())
    good, bad = (
        EventRecord(
            id=f"ev-{name}",
            type="whatsapp.webhook",
            channel="inbound",
            tenant=tenant_id,
            payload={"events": events},
            idempotency_key=name,
            created_at=0,
        )  # fmt: skip
        for name, events in (("good", [inbound(CHATS[0], "wamid.g", 1_000).to_json()]), ("bad", None))
    )
    with use_store(store):
        outcomes = handlers.project_inbound_batch([good, bad])
        assert outcomes[0] is None and isinstance(outcomes[1], Exception)
        assert [m["id"] for m in snapshot(store, tenant_id)["threads"][CHATS[0]]] == ["wamid.g"]


# -- the batch gives what one by one gives ------------------------------------------------


def snapshot(store: KvInboxStore, tenant: str) -> dict[str, Any]:
    """What a user sees of ``tenant``: conversations by chat, threads, counts, unread (no ids, no clock times)."""
    rows, _ = selectors.conversation_list(tenant, agent="ana", limit=50, store=store)
    conversations, threads = {}, {}
    for row in rows:
        c = row.conversation.to_json()
        conversations[c["chat_key"]] = {
            k: v for k, v in c.items() if k not in ("id", "created_at_ms", "updated_at_ms", "last_message_id")
        } | {"revision": None}
        threads[c["chat_key"]] = [
            {k: v for k, v in m.to_json().items() if k not in ("conversation_id",)}
            for m in selectors.message_latest(tenant, row.conversation.id, store=store)
        ]
    counts = store.conversation_counts(tenant, agent="ana")
    return {
        "conversations": conversations,
        "threads": threads,
        "counts": counts,
        "unread": store.unread_sum(tenant, agent="ana"),
    }


def events_strategy() -> st.SearchStrategy[list[tuple[str, Any]]]:
    """Random histories of 2 chats: webhook messages, their edits, reactions and statuses, ledger records of
    the same messages (aliases), outbound ledger messages and their statuses, blocks — any order, redelivered."""
    pids = [f"wamid.h{i}" for i in range(4)]
    outs = [f"wamid.o{i}" for i in range(2)]
    chat = st.sampled_from(CHATS[:2])
    ts = st.integers(1_000, 1_020)
    message = st.builds(lambda c, i, t: ("event", inbound(c, pids[i], t, f"text {i}")), chat, st.integers(0, 3), ts)
    edit = st.builds(
        lambda c, i, n, t: ("event", inbound(c, f"wamid.e{i}{n}", t, f"edited {i}.{n}", edit_of=pids[i])),
        chat, st.integers(0, 3), st.integers(0, 1), ts,
    )  # fmt: skip
    react = st.builds(
        lambda c, i, e, t: ("event", inbound(c, f"wamid.x{i}{e}", t, None, reaction=Reaction(pids[i], e))),
        chat, st.integers(0, 3), st.sampled_from(["👍", "❤️", ""]), ts,
    )  # fmt: skip
    status = st.builds(
        lambda c, i, s, t: (
            "event",
            StatusUpdate(channel="whatsapp", provider_message_id=outs[i], status=s, timestamp_ms=t, chat_key=c),
        ),
        chat, st.integers(0, 1), st.sampled_from(["sent", "delivered", "read", "failed"]), ts,
    )  # fmt: skip
    out = st.builds(lambda c, i, t: ("ledger", ledger(c, f"out-{i}", t, "out", outs[i])), chat, st.integers(0, 1), ts)
    twin = st.builds(lambda c, i, t: ("ledger", ledger(c, f"led-{i}", t, "in", pids[i])), chat, st.integers(0, 3), ts)
    block = st.builds(
        lambda c, s, t: ("event", MemberUpdate(channel="whatsapp", chat_key=c, status=s, timestamp_ms=t)),
        chat, st.sampled_from(["kicked", "member"]), ts,
    )  # fmt: skip
    poison = st.just(("poison", None))
    return st.lists(st.one_of(message, edit, react, status, out, twin, block, poison), min_size=1, max_size=14)


def unit_of(tenant: str, item: tuple[str, Any]) -> Callable[[], object]:
    kind, value = item
    if kind == "event":
        return partial(event_project, tenant, value)
    if kind == "ledger":
        return partial(message_project, tenant, value)

    def poisoned() -> None:
        raise RuntimeError("poisoned")

    return poisoned


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=events_strategy(), cuts=st.lists(st.integers(1, 6), min_size=1, max_size=6), redeliver=st.booleans())
def test_a_batch_gives_exactly_what_projecting_one_by_one_gives(
    history: list[tuple[str, Any]], cuts: list[int], redeliver: bool
) -> None:
    tenant = backends.unique_id()
    items = history + (history[: len(history) // 2] if redeliver else [])
    alone, batched = KvInboxStore(MemoryKv()), KvInboxStore(MemoryKv())
    with use_store(alone):
        expected = []
        for item in items:
            try:
                unit_of(tenant, item)()
                expected.append(None)
            except Exception as exc:  # noqa: BLE001 - compared with the batch's outcome
                expected.append(type(exc))
    with use_store(batched):
        got: list[type | None] = []
        start, n = 0, 0
        while start < len(items):
            size = cuts[n % len(cuts)]
            chunk = items[start : start + size]
            got += [None if o is None else type(o) for o in project_batched([unit_of(tenant, i) for i in chunk])]
            start, n = start + size, n + 1
    assert got == expected
    assert snapshot(batched, tenant) == snapshot(alone, tenant)
    layout = CONVERSATIONS.layout(batched.kv)
    table = batched._table(tenant)
    for index in layout.index_names():
        assert layout.check(table, index) == {"missing": 0, "extra": 0, "wrong": 0}, index


# -- through the journal worker -----------------------------------------------------------


def test_the_worker_projects_a_claimed_batch_in_one_commit_per_conversation_and_retries_a_poisoned_record_alone(
    tenant_id: str,
) -> None:
    from botmesh_admin.events import Envelope
    from botmesh_admin.events.handlers import dispatch
    from botmesh_admin.events.memory import MemoryEventJournal
    from botmesh_admin.events.worker import EventWorker
    from inbox.services import INBOUND_CHANNEL, LEDGER_EVENT

    journal = MemoryEventJournal()
    counted = CountingKv(MemoryKv())
    store = KvInboxStore(counted)  # type: ignore[arg-type]
    records = [ledger(CHATS[i % 2], f"w-{i}", 5_000 + i) for i in range(8)]
    records[5] = dict(records[5], tenantId="another-tenant")  # never projectable here: fails, then dead-letters
    for i, record in enumerate(records):
        journal.append(
            Envelope(
                type=LEDGER_EVENT,
                tenant=tenant_id,
                payload={"record": record},
                idempotency_key=f"w-{i}",
                channel=INBOUND_CHANNEL,
            )  # fmt: skip
        )
    worker = EventWorker(journal, 30_000, channel=INBOUND_CHANNEL, claim_batch=20)
    with use_store(store):
        event_project(tenant_id, inbound("whatsapp:573009990000", "wamid.first", 999))  # the table's index states
        before = counted.commits
        assert worker.run_batch(dispatch, 20) == {"processed": 7, "failed": 1, "stale": 0}
        assert counted.commits - before == 2, "one commit per conversation"
        seen = snapshot(store, tenant_id)
    assert {c: len(t) for c, t in seen["threads"].items() if c in CHATS} == {CHATS[0]: 4, CHATS[1]: 3}
    [poisoned] = journal.list(state="pending")
    assert poisoned.payload["record"]["id"] == "w-5" and "tenantId" in (poisoned.last_error or "")
    assert {r.payload["record"]["id"] for r in journal.list(state="done")} == {f"w-{i}" for i in range(8) if i != 5}


def test_a_batch_reads_its_senders_contacts_at_once_and_upserts_only_what_would_change(
    any_kv: DurableKv, tenant_id: str
) -> None:
    """Known senders cost the batch two CRM reads, not two per message; a contact without a name still gets it."""
    from crm import selectors as crm_selectors
    from crm.services import contact_upsert_identity
    from crm.stores import use_store as use_crm_store
    from crm.stores.kv import KvContactStore

    class CountingReads(CountingKv):
        def __init__(self, kv: DurableKv) -> None:
            super().__init__(kv)
            self.reads: list[str] = []

        def get(self, table: str, key: str) -> Any:
            self.reads.append("get")
            return self.kv.get(table, key)

        def get_many(self, table: str, keys: Sequence[str]) -> Any:
            self.reads.append("get_many")
            return self.kv.get_many(table, keys)

    crm_kv = CountingReads(any_kv)
    store = KvInboxStore(any_kv)
    with use_store(store), use_crm_store(KvContactStore(crm_kv)):  # type: ignore[arg-type]
        for i, chat in enumerate(CHATS):
            contact_upsert_identity(
                tenant_id, channel="whatsapp", address="+" + chat.split(":")[1], name=None if i == 2 else f"P{i}",
                source="test",
            )  # fmt: skip
        event_project(tenant_id, inbound("whatsapp:573009990000", "wamid.first", 999))
        units = [
            partial(
                event_project, tenant_id, inbound(CHATS[i % 3], f"wamid.c{i}", 3_000 + i, f"m{i}", sender_name="Nuevo")
            )
            for i in range(9)
        ]
        crm_kv.reads.clear()
        assert project_batched(units, prefetch=partial(_prefetch_senders, tenant_id, units)) == [None] * 9
        # Two reads ahead; the third chat's contact has no name: its first message upserts it (and fills it in).
        assert crm_kv.reads[:2] == ["get_many", "get_many"] and len(crm_kv.reads) > 2
        named = crm_selectors.contacts_find_by_identity(tenant_id, [("whatsapp", "+" + c.split(":")[1]) for c in CHATS])
        assert [c.name if c else None for c in named] == ["P0", "P1", "Nuevo"]
        conv = store.conversation_by_chat(tenant_id, CHATS[0])
        assert conv is not None and conv.contact_id == named[0].id  # type: ignore[union-attr]
        # Now every sender is known and named: the batch reads the CRM twice and writes nothing to it.
        more = [
            partial(event_project, tenant_id, inbound(CHATS[i % 3], f"wamid.d{i}", 4_000 + i, sender_name="Otro"))
            for i in range(9)
        ]
        crm_kv.reads.clear()
        commits = crm_kv.commits
        assert project_batched(more, prefetch=partial(_prefetch_senders, tenant_id, more)) == [None] * 9
        assert crm_kv.reads == ["get_many", "get_many"]
        assert crm_kv.commits == commits
        # Without reading ahead, each message's upsert reads its identity and its contact.
        crm_kv.reads.clear()
        again = [
            partial(event_project, tenant_id, inbound(CHATS[i % 3], f"wamid.e{i}", 5_000 + i, sender_name="Otro"))
            for i in range(9)
        ]
        assert project_batched(again) == [None] * 9
        assert crm_kv.reads.count("get") == 2 * 3  # once per sender: later messages reuse the batch's upserts


def _prefetch_senders(tenant: str, units: Sequence[Any], store: Any) -> None:
    from inbox.services import prefetch_contacts

    prefetch_contacts(tenant, [(u.args[1].channel, u.args[1].sender_id, u.args[1].sender_name) for u in units])
