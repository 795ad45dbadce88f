"""The plugin pages in a real headless Chromium: install, see the diff, grant, enable."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.tenancy import services as tenancy
from hub import services
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_admin_installs_grants_and_enables_a_plugin(
    page, tenant_id: str, order_status: bytes, order_status_more: bytes, screenshot_dir
) -> None:
    get_user_model().objects.create_user("hub-admin", password="hub-password-1")
    tenancy.tenant_create(tenant_id, name="Hub Shop")
    tenancy.membership_set(tenant_id, username="hub-admin", role="admin")
    login(page, "hub-admin", "hub-password-1")
    page.goto(f"/t/{tenant_id}/")
    page.click("nav.sidenav >> text=Plugins")
    page.fill("#manifest", order_status.decode())
    page.click("form.hub-install button[type=submit]")
    page.wait_for_url(f"**/t/{tenant_id}/plugins/acme.order-status/")
    assert page.locator("h1 [data-testid=status]").inner_text() == "pending-approval"
    assert page.locator("[data-testid=enable]").is_disabled()
    page.click("[data-testid=grant]")
    page.wait_for_selector("text=Permissions granted.")
    page.click("[data-testid=enable]")
    page.wait_for_selector("text=acme.order-status enabled.")
    assert page.locator("h1 [data-testid=status]").inner_text() == "enabled"

    services.plugin_install(tenant_id, manifest=order_status_more, actor="token:ci")
    page.reload()
    diff = page.locator("[data-testid=permission-diff]")
    assert "+ contacts:write" in diff.inner_text()
    assert page.locator("tr[data-permission='contacts:write'] >> text=new").count() == 1
    page.screenshot(path=str(screenshot_dir / "hub-plugin-upgrade.png"), full_page=True)
    page.click("[data-testid=grant]")
    page.click("[data-testid=enable]")
    page.wait_for_selector("text=acme.order-status enabled.")
    page.click("text=← Plugins")
    assert page.locator("tr[data-plugin='acme.order-status'] [data-testid=status]").inner_text() == "enabled"
