"""Campaign pages as a signed-in admin sees them (readable without JavaScript), against the fake provider."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.celery import app as celery_app
from botmesh_admin.channels import services as channels
from botmesh_admin.tenancy import services as tenancy
from campaigns import selectors
from crm import selectors as crm_selectors
from crm import services as crm

from .conftest import make_contacts


def _member(tenant: str, username: str, role: str) -> Client:
    get_user_model().objects.create_user(username=username, password="x-very-long-password")
    tenancy.membership_set(tenant, username=username, role=role)
    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client


@pytest.fixture
def tenant(db, world: str, fake) -> str:
    tenancy.tenant_create(world, name="Tienda", default_region="CO")
    channels.channel_config_set(
        world,
        kind="whatsapp",
        name="wa-main",
        phone_number_id="106540352242922",
        access_token="EAAG-test-token",
        api_base_url=fake.base_url,
    )
    make_contacts(world, 4)
    make_contacts(world, 1, consent="denied", start=9)
    crm.segment_create(world, name="Promo", rules={"tags_all": ["promo"]})
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield world
    celery_app.conf.task_always_eager = previous


@pytest.fixture
def admin(tenant: str) -> Client:
    return _member(tenant, f"admin-{tenant}", "admin")


def _form(tenant: str, **kw) -> dict:
    segment = crm_selectors.segment_list(tenant)[0]
    return {
        "name": "Noviembre",
        "segment_id": segment.id,
        "channel": "whatsapp",
        "channel_name": "wa-main",
        "template": "promo_nov",
        "language": "es",
        "parameters": "{name}\n20%",
        "text": "",
        "rate_per_s": "",
        "action": "save",
        **kw,
    }


def test_the_editor_previews_drop_counts_then_saves_a_draft(admin: Client, tenant: str) -> None:
    page = admin.get(f"/t/{tenant}/campaigns/new/")
    assert page.status_code == 200 and b"Promo" in page.content
    preview = admin.post(f"/t/{tenant}/campaigns/preview", _form(tenant), HTTP_HX_REQUEST="true")
    text = preview.content.decode()
    assert 'data-testid="preview-recipients">4<' in text
    assert 'data-reason="opted_out"' in text and "Cliente 9" in text
    no_js = admin.post(f"/t/{tenant}/campaigns/new/", _form(tenant, action="preview"))
    assert 'data-testid="preview-recipients">4<' in no_js.content.decode(), "the preview works without JavaScript"

    bad = admin.post(f"/t/{tenant}/campaigns/new/", _form(tenant, template=""))
    html = bad.content.decode()
    assert bad.status_code == 422 and "campaign.message.template" not in html  # plain words, under the field
    assert 'id="campaign-template-error" role="alert" data-testid="field-error">A WhatsApp campaign needs an' in html
    assert 'name="name" required maxlength="200" value="Noviembre"' in html  # what was typed is kept
    saved = admin.post(f"/t/{tenant}/campaigns/new/", _form(tenant))
    assert saved.status_code == 302
    (campaign,) = selectors.campaign_list(tenant).items
    assert (campaign.state, campaign.message.parameters) == ("draft", ("{name}", "20%"))
    detail = admin.get(saved["Location"]).content.decode()
    assert 'data-testid="preview-recipients">4<' in detail and 'data-testid="start-now"' in detail


def test_start_shows_progress_counts_and_the_deliveries_table(
    transactional_db: None, admin: Client, tenant: str, fake
) -> None:
    # transactional_db: no test transaction, so the run's journal event queues its (eager) drain on commit.
    admin.post(f"/t/{tenant}/campaigns/new/", _form(tenant))
    (campaign,) = selectors.campaign_list(tenant).items
    fake.script("+573000000001", "window_closed")
    fake.script("+573000000002", "drop", times=1)
    started = admin.post(f"/t/{tenant}/campaigns/{campaign.id}/start")
    assert started.status_code == 302
    text = admin.get(f"/t/{tenant}/campaigns/{campaign.id}/").content.decode()
    assert 'data-state="completed"' in text
    assert 'data-testid="progress-percent">100<' in text
    assert "in doubt: the provider may have received" in text
    assert text.count('data-testid="resend"') == 1
    progress = admin.get(f"/t/{tenant}/campaigns/{campaign.id}/?part=progress", HTTP_HX_REQUEST="true").content
    assert b'data-testid="count-accepted"' in progress and b"hx-trigger" not in progress, "no polling once done"
    failed = admin.get(
        f"/t/{tenant}/campaigns/{campaign.id}/deliveries", {"state": "failed"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "+573000000001" in failed and "131047" in failed and "+573000000000" not in failed

    resent = admin.post(f"/t/{tenant}/campaigns/{campaign.id}/resend", {"recipient": "+573000000002"})
    assert resent.status_code == 302
    assert selectors.campaign_progress(tenant, campaign.id).counts.states == {"accepted": 3, "failed": 1}
    assert fake.count("+573000000002") == 2


def test_list_page_and_agents_cannot_edit(admin: Client, tenant: str) -> None:
    admin.post(f"/t/{tenant}/campaigns/new/", _form(tenant))
    listing = admin.get(f"/t/{tenant}/campaigns/").content.decode()
    assert "Noviembre" in listing and 'data-testid="campaign-state">draft<' in listing
    agent = _member(tenant, f"agent-{tenant}", "agent")
    assert agent.get(f"/t/{tenant}/campaigns/").status_code == 200
    assert agent.get(f"/t/{tenant}/campaigns/new/").status_code == 403
    (campaign,) = selectors.campaign_list(tenant).items
    assert agent.post(f"/t/{tenant}/campaigns/{campaign.id}/start").status_code == 403
    assert selectors.campaign_get(tenant, campaign.id).state == "draft"


def test_campaign_pages_refuse_an_unknown_state_filter_with_400(admin: Client, tenant: str) -> None:
    """Found by a new user: ``?state=bogus`` answered 200 with every campaign (or delivery), unfiltered."""
    admin.post(f"/t/{tenant}/campaigns/new/", _form(tenant))
    (campaign,) = selectors.campaign_list(tenant).items
    assert "Noviembre" in admin.get(f"/t/{tenant}/campaigns/", {"state": "draft"}).content.decode()
    assert "Noviembre" not in admin.get(f"/t/{tenant}/campaigns/", {"state": "running"}).content.decode()
    for path in ("", f"{campaign.id}/", f"{campaign.id}/deliveries"):
        refused = admin.get(f"/t/{tenant}/campaigns/{path}", {"state": "bogus"})
        assert refused.status_code == 400, path
        assert "state: must be one of" in refused.content.decode(), path


def test_schedule_is_read_in_the_tenants_zone_and_a_past_time_is_refused_under_its_field(
    admin: Client, tenant: str
) -> None:
    """Issue 20 items 6 and 7: ``Schedule for (America/Bogota)``; a refused time stays in the box (422)."""
    import datetime as dt

    tenancy.tenant_time_zone_set(tenant, time_zone="America/Bogota")
    assert admin.post(f"/t/{tenant}/campaigns/new/", _form(tenant)).status_code == 302
    (campaign,) = selectors.campaign_list(tenant).items
    url = f"/t/{tenant}/campaigns/{campaign.id}/start"
    assert "Schedule for (America/Bogota)" in admin.get(f"/t/{tenant}/campaigns/{campaign.id}/").content.decode()
    past = admin.post(url, {"scheduled_at": "2020-01-02T08:30"})
    html = past.content.decode()
    assert past.status_code == 422 and 'value="2020-01-02T08:30" aria-invalid="true"' in html
    assert 'id="schedule-scheduled_at-error" role="alert" data-testid="field-error">' in html
    assert "scheduled_at:" not in html and selectors.campaign_get(tenant, campaign.id).state == "draft"
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(days=2)).replace(second=0, microsecond=0)
    typed = (at - dt.timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M")  # the same instant on a clock in Bogotá
    assert admin.post(url, {"scheduled_at": typed}).status_code == 302
    scheduled = selectors.campaign_get(tenant, campaign.id)
    assert scheduled.state == "scheduled" and scheduled.scheduled_at == int(at.timestamp() * 1000)


def test_the_editor_shows_every_bad_field_at_once_under_its_input_and_saves_nothing(admin: Client, tenant: str) -> None:
    """An empty name, a rate that is no number and a text with U+202E: all three under their inputs, in one answer."""
    bad = _form(tenant, name="", rate_per_s="fast!", channel="telegram", channel_name="", text="Hola\u202eevil")
    bad["segment_id"] = ""
    for action in ("preview", "save"):
        resp = admin.post(f"/t/{tenant}/campaigns/new/", {**bad, "action": action})
        html = resp.content.decode()
        assert resp.status_code == 422, action
        assert 'id="campaign-name-error" role="alert" data-testid="field-error">Must not be empty.<' in html
        assert 'id="campaign-segment_id-error" role="alert" data-testid="field-error">Choose a segment.<' in html
        assert (
            'id="campaign-rate_per_s-error" role="alert" data-testid="field-error">'
            "Must be a number of messages per second.<" in html
        )
        assert 'id="campaign-text-error" role="alert" data-testid="field-error">Contains U+202E RIGHT-TO-LEFT' in html
        assert 'data-testid="form-error"' not in html and "key:" not in html and "campaign." not in html
        assert 'value="fast!"' in html and "Hola\u202eevil</textarea>" in html  # what was typed is kept
        assert 'data-testid="preview-recipients"' not in html
    assert selectors.campaign_list(tenant).items == []


def test_the_live_preview_waits_for_a_segment_and_says_a_refusal_in_words(admin: Client, tenant: str) -> None:
    """The form's change preview (htmx) with no segment chosen shows nothing, never 'key: must not be empty'."""
    empty = admin.post(f"/t/{tenant}/campaigns/preview", _form(tenant, segment_id=""), HTTP_HX_REQUEST="true")
    html = empty.content.decode()
    assert empty.status_code == 200 and "key" not in html and 'role="alert"' not in html
    gone = admin.post(f"/t/{tenant}/campaigns/preview", _form(tenant, segment_id="s_nope"), HTTP_HX_REQUEST="true")
    assert 'class="error-box" role="alert">' in gone.content.decode() and "campaign." not in gone.content.decode()
