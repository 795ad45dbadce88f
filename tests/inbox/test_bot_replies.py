"""``POST …/bots/{bot}/replies``: a refused answer writes nothing and the fence is bounded (review fixes)."""

from __future__ import annotations

import json
from urllib.parse import quote

from botmesh_admin.tenancy import services as tenancy
from tests.inbox.test_webhooks_and_replies import drain, post_whatsapp, shop  # noqa: F401


def inbound(shop, bot_token: str, bot: str = "support"):  # noqa: F811
    post_whatsapp(shop, "01_text.json")
    drain()
    response = shop.client.get(
        f"/api/v1/tenants/{shop.tenant}/bots/{quote(bot, safe='')}/inbound?since_ms=0",
        HTTP_AUTHORIZATION=f"Bearer {bot_token}",
    )
    assert response.status_code == 200, response.content
    return response.json()["items"][0]


def reply(shop, bot_token: str, item, *, bot: str = "support", **body):  # noqa: F811
    data = {"conversation_id": item["conversation_id"], "in_reply_to": item["id"], "text": "Hola", **body}
    response = shop.client.post(
        f"/api/v1/tenants/{shop.tenant}/bots/{quote(bot, safe='')}/replies",
        data=json.dumps(data),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {bot_token}",
    )
    return response.status_code, response.json()


def test_a_fence_out_of_range_is_refused_naming_fence_and_leaves_no_fence_behind(shop):  # noqa: F811
    token = tenancy.token_create(shop.tenant, name="support", role="bot")[1]  # a bot token acts as its own bot
    item = inbound(shop, token)
    for fence in (10**18, 2**53, 0, -1, 1.5):
        status, body = reply(shop, token, item, fence=fence)
        assert status == 422, (fence, status, body)
        assert "fence" in json.dumps(body), (fence, body)
    status, body = reply(shop, token, item, fence=2**53 - 1 - 10**9, text="")  # refused for its text
    assert status == 422 and "text" in json.dumps(body)
    # Nothing was written by the refusals: a modest fence answers (a 10**18 one stored would make it stale).
    status, body = reply(shop, token, item, fence=5)
    assert status == 202, body
    assert body["created"] is True and body["message"]["reply_to"] == item["id"]


def test_a_bot_id_that_is_no_message_id_still_answers_and_a_refusal_after_the_lookup_writes_no_fence(shop):  # noqa: F811
    token = tenancy.token_create(shop.tenant, name="bot", role="bot", bot="support bot/es")[1]
    item = inbound(shop, token, bot="support bot/es")
    # A malformed in_reply_to is refused naming it, before any write.
    status, body = reply(shop, token, {**item, "id": "not an id"}, bot="support bot/es", fence=9)
    assert status == 422 and "in_reply_to" in json.dumps(body), body
    status, body = reply(shop, token, item, bot="support bot/es", fence=3)
    assert status == 202, body  # was 422 message.sender_id, with the fence 3 already stored
    assert body["created"] is True
    assert body["message"]["sender_id"].startswith("bot:") and " " not in body["message"]["sender_id"]
    status, body = reply(shop, token, item, bot="support bot/es", fence=2)
    assert (status, body["error"], body["current_version"]) == (409, "stale_fence", 3)


def test_a_delivery_status_of_a_message_the_inbox_does_not_know_does_not_answer_the_customer(shop):  # noqa: F811
    """Found by a new user: a status for an unknown message after the customer's made the bot stay silent.

    The status makes a placeholder ("sent outside the inbox") dated at the receipt, not at the send:
    it may be the read receipt of an older message. Only a real outbound record after it answers.
    """
    from botmesh_admin.demo import fixtures_dir
    from tests.inbox.test_unstorable_ids import post_signed

    token = tenancy.token_create(shop.tenant, name="support", role="bot")[1]
    item = inbound(shop, token)  # Ana's "Hola, ¿tienen envíos…" at 1764489600 s
    assert item["answered"] is False
    # The fixtures' status body, holding one read receipt of a message no record or ledger knows.
    body = json.loads((fixtures_dir() / "whatsapp" / "raw" / "06_statuses.json").read_text())
    value = body["entry"][0]["changes"][0]["value"]
    status = {"id": "wamid.SENT_ELSEWHERE", "status": "read", "timestamp": "1764489660", "recipient_id": "573001112233"}
    value["statuses"] = [status]
    code, answer = post_signed(shop, body)
    assert code == 200 and answer["received"] == 1
    drain()
    _, page = shop.api("get", f"conversations/{item['conversation_id']}/messages")
    assert [m["placeholder"] for m in page["items"] if m["direction"] == "out"] == [True]
    again = shop.client.get(f"/api/v1/tenants/{shop.tenant}/bots/support/inbound?since_ms=0",
                            HTTP_AUTHORIZATION=f"Bearer {token}").json()["items"]  # fmt: skip
    assert [(i["id"], i["answered"]) for i in again] == [(item["id"], False)]


def test_the_bot_client_reads_exactly_the_fields_the_inbound_feed_sends() -> None:
    """``botclient.InboundMessage`` stays a stdlib dataclass (a bot imports the client without Django or
    pydantic), so it repeats ``BotInboundOut``'s fields: this keeps the two the same (issue 14, item 5)."""
    from dataclasses import fields

    from botmesh_admin.botclient import InboundMessage
    from inbox.api import BotInboundOut

    assert [f.name for f in fields(InboundMessage)] == list(BotInboundOut.model_fields)
