"""The inbox in headless Chromium: an agent opens a conversation, assigns it to herself and replies."""

from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from botmesh_admin.channels.testing import FakeProviderServer
from botmesh_admin.demo import fixtures_dir
from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from inbox import services
from inbox.stores import default_store
from tests.backends import unique_id
from tests.conftest import login

from .conftest import ledger_records

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def drain(channel: str) -> None:
    while sum(journal_drain(channel=channel, limit=500).values()):
        pass


@pytest.fixture
def shop():
    from botmesh_admin.channels.services import channel_config_set

    tenant = unique_id("tienda")
    tenancy.tenant_create(tenant, name="Tienda Demo")
    get_user_model().objects.create_user("sofia", password="sofia-password-1")
    get_user_model().objects.create_user("mateo", password="mateo-password-1")
    tenancy.membership_set(tenant, username="sofia", role="agent")
    tenancy.membership_set(tenant, username="mateo", role="agent")
    raw = fixtures_dir() / "whatsapp" / "raw"
    signatures = json.loads((raw / "signatures.json").read_text())
    meta = json.loads((fixtures_dir() / "telegram" / "meta.json").read_text())
    with FakeProviderServer() as fake:
        channel_config_set(
            tenant,
            kind="whatsapp",
            name="main",
            phone_number_id="106540352242922",
            display_phone_number="+1 555 078 3881",
            app_secret=signatures["app_secret"],
            access_token="EAAG-browser-test",
            api_base_url=fake.base_url,
        )
        channel_config_set(
            tenant,
            kind="telegram",
            name="bot",
            webhook_secret=meta["secret_token"],
            bot_token="600000000:AAF-fixture-bot-token-not-real-xyz",
            api_base_url=fake.base_url,
        )
        client = Client()
        services.ledger_push(tenant, [dict(r, tenantId=None) for r in ledger_records() if r["tenantId"] == "tienda"])
        for name, signature in sorted(signatures["signatures"].items()):
            client.post(
                f"/webhooks/whatsapp/{tenant}",
                data=(raw / name).read_bytes(),
                content_type="application/json",
                HTTP_X_HUB_SIGNATURE_256=signature,
            )
        for path in sorted((fixtures_dir() / "telegram").glob("0*.json")):
            client.post(
                f"/webhooks/telegram/{tenant}/bot",
                data=path.read_bytes(),
                content_type="application/json",
                HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN=meta["secret_token"],
            )
        drain("inbound")
        drain("ledger")
        yield tenant, fake


def test_agent_assigns_and_replies(page, shop, screenshot_dir) -> None:
    tenant, fake = shop
    login(page, "sofia", "sofia-password-1")
    page.goto(f"/t/{tenant}/inbox/")
    assert page.locator(".inbox-row").count() >= 40
    page.locator(".inbox-row", has_text="Ana García").first.click()
    page.wait_for_selector(".inbox-threadhead h2:has-text('Ana García')")
    assert page.locator(".inbox-msg", has_text="Hablar con un asesor").count() == 1
    assert page.locator(".inbox-media", has_text="Photo").count() == 1
    page.get_by_role("button", name="Assign to me").click()
    page.wait_for_selector(".inbox-state:has-text('Assigned to @sofia')")
    page.get_by_role("button", name="Take from bot").click()
    page.wait_for_selector(".inbox-state:has-text('human handling')")
    page.fill("#note-text", "Pidió envío a Medellín; confirmar costo")
    page.get_by_role("button", name="Add note").click()
    page.wait_for_selector(".inbox-note:has-text('confirmar costo')")
    page.fill("#reply-text", "¡Hola Ana! Sí, enviamos a Medellín en 2 días hábiles 🚚")
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector(".inbox-agent:has-text('Medellín en 2 días')")
    drain("outbox")  # the worker: sends through the fake WhatsApp Cloud API
    assert fake.count("573001112233") == 1
    assert fake.requests[-1].body["text"]["body"].startswith("¡Hola Ana!")
    page.wait_for_selector(".inbox-agent .inbox-ticks", timeout=10000)  # htmx polling shows it sent
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and page.locator(".inbox-row.selected .pill", has_text="@sofia").count() == 0:
        time.sleep(0.2)
    page.screenshot(path=str(screenshot_dir / "inbox.png"))
    assert fake.count("573001112233") == 1


def test_reply_in_another_agents_chat_offers_assign_to_me_and_takes_it_from_the_bot(page, shop, screenshot_dir):
    """Issue 15, item 4: who may reply and what replying does, as the agent sees it."""
    from inbox.selectors import conversations_of_chat
    from inbox.services import conversation_assign

    tenant, fake = shop
    (conv,) = conversations_of_chat(tenant, "whatsapp:573001112233")
    conversation_assign(tenant, conv.id, agent="mateo", expected_version=conv.version)
    login(page, "sofia", "sofia-password-1")
    page.goto(f"/t/{tenant}/inbox/{conv.id}/")
    page.wait_for_selector(".inbox-reply-owner:has-text('Assigned to @mateo')")
    assert page.get_by_role("button", name="Send").count() == 0
    assert page.locator(".inbox-reply-hint", has_text="takes this chat from the bot").count() == 1
    page.fill("#reply-text", "Hola Ana, te atiendo yo")
    page.screenshot(path=str(screenshot_dir / "inbox-others-conversation.png"))
    page.get_by_role("button", name="Assign to me and reply").click()
    page.wait_for_selector(".inbox-agent:has-text('te atiendo yo')")
    page.wait_for_selector(".inbox-state:has-text('Assigned to @sofia')")
    page.wait_for_selector(".inbox-state:has-text('human handling')")
    assert page.locator(".inbox-state", has_text="taken by sofia").count() == 1
    assert page.get_by_role("button", name="Send").count() == 1  # hers now: a plain reply
    assert page.locator(".inbox-reply-hint").count() == 0  # already taken from the bot
    page.screenshot(path=str(screenshot_dir / "inbox-assign-and-reply.png"))
    state = default_store().conversation_get(tenant, conv.id)
    assert (state.assignee, state.handoff.taken_by) == ("sofia", "sofia")
    drain("outbox")
    assert fake.count("573001112233") == 1


TYPED_REPLY = "Hola Ana, el envío \u202esale mañana"  # U+202E: refused (it disguises the text)


def _refused_as_the_agent_reads_it(page, box: str, form: str, typed: str) -> None:
    """The box still holds what was typed; the plain error is right under it; no code, status or field path."""
    page.wait_for_selector(f"{box}[aria-invalid=true]")
    assert page.input_value(box) == typed
    error = page.locator(f"{form} .field-error")
    assert error.inner_text() == "Contains U+202E RIGHT-TO-LEFT OVERRIDE, a control or bidi override character."
    assert page.get_attribute(box, "aria-describedby") == error.get_attribute("id")
    text = page.inner_text("main")
    for raw in ("validation_error", "422", "reply.text", "note.text"):
        assert raw not in text


def test_a_refused_reply_or_note_keeps_the_text_with_the_error_next_to_it(page, shop, screenshot_dir) -> None:
    """Issue 20 item 6: the agent's text is still there, the error is next to the box in plain words."""
    from inbox.selectors import conversations_of_chat

    tenant, fake = shop
    (conv,) = conversations_of_chat(tenant, "whatsapp:573001112233")
    login(page, "sofia", "sofia-password-1")
    page.goto(f"/t/{tenant}/inbox/{conv.id}/")
    page.fill("#reply-text", TYPED_REPLY)
    page.get_by_role("button", name="Send").click()
    _refused_as_the_agent_reads_it(page, "#reply-text", "form.inbox-reply", TYPED_REPLY)
    page.screenshot(path=str(screenshot_dir / "inbox-refused-reply.png"))
    page.fill("#reply-text", "Hola Ana, el envío sale mañana")  # fixed: it goes
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector(".inbox-agent:has-text('el envío sale mañana')")
    assert page.locator(".field-error").count() == 0 and page.input_value("#reply-text") == ""

    typed_note = "Llamar \u202emañana"
    page.fill("#note-text", typed_note)
    page.get_by_role("button", name="Add note").click()
    _refused_as_the_agent_reads_it(page, "#note-text", "form.inbox-noteform", typed_note)
    assert page.input_value("#reply-text") == ""  # the other form is not touched


def test_without_javascript_a_refused_reply_keeps_the_text_too(chromium, live_server, shop) -> None:
    tenant, fake = shop
    from inbox.selectors import conversations_of_chat

    (conv,) = conversations_of_chat(tenant, "whatsapp:573001112233")
    context = chromium.new_context(java_script_enabled=False, base_url=live_server.url)
    try:
        page = context.new_page()
        login(page, "sofia", "sofia-password-1")
        page.goto(f"/t/{tenant}/inbox/{conv.id}/")
        page.fill("#reply-text", TYPED_REPLY)
        page.get_by_role("button", name="Send").click()
        _refused_as_the_agent_reads_it(page, "#reply-text", "form.inbox-reply", TYPED_REPLY)
        assert page.locator(".inbox-row").count() >= 40  # the whole page, list included
    finally:
        context.close()
