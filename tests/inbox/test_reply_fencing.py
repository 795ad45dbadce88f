"""The outbox send checks its claim's fencing token right before the provider request (issue 15, item 6).

The frozen worker with real processes is ``tests/faults/test_frozen_reply_sender.py``;
here the two ways a claim is lost, driven by the journal's clock.
"""

from __future__ import annotations

import pytest

from botmesh_admin.clock import FakeClock, use_clock
from botmesh_admin.events import StaleLeaseError, default_journal
from botmesh_admin.events.base import now_ms
from botmesh_admin.events.worker import Claim
from inbox import selectors
from inbox.services import replies
from tests.inbox.test_webhooks_and_replies import conversation, drain, post_whatsapp, shop  # noqa: F401

RECIPIENT = "573001112233"


def queued_reply(shop) -> str:  # noqa: F811
    post_whatsapp(shop, "01_text.json")
    drain()
    cid = conversation(shop, f"whatsapp:{RECIPIENT}").id
    status, reply = shop.api("post", f"conversations/{cid}/reply", {"text": "¿Sigue ahí?"})
    assert status == 202
    return reply["id"]


def test_a_claim_whose_lease_lapsed_sends_nothing_and_leaves_the_reply_queued_for_the_next(shop):  # noqa: F811
    message_id = queued_reply(shop)
    journal = default_journal()
    now = now_ms()
    record = journal.claim(now, 200, "outbox")
    assert record is not None and record.payload["message_id"] == message_id
    lapsed = Claim(journal, record.id, record.fencing_token, 200, clock=lambda: now + 300)
    with pytest.raises(StaleLeaseError):
        replies.reply_send(shop.tenant, message_id, claim=lapsed)
    assert shop.fake.count(RECIPIENT) == 0
    reply = selectors.message_get(shop.tenant, message_id).reply
    assert (reply.state, reply.attempts) == ("queued", 0)  # known not sent: not "not confirmed"
    with use_clock(FakeClock(now + 300)):  # the lapsed lease is over on the (kernel) clock too
        drain("outbox")  # the next claim sends it
    assert shop.fake.count(RECIPIENT) == 1
    assert selectors.message_get(shop.tenant, message_id).reply.state == "accepted"


def test_a_superseded_claim_sends_nothing_and_the_new_holder_sends_once(shop):  # noqa: F811
    message_id = queued_reply(shop)
    journal = default_journal()
    now = now_ms()
    first = journal.claim(now, 1000, "outbox")
    assert first is not None
    second = journal.claim(now + 1500, 30_000, "outbox")  # the first holder's lease lapsed: taken over
    assert second is not None and second.fencing_token > first.fencing_token
    with pytest.raises(StaleLeaseError):
        replies.reply_send(shop.tenant, message_id, claim=Claim(journal, first.id, first.fencing_token, 1000))
    assert shop.fake.count(RECIPIENT) == 0
    sent = replies.reply_send(shop.tenant, message_id, claim=Claim(journal, second.id, second.fencing_token, 30_000))
    assert sent is not None and sent.reply is not None and sent.reply.state == "accepted"
    assert shop.fake.count(RECIPIENT) == 1
