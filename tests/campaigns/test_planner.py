"""The planner: recipients from a segment and a channel, each left-out contact counted under its reason."""

from __future__ import annotations

from campaigns import selectors
from campaigns.domain.planning import Planner
from crm import services as crm
from crm.domain import Consent, Contact, Identity, SegmentRules

from .conftest import make_contacts


def test_plan_counts_every_reason_before_anything_is_sent(world: str) -> None:
    tenant = world
    ok = make_contacts(tenant, 3)
    denied = make_contacts(tenant, 1, consent="denied", start=10)
    unknown = make_contacts(tenant, 1, consent="", start=11)
    other_segment = make_contacts(tenant, 2, tags=("vip",), start=20)
    email_only = crm.contact_create(
        tenant,
        identities=[{"channel": "email", "address": "ana@example.com"}],
        tags=["promo"],
        consent={"whatsapp": "granted"},
    )
    segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})

    plan = selectors.campaign_plan(tenant, segment_id=segment.id, channel="whatsapp")

    assert [r.contact_id for r in plan.recipients] == [c.id for c in ok]
    assert plan.counts.recipients == 3
    assert plan.counts.considered == 3 + 1 + 1 + 2 + 1
    assert plan.counts.dropped == {"no_identity": 1, "not_in_segment": 2, "opted_out": 2}
    assert plan.examples["no_identity"] == [email_only.id]
    assert {r.address for r in plan.recipients} == {"+573000000000", "+573000000001", "+573000000002"}
    assert plan.recipients[0].chat_key == "whatsapp:573000000000"
    assert denied and unknown and other_segment


def test_a_contact_listed_twice_and_two_contacts_sharing_an_identity_are_one_recipient(world: str) -> None:
    tenant = world
    ana, luis = make_contacts(tenant, 2)
    segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})

    plan = selectors.campaign_plan(
        tenant, segment_id=segment.id, channel="whatsapp", contact_ids=[ana.id, luis.id, ana.id, "c_" + "0" * 22]
    )
    assert [r.contact_id for r in plan.recipients] == [ana.id, luis.id]
    assert plan.counts.dropped == {"contact_not_found": 1, "duplicate": 1}

    # The CRM keeps identities unique, but an audience from elsewhere may not:
    # the same phone written two ways is still one recipient.
    granted = {"whatsapp": Consent("whatsapp", "granted", 1, "test")}
    twins = [
        Contact(id="c_" + "1" * 22, identities=(Identity("whatsapp", "+573001112233"),), consent=granted),
        Contact(id="c_" + "2" * 22, identities=(Identity("whatsapp", "573001112233"),), consent=granted),
    ]

    class Source:
        def every(self):
            return iter(twins)

        def get(self, contact_id):
            return next((c for c in twins if c.id == contact_id), None)

    plan = Planner(tenant, Source()).plan(rules=SegmentRules(), channel="whatsapp")
    assert [r.contact_id for r in plan.recipients] == ["c_" + "1" * 22]
    assert plan.counts.dropped == {"duplicate": 1}


def test_consent_required_on_the_campaign_channel_counts_as_opted_out_not_as_segment(world: str) -> None:
    tenant = world
    make_contacts(tenant, 2)
    make_contacts(tenant, 1, consent="denied", start=5)
    segment = crm.segment_create(tenant, name="Opted in", rules={"tags_all": ["promo"], "consent_required": "whatsapp"})
    plan = selectors.campaign_plan(tenant, segment_id=segment.id, channel="whatsapp")
    assert plan.counts.recipients == 2
    assert plan.counts.dropped == {"opted_out": 1}


def test_telegram_plans_by_user_id(world: str) -> None:
    tenant = world
    users = make_contacts(tenant, 2, channel="telegram")
    make_contacts(tenant, 1, start=50)  # WhatsApp only
    segment = crm.segment_create(tenant, name="All", rules={})
    plan = selectors.campaign_plan(tenant, segment_id=segment.id, channel="telegram")
    assert [(r.contact_id, r.address, r.chat_key) for r in plan.recipients] == [
        (users[0].id, "700000000", "telegram:700000000"),
        (users[1].id, "700000001", "telegram:700000001"),
    ]
    assert plan.counts.dropped == {"no_identity": 1}


def test_send_time_check_sees_a_withdrawn_consent(world: str) -> None:
    tenant = world
    (ana,) = make_contacts(tenant, 1)
    planner = Planner(tenant)
    assert planner.check(ana.id, "whatsapp", "+573000000000")[0] is None
    crm.consent_set(tenant, ana.id, channel="whatsapp", status="denied", source="test")
    assert planner.check(ana.id, "whatsapp", "+573000000000")[0] == "opted_out"
    crm.contact_erase(tenant, ana.id)
    assert planner.check(ana.id, "whatsapp", "+573000000000")[0] == "contact_erased"
