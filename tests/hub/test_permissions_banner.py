"""The hub's "new permissions requested" banner goes once an admin approved them (issue 20, item 11)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.tenancy import services as tenancy
from hub import services
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_new_permissions_banner_disappears_once_approved(
    page, tenant_id: str, order_status: bytes, order_status_more: bytes, screenshot_dir
) -> None:
    get_user_model().objects.create_user("hub-admin", password="hub-password-1")
    tenancy.tenant_create(tenant_id, name="Hub Shop")
    tenancy.membership_set(tenant_id, username="hub-admin", role="admin")
    installed, _ = services.plugin_install(tenant_id, manifest=order_status, actor="token:ci")
    services.plugin_grant(tenant_id, installed.plugin_id, permissions=list(installed.manifest.permissions), actor="ci")
    services.plugin_install(tenant_id, manifest=order_status_more, actor="token:ci")  # asks for contacts:write
    login(page, "hub-admin", "hub-password-1")
    page.goto(f"/t/{tenant_id}/plugins/acme.order-status/")
    requested = page.locator("[data-testid=permissions-requested]")
    assert "New permissions requested" in requested.inner_text() and "+ contacts:write" in requested.inner_text()
    page.click("[data-testid=grant]")
    page.wait_for_selector("text=Permissions granted.")
    assert page.locator("[data-testid=permissions-requested]").count() == 0
    assert "New permissions requested" not in page.inner_text("main")
    assert "New permissions approved: + contacts:write" in page.locator("[data-testid=permission-diff]").inner_text()
    page.screenshot(path=str(screenshot_dir / "hub-permissions-approved.png"), full_page=True)
