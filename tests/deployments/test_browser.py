"""The deployments pages in a real headless Chromium: timeline, roll back with confirmation."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.tenancy import services as tenancy
from deployments import services
from tests.conftest import login

from .conftest import pass_gates

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_admin_rolls_back_after_confirming(page, tenant_id: str, versions, screenshot_dir) -> None:
    get_user_model().objects.create_user("ops-admin", password="ops-password-1")
    tenancy.tenant_create(tenant_id, name="Ops Shop")
    tenancy.membership_set(tenant_id, username="ops-admin", role="admin")
    registry = services.default_registry()
    for v in versions:
        registry.publish(tenant_id, v, actor="token:ci")
    for v in ("1.1.0", "1.2.0"):
        pass_gates(registry, tenant_id, v)
    registry.activate(tenant_id, "tienda-bot", "1.2.0", actor="token:ci")

    login(page, "ops-admin", "ops-password-1")
    page.goto(f"/t/{tenant_id}/")
    page.click("nav.sidenav >> text=Deployments")
    page.click("text=tienda-bot")
    rows = page.locator("table.deployments-timeline tbody tr")
    assert rows.count() == 5 and rows.first.get_attribute("data-version") == "2.0.0-rc.1"
    page.screenshot(path=str(screenshot_dir / "deployments-timeline.png"), full_page=True)
    page.click("[data-testid=rollback]")
    assert "Roll back tienda-bot to 1.1.0?" in page.locator("h1").inner_text()
    page.click("[data-testid=confirm]")
    page.wait_for_selector("text=Rolled tienda-bot back to 1.1.0.")
    assert "rolled back from 1.2.0" in page.locator("[data-testid=active]").inner_text()
    assert registry.active(tenant_id, "tienda-bot").version == "1.1.0"
