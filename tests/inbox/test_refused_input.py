"""Bad input to the inbox API is refused with a 422 naming the field, never answered as if valid.

Found by a new user (inbox and ledger APIs): a bot's typo in the handoff check
read "not handed off" (200), ``?channel=fax`` listed nothing (200), a settings
PATCH with an unknown field answered 200 and changed nothing, and a ledger body
``{"records": [...]}`` was blamed on ``records[0].channel``. Driven over the API
with the Django test client.
"""

from __future__ import annotations

import json

import pytest

from .test_api import Api, api, conversation, push_lines, records_of  # noqa: F401 - fixtures

# -- the handoff check -----------------------------------------------------------------


@pytest.fixture
def taken(api: Api, conversation: dict) -> dict:  # noqa: F811 - fixtures
    """A WhatsApp conversation an agent took from the bot (the bot must not answer it)."""
    status, body = api.call("post", f"conversations/{conversation['id']}/handoff", {"active": True})
    assert status == 200 and body["handoff"]["active"], body
    assert conversation["chat_key"].startswith("whatsapp:"), conversation["chat_key"]
    return conversation


def test_handoff_of_a_bare_number_is_422_naming_chat_id_with_the_format(api, taken):  # noqa: F811
    """``/handoff/573169136476`` answered 200 ``handed_off: false`` although ``whatsapp:…`` was taken."""
    bare = taken["chat_key"].removeprefix("whatsapp:")
    status, body = api.call("get", f"handoff/{bare}")
    assert (status, body["field"]) == (422, "chat_id")
    assert "whatsapp:<wa_id>" in body["message"] and "telegram:<chat id>" in body["message"]
    status, body = api.call("get", f"handoff/sms:{bare}")
    assert (status, body["field"]) == (422, "chat_id")
    status, body = api.call("get", f"handoff/{taken['chat_key']}")
    assert (status, body["handed_off"]) == (200, True)


def test_handoff_of_an_overlong_chat_id_is_422(api):  # noqa: F811
    status, body = api.call("get", "handoff/whatsapp:" + "5" * 3000)
    assert (status, body["field"]) == (422, "chat_id")
    assert "200" in body["message"]


def test_handoff_with_a_channel_the_tenant_lacks_is_422_naming_channel(api, taken):  # noqa: F811
    """``?channel=nope`` answered 200 ``handed_off: false``."""
    from botmesh_admin.channels.services import channel_config_set

    status, body = api.call("get", f"handoff/{taken['chat_key']}?channel=nope")
    assert (status, body["field"]) == (422, "channel")
    assert "no whatsapp channel" in body["message"]
    channel_config_set(api.tenant, kind="whatsapp", name="ventas", phone_number_id="106540352242922")
    status, body = api.call("get", f"handoff/{taken['chat_key']}?channel=nope")
    assert (status, body["field"]) == (422, "channel")
    assert "ventas" in body["message"]
    assert api.call("get", f"handoff/{taken['chat_key']}?channel=ventas")[0] == 200


# -- list filters and bodies --------------------------------------------------------------


def test_conversation_list_refuses_an_unknown_channel_like_an_unknown_status(api):  # noqa: F811
    for query, field in (("channel=fax", "channel"), ("status=bogus", "status")):
        status, body = api.call("get", f"conversations?{query}")
        assert (status, body["field"]) == (422, field), query
        assert "whatsapp, telegram" in body["message"] or "open, pending" in body["message"]
    assert api.call("get", "conversations?channel=telegram")[0] == 200


def test_openapi_declares_the_channel_filter_enum(client):
    document = client.get("/api/v1/openapi.json").json()
    params = document["paths"]["/api/v1/tenants/{tenant}/conversations"]["get"]["parameters"]
    channel = next(p for p in params if p["name"] == "channel")
    assert (
        channel["schema"].get("enum") == ["whatsapp", "telegram"]
        or any(s.get("enum") == ["whatsapp", "telegram"] for s in channel["schema"].get("anyOf", []))
        or channel.get("enum") == ["whatsapp", "telegram"]
    ), channel


def test_settings_patch_with_an_unknown_field_is_422_naming_it_and_changes_nothing(api):  # noqa: F811
    before = api.call("get", "inbox/settings")[1]
    status, body = api.call("patch", "inbox/settings", {"unknown_field": True, "reply_to_others": True})
    assert (status, body["field"]) == (422, "unknown_field")
    assert api.call("get", "inbox/settings")[1] == before


@pytest.mark.parametrize(
    ("path", "payload", "field"),
    [
        ("assign", {"agent": "ana", "expected_version": 0, "agnet": "bob"}, "agnet"),
        ("handoff", {"active": True, "force": True}, "force"),
        ("status", {"status": "open", "snooze_until_ms": 1}, "snooze_until_ms"),
        ("notes", {"text": "hi", "private": True}, "private"),
        ("read", {"message": "m1"}, "message"),
        ("reply", {"text": "hi", "idempotencyKey": "k1"}, "idempotencyKey"),
    ],
)
def test_conversation_bodies_refuse_unknown_fields(api, conversation, path, payload, field):  # noqa: F811
    status, body = api.call("post", f"conversations/{conversation['id']}/{path}", payload)
    assert (status, body["field"]) == (422, field)
    after = api.call("get", f"conversations/{conversation['id']}")[1]
    assert after["version"] == conversation["version"]


# -- the ledger body --------------------------------------------------------------------


def test_ledger_body_wrapping_the_records_is_422_naming_body(api):  # noqa: F811
    """``{"records": [record]}`` was refused as ``records[0].channel: must be one of whatsapp, telegram``."""
    record = records_of("soporte")[0]
    status, body = api.call("post", "ledger", {"records": [record]})
    assert (status, body["field"]) == (422, "body")
    assert "JSON array" in body["message"] and "JSON lines" in body["message"] and "'records'" in body["message"]
    pretty = json.dumps(record, indent=2).encode()
    status, body = api.call("post", "ledger", raw=pretty)
    assert (status, body["field"]) == (422, "body") and "several lines" in body["message"]
    status, body = push_lines(api, [record])  # one record on one line is JSON lines
    assert (status, body["accepted"]) == (202, 1)


def test_openapi_says_the_ledger_body_shapes(client):
    operation = client.get("/api/v1/openapi.json").json()["paths"]["/api/v1/tenants/{tenant}/ledger"]["post"]
    text = operation["requestBody"]["description"] + operation.get("description", "")
    assert "JSON array" in text and "JSON lines" in text and "body" in text
