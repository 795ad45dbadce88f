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

from .test_webhooks_and_replies import conversation, drain, post_telegram, shop  # noqa: F401 - the fixture


def test_a_block_after_the_contact_was_erased_is_recorded_without_recreating_the_contact(shop, caplog):  # noqa: F811
    assert post_telegram(shop, "02_text.json") == 200
    drain()
    conv = conversation(shop, "telegram:700000001")
    assert conv.contact_id
    status, _ = shop.api("delete", f"contacts/{conv.contact_id}")
    assert status == 200

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
