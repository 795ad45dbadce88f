"""A reply the provider refuses because the user blocked the bot denies the contact's consent, as a campaign send does.

End to end over real HTTP: a signed Telegram webhook creates the conversation
and its CRM contact, the agent replies through the API, the outbox worker
sends to the local fake provider (answering 403 "Forbidden: bot was blocked by
the user"), and the contact read back through the API shows Telegram consent
``denied`` with the provider's words as evidence.
"""

from __future__ import annotations

import pytest

from tests.inbox.shop import Shop, drain, open_shop, post_telegram

SOFIA = "700000001"  # the Telegram user of fixtures 02_text.json (private chat) and 05_group_a.json (a group)
GROUP = "-1001234567890"


@pytest.fixture
def shop(db):
    with open_shop("blk", whatsapp=False) as opened:
        yield opened


def _incoming(shop: Shop, fixture: str) -> None:
    assert post_telegram(shop, fixture) == 200
    drain("inbound")


def _reply(shop: Shop, chat_key: str, text: str) -> dict:
    status, page = shop.api("get", "conversations?limit=50")
    assert status == 200
    [conv] = [c for c in page["items"] if c["chat_key"] == chat_key]
    status, reply = shop.api("post", f"conversations/{conv['id']}/reply", {"text": text})
    assert status == 202, reply
    drain("outbox")
    status, thread = shop.api("get", f"conversations/{conv['id']}/messages?limit=50")
    assert status == 200
    return next(m for m in thread["items"] if m["id"] == reply["id"])


def _sofia(shop: Shop) -> dict:
    status, page = shop.api("get", f"contacts?identity=telegram:{SOFIA}")
    assert status == 200
    [contact] = page["items"]
    return contact


def test_a_reply_to_a_user_who_blocked_the_bot_denies_their_telegram_consent_with_the_evidence(shop):
    _incoming(shop, "02_text.json")
    assert _sofia(shop)["consent"].get("telegram", {}).get("status") != "denied"
    shop.fake.script(SOFIA, "blocked")
    message = _reply(shop, f"telegram:{SOFIA}", "¿Te ayudo con la dirección?")
    assert (message["reply"]["state"], message["reply"]["error_code"]) == ("failed", 403)
    consent = _sofia(shop)["consent"]["telegram"]
    assert consent["status"] == "denied" and consent["source"] == "inbox"
    assert consent["evidence"] == f"Telegram 403 to reply {message['id']}: Forbidden: bot was blocked by the user"
    assert shop.fake.count(SOFIA) == 1  # not retried


def test_a_403_in_a_group_is_the_bot_leaving_the_group_not_the_user_blocking_it(shop):
    _incoming(shop, "05_group_a.json")
    shop.fake.script(GROUP, "blocked")
    message = _reply(shop, f"telegram:{GROUP}:{SOFIA}", "Sí, 20% este mes")
    assert (message["reply"]["state"], message["reply"]["error_code"]) == ("failed", 403)
    assert _sofia(shop)["consent"].get("telegram", {}).get("status") != "denied"
