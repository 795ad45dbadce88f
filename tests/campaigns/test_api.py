"""``/api/v1/tenants/{tenant}/campaigns`` through Django's test client, sending to the fake WhatsApp API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from botmesh_admin.celery import app as celery_app
from botmesh_admin.channels import services as channels
from botmesh_admin.tenancy import services as tenancy
from campaigns import services
from campaigns.domain import now_ms
from crm import services as crm

from .conftest import make_contacts


class Api:
    """A client holding one tenant's bearer token."""

    def __init__(self, tenant: str, token: str) -> None:
        self.tenant, self.client = tenant, Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def url(self, path: str) -> str:
        return f"/api/v1/tenants/{self.tenant}/{path}"

    def get(self, path: str, **params):
        return self.client.get(self.url(path), params)

    def post(self, path: str, body=None):
        return self.client.post(self.url(path), body, content_type="application/json")

    def patch(self, path: str, body):
        return self.client.patch(self.url(path), body, content_type="application/json")

    def delete(self, path: str):
        return self.client.delete(self.url(path))


@pytest.fixture
def eager_celery(transactional_db: None) -> Iterator[None]:
    """Run Celery tasks in the calling thread (no worker in these tests).

    Without a test transaction around the request: the run's journal event queues its drain on commit.
    """
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


def _api(tenant: str, role: str) -> Api:
    _, plaintext = tenancy.token_create(tenant, name=f"{role}-token", role=role)
    return Api(tenant, plaintext)


@pytest.fixture
def tenant(db, world: str, fake) -> str:
    """A tenant with a WhatsApp channel pointed at the fake provider, 6 opted-in contacts and a segment."""
    tenancy.tenant_create(world, name="Tienda", default_region="CO")
    channels.channel_config_set(
        world,
        kind="whatsapp",
        name="wa-main",
        phone_number_id="106540352242922",
        access_token="EAAG-test-token",
        api_base_url=fake.base_url,
    )
    make_contacts(world, 6)
    make_contacts(world, 2, consent="denied", start=20)
    return world


@pytest.fixture
def admin(tenant: str, eager_celery: None) -> Api:
    return _api(tenant, "admin")


@pytest.fixture
def agent(tenant: str) -> Api:
    return _api(tenant, "agent")


def _segment(tenant: str) -> str:
    return crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]}).id


def _create(admin: Api, segment_id: str, **kw) -> dict:
    body = {
        "name": "Noviembre",
        "segment_id": segment_id,
        "channel": "whatsapp",
        "channel_name": "wa-main",
        "message": {"template": "promo_nov", "language": "es", "parameters": ["{name}"]},
        **kw,
    }
    r = admin.post("campaigns", body)
    assert r.status_code == 201, r.content
    return r.json()


def test_create_preview_start_and_read_the_outcomes(admin: Api, tenant: str, fake) -> None:
    segment_id = _segment(tenant)
    preview = admin.post("campaigns/plan", {"segment_id": segment_id, "channel": "whatsapp"})
    assert preview.status_code == 200
    assert (preview.json()["recipients"], preview.json()["dropped"]) == (6, {"opted_out": 2})
    created = _create(admin, segment_id)
    assert (created["state"], created["version"], created["plan"]) == ("draft", 1, None)
    assert admin.get(f"campaigns/{created['id']}/plan").json()["recipients"] == 6

    fake.script("+573000000002", "window_closed")
    started = admin.post(f"campaigns/{created['id']}/start")  # eager Celery: the run happens in this call
    assert started.status_code == 200, started.content
    body = admin.get(f"campaigns/{created['id']}").json()
    assert body["state"] == "completed"
    assert body["plan"] == {"considered": 8, "recipients": 6, "dropped": {"opted_out": 2}}
    assert body["progress"]["states"] == {"accepted": 5, "failed": 1}
    assert body["progress"]["reasons"] == {"failed:code:131047": 1}
    assert body["progress"]["percent"] == 100
    assert fake.count() == 6

    failed = admin.get(f"campaigns/{created['id']}/deliveries", state="failed").json()
    assert [(d["recipient"], d["error_code"], d["retryable"]) for d in failed["items"]] == [
        ("+573000000002", 131047, False)
    ]
    page1 = admin.get(f"campaigns/{created['id']}/deliveries", limit=4).json()
    page2 = admin.get(f"campaigns/{created['id']}/deliveries", limit=4, after=page1["next"]).json()
    assert len(page1["items"]) == 4 and len(page2["items"]) == 2 and page2["next"] is None
    accepted = page1["items"][0]
    assert accepted["state"] == "accepted" and accepted["provider_message_id"].startswith("wamid.")
    assert accepted["provider_recipient"] == "573000000000"

    listed = admin.get("campaigns", state="completed").json()
    assert [c["id"] for c in listed["items"]] == [created["id"]]


def test_bad_input_is_422_naming_the_field(admin: Api, tenant: str) -> None:
    segment_id = _segment(tenant)
    cases = [
        ({"message": {"text": "hola"}}, "campaign.message.template"),
        ({"message": {"template": "Promo Nov"}}, "campaign.message.template"),
        ({"channel": "sms"}, "campaign.channel"),
        ({"segment_id": "s_" + "0" * 22}, "campaign.segment_id"),
        ({"channel_name": "nope"}, "campaign.channel_name"),
        ({"rate_per_s": 0}, "campaign.rate_per_s"),
        ({"contact_ids": ["c_1"]}, "campaign.contact_ids[0]"),
        ({"channel": "telegram", "channel_name": None, "message": {"template": "x"}}, "campaign.message.template"),
        # a fresh user's report: "{unknown}" was sent as it is to every recipient, and [] made an empty campaign
        ({"message": {"template": "promo_nov", "parameters": ["{name}", "{x}"]}}, "campaign.message.parameters[1]"),
        ({"channel": "telegram", "channel_name": None, "message": {"text": "Hola {nombre}"}}, "campaign.message.text"),
        ({"contact_ids": []}, "campaign.contact_ids"),
    ]
    for change, field in cases:
        body = {
            "name": "x",
            "segment_id": segment_id,
            "channel": "whatsapp",
            "channel_name": "wa-main",
            "message": {"template": "promo_nov"},
            **change,
        }
        r = admin.post("campaigns", body)
        assert (r.status_code, r.json()["field"]) == (422, field), (change, r.content)
    assert admin.get("campaigns").json()["items"] == [], "nothing was written"


def test_a_field_a_write_does_not_declare_is_422_naming_it_and_nothing_is_written(admin: Api, tenant: str) -> None:
    """A client sending ``scheduled_at`` on a create believed it scheduled the campaign (201, ignored)."""
    segment_id = _segment(tenant)
    body = {
        "name": "x",
        "segment_id": segment_id,
        "channel": "whatsapp",
        "channel_name": "wa-main",
        "message": {"template": "promo_nov"},
    }
    for extra in ({"scheduled_at": now_ms() + 3_600_000}, {"bogus_field": 1}):
        r = admin.post("campaigns", {**body, **extra})
        [name] = extra
        assert r.status_code == 422 and name in r.json()["field"], (extra, r.content)
    assert admin.get("campaigns").json()["items"] == [], "nothing was written"
    cid = _create(admin, segment_id)["id"]
    for method, path, sent in (
        ("patch", f"campaigns/{cid}", {"expected_version": 1, "nmae": "typo"}),
        ("post", "campaigns/plan", {"segment_id": segment_id, "channel": "whatsapp", "bogus_field": 1}),
        ("post", f"campaigns/{cid}/start", {"schedule_at": now_ms() + 3_600_000}),
        ("post", f"campaigns/{cid}/deliveries/resend", {"recipients": [], "bogus_field": 1}),
    ):
        r = getattr(admin, method)(path, sent)
        [name] = set(sent) - {"expected_version", "segment_id", "channel", "recipients"}
        assert r.status_code == 422 and name in r.json()["field"], (path, r.content)
    after = admin.get(f"campaigns/{cid}").json()
    assert (after["name"], after["state"], after["version"], after["scheduled_at"]) == ("Noviembre", "draft", 1, None)


def test_a_schedule_in_the_past_is_refused_and_a_future_one_waits(admin: Api, tenant: str, fake) -> None:
    created = _create(admin, _segment(tenant))
    past = admin.post(f"campaigns/{created['id']}/start", {"scheduled_at": now_ms() - 1000})
    assert (past.status_code, past.json()["field"]) == (422, "scheduled_at")
    at = now_ms() + 3_600_000
    scheduled = admin.post(f"campaigns/{created['id']}/start", {"scheduled_at": at}).json()
    assert (scheduled["state"], scheduled["scheduled_at"]) == ("scheduled", at)
    assert fake.count() == 0
    # The durable job's tick before the time leaves it alone; at the time it starts it (and the run sends).
    assert services.campaigns_tick(at_ms=at - 1)["started"] == 0
    assert services.campaigns_tick(at_ms=at)["started"] == 1
    assert admin.get(f"campaigns/{created['id']}").json()["state"] == "completed"
    assert fake.count() == 6
    assert services.campaigns_tick(at_ms=at + 10_000) == {"started": 0, "redispatched": 0, "cleaned": 0}


def test_state_actions_follow_the_lifecycle(admin: Api, tenant: str) -> None:
    created = _create(admin, _segment(tenant))
    cid = created["id"]
    assert admin.post(f"campaigns/{cid}/pause").json()["error"] == "campaign_state"
    stale = admin.patch(f"campaigns/{cid}", {"expected_version": 9, "name": "Otro"})
    assert (stale.status_code, stale.json()["current_version"]) == (409, 1)
    renamed = admin.patch(f"campaigns/{cid}", {"expected_version": 1, "name": "Diciembre"})
    assert (renamed.json()["name"], renamed.json()["version"]) == ("Diciembre", 2)
    admin.post(f"campaigns/{cid}/start", {"scheduled_at": now_ms() + 60_000})
    assert admin.patch(f"campaigns/{cid}", {"expected_version": 3, "name": "x"}).status_code == 409
    assert admin.delete(f"campaigns/{cid}").json()["error"] == "campaign_state", "cancel first"
    cancelled = admin.post(f"campaigns/{cid}/cancel").json()
    assert cancelled["state"] == "cancelled"
    assert admin.post(f"campaigns/{cid}/resume").status_code == 409
    assert admin.delete(f"campaigns/{cid}").status_code == 204
    assert admin.get(f"campaigns/{cid}").status_code == 404


def test_resend_takes_only_deliveries_in_doubt(admin: Api, tenant: str, fake) -> None:
    created = _create(admin, _segment(tenant))
    fake.script("+573000000001", "drop", times=1)  # the provider took it, its answer was lost
    admin.post(f"campaigns/{created['id']}/start")
    doubt = admin.get(f"campaigns/{created['id']}/deliveries", state="in_doubt").json()["items"]
    assert [(d["recipient"], d["reason"]) for d in doubt] == [("+573000000001", "no_answer")]
    refused = admin.post(f"campaigns/{created['id']}/deliveries/resend", {"recipients": ["+573000000000"]})
    assert refused.status_code == 409
    again = admin.post(f"campaigns/{created['id']}/deliveries/resend", {"recipients": ["+573000000001"]}).json()
    assert again["state"] == "completed" and again["progress"]["states"] == {"accepted": 6}
    assert fake.count("+573000000001") == 2 and fake.count("+573000000000") == 1
