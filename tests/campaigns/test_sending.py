"""``send_campaign`` and ``campaign_run`` against the fake WhatsApp / Telegram APIs: real outcomes, never twice."""

from __future__ import annotations

import pytest

from botmesh_admin.channels.domain import OutboundMessage
from botmesh_admin.channels.providers import TelegramProvider, WhatsAppProvider
from campaigns import selectors, services
from campaigns.domain.planning import Planner
from campaigns.services import planning
from campaigns.services.sending import BroadcastFailed, CampaignBot, SendOptions, send_campaign
from campaigns.stores import default_store
from crm import services as crm
from crm.selectors import contact_get

from .conftest import make_contacts

FAST = SendOptions(batch_size=10, ttl_ms=5_000, rate_per_s=None, max_attempts=3)


class Clock:
    """A clock the sender's sleeps move forward (retries become due without waiting)."""

    def __init__(self) -> None:
        from campaigns.domain import now_ms

        self.now = now_ms()

    def __call__(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += int(seconds * 1000) + 1


def whatsapp(fake, **kw) -> WhatsAppProvider:
    return WhatsAppProvider(fake.base_url, "106540352242922", "test-token", timeout_s=2, max_workers=4, **kw)


def telegram(fake) -> TelegramProvider:
    return TelegramProvider(fake.base_url, "123456:" + "A" * 30, timeout_s=2, max_workers=4)


def start(tenant: str, channel: str = "whatsapp", **kw):
    segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
    message = (
        {"template": "promo_nov", "language": "es", "parameters": ["{name}"]}
        if channel == "whatsapp"
        else {"text": "Hola {name}, 20% hoy"}
    )
    campaign = services.campaign_create(
        tenant, name="Noviembre", segment_id=segment.id, channel=channel, message=message, **kw
    )
    return services.campaign_start(tenant, campaign.id)


def states(tenant: str, campaign_id: str) -> dict[str, tuple]:
    page = selectors.delivery_list(tenant, campaign_id, limit=200)
    return {d.recipient: d for d in page.items}


def test_each_delivery_is_recorded_with_its_real_outcome(world: str, fake) -> None:
    tenant = world
    contacts = make_contacts(tenant, 8)
    addr = [f"+5730{i:08d}" for i in range(8)]
    fake.script(addr[1], "window_closed")
    fake.script(addr[2], "rate_limited", times=1)
    fake.script(addr[3], "drop")
    campaign = start(tenant)
    # Opted out before the run fixes the recipients: left out by the plan.
    crm.consent_set(tenant, contacts[5].id, channel="whatsapp", status="denied", source="test")
    # Opts out after the plan, before the send: dropped by the send-time check.
    planner = Planner(tenant)
    original_plan = planner.plan

    def plan_then_opt_out(**kw):
        plan = original_plan(**kw)
        crm.consent_set(tenant, contacts[6].id, channel="whatsapp", status="denied", source="unsubscribe link")
        return plan

    planner.plan = plan_then_opt_out  # type: ignore[method-assign]

    def handoff_hook(recipient, message: OutboundMessage):
        return "handoff" if recipient.address == addr[7] else None

    clock = Clock()
    done = services.campaign_run(
        tenant,
        campaign.id,
        bot=CampaignBot(whatsapp(fake), (handoff_hook,)),
        planner=planner,
        options=FAST,
        clock=clock,
        sleep=clock.sleep,
    )

    assert done.state == "completed"
    assert done.plan.recipients == 7 and done.plan.dropped == {"opted_out": 1}
    got = states(tenant, campaign.id)
    assert addr[5] not in got, "opted out before the plan: never a recipient"
    accepted = got[addr[0]]
    assert (accepted.state, accepted.sends) == ("accepted", 1)
    assert accepted.provider_message_id.startswith("wamid.")
    # Sent to "+573000000000"; the provider answers with its canonical wa_id, still matched by destination chat.
    assert accepted.provider_recipient == "573000000000" != accepted.recipient
    assert (got[addr[1]].state, got[addr[1]].error_code, got[addr[1]].retryable, got[addr[1]].reason) == (
        "failed",
        131047,
        False,
        "code:131047",
    )
    assert (got[addr[2]].state, got[addr[2]].attempts, got[addr[2]].sends) == ("accepted", 2, 1)
    assert (got[addr[3]].state, got[addr[3]].reason) == ("in_doubt", "no_answer")
    assert (got[addr[6]].state, got[addr[6]].reason) == ("dropped", "opted_out")
    assert (got[addr[7]].state, got[addr[7]].reason) == ("dropped", "handoff")
    assert [fake.count(a) for a in addr] == [1, 1, 2, 1, 1, 0, 0, 0]
    body = next(r.body for r in fake.requests if r.recipient == "573000000000")
    assert body["template"]["name"] == "promo_nov"
    assert body["template"]["components"][0]["parameters"] == [{"type": "text", "text": "Cliente 0"}]
    progress = selectors.campaign_progress(tenant, campaign.id)
    assert progress.counts.states == {"accepted": 3, "dropped": 2, "failed": 1, "in_doubt": 1}
    assert progress.counts.reasons == {
        "dropped:handoff": 1,
        "dropped:opted_out": 1,
        "failed:code:131047": 1,
        "in_doubt:no_answer": 1,
    }
    assert progress.counts.percent == 100

    # Running it again sends nothing more.
    services.campaign_run(tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), options=FAST)
    assert [fake.count(a) for a in addr] == [1, 1, 2, 1, 1, 0, 0, 0]


def test_if_the_broadcast_raises_every_reserved_slot_is_released(world: str, fake) -> None:
    tenant = world
    make_contacts(tenant, 5)
    campaign = start(tenant)
    campaigns, slots = default_store()

    class Exploding:
        kind = "whatsapp"

        def send(self, message):
            raise AssertionError("not used")

        def broadcast(self, messages):
            raise ConnectionError("pool exhausted")

    planning._materialize(tenant, campaign, Planner(tenant))
    campaign = selectors.campaign_get(tenant, campaign.id)
    with pytest.raises(BroadcastFailed):
        send_campaign(
            CampaignBot(Exploding()), Planner(tenant), tenant=tenant, campaign=campaign, slots=slots, options=FAST
        )
    after = slots.slot_scan(tenant, campaign.id)
    assert [(d.state, d.token, d.attempts) for d in after] == [("pending", None, 0)] * 5

    report = send_campaign(
        CampaignBot(whatsapp(fake)), Planner(tenant), tenant=tenant, campaign=campaign, slots=slots, options=FAST
    )
    assert (report.accepted, report.finished) == (5, True)


def test_a_broadcast_that_keeps_raising_fails_the_campaign_and_resume_sends_the_rest(world: str, fake) -> None:
    tenant = world
    make_contacts(tenant, 3)
    campaign = start(tenant)

    class Down:
        kind = "whatsapp"

        def broadcast(self, messages):
            raise OSError("provider SDK crashed")

    clock = Clock()
    failed = services.campaign_run(
        tenant, campaign.id, bot=CampaignBot(Down()), options=FAST, clock=clock, sleep=clock.sleep
    )
    assert failed.state == "failed" and "broadcast raised OSError" in failed.error
    services.campaign_resume(tenant, campaign.id)
    done = services.campaign_run(tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), options=FAST)
    assert done.state == "completed" and fake.count() == 3


def test_telegram_403_blocked_denies_the_contacts_telegram_consent(world: str, fake) -> None:
    tenant = world
    users = make_contacts(tenant, 3, channel="telegram")
    fake.script("700000001", "blocked")
    fake.script("700000002", "chat_not_found")
    campaign = start(tenant, channel="telegram")
    done = services.campaign_run(tenant, campaign.id, bot=CampaignBot(telegram(fake)), options=FAST)
    assert done.state == "completed"
    got = states(tenant, campaign.id)
    assert got["700000000"].state == "accepted" and got["700000000"].provider_message_id.startswith("700000000:")
    assert (got["700000001"].state, got["700000001"].error_code, got["700000001"].retryable) == ("failed", 403, False)
    assert (got["700000002"].state, got["700000002"].error_code) == ("failed", 400)
    assert contact_get(tenant, users[1].id).consent_status("telegram") == "denied"
    assert contact_get(tenant, users[1].id).consent["telegram"].source == "campaign"
    assert contact_get(tenant, users[2].id).consent_status("telegram") == "granted", "chat not found is not a block"
    assert next(r.body["text"] for r in fake.requests if r.recipient == "700000000") == "Hola Cliente 0, 20% hoy"


def test_an_expired_token_stops_the_campaign_with_the_rest_still_pending(world: str, fake) -> None:
    tenant = world
    make_contacts(tenant, 30)
    fake.script_all("bad_token")
    campaign = start(tenant)
    failed = services.campaign_run(tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), options=FAST)
    assert failed.state == "failed" and "code 190" in failed.error
    counts = selectors.campaign_progress(tenant, campaign.id).counts
    assert counts.get("failed") == 10 and counts.get("pending") == 20, "one batch, then stop"


def test_pause_stops_after_the_batch_and_resume_sends_no_duplicate(world: str, fake) -> None:
    tenant = world
    make_contacts(tenant, 30)
    campaign = start(tenant)
    sent_batches = []

    def pause_after_first_batch(recipient, message):
        if len(sent_batches) == 0 and recipient.address.endswith("09"):
            sent_batches.append(1)
            services.campaign_pause(tenant, campaign.id)
        return None

    paused = services.campaign_run(
        tenant, campaign.id, bot=CampaignBot(whatsapp(fake), (pause_after_first_batch,)), options=FAST
    )
    assert paused.state == "paused" and fake.count() == 10
    assert services.campaign_run(tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), options=FAST).state == "paused"
    assert fake.count() == 10, "a paused campaign sends nothing"
    services.campaign_resume(tenant, campaign.id)
    done = services.campaign_run(tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), options=FAST)
    assert done.state == "completed"
    assert fake.count() == 30 and all(fake.count(f"+5730{i:08d}") == 1 for i in range(30))


def test_cancel_marks_every_unsent_delivery_cancelled(world: str, fake) -> None:
    tenant = world
    make_contacts(tenant, 25)
    campaign = start(tenant)
    provider = whatsapp(fake)

    class CancelledMidBroadcast:
        kind = "whatsapp"

        def broadcast(self, messages):
            services.campaign_cancel(tenant, campaign.id)  # a person presses cancel while the batch is out
            return provider.broadcast(messages)

    done = services.campaign_run(tenant, campaign.id, bot=CampaignBot(CancelledMidBroadcast()), options=FAST)
    assert done.state == "cancelled"
    counts = selectors.campaign_progress(tenant, campaign.id).counts
    assert counts.states == {"accepted": 10, "cancelled": 15}, "the batch in flight finishes; the rest is cancelled"
    assert counts.reasons == {"cancelled:campaign_cancelled": 15}
    assert fake.count() == 10


def test_the_throttle_spaces_batches_by_the_channel_rate(world: str, fake) -> None:
    tenant = world
    make_contacts(tenant, 12)
    campaign = start(tenant, rate_per_s=4)
    options = services.default_options(selectors.campaign_get(tenant, campaign.id))
    assert (options.rate_per_s, options.batch_size) == (4.0, 4)
    clock = Clock()
    t0 = clock.now
    done = services.campaign_run(
        tenant, campaign.id, bot=CampaignBot(whatsapp(fake)), options=options, clock=clock, sleep=clock.sleep
    )
    assert done.state == "completed" and fake.count() == 12
    assert clock.now - t0 >= 2000, "12 messages at 4/s: the third batch starts 2 s after the first"


def test_results_are_matched_by_destination_chat_not_by_order_or_canonical_id(world: str, fake) -> None:
    """A provider may answer out of order and with its own id for the recipient (the fixture's ``wa_id``)."""
    tenant = world
    make_contacts(tenant, 6)
    fake.script("+573000000004", "window_closed")
    campaign = start(tenant)
    provider = whatsapp(fake)

    class Shuffled:
        kind = "whatsapp"

        def broadcast(self, messages):
            return list(reversed(provider.broadcast(messages)))

    services.campaign_run(tenant, campaign.id, bot=CampaignBot(Shuffled()), options=FAST)
    got = states(tenant, campaign.id)
    for recipient, d in got.items():
        sent = [r for r in fake.requests if r.body["to"] == recipient]
        assert len(sent) == 1 and sent[0].body["to"] == recipient  # sent to the planned address itself
        if recipient == "+573000000004":
            assert (d.state, d.error_code) == ("failed", 131047)
        else:
            assert d.state == "accepted" and d.provider_recipient == recipient.lstrip("+")
    # Each accepted delivery holds the wamid the provider gave for *its* request (the fake numbers them).
    wamid_of = {r.body["to"]: f"wamid.FAKE{n:026X}" for n, r in enumerate(fake.requests, start=1)}
    assert {r: d.provider_message_id for r, d in got.items() if d.state == "accepted"} == {
        r: wamid_of[r] for r in got if r != "+573000000004"
    }
