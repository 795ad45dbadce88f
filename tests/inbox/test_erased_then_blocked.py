"""A block after the conversation's CRM contact was erased (found by review: it dead-lettered).

``project_member`` set consent on the erased contact id, got ``NotFound`` and the
Telegram update went to the dead letters, where no replay could fix it; and it
upserted the blocked user's identity first, re-creating a contact for a person
who had been erased.
"""

from __future__ import annotations

import logging

from botmesh_admin.events import default_journal
from crm.selectors import contact_list
from crm.services import contact_erase

from .test_webhooks_and_replies import conversation, drain, post_telegram, shop  # noqa: F401 - the fixture


def test_a_block_after_the_contact_was_erased_is_recorded_without_recreating_the_contact(shop, caplog):  # noqa: F811
    assert post_telegram(shop, "02_text.json") == 200
    drain()
    conv = conversation(shop, "telegram:700000001")
    assert conv.contact_id
    # The contact erased, its conversation kept: what an erasure before contacts took their conversations
    # along left (contact_erase now erases them first: test_erasing_a_contact_erases_its_conversations).
    contact_erase(shop.tenant, conv.contact_id, conversations=False)

    with caplog.at_level(logging.INFO, logger="inbox.services.projection"):
        assert post_telegram(shop, "08_blocked.json") == 200
        drain()

    counts = default_journal().counts(shop.tenant)
    assert counts.get(("dead", "inbound"), 0) == 0 and counts.get(("pending", "inbound"), 0) == 0
    blocked = conversation(shop, "telegram:700000001")
    assert blocked.blocked and "kicked" in blocked.blocked_evidence
    # The erased person is not brought back as a contact by their block.
    assert contact_list(shop.tenant, identity="telegram:700000001").items == []
    assert any("was erased" in r.getMessage() for r in caplog.records)
    status, page = shop.api("get", "conversations?limit=200")
    assert [c["blocked"] for c in page["items"] if c["chat_key"] == "telegram:700000001"] == [True]


def test_erasing_a_contact_erases_its_conversations(shop):  # noqa: F811
    """A fresh user's report: after DELETE contacts/<id> the conversation still showed the name, was found by
    the number and listed under ``?contact=<erased id>``."""
    assert post_telegram(shop, "02_text.json") == 200
    drain()
    conv = conversation(shop, "telegram:700000001")
    status, report = shop.api("delete", f"contacts/{conv.contact_id}")
    assert (status, report["erased"], report["conversations"]) == (200, True, 1)
    status, _ = shop.api("get", f"conversations/{conv.id}")
    assert status == 404
    for query in (f"contact={conv.contact_id}", "q=700000001", f"q={conv.display_name}"):
        status, page = shop.api("get", f"conversations?{query}")
        assert (status, page["items"]) == (200, []), query
