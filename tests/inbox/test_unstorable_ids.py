"""Signed webhooks whose ids the inbox can never store (found by review: they were answered 200, then
failed projection on every attempt and ended as dead letters no replay could fix).

The intake now skips such a message or status with a log line, as the parsers skip a
message without a usable ``from``/``id``, and journals the rest of the body: the
answer is 200 with ``skipped`` (a non-2xx would make Meta redeliver the whole body,
good messages included). Projection skips one journaled before the change.
"""

from __future__ import annotations

import copy
import json

import pytest

from botmesh_admin.channels import whatsapp
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.events import default_journal
from inbox import selectors
from inbox.stores import default_store

from .test_webhooks_and_replies import drain, shop  # noqa: F401 - the fixture

SECRET = json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())["app_secret"]
BATCH = json.loads((fixtures_dir() / "whatsapp" / "raw" / "08_batch.json").read_text())


def post_signed(shop, body: dict) -> tuple[int, dict]:  # noqa: F811
    raw = json.dumps(body).encode()
    response = shop.client.post(
        f"/webhooks/whatsapp/{shop.tenant}",
        data=raw,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=whatsapp.signature(raw, SECRET),
    )
    return response.status_code, response.json()


def batch_with(**changes: object) -> tuple[dict, list[str]]:
    """The fixture batch (three messages) with ``changes`` applied to its first message; the others' ids."""
    body = copy.deepcopy(BATCH)
    messages = [m for c in body["entry"][0]["changes"] for m in c["value"].get("messages", [])]
    messages[0].update(changes)
    return body, [m["id"] for m in messages[1:]]


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"id": "wamid." + "x" * 195}, id="message id of 201 characters"),
        pytest.param({"id": "wamid." + "\U0001f600" * 120}, id="message id of 126 characters but 486 bytes"),
        pytest.param({"id": "wamid.a/b"}, id="message id with a slash"),
        pytest.param({"from": "5" * 201}, id="sender of 201 characters"),
        pytest.param({"from": "5" * 192}, id="sender over 191 characters (whatsapp: + from is the id)"),
        pytest.param({"from": "57/3001112233"}, id="sender with a slash"),
    ],
)
def test_a_message_the_inbox_cannot_store_is_skipped_and_the_rest_of_the_body_is_stored(shop, changes):  # noqa: F811
    body, others = batch_with(**changes)
    status, answer = post_signed(shop, body)
    assert (status, answer["received"], answer["skipped"]) == (200, 2, 1)
    [record] = default_journal().list(tenant=shop.tenant)
    assert len(record.payload["events"]) == 2
    drain()
    assert default_journal().counts(shop.tenant) == {("done", "inbound"): 1}
    assert all(selectors.message_get(shop.tenant, m) is not None for m in others)


@pytest.mark.parametrize("sender", ["abc", "12345"])
def test_a_sender_that_is_no_phone_number_is_skipped_and_the_rest_of_the_body_stored(shop, sender):  # noqa: F811
    """A ``from`` no phone number has is skipped: the bots' handoff and ledger could never name its chat.

    (``abc`` had crashed the search index; stored since, the fresh-user trial found ``whatsapp:12345``
    listed in the inbox and its bot's handoff read refused every minute.)
    """
    body, others = batch_with(**{"from": sender})
    status, answer = post_signed(shop, body)
    assert (status, answer["received"], answer["skipped"]) == (200, 2, 1)
    drain()
    assert default_journal().counts(shop.tenant) == {("done", "inbound"): 1}
    assert default_store().conversation_by_chat(shop.tenant, f"whatsapp:{sender}", channel_name="main") is None
    assert all(selectors.message_get(shop.tenant, m) is not None for m in others)


def test_a_quote_id_the_inbox_cannot_store_drops_the_quote_not_the_message(shop):  # noqa: F811
    body, _ = batch_with(context={"from": "573001112233", "id": "wamid/" + "q" * 300})
    wamid = body["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
    assert post_signed(shop, body)[0] == 200
    drain()
    assert default_journal().counts(shop.tenant) == {("done", "inbound"): 1}
    stored = selectors.message_get(shop.tenant, wamid)
    assert stored is not None and stored.reply_to is None


def test_an_unstorable_status_is_skipped(shop):  # noqa: F811
    body = json.loads((fixtures_dir() / "whatsapp" / "raw" / "06_statuses.json").read_text())
    statuses = body["entry"][0]["changes"][0]["value"]["statuses"]
    statuses[0]["id"] = "wamid/" + "s" * 10
    status, answer = post_signed(shop, body)
    assert (status, answer["received"], answer["skipped"]) == (200, len(statuses) - 1, 1)
    drain()
    assert default_journal().counts(shop.tenant) == {("done", "inbound"): 1}


def test_telegram_ids_the_inbox_cannot_store_are_skipped(shop):  # noqa: F811
    meta = json.loads((fixtures_dir() / "telegram" / "meta.json").read_text())
    update = json.loads((fixtures_dir() / "telegram" / "02_text.json").read_text())
    update["message"]["chat"]["id"] = 10**250  # JSON allows any integer; a chat key of 260 characters
    response = shop.client.post(
        f"/webhooks/telegram/{shop.tenant}/bot",
        data=json.dumps(update),
        content_type="application/json",
        HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=meta["secret_token"],
    )
    assert response.status_code == 200
    assert (response.json()["received"], response.json()["skipped"]) == (0, 1)
    drain()
    assert default_journal().counts(shop.tenant) == {("done", "inbound"): 1}


def post_telegram(shop, update: dict):  # noqa: F811
    meta = json.loads((fixtures_dir() / "telegram" / "meta.json").read_text())
    return shop.client.post(
        f"/webhooks/telegram/{shop.tenant}/bot",
        data=json.dumps(update),
        content_type="application/json",
        HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=meta["secret_token"],
    )


@pytest.mark.parametrize(
    "changes",
    [pytest.param({"from": None}, id="message without from"), pytest.param({"id": ""}, id="empty message id")],
)
def test_a_message_the_parser_cannot_read_counts_as_skipped(shop, changes, caplog):  # noqa: F811
    """Before, the parser dropped it without a word: the answer said received 2 and nothing of the third."""
    body, others = batch_with(**changes)
    with caplog.at_level("WARNING", logger="botmesh.channels"):
        status, answer = post_signed(shop, body)
    assert (status, answer["received"], answer["skipped"]) == (200, 2, 1)
    assert "entry[0].changes[0].value.messages[0]: no from or id, skipped" in caplog.text
    drain()
    assert all(selectors.message_get(shop.tenant, m) is not None for m in others)


@pytest.mark.parametrize("state", [None, "exploded", 5], ids=["no status", "an unknown status", "a number"])
def test_a_status_without_a_known_state_counts_as_skipped(shop, state):  # noqa: F811
    """Found by a new user: a status "exploded" was answered received 1 and then stored nowhere."""
    body = json.loads((fixtures_dir() / "whatsapp" / "raw" / "06_statuses.json").read_text())
    statuses = body["entry"][0]["changes"][0]["value"]["statuses"]
    statuses[0]["status"] = state
    status, answer = post_signed(shop, body)
    assert (status, answer["received"], answer["skipped"]) == (200, len(statuses) - 1, 1)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda u: u["message"]["chat"].update(id="not-a-number"), id="chat id not an integer"),
        pytest.param(lambda u: u["message"].pop("message_id"), id="no message_id"),
    ],
)
def test_a_telegram_message_without_usable_ids_counts_as_skipped(shop, spoil):  # noqa: F811
    update = json.loads((fixtures_dir() / "telegram" / "02_text.json").read_text())
    spoil(update)
    response = post_telegram(shop, update)
    assert response.status_code == 200
    assert (response.json()["received"], response.json()["skipped"]) == (0, 1)


def test_a_telegram_update_of_a_kind_the_inbox_does_not_handle_is_received_as_nothing_not_skipped(shop):  # noqa: F811
    update = {"update_id": 901, "poll": {"id": "5", "question": "?", "options": []}}
    response = post_telegram(shop, update)
    assert response.status_code == 200
    assert response.json()["received"] == 0 and "skipped" not in response.json()


def test_a_record_journaled_before_the_check_is_processed_without_its_unstorable_message(shop):  # noqa: F811
    """What the old intake journaled is now replayable: projection skips the unstorable event."""
    from botmesh_admin.channels.domain import InboundMessage
    from botmesh_admin.events.services import event_publish

    good, bad = (
        InboundMessage("whatsapp", "whatsapp:573001112233", "whatsapp:573001112233", pid, "text", "hola", 1764489600000)
        for pid in ("wamid.good", "wamid/bad")
    )
    event_publish(
        shop.tenant,
        type="whatsapp.webhook",
        channel="inbound",
        payload={"config": "main", "events": [bad.to_json(), good.to_json()]},
        idempotency_key="old-intake",
    )
    drain()
    assert default_journal().counts(shop.tenant) == {("done", "inbound"): 1}
    assert selectors.message_get(shop.tenant, "wamid.good") is not None
