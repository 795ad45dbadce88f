"""End to end: signed webhooks → journal → worker → inbox; agent replies → outbox → fake provider."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.demo import fixtures_dir
from botmesh_admin.tenancy import services as tenancy
from inbox import selectors
from inbox.services import replies
from tests.inbox.shop import Shop, conversation, drain, open_shop, post_telegram, post_whatsapp


@pytest.fixture
def shop(db):
    with open_shop("shop") as opened:
        yield opened


def test_signed_webhooks_are_projected_by_the_worker(shop):
    for name in sorted(p.name for p in (fixtures_dir() / "whatsapp" / "raw").glob("0*.json")):
        assert post_whatsapp(shop, name) == 200
    for name in sorted(p.name for p in (fixtures_dir() / "telegram").glob("0*.json")):
        assert post_telegram(shop, name) == 200
    assert post_whatsapp(shop, "01_text.json", signature="sha256=" + "0" * 64) == 401
    drain()
    status, page = shop.api("get", "conversations?limit=200")
    chats = {c["chat_key"]: c for c in page["items"]}
    assert set(chats) == {
        "whatsapp:573001112233",
        "whatsapp:5215512345678",
        "telegram:700000001",
        "telegram:-1001234567890:700000001",
        "telegram:-1001234567890:700000002",
    }
    assert chats["telegram:700000001"]["blocked"]
    ana = chats["whatsapp:573001112233"]
    assert ana["display_name"] == "Ana García" and ana["contact_id"]
    _, messages = shop.api("get", f"conversations/{ana['id']}/messages?limit=200")
    texts = [m["text"] for m in messages["items"]]
    assert "Gracias!" in texts and "Hablar con un asesor" in texts


def test_mexican_whatsapp_sender_of_the_batch_becomes_a_contact(shop):
    """Found by exploratory testing: wa_id 5215512345678 (+52 1 55…) failed CRM normalisation, so no contact."""
    from crm.selectors import contact_get, contact_list

    assert post_whatsapp(shop, "08_batch.json") == 200
    drain()
    conv = conversation(shop, "whatsapp:5215512345678")
    assert conv.contact_id is not None
    contact = contact_get(shop.tenant, conv.contact_id)
    assert [(i.channel, i.address) for i in contact.identities] == [("whatsapp", "+525512345678")]
    found = contact_list(shop.tenant, identity="whatsapp:+5215512345678").items
    assert [c.id for c in found] == [conv.contact_id]


def test_reply_is_sent_once_and_shows_the_provider_id(shop):
    post_whatsapp(shop, "01_text.json")
    drain()
    cid = conversation(shop, "whatsapp:573001112233").id
    status, reply = shop.api("post", f"conversations/{cid}/reply", {"text": "¡Hola Ana!", "idempotency_key": "k1"})
    assert status == 202 and reply["reply"]["state"] == "queued"
    again = shop.api("post", f"conversations/{cid}/reply", {"text": "¡Hola Ana!", "idempotency_key": "k1"})[1]
    assert again["id"] == reply["id"]
    status, other = shop.api("post", f"conversations/{cid}/reply", {"text": "Otro texto", "idempotency_key": "k1"})
    assert (status, other["field"]) == (422, "idempotency_key")
    drain("outbox")
    drain("outbox")
    sent = selectors.message_get(shop.tenant, reply["id"])
    assert sent.reply.state == "accepted" and sent.provider_message_id.startswith("wamid.")
    assert shop.fake.count("573001112233") == 1
    assert shop.fake.requests[0].body["text"]["body"] == "¡Hola Ana!"


def test_window_closed_is_shown_and_not_retried(shop):
    post_whatsapp(shop, "05_location.json")
    drain()
    shop.fake.script("5215512345678", "window_closed")
    cid = conversation(shop, "whatsapp:5215512345678").id
    reply = shop.api("post", f"conversations/{cid}/reply", {"text": "¿Sigues ahí?"})[1]
    drain("outbox")
    failed = selectors.message_get(shop.tenant, reply["id"])
    assert (failed.reply.state, failed.reply.error_code) == ("failed", 131047)
    drain("outbox")
    assert shop.fake.count("5215512345678") == 1


def test_telegram_blocked_is_shown_and_not_retried(shop):
    post_telegram(shop, "02_text.json")
    drain()
    shop.fake.script("700000001", "blocked")
    cid = conversation(shop, "telegram:700000001").id
    reply = shop.api("post", f"conversations/{cid}/reply", {"text": "hola"})[1]
    drain("outbox")
    failed = selectors.message_get(shop.tenant, reply["id"])
    assert (failed.reply.state, failed.reply.error_code) == ("failed", 403)
    assert shop.fake.count("700000001") == 1


def test_rate_limit_is_retried_after_the_given_delay(shop):
    post_whatsapp(shop, "05_location.json")
    drain()
    shop.fake.script("5215512345678", "rate_limited", times=1)
    cid = conversation(shop, "whatsapp:5215512345678").id
    reply = shop.api("post", f"conversations/{cid}/reply", {"text": "un momento"})[1]
    waits: list[float] = []
    sent = replies.reply_send(shop.tenant, reply["id"], sleep=waits.append)
    assert sent.reply.state == "accepted" and sent.reply.attempts == 2
    assert waits and waits[0] > 0
    assert shop.fake.count("5215512345678") == 2


def test_no_answer_is_not_confirmed_and_resent_only_by_the_agent(shop):
    post_whatsapp(shop, "01_text.json")
    drain()
    shop.fake.script("573001112233", "drop", times=1)
    cid = conversation(shop, "whatsapp:573001112233").id
    reply = shop.api("post", f"conversations/{cid}/reply", {"text": "¿recibiste?"})[1]
    drain("outbox")
    unknown = selectors.message_get(shop.tenant, reply["id"])
    assert unknown.reply.state == "not_confirmed"
    drain("outbox")
    assert shop.fake.count("573001112233") == 1  # never resent by itself
    status, resent = shop.api("post", f"conversations/{cid}/messages/{reply['id']}/resend")
    assert status == 202 and resent["reply"]["state"] == "queued"
    drain("outbox")
    assert selectors.message_get(shop.tenant, reply["id"]).reply.state == "accepted"
    assert shop.fake.count("573001112233") == 2


def test_a_provider_slower_than_the_lease_gets_one_request_and_the_reply_is_accepted(shop):
    """The live worker renews its lease while the request is in flight: another worker finds nothing to take.

    (A worker that dies mid-request is ``test_reply_crash``: real processes, SIGKILL.)
    """
    from botmesh_admin.events import default_journal
    from botmesh_admin.events.handlers import dispatch
    from botmesh_admin.events.worker import EventWorker

    post_whatsapp(shop, "01_text.json")
    drain()
    cid = conversation(shop, "whatsapp:573001112233").id
    shop.fake.set_delay(2.5, "573001112233")
    reply = shop.api("post", f"conversations/{cid}/reply", {"text": "lento"})[1]
    seen: list[dict[str, int]] = []

    def other_worker() -> None:
        deadline = time.monotonic() + 5
        while shop.fake.count("573001112233") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(2.0)  # twice the lease: the sender's first lease would have expired without renewals
        seen.append(EventWorker(default_journal(), lease_ms=5000, channel="outbox").run_batch(dispatch, 10))

    other = threading.Thread(target=other_worker)
    other.start()
    sent = EventWorker(default_journal(), lease_ms=1000, channel="outbox").run_batch(dispatch, 1)
    other.join(timeout=10)
    assert sent == {"processed": 1, "failed": 0, "stale": 0}
    assert seen == [{"processed": 0, "failed": 0, "stale": 0}]
    assert shop.fake.count("573001112233") == 1
    assert selectors.message_get(shop.tenant, reply["id"]).reply.state == "accepted"


def test_a_message_too_long_or_with_nul_is_kept_not_dead_lettered(shop):
    """The provider was answered 200: what the customer sent is stored (cut, NUL replaced), never lost."""
    from botmesh_admin.channels import whatsapp
    from botmesh_admin.events import default_journal

    secret = json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())["app_secret"]
    body = json.loads((fixtures_dir() / "whatsapp" / "raw" / "01_text.json").read_text())
    message = body["entry"][0]["changes"][0]["value"]["messages"][0]
    for wamid, text in (("wamid.long", "a" * 200_000), ("wamid.nul", "hola\u0000mundo")):
        message.update(id=wamid, text={"body": text})
        raw = json.dumps(body).encode()
        signature = whatsapp.signature(raw, secret)
        response = shop.client.post(
            f"/webhooks/whatsapp/{shop.tenant}",
            data=raw,
            content_type="application/json",
            HTTP_X_HUB_SIGNATURE_256=signature,
        )
        assert response.status_code == 200
    drain()
    assert default_journal().counts(shop.tenant).get(("dead", "inbound"), 0) == 0
    long = selectors.message_get(shop.tenant, "wamid.long")
    assert len(long.text) <= 65536 and long.text.startswith("a" * 60_000)
    assert long.text.endswith(f"[{200_000 - 65536 + 64} more characters not shown]")
    assert selectors.message_get(shop.tenant, "wamid.nul").text == "hola\ufffdmundo"


def test_bodies_over_the_size_limit_get_a_json_413_and_nothing_is_journaled(shop, settings):
    from botmesh_admin.events import default_journal

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    raw = json.dumps({"object": "whatsapp_business_account", "pad": "x" * 5000}).encode()
    response = shop.client.post(
        f"/webhooks/whatsapp/{shop.tenant}",
        data=raw,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256="sha256=" + "0" * 64,
    )
    assert (response.status_code, response.json()["error"]) == (413, "too_large")
    records = [
        {
            "id": f"m{i}",
            "channel": "whatsapp",
            "chatId": "whatsapp:573001112233",
            "senderId": "bot",
            "direction": "out",
            "type": "text",
            "body": "x" * 100,
            "timestamp": 1764489600000 + i,
        }
        for i in range(60)
    ]
    status, body = shop.api("post", "ledger", records)
    assert status == 413 and body["field"] == "body" and "4096 bytes" in body["message"]
    assert default_journal().counts(shop.tenant) == {}


def test_resend_through_another_conversation_is_404_and_sends_nothing(shop):
    """Issue 15, item 5: ``…/conversations/{A}/messages/{m}/resend`` with B's reply resent B's reply."""
    post_whatsapp(shop, "01_text.json")
    post_telegram(shop, "02_text.json")
    drain()
    a = conversation(shop, "whatsapp:573001112233").id
    b = conversation(shop, "telegram:700000001").id
    shop.fake.script("700000001", "drop", times=1)
    reply = shop.api("post", f"conversations/{b}/reply", {"text": "¿recibiste?"})[1]
    drain("outbox")
    assert selectors.message_get(shop.tenant, reply["id"]).reply.state == "not_confirmed"
    status, body = shop.api("post", f"conversations/{a}/messages/{reply['id']}/resend")
    assert (status, body["error"]) == (404, "not_found")
    drain("outbox")
    assert shop.fake.count("700000001") == 1
    assert selectors.message_get(shop.tenant, reply["id"]).reply.state == "not_confirmed"
    status, resent = shop.api("post", f"conversations/{b}/messages/{reply['id']}/resend")
    assert status == 202 and resent["reply"]["state"] == "queued"


def post_statuses(shop: Shop, wamid: str, *statuses: str) -> int:
    """POST a signed WhatsApp webhook with ``statuses`` (``sent``, ``delivered``…) of ``wamid``."""
    from botmesh_admin.channels import whatsapp

    secret = json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())["app_secret"]
    body = json.loads((fixtures_dir() / "whatsapp" / "raw" / "06_statuses.json").read_text())
    value = body["entry"][0]["changes"][0]["value"]
    ts = int(time.time())
    value["statuses"] = [
        {"id": wamid, "status": s, "timestamp": str(ts + i), "recipient_id": "573001112233"}
        for i, s in enumerate(statuses)
    ]
    raw = json.dumps(body).encode()
    return shop.client.post(
        f"/webhooks/whatsapp/{shop.tenant}",
        data=raw,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=whatsapp.signature(raw, secret),
    ).status_code


INTERLEAVINGS = {
    # name: steps while the provider holds its answer, and after the answer is recorded
    "projected before the answer": (["sent", "delivered", "project"], []),
    "journaled before, projected after": (["sent", "delivered"], ["project"]),
    "delivered before, sent after": (["delivered", "project"], ["sent", "project"]),
    "projected while the answer is recorded": (["sent", "delivered", "race"], []),
}


@pytest.mark.parametrize("interleaving", list(INTERLEAVINGS))
def test_a_status_before_the_send_answer_is_absorbed_into_the_reply(shop, transactional_db, interleaving):
    """Issue 15, item 3: a ``sent``/``delivered`` webhook that arrived while the Graph API answer was in
    flight left a placeholder beside the reply: two outbound messages with one wamid."""
    post_whatsapp(shop, "01_text.json")
    drain()
    cid = conversation(shop, "whatsapp:573001112233").id
    during, after = INTERLEAVINGS[interleaving]
    for attempt in range(3 if interleaving.startswith("projected while") else 1):
        reply = shop.api("post", f"conversations/{cid}/reply", {"text": f"en camino {attempt}"})[1]
        shop.fake.hold()
        sender = threading.Thread(target=drain, args=("outbox",))
        sender.start()
        racer = None
        try:
            assert shop.fake.wait_for(attempt + 1, timeout_s=10)
            wamid = shop.fake.requests[-1].provider_message_id
            for step in during:
                if step == "project":
                    drain()
                elif step == "race":
                    racer = threading.Thread(target=drain)
                    racer.start()
                else:
                    assert post_statuses(shop, wamid, step) == 200
        finally:
            shop.fake.release()
            sender.join(timeout=20)
            if racer is not None:
                racer.join(timeout=20)
        for step in after:
            if step == "project":
                drain()
            else:
                assert post_statuses(shop, wamid, step) == 200
        drain()
        status, page = shop.api("get", f"conversations/{cid}/messages?limit=200")
        same = [m for m in page["items"] if m["provider_message_id"] == wamid]
        assert [(m["id"], m["status"], m["placeholder"]) for m in same] == [(reply["id"], "delivered", False)]
        assert same[0]["reply"]["state"] == "accepted"
        _, conv = shop.api("get", f"conversations/{cid}")
        assert conv["message_count"] == len(page["items"])
        assert conv["last_text"] == f"en camino {attempt}"


def agent_client(shop: Shop, username: str) -> Client:
    """A browser session of ``username``, an agent of the shop (the API takes the UI's session too)."""
    user, _ = get_user_model().objects.get_or_create(username=username)
    tenancy.membership_set(shop.tenant, username=username, role="agent")
    client = Client()
    client.force_login(user)
    return client


def as_client(client: Client, shop: Shop, method: str, path: str, body=None):
    response = getattr(client, method)(
        f"/api/v1/tenants/{shop.tenant}/{path}",
        content_type="application/json",
        data=json.dumps(body) if body is not None else None,
    )
    return response.status_code, response.json()


def test_an_agents_reply_takes_the_chat_from_the_bot_and_the_bot_sees_who_and_when(shop):
    """Issue 15, item 4: the bot kept answering after an agent replied (no handoff was recorded)."""
    post_whatsapp(shop, "01_text.json")
    drain()
    cid = conversation(shop, "whatsapp:573001112233").id
    ana = agent_client(shop, "ana")
    before = int(time.time() * 1000)
    status, _ = as_client(ana, shop, "post", f"conversations/{cid}/reply", {"text": "Hola, soy Ana"})
    assert status == 202
    _, conv = shop.api("get", f"conversations/{cid}")
    assert conv["handoff"]["active"] and conv["handoff"]["taken_by"] == "ana" and conv["assignee"] == "ana"
    bot_token = tenancy.token_create(shop.tenant, name="bot", role="bot")[1]
    response = shop.client.get(
        f"/api/v1/tenants/{shop.tenant}/handoff/whatsapp:573001112233", HTTP_AUTHORIZATION=f"Bearer {bot_token}"
    )
    seen = response.json()
    assert response.status_code == 200 and seen["handed_off"] and seen["taken_by"] == "ana"
    assert before <= seen["taken_at_ms"] <= int(time.time() * 1000)


def test_a_reply_does_not_take_over_when_the_tenant_setting_says_so(shop):
    post_whatsapp(shop, "01_text.json")
    drain()
    cid = conversation(shop, "whatsapp:573001112233").id
    ana = agent_client(shop, "ana")
    assert as_client(ana, shop, "patch", "inbox/settings", {"reply_takes_over": False})[0] == 403
    status, body = shop.api("patch", "inbox/settings", {"reply_takes_over": "no"})
    assert (status, body["field"]) == (422, "reply_takes_over")
    assert shop.api("patch", "inbox/settings", {"reply_takes_over": False}) == (
        200,
        {"reply_takes_over": False, "reply_to_others": False},
    )
    assert as_client(ana, shop, "get", "inbox/settings")[1]["reply_takes_over"] is False
    assert as_client(ana, shop, "post", f"conversations/{cid}/reply", {"text": "Hola"})[0] == 202
    _, conv = shop.api("get", f"conversations/{cid}")
    assert conv["handoff"] is None and conv["assignee"] is None


def test_a_reply_in_another_agents_conversation_is_409_naming_the_assignee(shop):
    """Issue 15, item 4: anyone's reply went out in a conversation another agent was handling."""
    post_whatsapp(shop, "01_text.json")
    drain()
    cid = conversation(shop, "whatsapp:573001112233").id
    ana, bob = agent_client(shop, "ana"), agent_client(shop, "bob")
    assert as_client(ana, shop, "post", f"conversations/{cid}/reply", {"text": "Te atiendo yo"})[0] == 202
    status, refused = as_client(bob, shop, "post", f"conversations/{cid}/reply", {"text": "¿Y yo?"})
    assert (status, refused["error"], refused["assignee"]) == (409, "conflict", "ana")
    assert "assigned to ana" in refused["message"]
    _, page = shop.api("get", f"conversations/{cid}/messages?limit=200")
    assert [m["text"] for m in page["items"] if m["reply"]] == ["Te atiendo yo"]  # nothing queued
    # "Assign to me and reply": one step, and the conversation is bob's
    status, taken = as_client(bob, shop, "post", f"conversations/{cid}/reply", {"text": "Sigo yo", "assign": True})
    assert status == 202 and taken["reply"]["author"] == "bob"
    assert shop.api("get", f"conversations/{cid}")[1]["assignee"] == "bob"
    # an admin may always reply; with the tenant's reply_to_others any agent may
    assert shop.api("post", f"conversations/{cid}/reply", {"text": "Soy la admin"})[0] == 202
    assert as_client(ana, shop, "post", f"conversations/{cid}/reply", {"text": "Otra vez"})[0] == 409
    shop.api("patch", "inbox/settings", {"reply_to_others": True})
    assert as_client(ana, shop, "post", f"conversations/{cid}/reply", {"text": "Otra vez"})[0] == 202
    assert shop.api("get", f"conversations/{cid}")[1]["assignee"] == "bob"
    drain("outbox")
    assert shop.fake.count("573001112233") == 4
