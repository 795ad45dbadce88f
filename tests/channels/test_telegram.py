"""Telegram: secret token check and parsing of every fixture update."""

from __future__ import annotations

import json

import pytest

from botmesh_admin.channels import credentials, telegram
from botmesh_admin.channels.domain import InboundMessage, MemberUpdate, event_from_json
from botmesh_admin.errors import ValidationError

from .conftest import load_json, telegram_updates

META = load_json("telegram", "meta.json")


def parse(name: str) -> list:
    return telegram.parse_update(telegram_updates()[name], now_ms=1764489700000)


def test_secret_token_matches_its_hash_only() -> None:
    stored = credentials.secret_hash(META["secret_token"])
    assert META["secret_token"] not in stored
    assert telegram.verify_secret(META["secret_token"], stored)
    assert not telegram.verify_secret(META["secret_token"] + "x", stored)
    assert not telegram.verify_secret(None, stored)
    assert not telegram.verify_secret(META["secret_token"], None)
    assert credentials.secret_hash(META["secret_token"]) != stored  # salted


def test_start_is_a_text_command() -> None:
    [msg] = parse("01_start.json")
    assert (msg.type, msg.text, msg.raw_type) == ("text", "/start", "bot_command")
    assert (msg.chat_key, msg.sender_id, msg.sender_name) == ("telegram:700000001", "telegram:700000001", "Sofía Díaz")
    assert (msg.provider_message_id, msg.timestamp_ms) == ("700000001:1", 1764489610000)


def test_photo_takes_the_largest_size_and_caption() -> None:
    [msg] = parse("03_photo.json")
    assert (msg.type, msg.text) == ("image", "la factura")
    assert (msg.media.id, msg.media.width, msg.media.height, msg.media.size_bytes) == (
        "AgACAgEAAxkBAAIBZ3",
        800,
        600,
        52000,
    )


def test_edit_names_the_edited_message() -> None:
    [msg] = parse("04_edited.json")
    assert msg.edit_of == "700000001:2"
    assert msg.text == "Quiero cambiar mi dirección de entrega, por favor"
    assert msg.timestamp_ms == 1764489645000
    assert msg.provider_message_id != "700000001:2"  # not a duplicate of the original


def test_supergroup_gives_one_conversation_per_participant() -> None:
    [a] = parse("05_group_a.json")
    [b] = parse("06_group_b.json")
    assert a.chat_key == "telegram:-1001234567890:700000001"
    assert b.chat_key == "telegram:-1001234567890:700000002"
    assert (b.sender_id, b.sender_name) == ("telegram:700000002", "Tomás")


def test_callback_query_keeps_data_and_message() -> None:
    [msg] = parse("07_callback.json")
    assert (msg.type, msg.raw_type, msg.button.id, msg.button.kind) == (
        "button",
        "callback_query",
        "confirm:order:8812",
        "callback",
    )
    assert (msg.reply_to, msg.chat_key, msg.timestamp_ms) == ("700000001:4", "telegram:700000001", 1764489700000)
    assert msg.provider_message_id == "callback:4382bfdwdsb323b2d9"


def test_callback_title_comes_from_the_inline_keyboard() -> None:
    update = telegram_updates()["07_callback.json"]
    update["callback_query"]["message"]["reply_markup"] = {
        "inline_keyboard": [
            [
                {"text": "Sí, confirmar", "callback_data": "confirm:order:8812"},
                {"text": "No", "callback_data": "cancel"},
            ]
        ]
    }
    [msg] = telegram.parse_update(update, now_ms=1)
    assert (msg.button.title, msg.text) == ("Sí, confirmar", "Sí, confirmar")


def test_kicked_means_the_user_blocked_the_bot() -> None:
    [event] = parse("08_blocked.json")
    assert event == MemberUpdate(
        channel="telegram",
        chat_key="telegram:700000001",
        status="kicked",
        timestamp_ms=1764489690000,
        sender_id="telegram:700000001",
        previous_status="member",
    )
    assert event.blocked


def test_reply_to_and_other_updates() -> None:
    update = telegram_updates()["02_text.json"]
    update["message"]["reply_to_message"] = {"message_id": 1, "chat": update["message"]["chat"], "date": 1}
    [msg] = telegram.parse_update(update)
    assert msg.reply_to == "700000001:1"
    assert telegram.parse_update({"update_id": 1, "poll": {"id": "x"}}) == []


@pytest.mark.parametrize("name", sorted(telegram_updates()))
def test_every_event_round_trips_through_json(name: str) -> None:
    events = parse(name)
    assert len(events) == 1
    assert [event_from_json(json.loads(json.dumps(e.to_json()))) for e in events] == events
    assert isinstance(events[0], InboundMessage | MemberUpdate)


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("02_text.json", ("message", "date")),
        ("04_edited.json", ("edited_message", "edit_date")),
        ("08_blocked.json", ("my_chat_member", "date")),
    ],
)
@pytest.mark.parametrize("date", ["abc", None, 0, -5, 1.5])
def test_a_date_that_is_not_unix_seconds_is_refused_naming_it(name, path, date) -> None:  # type: ignore[no-untyped-def]
    """Found by exploratory testing: an unreadable date was stored as 0 (1970) instead of being refused."""
    update = telegram_updates()[name]
    update[path[0]][path[1]] = date
    with pytest.raises(ValidationError) as info:
        telegram.parse_update(update)
    assert info.value.field == ".".join(path)


def test_a_first_name_of_bidi_and_control_characters_only_falls_back_to_the_username() -> None:
    update = json.loads(json.dumps(telegram_updates()["01_start.json"]))
    update["message"]["from"].update({"first_name": "\u202eRLO\u0007", "last_name": "\u200b"})
    [msg] = telegram.parse_update(update, now_ms=1764489700000)
    assert msg.sender_name == "RLO"
    update["message"]["from"].update({"first_name": "\u202e", "last_name": None, "username": "sofi_d"})
    [msg] = telegram.parse_update(update, now_ms=1764489700000)
    assert msg.sender_name == "sofi_d"
