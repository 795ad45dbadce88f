"""The thread as its history (issue 20, item 8): who assigned, took, resolved — interleaved in time
order with the messages; a reply through the console provider says so; an unknown address is a 404 page."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.events.services import journal_drain
from botmesh_admin.tenancy import services as tenancy
from inbox import selectors, services
from inbox.selectors import conversations_of_chat
from tests.backends import unique_id
from tests.conftest import login

from .conftest import ledger_records

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def console_shop():
    """A tenant without channel credentials (the embedded default: replies go to the console provider)."""
    tenant = unique_id("consola")
    tenancy.tenant_create(tenant, name="Consola")
    for name in ("sofia", "mateo"):
        get_user_model().objects.create_user(name, password=f"{name}-password-1")
        tenancy.membership_set(tenant, username=name, role="agent")
    for record in ledger_records():
        if record["tenantId"] == "tienda" and record["chatId"] == "whatsapp:573198723998":
            services.message_project(tenant, dict(record, tenantId=None))
    (conv,) = conversations_of_chat(tenant, "whatsapp:573198723998")
    return tenant, conv


def texts(page, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_inner_texts()]


def test_thread_shows_who_changed_what_in_time_order_and_labels_console_replies(
    page, console_shop, screenshot_dir
) -> None:
    tenant, conv = console_shop
    services.conversation_assign(tenant, conv.id, agent="mateo", expected_version=conv.version, actor="mateo")
    login(page, "sofia", "sofia-password-1")
    page.goto(f"/t/{tenant}/inbox/{conv.id}/")
    page.get_by_role("button", name="Assign to me", exact=True).click()
    page.wait_for_selector(".inbox-event:has-text('sofia took the conversation')")
    page.get_by_role("button", name="Take from bot").click()
    page.wait_for_selector(".inbox-event:has-text('sofia took the chat from the bot')")
    page.get_by_role("button", name="Resolve").click()
    page.wait_for_selector(".inbox-event:has-text('sofia resolved the conversation')")
    page.get_by_role("button", name="Reopen").click()
    page.wait_for_selector(".inbox-event:has-text('sofia reopened the conversation')")
    page.fill("#reply-text", "Hola Ana, ¿en qué te ayudo?")
    page.get_by_role("button", name="Send").click()
    page.wait_for_selector(".inbox-agent:has-text('en qué te ayudo')")
    events = [t.split(" · ")[0] for t in texts(page, ".inbox-event")]
    assert events == [
        "mateo took the conversation",
        "sofia took the conversation",
        "sofia took the chat from the bot",
        "sofia resolved the conversation",
        "sofia reopened the conversation",
    ]
    # Interleaved in time: every event comes after the customer's messages (older) and before the reply.
    order = page.eval_on_selector_all(
        "#inbox-messages > li", "items => items.map(li => li.classList.contains('inbox-event') ? 'e' : 'm')"
    )
    assert "".join(order).strip("m").count("m") == 0 and order[-1] == "m"  # m…m e…e m
    journal_drain(channel="outbox")
    page.wait_for_selector(".inbox-agent .inbox-console", timeout=10000)  # htmx polling shows the send
    assert texts(page, ".inbox-agent .inbox-console") == ["console — not sent to WhatsApp"]
    assert page.locator(".inbox-agent .inbox-ticks").count() == 0  # no tick that suggests delivery
    page.screenshot(path=str(screenshot_dir / "inbox-thread-events.png"), full_page=True)
    stored = selectors.event_list(tenant, conv.id)
    assert [(e.kind, e.actor, e.value) for e in stored][:2] == [
        ("assigned", "mateo", "mateo"),
        ("assigned", "sofia", "sofia"),
    ]


def test_unknown_conversation_address_is_a_404_page(page, console_shop, screenshot_dir) -> None:
    tenant, _ = console_shop
    login(page, "sofia", "sofia-password-1")
    for address in (f"/t/{tenant}/inbox/bogus/", f"/t/{tenant}/inbox/cv_{'0' * 20}/"):
        response = page.goto(address)
        assert response is not None and response.status == 404, address
        assert page.locator(".error-box", has_text="This conversation does not exist.").count() == 1
        assert "422" not in page.inner_text("main") and "validation" not in page.inner_text("main")
    page.screenshot(path=str(screenshot_dir / "inbox-404.png"))
