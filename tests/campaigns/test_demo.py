"""``campaigns.demo.load`` through the real API (a test client stands in for the running server)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from botmesh_admin.celery import app as celery_app
from botmesh_admin.tenancy import services as tenancy
from campaigns import demo, selectors
from crm import services as crm

from .conftest import make_contacts


class Ctx:
    """The part of ``DemoContext`` a loader uses, over Django's test client."""

    def __init__(self, token: str) -> None:
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def request(self, method, path, body=None, headers=None, tenant=None):
        response = self.client.generic(
            method, path, json.dumps(body) if body is not None else "", content_type="application/json"
        )
        return response.status_code, response.json() if response.content else None


@pytest.fixture
def eager(transactional_db):
    # No test transaction: a campaign run's journal event queues its (eager) drain on commit.
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


def test_demo_creates_a_draft_and_a_completed_campaign_once(db, world: str, eager) -> None:
    from botmesh_admin.channels.services import channel_config_set

    tenancy.tenant_create(world, name="Tienda Demo", default_region="CO")
    # the inbox demo's first number, which the demo campaigns name as their sending channel
    channel_config_set(world, kind="whatsapp", name=demo.CHANNEL, phone_number_id="106540352242922")
    _, token = tenancy.token_create(world, name="demo", role="admin")
    make_contacts(world, 5, tags=("vip",))
    make_contacts(world, 2, tags=("vip",), consent="denied", start=10)
    crm.segment_create(world, name=demo.SEGMENT, rules={"tags_all": ["vip"], "consent_required": "whatsapp"})
    summary = demo.load(Ctx(token), tenant=world)
    assert "would reach 5" in summary and "(left out: 2 opted out)" in summary and "is completed (" in summary
    states = {c.name: c.state for c in selectors.campaign_list(world).items}
    assert states == {demo.DRAFT: "draft", demo.SMALL: "completed"}
    small = next(c for c in selectors.campaign_list(world).items if c.name == demo.SMALL)
    assert selectors.campaign_progress(world, small.id).counts.states == {"accepted": 3}
    assert "already loaded" in demo.load(Ctx(token), tenant=world)
    assert len(selectors.campaign_list(world).items) == 2
