"""A conversation belongs to the channel that received it (issue 15, item 1).

Driven through the real surface: signed webhooks, the API, the journal worker
and a fake provider that records which number or bot each send used. Before
the fix every chat of a kind merged into one conversation and every reply went
out through the first channel of that kind by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.channels import whatsapp
from botmesh_admin.channels.testing import (
    FakeProviderServer,
    compact_json,
    whatsapp_body_for_number,
)
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id
from tests.polling import wait_until

MAIN, SALES = "106540352242922", "106540352299999"  # two numbers of one Meta app (one app secret)
SHOP_TOKEN = "600000000:AAF-fixture-bot-token-shop-xyz"
HELP_TOKEN = "600000001:AAF-fixture-bot-token-help-xyz"
HELP_SECRET = "help-bot-webhook-secret"
ANA = "whatsapp:573001112233"
SOFIA = "telegram:700000001"


@dataclass
class Tenant:
    id: str
    client: Client
    token: str
    fake: FakeProviderServer
    app_secret: str
    shop_secret: str

    def api(self, method: str, path: str, body=None):
        response = getattr(self.client, method)(
            f"/api/v1/tenants/{self.id}/{path}",
            data=json.dumps(body) if body is not None else None,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {self.token}",
        )
        return response.status_code, response.json()

    def conversations(self) -> dict[tuple[str, str | None], dict]:
        status, page = self.api("get", "conversations?limit=200")
        assert status == 200, page
        return {(c["channel_name"], c["chat_key"]): c for c in page["items"]}


@pytest.fixture
def two_of_each(db):
    """A tenant with two WhatsApp numbers (``main``, ``sales``) and two Telegram bots (``shop``, ``help``)."""
    from botmesh_admin.channels.services import channel_config_set

    tenant = unique_id("multi")
    tenancy.tenant_create(tenant, name="Multi")
    get_user_model().objects.get_or_create(username="ana")
    tenancy.membership_set(tenant, username="ana", role="agent")
    app_secret = json.loads((fixtures_dir() / "whatsapp" / "raw" / "signatures.json").read_text())["app_secret"]
    shop_secret = json.loads((fixtures_dir() / "telegram" / "meta.json").read_text())["secret_token"]
    with FakeProviderServer() as fake:
        for name, number, token in (("main", MAIN, "EAAG-main-token"), ("sales", SALES, "EAAG-sales-token")):
            channel_config_set(
                tenant,
                kind="whatsapp",
                name=name,
                phone_number_id=number,
                app_secret=app_secret,
                access_token=token,
                api_base_url=fake.base_url,
            )
        channel_config_set(
            tenant,
            kind="telegram",
            name="help",
            bot_token=HELP_TOKEN,
            webhook_secret=HELP_SECRET,
            api_base_url=fake.base_url,
        )
        channel_config_set(
            tenant,
            kind="telegram",
            name="shop",
            bot_token=SHOP_TOKEN,
            webhook_secret=shop_secret,
            api_base_url=fake.base_url,
        )
        yield Tenant(tenant, Client(), tenancy.token_create(tenant, name="ci")[1], fake, app_secret, shop_secret)


def drain(channel: str = "inbound") -> None:
    while sum(journal_drain(channel=channel, limit=500).values()):
        pass


def post_whatsapp(t: Tenant, body: dict) -> int:
    raw = compact_json(body)
    return t.client.post(
        f"/webhooks/whatsapp/{t.id}",
        data=raw,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=whatsapp.signature(raw, t.app_secret),
    ).status_code


def post_telegram(t: Tenant, bot: str, name: str) -> int:
    secret = t.shop_secret if bot == "shop" else HELP_SECRET
    return t.client.post(
        f"/webhooks/telegram/{t.id}/{bot}",
        data=(fixtures_dir() / "telegram" / name).read_bytes(),
        content_type="application/json",
        HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=secret,
    ).status_code


def two_number_body() -> dict:
    """``01_text.json`` once for each number, as one Meta app posts it: one body, two entries."""
    main = json.loads((fixtures_dir() / "whatsapp" / "raw" / "01_text.json").read_bytes())
    sales = whatsapp_body_for_number(main, phone_number_id=SALES, display_phone_number="15550783999")
    return {"object": main["object"], "entry": main["entry"] + sales["entry"]}


def test_one_body_for_two_numbers_lands_in_a_conversation_of_each_number(two_of_each):
    t = two_of_each
    assert post_whatsapp(t, two_number_body()) == 200
    drain()
    conversations = t.conversations()
    assert {k for k in conversations if k[1] == ANA} == {("main", ANA), ("sales", ANA)}
    for key in (("main", ANA), ("sales", ANA)):
        assert conversations[key]["message_count"] == 1
        assert conversations[key]["channel"] == "whatsapp"
    # the same customer is one CRM contact on both numbers
    assert conversations[("main", ANA)]["contact_id"] == conversations[("sales", ANA)]["contact_id"]
    # the list filters by the number (an index page: conv_channel), in the API and on the inbox page
    for query in ("channel_name=sales", "channel_name=sales&status=open", "channel_name=sales&view=unassigned"):
        status, page = t.api("get", f"conversations?{query}")
        assert [(c["channel_name"], c["chat_key"]) for c in page["items"]] == [("sales", ANA)], query
    assert t.api("get", "conversations?channel_name=main")[1]["items"][0]["id"] == conversations[("main", ANA)]["id"]
    from django.contrib.auth import get_user_model

    t.client.force_login(get_user_model().objects.get(username="ana"))
    html = t.client.get(f"/t/{t.id}/inbox/?channel=whatsapp/sales").content.decode()
    assert conversations[("sales", ANA)]["id"] in html and conversations[("main", ANA)]["id"] not in html
    assert "whatsapp · sales" in html


def test_replies_and_resends_go_out_through_the_number_that_received_the_chat(two_of_each):
    t = two_of_each
    assert post_whatsapp(t, two_number_body()) == 200
    drain()
    sales = t.conversations()[("sales", ANA)]
    t.fake.script("573001112233", "window_closed", times=1)
    status, reply = t.api("post", f"conversations/{sales['id']}/reply", {"text": "Le escribe Ventas"})
    assert status == 202, reply
    drain("outbox")
    status, resent = t.api("post", f"conversations/{sales['id']}/messages/{reply['id']}/resend", {})
    assert status in (200, 202), resent
    drain("outbox")
    sends = [r for r in t.fake.requests if r.provider == "whatsapp"]
    assert [r.path.rsplit("/", 2)[-2] for r in sends] == [SALES, SALES]
    assert {r.headers["authorization"] for r in sends} == {"Bearer EAAG-sales-token"}
    main = t.conversations()[("main", ANA)]
    t.api("post", f"conversations/{main['id']}/reply", {"text": "Le escribe la tienda"})
    drain("outbox")
    assert t.fake.requests[-1].path.rsplit("/", 2)[-2] == MAIN


def test_two_telegram_bots_same_message_id_are_two_messages_in_two_conversations(two_of_each):
    """The second bot's message_id 2 from the same user was dropped as a duplicate of the first bot's."""
    t = two_of_each
    assert post_telegram(t, "shop", "02_text.json") == 200
    assert post_telegram(t, "help", "02_text.json") == 200  # same update_id, message_id and user
    drain()
    conversations = t.conversations()
    assert {k for k in conversations if k[1] == SOFIA} == {("shop", SOFIA), ("help", SOFIA)}
    for bot in ("shop", "help"):
        conversation = conversations[(bot, SOFIA)]
        status, messages = t.api("get", f"conversations/{conversation['id']}/messages")
        assert [(m["id"], m["text"]) for m in messages["items"]] == [
            (f"{bot}:700000001:2", "Quiero cambiar mi dirección de entrega")
        ]
    # an answer to help's chat comes from the help bot (the shop bot cannot even reach her there)
    t.api("post", f"conversations/{conversations[('help', SOFIA)]['id']}/reply", {"text": "Soy el bot de ayuda"})
    drain("outbox")
    [send] = [r for r in t.fake.requests if r.provider == "telegram"]
    assert f"/bot{HELP_TOKEN}/" in send.path
    status, state = t.api("get", f"handoff/{SOFIA}?channel=help")
    assert (status, state["conversation_id"]) == (200, conversations[("help", SOFIA)]["id"])
    status, refused = t.api("get", f"handoff/{SOFIA}?channel=Not%20a%20name")
    assert (status, refused["field"]) == (422, "channel")


def test_a_ledger_record_joins_the_conversation_of_the_channel_it_names(two_of_each):
    t = two_of_each
    assert post_whatsapp(t, two_number_body()) == 200
    drain()
    record = {
        "id": "bot-out-1",
        "channel": "whatsapp",
        "chatId": ANA,
        "senderId": "bot",
        "direction": "out",
        "type": "text",
        "body": "Respuesta del bot de ventas",
        "timestamp": 1764489700000,
        "channelName": "sales",
    }
    response = t.client.post(
        f"/api/v1/tenants/{t.id}/ledger",
        data=json.dumps([record]),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {t.token}",
    )
    assert response.status_code == 202, response.content
    bad = t.client.post(
        f"/api/v1/tenants/{t.id}/ledger",
        data=json.dumps([dict(record, id="x", channelName="shop")]),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {t.token}",
    )
    assert (bad.status_code, bad.json()["field"]) == (422, "records[0].channelName")
    drain("ledger")
    conversations = t.conversations()
    assert conversations[("sales", ANA)]["message_count"] == 2
    assert conversations[("main", ANA)]["message_count"] == 1


@pytest.fixture
def eager():
    from botmesh_admin.celery import app as celery_app

    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


def test_a_campaign_sends_through_its_named_bot_and_reports_who_has_no_conversation_there(two_of_each, eager):
    """Campaigns went out through the first channel of the kind by name, whoever the recipient had written to."""
    from crm import services as crm

    t = two_of_each
    for user in ("700000001", "700000002"):
        crm.contact_create(
            t.id,
            identities=[{"channel": "telegram", "address": user}],
            tags=("promo",),
            consent={"telegram": "granted"},
            source="test",
        )
    segment = crm.segment_create(t.id, name="Promo", rules={"tags_all": ["promo"]})
    assert post_telegram(t, "help", "02_text.json") == 200  # Sofía (700000001) wrote to the help bot
    update = json.loads((fixtures_dir() / "telegram" / "02_text.json").read_bytes())
    update["update_id"] += 1
    update["message"]["from"]["id"] = update["message"]["chat"]["id"] = 700000002
    other = t.client.post(
        f"/webhooks/telegram/{t.id}/shop",
        data=json.dumps(update),
        content_type="application/json",
        HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=t.shop_secret,
    )
    assert other.status_code == 200  # 700000002 wrote to the shop bot only
    drain()
    wait_until(
        lambda: {("help", SOFIA), ("shop", "telegram:700000002")} <= set(t.conversations()),
        "both chats projected",
        timeout_s=10,
    )
    body = {"name": "Aviso", "segment_id": segment.id, "channel": "telegram", "message": {"text": "Hola {name}"}}
    for channel_name, message in (
        (None, "name the telegram channel that sends: one of help, shop"),
        ("main", "'main' is a whatsapp channel, not telegram"),
    ):
        status, refused = t.api("post", "campaigns", dict(body, channel_name=channel_name))
        assert (status, refused["field"]) == (422, "campaign.channel_name") and message in refused["message"]
    status, campaign = t.api("post", "campaigns", dict(body, channel_name="help"))
    assert status == 201 and campaign["channel_name"] == "help"
    status, started = t.api("post", f"campaigns/{campaign['id']}/start")
    assert status == 200, started
    drain("campaigns-run")  # the run is a journal event; the test's transaction never commits to queue its drain

    def deliveries() -> list[dict]:
        return t.api("get", f"campaigns/{campaign['id']}/deliveries")[1]["items"]

    wait_until(
        lambda: len(deliveries()) == 2 and all(d["state"] in ("accepted", "dropped") for d in deliveries()),
        "the campaign's outcomes",
        timeout_s=10,
    )
    outcome = {d["recipient"]: (d["state"], d["reason"]) for d in deliveries()}
    assert outcome == {"700000001": ("accepted", None), "700000002": ("dropped", "no_conversation_on_channel")}
    [send] = [r for r in t.fake.requests if r.provider == "telegram"]
    assert f"/bot{HELP_TOKEN}/" in send.path and send.recipient == "700000001"


def test_conversations_of_an_earlier_version_get_their_channel_from_the_command(two_of_each):
    """Conversations stored before they belonged to a channel: botmesh_assign_channels assigns them."""
    import io

    from django.core.management import call_command

    from botmesh_admin.channels import telegram
    from botmesh_admin.channels.services import channel_config_delete
    from botmesh_admin.events.services import event_publish
    from botmesh_admin.kv import Put
    from botmesh_admin.kv.runtime import default_kv
    from inbox.stores.kv import KvInboxStore

    t = two_of_each
    channel_config_delete(t.id, name="sales")  # one number (assigned by itself), two bots (named by the operator)
    old_events = [  # what an earlier version journaled: events without channel_name, ids without the bot
        *whatsapp.parse_webhook(json.loads((fixtures_dir() / "whatsapp" / "raw" / "01_text.json").read_bytes())),
        *telegram.parse_update(json.loads((fixtures_dir() / "telegram" / "02_text.json").read_bytes())),
    ]
    event_publish(
        t.id,
        type="whatsapp.webhook",
        channel="inbound",
        idempotency_key="old-body",
        payload={"config": "main,shop", "events": [e.to_json() for e in old_events]},
    )
    drain()
    store = KvInboxStore(default_kv())
    table = store._table(t.id)
    for e in store.kv.scan(table, prefix="k/", limit=100):  # the stored form of an earlier version
        store.kv.commit(
            table,
            [
                Put(
                    e.key,
                    {k: v for k, v in e.value.items() if k not in ("channel_name", "keyed_by_chat_only")},
                    e.version,
                )
            ],
        )
    assert {k for k in t.conversations()} == {(None, ANA), (None, SOFIA)}

    out, err = io.StringIO(), io.StringIO()
    call_command("botmesh_assign_channels", "--tenant", t.id, stdout=out, stderr=err)
    assert f"{t.id}: done: 1 assigned, 1 left without a channel" in out.getvalue()
    assert "telegram has help, shop" in err.getvalue() and "--channel KIND=NAME" in err.getvalue()
    assert {k for k in t.conversations()} == {("main", ANA), (None, SOFIA)}
    call_command("botmesh_assign_channels", "--tenant", t.id, "--channel", "telegram=shop", stdout=out, stderr=err)
    assert {k for k in t.conversations()} == {("main", ANA), ("shop", SOFIA)}
    again = io.StringIO()
    call_command("botmesh_assign_channels", "--tenant", t.id, stdout=again, stderr=err)
    assert f"{t.id}: done: 0 assigned, 0 left" in again.getvalue()  # idempotent

    # the assigned conversation is the one its number's next message joins, and replies go out through it
    image = json.loads((fixtures_dir() / "whatsapp" / "raw" / "02_image_caption.json").read_bytes())
    assert post_whatsapp(t, image) == 200
    drain()
    conversations = t.conversations()
    assert set(conversations) == {("main", ANA), ("shop", SOFIA)} and conversations[("main", ANA)]["message_count"] == 2
    t.api("post", f"conversations/{conversations[('main', ANA)]['id']}/reply", {"text": "hola"})
    drain("outbox")
    assert t.fake.requests[-1].path.rsplit("/", 2)[-2] == MAIN
