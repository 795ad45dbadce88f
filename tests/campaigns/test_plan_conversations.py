"""The plan preview says who has no conversation on the sending channel (a new user's report).

``POST …/campaigns/plan`` for Telegram with ``channel_name`` "bot" said
``recipients: 11`` and the started campaign dropped all 11 with
``no_conversation_on_channel``: the preview never looked at the channel. Now
the plan (API and the draft's page) looks up its first recipients on the named
channel with the send hook's rule, exact when those are all the recipients and
otherwise saying the rest are checked at send time.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model

from tests.inbox.test_channel_identity import drain, post_telegram, two_of_each  # noqa: F401 (fixture)
from tests.polling import wait_until


def telegram_contacts(t, users: range) -> None:
    from crm import services as crm

    for user in users:
        crm.contact_create(
            t.id,
            identities=[{"channel": "telegram", "address": str(user)}],
            name=f"Cliente {user}",
            tags=("promo",),
            consent={"telegram": "granted"},
            source="test",
        )


def write_to_shop(t, user: int) -> None:
    """``user`` writes to the shop bot (a signed Telegram webhook), so a conversation exists on ``shop``."""
    from botmesh_admin.demo import fixtures_dir

    update = json.loads((fixtures_dir() / "telegram" / "02_text.json").read_bytes())
    update["update_id"] += user % 1000
    update["message"]["from"]["id"] = update["message"]["chat"]["id"] = user
    response = t.client.post(
        f"/webhooks/telegram/{t.id}/shop",
        data=json.dumps(update),
        content_type="application/json",
        HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=t.shop_secret,
    )
    assert response.status_code == 200


@pytest.fixture
def eager(transactional_db):
    # No test transaction: a campaign run's journal event queues its (eager) drain on commit.
    from botmesh_admin.celery import app as celery_app

    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


@pytest.mark.parametrize("membership", [True, False], ids=["membership", "walk"])
def test_the_plan_counts_recipients_without_a_conversation_on_the_named_bot_as_the_run_drops_them(
    two_of_each,  # noqa: F811 (the fixture)
    eager,
    membership,
):
    from crm import services as crm
    from crm.selectors import segment_reach

    t = two_of_each
    telegram_contacts(t, range(700000001, 700000004))
    segment = crm.segment_create(t.id, name="Promo", rules={"tags_all": ["promo"]})
    assert post_telegram(t, "help", "02_text.json") == 200  # 700000001 (Sofía's chat) wrote to the help bot
    write_to_shop(t, 700000002)  # 700000002 wrote to the shop bot only; 700000003 to neither
    drain()
    wait_until(
        lambda: {("help", "telegram:700000001"), ("shop", "telegram:700000002")} <= set(t.conversations()),
        "both chats projected",
        timeout_s=10,
    )

    if membership:  # the draft preview's usual path: the membership counters and one page (O(page))
        crm.segment_membership_build(t.id)
    assert (segment_reach(t.id, segment.id, channel="telegram") is not None) is membership
    body = {"segment_id": segment.id, "channel": "telegram"}
    status, plan = t.api("post", "campaigns/plan", dict(body, channel_name="help"))
    assert status == 200, plan
    assert plan["recipients"] == 3
    assert plan["no_conversation"] == {
        "channel_name": "help",
        "checked": 3,
        "without_conversation": 2,
        "examples": ["Cliente 700000002", "Cliente 700000003"],
        "exact": True,
    }
    status, plan = t.api("post", "campaigns/plan", dict(body, channel_name="shop"))
    assert plan["no_conversation"]["without_conversation"] == 2 and plan["no_conversation"]["exact"]
    assert t.api("post", "campaigns/plan", body)[1]["no_conversation"] is None  # no sender named: nothing looked at
    status, refused = t.api("post", "campaigns/plan", dict(body, channel_name="main"))
    assert (status, refused["field"]) == (422, "campaign.channel_name") and "whatsapp channel" in refused["message"]
    # A WhatsApp campaign sends a template, which needs no conversation (the hook lets it through).
    status, plan = t.api(
        "post", "campaigns/plan", {"segment_id": segment.id, "channel": "whatsapp", "channel_name": "main"}
    )
    assert status == 200 and plan["no_conversation"] is None

    status, campaign = t.api(
        "post", "campaigns", dict(body, name="Aviso", channel_name="help", message={"text": "Hola {name}"})
    )
    assert status == 201, campaign
    status, draft_plan = t.api("get", f"campaigns/{campaign['id']}/plan")
    assert draft_plan["no_conversation"]["without_conversation"] == 2
    ana = get_user_model().objects.get(username="ana")
    t.client.force_login(ana)
    page = t.client.get(f"/t/{t.id}/campaigns/{campaign['id']}/").content.decode()
    assert "2</strong> of the 3 recipients have no conversation on <strong>help</strong>" in page
    assert "so 1 would get the message" in page and "Cliente 700000003" in page

    # The run drops exactly those the preview named.
    assert t.api("post", f"campaigns/{campaign['id']}/start")[0] == 200

    def deliveries() -> list[dict]:
        return t.api("get", f"campaigns/{campaign['id']}/deliveries")[1]["items"]

    wait_until(
        lambda: len(deliveries()) == 3 and all(d["state"] in ("accepted", "dropped") for d in deliveries()),
        "the campaign's outcomes",
        timeout_s=10,
    )
    dropped = sorted(d["recipient"] for d in deliveries() if d["reason"] == "no_conversation_on_channel")
    assert dropped == ["700000002", "700000003"]


def test_past_a_page_of_recipients_the_plan_says_the_rest_are_checked_at_send_time(two_of_each):  # noqa: F811
    """The preview stays O(page): it looks up at most 50 recipients and says the total is not checked."""
    from crm import services as crm
    from crm.selectors import segment_reach

    t = two_of_each
    telegram_contacts(t, range(700000101, 700000161))  # 60 recipients, none has written to a bot
    segment = crm.segment_create(t.id, name="Todos", rules={"tags_all": ["promo"]})
    crm.segment_membership_build(t.id)
    assert segment_reach(t.id, segment.id, channel="telegram") is not None  # counters and a page
    status, plan = t.api(
        "post", "campaigns/plan", {"segment_id": segment.id, "channel": "telegram", "channel_name": "shop"}
    )
    assert status == 200 and plan["recipients"] == 60
    check = plan["no_conversation"]
    assert (check["checked"], check["without_conversation"], check["exact"]) == (50, 50, False)
    assert len(check["examples"]) == 10
    status, campaign = t.api(
        "post",
        "campaigns",
        {
            "name": "Todos",
            "segment_id": segment.id,
            "channel": "telegram",
            "channel_name": "shop",
            "message": {"text": "Hola"},
        },
    )
    t.client.force_login(get_user_model().objects.get(username="ana"))
    page = t.client.get(f"/t/{t.id}/campaigns/{campaign['id']}/").content.decode()
    assert "Of the first <strong>50</strong> recipients" in page
    assert "The other 10 are not looked up here: each is checked at send time" in page
