"""The channels page in headless Chromium: an admin adds a Telegram bot; the secret is never shown back."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.tenancy import services as tenancy
from tests.conftest import login

from .conftest import TG_BOT_TOKEN


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_admin_adds_a_telegram_bot(configured, page, screenshot_dir) -> None:
    get_user_model().objects.create_user("alice", password="alice-password-1")
    tenancy.membership_set("tienda", username="alice", role="admin")
    login(page, "alice", "alice-password-1")
    page.goto("/t/tienda/channels/")
    form = page.locator("#telegram-form")
    form.locator("input[name=name]").fill("soporte")
    form.locator("input[name=bot_username]").fill("soporte_bot")
    form.locator("input[name=bot_token]").fill(TG_BOT_TOKEN)
    form.locator("input[name=webhook_secret]").fill("a-webhook-secret")
    form.locator("button[type=submit]").click()
    row = page.locator("tr[data-channel=soporte]")
    assert "Bot token: set ✓" in row.inner_text()
    assert "/webhooks/telegram/tienda/soporte" in row.inner_text()
    assert TG_BOT_TOKEN not in page.content() and "a-webhook-secret" not in page.content()
    page.screenshot(path=str(screenshot_dir / "channels.png"), full_page=True)
