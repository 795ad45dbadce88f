"""Projection of bot ledger records and channel events (fixtures from shared/fixtures)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest

from botmesh_admin.channels import telegram, whatsapp
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.errors import ValidationError
from inbox import selectors
from inbox.domain import StoredMessage
from inbox.services import event_project, message_project
from inbox.stores import use_store
from inbox.stores.base import InboxStore

from .conftest import ledger_records, open_store

pytestmark = pytest.mark.django_db


def whatsapp_events(name: str) -> list:
    return whatsapp.parse_webhook(json.loads((fixtures_dir() / "whatsapp" / "raw" / name).read_bytes()))


def telegram_events(name: str) -> list:
    return telegram.parse_update(json.loads((fixtures_dir() / "telegram" / name).read_text()), now_ms=1764489671000)


def thread(inbox: InboxStore, tenant: str, chat_key: str) -> list:
    conv = inbox.conversation_by_chat(tenant, chat_key)
    assert conv is not None, chat_key
    return selectors.message_latest(tenant, conv.id, store=inbox)


def project_ledger(inbox: InboxStore, tenant: str, records: list[dict]) -> None:
    for record in records:
        message_project(tenant, record)


@pytest.fixture(params=["memory", "kv-postgresql"])
def full_inbox(request: pytest.FixtureRequest) -> Iterator[InboxStore]:
    """The whole ledger runs on the reference store and the production backend (the rest: a sample)."""
    with use_store(open_store(request.param, request)) as store:
        yield store


def test_ledger_sample_counts_on_every_store(inbox, tenant_id):
    records = [dict(r, tenantId=None) for r in ledger_records()[:80]]
    project_ledger(inbox, tenant_id, records)
    distinct = {r["id"]: r for r in records}
    rows, _ = selectors.conversation_list(tenant_id, agent="ana", limit=200, store=inbox)
    assert len(rows) == len({r["chatId"] for r in records})
    assert sum(r.conversation.message_count for r in rows) == len(distinct)
    assert sum(r.conversation.inbound_count for r in rows) == sum(r["direction"] == "in" for r in distinct.values())


def test_ledger_fixture_gives_the_documented_conversations_and_messages(full_inbox, tenant_id):
    """fixtures/README: tienda 40 chats, 305 in + 175 out; soporte 38 chats and 121 messages."""
    inbox = full_inbox
    records = ledger_records()
    for tenant in ("tienda", "soporte"):
        mine = [dict(r, tenantId=None) for r in records if r["tenantId"] == tenant]
        project_ledger(inbox, f"{tenant_id}-{tenant}", mine)
    rows = {
        t: selectors.conversation_list(f"{tenant_id}-{t}", agent="ana", limit=200, store=inbox)[0]
        for t in ("tienda", "soporte")
    }
    assert len(rows["tienda"]) == 40 and len(rows["soporte"]) == 38
    tienda = [r.conversation for r in rows["tienda"]]
    assert sum(c.message_count for c in tienda) == 480
    assert sum(c.inbound_count for c in tienda) == 305
    assert sum(c.message_count for c in (r.conversation for r in rows["soporte"])) == 121
    # newest activity first
    activity = [c.last_activity_ms for c in tienda]
    assert activity == sorted(activity, reverse=True)


def test_redelivered_record_changes_nothing(inbox, tenant_id):
    record = dict(ledger_records()[10], tenantId=None)
    first = message_project(tenant_id, record)
    conv = inbox.conversation_get(tenant_id, first.conversation_id)
    second = message_project(tenant_id, record)
    assert (first.outcome, second.outcome) == ("created", "duplicate")
    assert inbox.conversation_get(tenant_id, first.conversation_id) == conv


def test_late_record_is_placed_by_timestamp(default_inbox_store):
    """``msg_late`` (fixtures/README) is older than the records around it: it sorts before them."""
    inbox = default_inbox_store
    records = ledger_records()
    late = next(r for r in records if r["id"] == "msg_late")
    for record in records:
        message_project(None, record)
    ids = [m.id for m in thread(inbox, "soporte", late["chatId"])]
    stamps = [m.timestamp_ms for m in thread(inbox, "soporte", late["chatId"])]
    assert stamps == sorted(stamps)
    assert ids.index("msg_late") < len(ids) - 1 or stamps[-1] == late["timestamp"]
    assert "msg_late" in ids


def test_record_tenant_must_match(inbox, tenant_id):
    record = dict(ledger_records()[0], tenantId="soporte")
    with pytest.raises(ValidationError) as err:
        message_project(tenant_id, record)
    assert err.value.field == "record.tenantId"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"timestamp": "soon"}, "record.timestamp"),
        ({"direction": "sideways"}, "record.direction"),
        ({"chatId": ""}, "record.chatId"),
        ({"id": None}, "record.id"),
        ({"tenantId": "Bad Tenant"}, "record.tenantId"),
    ],
)
def test_bad_record_names_the_field(change, field):
    with pytest.raises(ValidationError) as err:
        StoredMessage.from_json(dict(ledger_records()[0], **change))
    assert err.value.field == field


def test_whatsapp_fixtures_project_with_their_details(inbox, tenant_id):
    for name in sorted(p.name for p in (fixtures_dir() / "whatsapp" / "raw").glob("0*.json")):
        for event in whatsapp_events(name):
            event_project(tenant_id, event)
    ana = thread(inbox, tenant_id, "whatsapp:573001112233")
    by_id = {m.id: m for m in ana}
    bot = by_id["wamid.HBgM9C4C9375A2A8FD488DD06113"]
    assert bot.placeholder and bot.direction == "out"
    assert bot.status == "read"  # sent < delivered < read
    assert [(r.emoji, r.sender_id) for r in bot.reactions] == [("👍", "whatsapp:573001112233")]
    button = by_id["wamid.HBgM862A51F8B6294A4B0729A7C5"]
    assert button.button["id"] == "talk_to_human" and button.button["title"] == "Hablar con un asesor"
    image = by_id["wamid.HBgM32D332DA761F44DF7959E588"]
    assert image.type == "image" and image.media["caption"] == "Este es el modelo"
    assert "wamid.HBgM0E5BC0A684C7AFE47FA66CDF" not in by_id  # the reaction is not a message of its own
    luis = {m.id: m for m in thread(inbox, tenant_id, "whatsapp:5215512345678")}
    failed = luis["wamid.HBgM671F0D398A85BC55D0EAFC90"]
    assert (failed.status, failed.error_code) == ("failed", 131047)
    assert failed.error_title
    assert luis["wamid.HBgMA2583CF386EF113D138BC18E"].type == "unsupported"
    assert luis["wamid.HBgMEC4C91AFBF23E886603DAADF"].location["name"] == "Zócalo"
    # the batch: one entry, two changes, three messages
    batch = [
        m
        for m in [*ana, *luis.values()]
        if m.id
        in {
            "wamid.HBgMF5E6C84556D2C0BED9A257E3",
            "wamid.HBgM60018F2177591071FCC9A67E",
            "wamid.HBgM86EF3E57FC04E813CD6C34B5",
        }
    ]
    assert len(batch) == 3
    conv = inbox.conversation_by_chat(tenant_id, "whatsapp:573001112233")
    assert conv.contact_id and conv.display_name == "Ana García"


def test_statuses_only_move_forward_and_failed_is_final(inbox, tenant_id):
    events = whatsapp_events("06_statuses.json")
    for event in reversed(events):  # read first, then delivered, then sent
        event_project(tenant_id, event)
    m = inbox.message_by_provider_id(tenant_id, events[0].provider_message_id)
    assert m.status == "read"
    failed = whatsapp_events("07_status_failed.json")[0]
    event_project(tenant_id, failed)
    from dataclasses import replace

    event_project(tenant_id, replace(failed, status="read", timestamp_ms=failed.timestamp_ms + 1))
    m = inbox.message_by_provider_id(tenant_id, failed.provider_message_id)
    assert (m.status, m.error_code) == ("failed", 131047)


def test_ledger_record_replaces_the_placeholder_a_status_created(inbox, tenant_id):
    status = whatsapp_events("06_statuses.json")[2]  # read
    event_project(tenant_id, status)
    waiting = inbox.conversation_by_chat(tenant_id, "whatsapp:573001112233")
    assert (waiting.last_text, waiting.last_direction) == ("[not in the ledger yet]", "out"), "not '[text]'"
    record = {
        "id": "msg_bot_1",
        "channel": "whatsapp",
        "chatId": "whatsapp:573001112233",
        "senderId": "bot",
        "direction": "out",
        "type": "text",
        "body": "¿Te ayudo con algo más?",
        "timestamp": 1764489600500,
        "providerMessageId": status.provider_message_id,
    }
    message_project(tenant_id, record)
    messages = thread(inbox, tenant_id, "whatsapp:573001112233")
    assert [(m.id, m.text, m.status, m.placeholder) for m in messages] == [
        ("msg_bot_1", "¿Te ayudo con algo más?", "read", False)
    ]
    conv = inbox.conversation_by_chat(tenant_id, "whatsapp:573001112233")
    assert conv.message_count == 1
    assert conv.last_text == "¿Te ayudo con algo más?"


def test_same_message_from_webhook_and_ledger_is_one_message(inbox, tenant_id):
    event = whatsapp_events("01_text.json")[0]
    event_project(tenant_id, event)
    record = {
        "id": "msg_in_1",
        "channel": "whatsapp",
        "chatId": event.chat_key,
        "senderId": event.sender_id,
        "direction": "in",
        "type": "text",
        "body": event.text,
        "timestamp": event.timestamp_ms,
        "providerMessageId": event.provider_message_id,
    }
    assert message_project(tenant_id, record).outcome == "duplicate"
    assert message_project(tenant_id, record).outcome == "duplicate"
    assert len(thread(inbox, tenant_id, event.chat_key)) == 1


def test_telegram_fixtures(inbox, tenant_id):
    for name in (
        "01_start.json",
        "02_text.json",
        "03_photo.json",
        "04_edited.json",
        "05_group_a.json",
        "06_group_b.json",
        "07_callback.json",
        "04_edited.json",
    ):
        for event in telegram_events(name):
            event_project(tenant_id, event)
    sofia = {m.id: m for m in thread(inbox, tenant_id, "telegram:700000001")}
    edited = sofia["700000001:2"]
    assert edited.text == "Quiero cambiar mi dirección de entrega, por favor"
    assert [e.text for e in edited.edits] == ["Quiero cambiar mi dirección de entrega"]
    photo = sofia["700000001:3"]
    assert photo.type == "image" and photo.media["caption"] == "la factura" and photo.media["width"] == 800
    callback = sofia["callback:4382bfdwdsb323b2d9"]
    assert callback.button["id"] == "confirm:order:8812"
    # one conversation per participant of the supergroup
    a = thread(inbox, tenant_id, "telegram:-1001234567890:700000001")
    b = thread(inbox, tenant_id, "telegram:-1001234567890:700000002")
    assert [m.text for m in a] == ["¿Hay descuento este mes?"] and [m.text for m in b] == ["Same question here"]


def test_edits_in_any_order_show_the_last_and_keep_every_previous_text(inbox, tenant_id):
    """Issue 15, item 2: an edit projected before its original kept no previous text (``edits[0].text`` None)."""

    def update(update_id: int, text: str, edit_s: int | None) -> list:
        message = {
            "message_id": 9,
            "from": {"id": 700000009, "first_name": "Eva"},
            "chat": {"id": 700000009, "type": "private"},
            "date": 1764489600,
            "text": text,
        }
        key = "message" if edit_s is None else "edited_message"
        if edit_s is not None:
            message["edit_date"] = 1764489600 + edit_s
        return telegram.parse_update({"update_id": update_id, key: message})

    second, first, original = update(3, "v3", 20), update(2, "v2", 10), update(1, "v1", None)
    for events in (second, first, original, first, second):  # the newest edit first; then redeliveries
        for event in events:
            event_project(tenant_id, event)
    (message,) = thread(inbox, tenant_id, "telegram:700000009")
    assert (message.text, [e.text for e in message.edits]) == ("v3", ["v1", "v2"])
    assert [e.replaced_at_ms for e in message.edits] == [1764489610000, 1764489620000]
    assert message.timestamp_ms == 1764489600000 and not message.placeholder
    conv = inbox.conversation_by_chat(tenant_id, "telegram:700000009")
    assert (conv.message_count, conv.inbound_count) == (1, 1)


def test_blocked_bot_marks_conversation_and_denies_consent(inbox, tenant_id):
    from botmesh_admin.tenancy.services import tenant_create
    from crm.selectors import contact_get

    tenant_create(tenant_id, name="Blocked test")
    for name in ("02_text.json", "08_blocked.json", "08_blocked.json"):
        for event in telegram_events(name):
            event_project(tenant_id, event)
    conv = inbox.conversation_by_chat(tenant_id, "telegram:700000001")
    assert conv.blocked and "kicked" in conv.blocked_evidence
    contact = contact_get(tenant_id, conv.contact_id)
    assert contact.consent_status("telegram") == "denied"


def test_handoff_dropped_bot_message_is_projected_and_counted(inbox, tenant_id):
    from botmesh_admin.observability.metrics import snapshot

    before = snapshot()["dropped"]["handoff"]
    record = {
        "id": "msg_d1",
        "channel": "whatsapp",
        "chatId": "whatsapp:573001112233",
        "senderId": "bot",
        "direction": "out",
        "type": "text",
        "body": "Hola",
        "timestamp": 1764489600000,
        "providerMessageId": None,
        "dropped": "handoff",
    }
    message_project(tenant_id, record)
    message_project(tenant_id, record)
    assert thread(inbox, tenant_id, "whatsapp:573001112233")[0].dropped == "handoff"
    assert snapshot()["dropped"]["handoff"] == before + 1


def test_counts_by_direction_per_tenant_match_the_fixture(default_inbox_store):
    inbox = default_inbox_store
    for record in ledger_records():
        message_project(None, record)
    counts = Counter()
    for tenant in ("tienda", "soporte"):
        rows, _ = selectors.conversation_list(tenant, agent="ana", limit=200, store=inbox)
        for row in rows:
            for m in selectors.message_latest(tenant, row.conversation.id, limit=1000, store=inbox):
                counts[(tenant, m.direction)] += 1
    assert counts == {("tienda", "in"): 305, ("tienda", "out"): 175, ("soporte", "in"): 71, ("soporte", "out"): 50}
