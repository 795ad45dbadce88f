"""Destructive actions ask first, with and without JavaScript (issue 20 item 5), in a real headless Chromium.

Before: channel delete, token revoke and segment delete acted on the first click; a segment a campaign
still needed could be deleted, and the campaign then showed the segment's bare id.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.channels import selectors as channel_selectors
from botmesh_admin.channels import services as channels
from botmesh_admin.tenancy import selectors as tenancy_selectors
from botmesh_admin.tenancy import services as tenancy
from campaigns import selectors as campaigns_selectors
from campaigns import services as campaigns
from crm import selectors as crm_selectors
from crm import services as crm
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def admin(tenant_id: str) -> str:
    get_user_model().objects.create_user("ines", password="ines-password-1")
    tenancy.tenant_create(tenant_id, name="Tienda", default_region="CO")
    tenancy.membership_set(tenant_id, username="ines", role="admin")
    return tenant_id


def test_channel_delete_and_token_revoke_ask_first_with_javascript(page, admin: str, screenshot_dir) -> None:
    tenant = admin
    channels.channel_config_set(tenant, kind="telegram", name="bot", bot_token="600000000:AAF-fixture-bot-token-x")
    tenancy.token_create(tenant, name="ci", role="admin")
    login(page, "ines", "ines-password-1")
    page.goto(f"/t/{tenant}/channels/")
    asked: list[str] = []

    def dismiss(dialog) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.get_by_test_id("delete-channel").click()
    page.wait_for_timeout(300)
    assert asked and "Delete the channel bot?" in asked[0]
    assert [c.name for c in channel_selectors.channel_config_list(tenant)] == ["bot"]  # dismissed: nothing gone
    page.once("dialog", lambda d: d.accept())
    page.get_by_test_id("delete-channel").click()
    page.wait_for_selector("text=Channel 'bot' deleted.")
    assert channel_selectors.channel_config_list(tenant) == []

    page.goto(f"/t/{tenant}/settings/tokens/")
    page.once("dialog", lambda d: (asked.append(d.message), d.accept()))
    page.get_by_test_id("revoke-token").click()
    page.wait_for_selector("text=Token revoked.")
    assert "Revoke the token ci?" in asked[-1]
    assert tenancy_selectors.token_list(tenant)[0].revoked_at is not None

    contact = crm.contact_create(tenant, identities=[{"channel": "telegram", "address": "7000001"}], name="Ana")
    page.goto(f"/t/{tenant}/crm/contacts/{contact.id}/")
    page.once("dialog", dismiss)
    page.get_by_test_id("erase-contact").click()
    page.wait_for_timeout(300)
    assert "Erase this contact and its conversations for good?" in asked[-1]
    assert crm_selectors.contact_get(tenant, contact.id).name == "Ana"  # dismissed: still there
    page.once("dialog", lambda d: d.accept())
    page.get_by_test_id("erase-contact").click()
    page.wait_for_selector(f"text=Contact {contact.id} erased")


def test_without_javascript_a_confirm_page_asks_and_a_segment_in_use_is_refused(
    chromium, live_server, admin: str, screenshot_dir
) -> None:
    tenant = admin
    tenancy.token_create(tenant, name="ci", role="admin")
    segment = crm.segment_create(tenant, name="Clientes promo", rules={"tags_all": ["promo"]})
    draft = campaigns.campaign_create(
        tenant, name="Noviembre", segment_id=segment.id, channel="whatsapp", message={"template": "promo"}
    )
    context = chromium.new_context(java_script_enabled=False, base_url=live_server.url)
    page = context.new_page()
    page.set_default_timeout(15000)
    try:
        login(page, "ines", "ines-password-1")
        page.goto(f"/t/{tenant}/settings/tokens/")
        page.get_by_test_id("revoke-token").click()
        assert page.locator("h1").inner_text() == "Revoke the API token 'ci' (bm_" + (
            tenancy_selectors.token_list(tenant)[0].prefix + "_…)?"
        )
        assert tenancy_selectors.token_list(tenant)[0].revoked_at is None  # asked, nothing done yet
        page.get_by_test_id("confirm").click()
        page.wait_for_selector("text=Token revoked.")
        assert tenancy_selectors.token_list(tenant)[0].revoked_at is not None

        page.goto(f"/t/{tenant}/crm/segments/{segment.id}/")
        assert "Noviembre (draft)" in page.get_by_test_id("segment-in-use").inner_text()
        page.screenshot(path=str(screenshot_dir / "segment-in-use.png"), full_page=True)

        page.goto(f"/t/{tenant}/campaigns/{draft.id}/")
        page.get_by_test_id("cancel").click()  # no JavaScript: a page asks first
        assert page.locator("h1").inner_text() == "Cancel the campaign 'Noviembre'?"
        assert campaigns_selectors.campaign_get(tenant, draft.id).state == "draft"
        page.get_by_test_id("confirm").click()
        page.wait_for_selector("text=Campaign cancelled.")  # finished now: the segment may go, with a warning
        page.goto(f"/t/{tenant}/crm/segments/{segment.id}/")
        page.get_by_test_id("delete-segment").click()
        confirm = page.get_by_test_id("confirm-page").inner_text()
        assert "Delete the segment 'Clientes promo'?" in confirm and "“segment deleted”" in confirm
        page.screenshot(path=str(screenshot_dir / "segment-delete-confirm.png"), full_page=True)
        page.get_by_test_id("confirm").click()
        page.wait_for_selector("text=Segment deleted.")
        assert crm_selectors.segment_list(tenant) == []

        page.goto(f"/t/{tenant}/campaigns/{draft.id}/")
        assert page.get_by_test_id("campaign-segment").inner_text().strip() == "segment deleted"
        assert segment.id not in page.get_by_test_id("campaign-segment").inner_text()
        page.screenshot(path=str(screenshot_dir / "campaign-segment-deleted.png"), full_page=True)
    finally:
        context.close()


def test_the_api_refuses_to_delete_a_segment_a_campaign_still_needs(client, admin: str) -> None:
    tenant = admin
    _, token = tenancy.token_create(tenant, name="ci", role="admin")
    segment = crm.segment_create(tenant, name="Promo", rules={"tags_all": ["promo"]})
    campaigns.campaign_create(
        tenant, name="Noviembre", segment_id=segment.id, channel="whatsapp", message={"template": "promo"}
    )
    resp = client.delete(f"/api/v1/tenants/{tenant}/segments/{segment.id}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 409 and resp.json()["error"] == "segment_in_use"
    assert "'Noviembre' (draft)" in resp.json()["message"]
    assert [s.id for s in crm_selectors.segment_list(tenant)] == [segment.id]
