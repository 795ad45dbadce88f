"""The campaign pages in headless Chromium: an admin creates, previews and starts a campaign, then reads the result."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.celery import app as celery_app
from botmesh_admin.channels import services as channels
from botmesh_admin.tenancy import services as tenancy
from crm import services as crm
from tests.conftest import login

from .conftest import make_contacts


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_admin_creates_previews_and_starts_a_campaign(world, fake, page, screenshot_dir) -> None:
    tenant = world
    tenancy.tenant_create(tenant, name="Tienda Demo", default_region="CO")
    channels.channel_config_set(
        tenant,
        kind="whatsapp",
        name="wa-main",
        phone_number_id="106540352242922",
        access_token="EAAG-test-token",
        api_base_url=fake.base_url,
    )
    make_contacts(tenant, 12)
    make_contacts(tenant, 2, consent="denied", start=40)
    make_contacts(tenant, 1, tags=("otro",), start=50)
    crm.segment_create(tenant, name="Clientes promo", rules={"tags_all": ["promo"]})
    fake.script("+573000000003", "window_closed")
    fake.script("+573000000007", "drop")
    get_user_model().objects.create_user("marta", password="marta-password-1")
    tenancy.membership_set(tenant, username="marta", role="admin")
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True  # the run happens inside the start request (no worker here)
    try:
        login(page, "marta", "marta-password-1")
        page.goto(f"/t/{tenant}/campaigns/")
        page.get_by_role("link", name="New campaign").click()
        page.fill("input[name=rate_per_s]", "fast!")
        page.get_by_test_id("preview-button").click()  # nothing chosen yet: every mistake at once, under its input
        page.wait_for_selector("#campaign-rate_per_s-error")
        shown = page.get_by_test_id("field-error").all_inner_texts()
        assert shown[:2] == ["Must not be empty.", "Choose a segment."] and "key" not in " ".join(shown), shown
        assert page.inner_text("#campaign-rate_per_s-error") == "Must be a number of messages per second."
        assert page.input_value("input[name=rate_per_s]") == "fast!"
        page.screenshot(path=str(screenshot_dir / "campaign-editor-errors.png"), full_page=True)
        page.fill("input[name=rate_per_s]", "")
        page.fill("input[name=name]", "Noviembre 20%")
        page.select_option("select[name=segment_id]", label="Clientes promo")
        page.select_option("select[name=channel]", "whatsapp")
        page.select_option("select[name=channel_name]", "wa-main")
        page.fill("input[name=template]", "promo_noviembre")
        page.fill("input[name=language]", "es")
        page.fill("textarea[name=parameters]", "{name}\n20%")
        page.get_by_test_id("preview-button").click()
        page.wait_for_selector("[data-testid=preview-recipients]")
        assert page.get_by_test_id("preview-recipients").inner_text() == "12"
        drops = page.get_by_test_id("preview-drops").inner_text()
        assert "opted out" in drops and "not in the segment" in drops
        assert fake.count() == 0, "a preview sends nothing"

        page.get_by_test_id("save-button").click()
        page.wait_for_selector("[data-testid=start-now]")
        assert page.get_by_test_id("campaign-state").first.inner_text() == "draft"
        page.get_by_test_id("start-now").click()
        page.wait_for_selector("#campaign-progress[data-state=completed]")

        assert page.get_by_test_id("progress-percent").inner_text() == "100"
        assert page.get_by_test_id("count-accepted").inner_text().split()[-1] == "10"
        assert page.get_by_test_id("count-failed").inner_text().split()[-1] == "1"
        assert page.get_by_test_id("count-in_doubt").inner_text().split()[-1] == "1"
        assert "Planned 12 recipients of 15 contacts" in page.get_by_test_id("plan-summary").inner_text()
        assert page.locator("[data-testid=deliveries] tr[data-state=accepted]").count() == 10
        assert page.get_by_test_id("resend").count() == 1
        # Issue 20 item 9: each delivery names its contact and identity, not the contact id.
        first = page.locator("[data-testid=deliveries] tr[data-state]").first.get_by_test_id("delivery-contact")
        assert first.inner_text().startswith("Cliente 0") and "+573000000000" in first.inner_text()
        assert not re.search(r"\bc_[0-9a-f]{8}", page.get_by_test_id("deliveries").inner_text())
        assert fake.count() == 12 and all(fake.count(f"+5730{i:08d}") == 1 for i in range(12))
        page.select_option("select[name=state]", "failed")
        page.wait_for_function("document.querySelectorAll('[data-testid=deliveries] tr[data-state]').length === 1")
        assert "131047" in page.get_by_test_id("deliveries").inner_text()
        page.select_option("select[name=state]", "")
        page.wait_for_function("document.querySelectorAll('[data-testid=deliveries] tr[data-state]').length === 12")
        page.screenshot(path=str(screenshot_dir / "campaign.png"), full_page=True)
    finally:
        celery_app.conf.task_always_eager = previous


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_send_with_offers_only_the_chosen_kinds_channels_and_the_preview_names_who_has_no_chat_there(
    world, page, screenshot_dir
) -> None:
    """A new user's report: after choosing Telegram, "Send with" still offered the WhatsApp numbers, and the
    preview promised 3 recipients to a bot only one of them had written to."""
    from inbox.services import message_project

    tenant = world
    tenancy.tenant_create(tenant, name="Tienda Demo", default_region="CO")
    for name in ("main", "ventas"):
        channels.channel_config_set(tenant, kind="whatsapp", name=name, phone_number_id=f"10654035224{len(name)}")
    channels.channel_config_set(
        tenant, kind="telegram", name="bot", bot_token="600000000:AAF-fixture-bot-token-shop-xyz"
    )
    make_contacts(tenant, 3, channel="telegram")
    crm.segment_create(tenant, name="Clientes promo", rules={"tags_all": ["promo"]})
    message_project(
        tenant,
        {
            "id": "m1",
            "channel": "telegram",
            "chatId": "telegram:700000001",
            "senderId": "700000001",
            "direction": "in",
            "type": "text",
            "body": "hola",
            "timestamp": 1764489700000,
            "channelName": "bot",
        },
    )  # Cliente 1 wrote to the bot; Cliente 0 and 2 did not
    get_user_model().objects.create_user("marta", password="marta-password-1")
    tenancy.membership_set(tenant, username="marta", role="admin")
    login(page, "marta", "marta-password-1")
    page.goto(f"/t/{tenant}/campaigns/new/")

    def offered() -> list[str]:
        return page.eval_on_selector_all(
            "select[name=channel_name] option", "os => os.filter(o => !o.hidden && !o.disabled).map(o => o.value)"
        )

    assert page.input_value("select[name=channel]") == "whatsapp"
    assert offered() == ["", "main", "ventas"]
    page.fill("input[name=name]", "Aviso")
    page.fill("textarea[name=text]", "Hola {name}")
    page.select_option("select[name=channel_name]", "main")
    page.select_option("select[name=segment_id]", label="Clientes promo")
    page.select_option("select[name=channel]", "telegram")
    assert offered() == ["", "bot"]
    assert page.input_value("select[name=channel_name]") == ""  # the WhatsApp number is no longer chosen
    assert "(choose the telegram number or bot)" in page.inner_text("select[name=channel_name]")
    page.select_option("select[name=channel_name]", "bot")  # the form's change: htmx previews
    page.wait_for_selector("[data-testid=preview-no-conversation]")
    assert page.get_by_test_id("preview-recipients").inner_text() == "3"
    note = page.get_by_test_id("preview-no-conversation").inner_text()
    assert "2 of the 3 recipients have no conversation on bot" in note and "so 1 would get the message" in note
    assert page.get_by_test_id("no-conversation-examples").inner_text() == "For example: Cliente 0, Cliente 2"
    page.screenshot(path=str(screenshot_dir / "campaign_send_with.png"), full_page=True)
    page.select_option("select[name=channel]", "whatsapp")
    assert offered() == ["", "main", "ventas"] and page.input_value("select[name=channel_name]") == ""


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_running_campaigns_page_follows_it_to_the_end_then_stops_polling(world, fake, page, screenshot_dir) -> None:
    """Issue 20 item 3: the page showed "running" with no progress section until reloaded, and the list's
    progress column went blank once the campaign completed."""
    import threading

    from campaigns import services as campaigns

    tenant = world
    tenancy.tenant_create(tenant, name="Tienda Demo", default_region="CO")
    channels.channel_config_set(
        tenant,
        kind="whatsapp",
        name="wa-main",
        phone_number_id="106540352242922",
        access_token="EAAG-test-token",
        api_base_url=fake.base_url,
    )
    make_contacts(tenant, 12)
    segment = crm.segment_create(tenant, name="Clientes promo", rules={"tags_all": ["promo"]})
    get_user_model().objects.create_user("marta", password="marta-password-1")
    tenancy.membership_set(tenant, username="marta", role="admin")
    campaign = campaigns.campaign_create(
        tenant,
        name="Noviembre 20%",
        segment_id=segment.id,
        channel="whatsapp",
        channel_name="wa-main",
        message={"template": "promo_noviembre", "language": "es", "parameters": ["{name}"]},
        rate_per_s=3,  # 12 recipients in about 4 s: the page polls (every 2 s) while it runs
    )
    campaigns.campaign_start(tenant, campaign.id)  # queued for a worker: none runs here until the thread below

    login(page, "marta", "marta-password-1")
    page.goto(f"/t/{tenant}/campaigns/{campaign.id}/")
    assert page.get_by_test_id("progress-planning").is_visible()  # running, recipients not fixed yet
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "part=progress" in r.url else None)
    runner = threading.Thread(target=campaigns.campaign_run, args=(tenant, campaign.id), daemon=True)
    runner.start()
    try:
        # Mid-run, without a reload: some recipients have an outcome, not all.
        page.wait_for_function(
            "(() => { const p = document.querySelector('[data-testid=progress-percent]');"
            " return p && +p.textContent > 0 && +p.textContent < 100; })()",
            timeout=20000,
        )
        page.screenshot(path=str(screenshot_dir / "campaign_running.png"), full_page=True)
        page.wait_for_selector("#campaign-progress[data-state=completed]", timeout=30000)
    finally:
        runner.join(30)
    assert page.get_by_test_id("campaign-outcome").inner_text().startswith("Completed: 12 accepted.")
    assert page.get_by_test_id("progress-percent").inner_text() == "100"
    assert page.get_by_test_id("campaign-state").first.inner_text() == "completed"  # the header too
    assert page.get_by_test_id("pause").count() == 0  # the actions follow the state
    assert page.locator("[data-testid=deliveries] tr[data-state=accepted]").count() == 12
    seen = len(polls)
    page.wait_for_timeout(4500)  # two polling periods
    assert len(polls) == seen, "a completed campaign's page stops polling"
    page.screenshot(path=str(screenshot_dir / "campaign_completed.png"), full_page=True)

    page.goto(f"/t/{tenant}/campaigns/")
    assert page.get_by_test_id("final-counts").inner_text() == "12 accepted"
    page.screenshot(path=str(screenshot_dir / "campaign_list_final.png"), full_page=True)
