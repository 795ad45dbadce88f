"""WhatsApp Cloud API: signature over the raw bytes, handshake, and parsing of every fixture."""

from __future__ import annotations

import json

import pytest

from botmesh_admin.channels import whatsapp
from botmesh_admin.channels.domain import InboundMessage, StatusUpdate, event_from_json
from botmesh_admin.errors import ValidationError

from .conftest import fixture_path, load_json, whatsapp_bodies

SIGNATURES = load_json("whatsapp", "raw", "signatures.json")


def parse(name: str) -> list:
    return whatsapp.parse_webhook(whatsapp_bodies()[name])


@pytest.mark.parametrize("name", sorted(SIGNATURES["signatures"]))
def test_raw_fixture_bytes_pass_with_their_signature(name: str) -> None:
    raw = fixture_path("whatsapp", "raw", name).read_bytes()
    header = SIGNATURES["signatures"][name]
    assert whatsapp.verify_signature(raw, header, SIGNATURES["app_secret"])
    assert whatsapp.signature(raw, SIGNATURES["app_secret"]) == header


@pytest.mark.parametrize("name", sorted(SIGNATURES["signatures"]))
def test_one_changed_byte_or_wrong_secret_fails(name: str) -> None:
    raw = fixture_path("whatsapp", "raw", name).read_bytes()
    header = SIGNATURES["signatures"][name]
    for i in (0, len(raw) // 2, len(raw) - 1):
        changed = raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1 :]
        assert not whatsapp.verify_signature(changed, header, SIGNATURES["app_secret"])
    assert not whatsapp.verify_signature(raw, header, "another-secret")
    assert not whatsapp.verify_signature(raw, None, SIGNATURES["app_secret"])
    assert not whatsapp.verify_signature(raw, header.replace("sha256=", "sha1="), SIGNATURES["app_secret"])
    assert not whatsapp.verify_signature(raw, header, "")


def test_handshake_echoes_challenge_only_for_the_right_token() -> None:
    check = lambda token: token == "good"  # noqa: E731
    ok = {"hub.mode": "subscribe", "hub.verify_token": "good", "hub.challenge": "1158201444"}
    assert whatsapp.verify_handshake(ok, check) == "1158201444"
    assert whatsapp.verify_handshake({**ok, "hub.verify_token": "bad"}, check) is None
    assert whatsapp.verify_handshake({**ok, "hub.mode": "unsubscribe"}, check) is None
    assert whatsapp.verify_handshake({**ok, "hub.challenge": ""}, check) is None


def test_text_message_with_profile_name() -> None:
    [msg] = parse("01_text.json")
    assert msg == InboundMessage(
        channel="whatsapp",
        chat_key="whatsapp:573001112233",
        sender_id="whatsapp:573001112233",
        provider_message_id="wamid.HBgMAE23B94CCAF714337E4CE5BA",
        type="text",
        text="Hola, ¿tienen envíos a Medellín? 🚚",
        timestamp_ms=1764489600000,
        sender_name="Ana García",
        raw_type="text",
    )


def test_image_keeps_media_id_mime_and_caption() -> None:
    [msg] = parse("02_image_caption.json")
    assert msg.type == "image" and msg.text == "Este es el modelo"
    assert (msg.media.id, msg.media.mime_type, msg.media.caption) == (
        "1037543291543636",
        "image/jpeg",
        "Este es el modelo",
    )


def test_button_reply_keeps_id_title_and_context() -> None:
    [msg] = parse("03_button_reply.json")
    assert msg.type == "button" and msg.raw_type == "interactive"
    assert (msg.button.id, msg.button.title, msg.button.kind) == (
        "talk_to_human",
        "Hablar con un asesor",
        "button_reply",
    )
    assert msg.reply_to == "wamid.HBgM9C4C9375A2A8FD488DD06113"


def test_list_reply_and_template_quick_reply() -> None:
    body = whatsapp_bodies()["03_button_reply.json"]
    message = body["entry"][0]["changes"][0]["value"]["messages"][0]
    message["interactive"] = {
        "type": "list_reply",
        "list_reply": {"id": "plan_a", "title": "Plan A", "description": "12 meses"},
    }
    [msg] = whatsapp.parse_webhook(body)
    assert (msg.button.id, msg.button.kind, msg.button.description) == ("plan_a", "list_reply", "12 meses")
    message.update(type="button", button={"payload": "STOP", "text": "Dejar de recibir"})
    [msg] = whatsapp.parse_webhook(body)
    assert (msg.type, msg.button.id, msg.button.title, msg.button.kind) == (
        "button",
        "STOP",
        "Dejar de recibir",
        "quick_reply",
    )


def test_reaction_names_its_target() -> None:
    [msg] = parse("04_reaction.json")
    assert msg.type == "reaction"
    assert (msg.reaction.target_message_id, msg.reaction.emoji) == ("wamid.HBgM9C4C9375A2A8FD488DD06113", "👍")


def test_location() -> None:
    [msg] = parse("05_location.json")
    assert msg.type == "location" and msg.sender_name == "Luis Pérez"
    assert (msg.location.latitude, msg.location.longitude, msg.location.name, msg.location.address) == (
        19.4326,
        -99.1332,
        "Zócalo",
        "Centro, CDMX",
    )


def test_statuses_in_order() -> None:
    events = parse("06_statuses.json")
    assert [(e.status, e.timestamp_ms) for e in events] == [
        ("sent", 1764489601000),
        ("delivered", 1764489602000),
        ("read", 1764489630000),
    ]
    assert all(
        isinstance(e, StatusUpdate) and e.provider_message_id == "wamid.HBgM9C4C9375A2A8FD488DD06113" for e in events
    )
    assert events[0].recipient == "573001112233" and events[0].chat_key == "whatsapp:573001112233"


def test_failed_status_keeps_code_and_title() -> None:
    [status] = parse("07_status_failed.json")
    assert (status.status, status.error_code, status.error_title) == ("failed", 131047, "Re-engagement message")


def test_batch_yields_every_message_of_every_change() -> None:
    events = parse("08_batch.json")
    assert len(events) == 3
    assert {e.chat_key for e in events} == {"whatsapp:5215512345678", "whatsapp:573001112233"}
    assert [e.sender_name for e in events] == ["Luis Pérez", "Luis Pérez", "Ana García"]
    assert [e.text for e in events] == ["¿Precio del plan anual?", "y si pago en pesos", "Gracias!"]


def test_unsupported_is_kept_as_such() -> None:
    [msg] = parse("09_unsupported.json")
    assert (msg.type, msg.raw_type, msg.text) == ("unsupported", "unsupported", None)
    assert msg.provider_message_id == "wamid.HBgMA2583CF386EF113D138BC18E"


def test_unknown_type_is_unsupported_with_raw_type() -> None:
    body = whatsapp_bodies()["01_text.json"]
    body["entry"][0]["changes"][0]["value"]["messages"][0].update(type="order", order={"catalog_id": "1"})
    [msg] = whatsapp.parse_webhook(body)
    assert (msg.type, msg.raw_type) == ("unsupported", "order")


@pytest.mark.parametrize("name", sorted(whatsapp_bodies()))
def test_every_event_round_trips_through_json(name: str) -> None:
    events = parse(name)
    assert events
    assert [event_from_json(json.loads(json.dumps(e.to_json()))) for e in events] == events


def test_not_an_object_is_a_validation_error_and_odd_shapes_yield_nothing() -> None:
    with pytest.raises(ValidationError):
        whatsapp.parse_webhook([1, 2])
    assert (
        whatsapp.parse_webhook(
            {
                "object": "whatsapp_business_account",
                "entry": [{"changes": [{"value": {"messages": [{"type": "text"}]}}]}],
            }
        )
        == []
    )
    assert whatsapp.parse_webhook({"entry": "nope"}) == []


def test_phone_number_ids() -> None:
    assert whatsapp.phone_number_ids(whatsapp_bodies()["08_batch.json"]) == ["106540352242922"]


@pytest.mark.parametrize("timestamp", ["abc", None, "", "1.5", 12, "99999999999", True, "9" * 4301])
def test_a_message_time_that_is_not_unix_seconds_is_refused_naming_it(timestamp) -> None:  # type: ignore[no-untyped-def]
    """Found by exploratory testing: a timestamp "abc" was stored as 0 (1970) instead of being refused."""
    body = whatsapp_bodies()["08_batch.json"]
    body["entry"][0]["changes"][0]["value"]["messages"][1]["timestamp"] = timestamp
    with pytest.raises(ValidationError) as info:
        whatsapp.parse_webhook(body)
    assert info.value.field == "entry[0].changes[0].value.messages[1].timestamp"
    if isinstance(timestamp, str) and not timestamp.isdigit():  # the Cloud API's own form is a digit string
        assert "Unix seconds written as digits" in info.value.message
    if timestamp is None:
        assert info.value.message.endswith(": is missing: it must be an integer epoch time")
    if timestamp == "9" * 4301:  # Python refuses to read it (a ValueError was a 500, and Meta resends on a 500)
        assert info.value.message.endswith(": must be Unix seconds, not a number of 4301 digits")


def test_a_status_time_that_is_not_unix_seconds_is_refused_naming_it() -> None:
    """Found by exploratory testing: a status with an unreadable time was dated 1970."""
    body = whatsapp_bodies()["06_statuses.json"]
    body["entry"][0]["changes"][0]["value"]["statuses"][0]["timestamp"] = "abc"
    with pytest.raises(ValidationError) as info:
        whatsapp.parse_webhook(body)
    assert info.value.field == "entry[0].changes[0].value.statuses[0].timestamp"


@pytest.mark.parametrize(
    ("name", "shown"),
    [("Evil\u202eName", "EvilName"), ("Ctl\x07Name", "Ctl Name"), ("Zero\u200bWidth", "ZeroWidth"), ("\u202e", None),
     ("محمد", "محمد"), ("👩\u200d💻 Ana", "👩\u200d💻 Ana")],
)  # fmt: skip
def test_a_profile_name_loses_control_and_bidi_characters_and_nothing_else(name: str, shown: str | None) -> None:
    """A fresh user's report: ``Evil\\u202eName`` was shown raw in the inbox while the CRM dropped it."""
    body = json.loads(json.dumps(whatsapp_bodies()["01_text.json"]))
    body["entry"][0]["changes"][0]["value"]["contacts"][0]["profile"]["name"] = name
    [msg] = whatsapp.parse_webhook(body)
    assert msg.sender_name == shown
