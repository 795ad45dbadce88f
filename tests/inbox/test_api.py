"""The inbox REST API: ledger push, conversations, assignment, handoff, notes, read markers, erasure."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id

from .conftest import ledger_records


@dataclass
class Api:
    tenant: str
    client: Client
    token: str
    agent_token: str
    other_tenant: str
    other_token: str

    def call(
        self,
        method: str,
        path: str,
        body=None,
        *,
        token: str | None = None,
        tenant: str | None = None,
        raw: bytes | None = None,
    ):
        url = f"/api/v1/tenants/{tenant or self.tenant}/{path}"
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        response = getattr(self.client, method)(
            url,
            data=data,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token or self.token}",
        )
        return response.status_code, response.json() if response.content else None


@pytest.fixture
def api(db) -> Api:
    tenant, other = unique_id("shop"), unique_id("other")
    users = get_user_model()
    for name in ("ana", "bob"):
        users.objects.get_or_create(username=name)
    tenancy.tenant_create(tenant, name="Shop")
    tenancy.tenant_create(other, name="Other")
    tenancy.membership_set(tenant, username="ana", role="agent")
    return Api(
        tenant=tenant,
        client=Client(),
        token=tenancy.token_create(tenant, name="ci")[1],
        agent_token=tenancy.token_create(tenant, name="bot", role="agent")[1],
        other_tenant=other,
        other_token=tenancy.token_create(other, name="ci")[1],
    )


def drain() -> None:
    """Project what was journaled: webhooks (``inbound``) and ledger pushes (``ledger``)."""
    while sum(journal_drain(channel="inbound", limit=500).values()) + sum(
        journal_drain(channel="ledger", limit=500).values()
    ):
        pass


def records_of(tenant: str) -> list[dict]:
    return [dict(r, tenantId=None) for r in ledger_records() if r["tenantId"] == tenant]


def push_lines(api: Api, records: list[dict], **kw):
    body = "\n".join(json.dumps(r, ensure_ascii=False) for r in records).encode()
    return api.call("post", "ledger", raw=body, **kw)


def test_ledger_push_journals_then_worker_projects(api):
    records = records_of("soporte")
    status, body = push_lines(api, records)
    assert status == 202
    assert body == {"records": 122, "accepted": 121, "duplicates": 1}  # one redelivered line
    drain()
    status, page = api.call("get", "conversations?limit=200")
    assert status == 200 and len(page["items"]) == 38
    assert sum(c["message_count"] for c in page["items"]) == 121
    # pushing again changes nothing
    assert push_lines(api, records)[1]["accepted"] == 0


def test_ledger_push_accepts_a_json_array(api):
    status, body = api.call("post", "ledger", records_of("soporte")[:5])
    assert (status, body["accepted"]) == (202, 5)


def test_bad_record_is_422_naming_it_and_nothing_is_written(api):
    records = records_of("soporte")[:6]
    records[3]["timestamp"] = "yesterday"
    status, body = push_lines(api, records)
    assert status == 422 and body["field"] == "records[3].timestamp"
    drain()
    assert api.call("get", "conversations")[1]["items"] == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"channel": "pigeon"}, "channel"),
        ({"channel": "whatsapp", "chatId": "telegram:700000101"}, "chatId"),
        ({"channel": "whatsapp", "chatId": "whatsapp:notaphone"}, "chatId"),
        ({"channel": "whatsapp", "chatId": "whatsapp:123"}, "chatId"),
        ({"channel": "telegram", "chatId": "telegram:abc"}, "chatId"),
        ({"timestamp": "abc"}, "timestamp"),
        ({"timestamp": 0}, "timestamp"),
        ({"timestamp": 1764489609.5}, "timestamp"),
        ({"timestamp": 1764489609}, "timestamp"),  # seconds, not milliseconds
        ({"timestamp": 9_999_999_999_999}, "timestamp"),  # the year 2286
    ],
)
def test_record_the_inbox_cannot_place_is_422_naming_its_field_and_nothing_is_written(api, change, field):
    """Found by exploratory testing: such records were accepted (202) and made odd conversations."""
    records = records_of("soporte")[:6]
    records[2].update(change)
    status, body = push_lines(api, records)
    assert (status, body["field"]) == (422, f"records[2].{field}")
    drain()
    assert api.call("get", "conversations")[1]["items"] == []


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 3000 + b"]" * 3000,
        b'{"id": "m1", "body": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        b"[" + b"[" * 100 + b"]" * 100 + b"]",
    ],
)
def test_deeply_nested_ledger_body_is_422_not_500(api, body):
    """Found by exploratory testing: a body nested 3000 levels deep answered 500 with a traceback."""
    status, answer = api.call("post", "ledger", raw=body)
    assert status == 422 and answer["field"] in ("records", "records[0]")
    assert "nested" in answer["message"]


def test_record_naming_another_tenant_is_refused(api):
    records = records_of("soporte")[:2]
    records[1]["tenantId"] = api.other_tenant
    status, body = push_lines(api, records)
    assert status == 422 and body["field"] == "records[1].tenantId"


def test_ledger_needs_a_token_of_the_tenant(api):
    status, _ = push_lines(api, records_of("soporte")[:1], token=api.other_token)
    assert status in (401, 404)


@pytest.fixture
def conversation(api) -> dict:
    push_lines(api, records_of("soporte")[:40])
    drain()
    return api.call("get", "conversations")[1]["items"][0]


def test_assign_stale_version_is_409_with_current_assignee_and_version(api, conversation):
    cid, version = conversation["id"], conversation["version"]
    status, body = api.call("post", f"conversations/{cid}/assign", {"agent": "ana", "expected_version": version})
    assert status == 200 and body["assignee"] == "ana" and body["version"] == version + 1
    status, body = api.call("post", f"conversations/{cid}/assign", {"agent": None, "expected_version": version})
    assert status == 409
    assert body["current_version"] == version + 1 and body["assignee"] == "ana"
    status, body = api.call("post", f"conversations/{cid}/assign", {"agent": "bob", "expected_version": version + 1})
    assert status == 422 and body["field"] == "agent"  # bob is no member of this tenant
    status, body = api.call("post", f"conversations/{cid}/assign", {"agent": "ana", "expected_version": -1})
    assert (status, body["field"]) == (422, "expected_version") and "conversation's version" in body["message"]


def test_handoff_is_readable_by_bots(api, conversation):
    cid = conversation["id"]
    status, body = api.call("post", f"conversations/{cid}/handoff", {"active": True}, token=api.agent_token)
    assert status == 200 and body["handoff"]["active"]
    status, state = api.call("get", f"handoff/{conversation['chat_key']}", token=api.agent_token)
    assert status == 200 and state["handed_off"] and state["taken_by"].startswith("token-")
    api.call("post", f"conversations/{cid}/handoff", {"active": False})
    assert not api.call("get", f"handoff/{conversation['chat_key']}")[1]["handed_off"]
    status, body = api.call("post", f"conversations/{cid}/handoff", {"active": "yes"})
    assert (status, body["field"]) == (422, "active")
    assert not api.call("get", f"handoff/{conversation['chat_key']}")[1]["handed_off"]


def test_notes_and_read_markers(api, conversation):
    cid = conversation["id"]
    for i in range(3):
        assert api.call("post", f"conversations/{cid}/notes", {"text": f"n{i}"})[0] == 201
    status, page = api.call("get", f"conversations/{cid}/notes?limit=2")
    assert [n["text"] for n in page["items"]] == ["n0", "n1"]
    rest = api.call("get", f"conversations/{cid}/notes?limit=2&after={page['next']}")[1]
    assert [n["text"] for n in rest["items"]] == ["n2"] and rest["next"] is None
    assert api.call("post", f"conversations/{cid}/notes", {"text": ""})[1]["field"] == "text"
    before = api.call("get", f"conversations/{cid}")[1]
    assert before["unread"] == before["inbound_count"]
    status, read = api.call("post", f"conversations/{cid}/read", {})
    assert status == 200 and read["unread"] == 0
    assert api.call("get", f"conversations/{cid}")[1]["unread"] == 0
    assert api.call("get", "conversations?unread=true")[1]["items"] == [
        c for c in api.call("get", "conversations?unread=true")[1]["items"] if c["id"] != cid
    ]


def test_messages_paginate_in_order(api, conversation):
    cid = conversation["id"]
    status, page = api.call("get", f"conversations/{cid}/messages?limit=1")
    assert status == 200 and len(page["items"]) == 1
    items = page["items"]
    while page["next"]:
        page = api.call("get", f"conversations/{cid}/messages?limit=1&after={page['next']}")[1]
        items += page["items"]
    assert len(items) == conversation["message_count"]
    assert [m["timestamp_ms"] for m in items] == sorted(m["timestamp_ms"] for m in items)


def test_list_filters_and_cursor(api, conversation):
    status, page = api.call("get", "conversations?limit=3")
    seen = [c["id"] for c in page["items"]]
    while page["next"]:
        page = api.call("get", f"conversations?limit=3&after={page['next']}")[1]
        seen += [c["id"] for c in page["items"]]
    assert len(seen) == len(set(seen)) == len(api.call("get", "conversations?limit=200")[1]["items"])
    assert api.call("get", "conversations?view=mine")[1]["items"] == []
    assert api.call("get", "conversations?status=closed")[0] == 422
    telegram = api.call("get", "conversations?channel=telegram&limit=200")[1]["items"]
    assert telegram and all(c["channel"] == "telegram" for c in telegram)


def test_erase_needs_admin_and_removes_the_conversation(api, conversation):
    cid = conversation["id"]
    assert api.call("delete", f"conversations/{cid}", token=api.agent_token)[0] == 403
    status, body = api.call("delete", f"conversations/{cid}")
    assert status == 200 and body["records_removed"] >= 1 + conversation["message_count"]
    assert api.call("get", f"conversations/{cid}")[0] == 404


def test_openapi_documents_the_inbox_schemas(api):
    schema = api.client.get("/api/v1/openapi.json").json()
    names = set(schema["components"]["schemas"])
    assert {
        "ConversationOut",
        "MessageOut",
        "NoteOut",
        "AssignIn",
        "LedgerOut",
        "HandoffStateOut",
        "ReplyIn",
        "ConversationPage",
    } <= names
    ledger = schema["paths"]["/api/v1/tenants/{tenant}/ledger"]["post"]
    assert "application/x-ndjson" in ledger["requestBody"]["content"]


def test_a_refused_note_or_reply_names_the_body_field_it_sent_whichever_check_refused_it(api, conversation):
    """A fresh user's report: a note's type error named ``text`` and its blank text ``note.text``."""
    cid = conversation["id"]
    for path in ("notes", "reply"):
        for text in (5, "", " \n ", "x" * 5000):
            status, body = api.call("post", f"conversations/{cid}/{path}", {"text": text})
            assert (status, body["field"]) == (422, "text"), (path, text, body)
            assert body["message"].startswith("text: "), body["message"]
    status, body = api.call("post", f"conversations/{cid}/reply", {"text": "hola", "idempotency_key": "k\x00"})
    assert (status, body["field"]) == (422, "idempotency_key") and body["message"].startswith("idempotency_key: ")
    assert api.call("get", f"conversations/{cid}/notes")[1]["items"] == []


@pytest.mark.parametrize("text", ["ring\x07ring", "pay\u202eknil", "a\u2066b", "x\x1by", "c1\x85"])
def test_note_and_reply_with_a_control_or_bidi_override_character_are_422(api, conversation, text):
    """Found by exploratory testing: notes kept BEL and U+202E, which make a note read otherwise than it says."""
    cid = conversation["id"]
    status, body = api.call("post", f"conversations/{cid}/notes", {"text": text})
    assert (status, body["field"]) == (422, "text")
    status, body = api.call("post", f"conversations/{cid}/reply", {"text": text})
    assert (status, body["field"]) == (422, "text")
    assert api.call("get", f"conversations/{cid}/notes")[1]["items"] == []


def test_note_keeps_tabs_and_line_breaks_and_reads_crlf_as_one_break(api, conversation):
    """Found by exploratory testing (the control-character rule must not refuse a multi-line note)."""
    status, body = api.call("post", f"conversations/{conversation['id']}/notes", {"text": "a\tb\r\nc\nd"})
    assert (status, body["text"]) == (201, "a\tb\nc\nd")
