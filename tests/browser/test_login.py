"""The login page and tenant overview in a real headless Chromium."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.tenancy import services
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def member() -> None:
    get_user_model().objects.create_user("dana", password="dana-password-1")
    services.tenant_create("acme", name="ACME")
    services.tenant_create("globex", name="Globex")
    services.membership_set("acme", username="dana", role="admin")
    services.membership_set("globex", username="dana", role="agent")


def test_login_then_switch_tenant(page, member, screenshot_dir) -> None:
    login(page, "dana", "dana-password-1")
    page.wait_for_url("**/t/acme/")
    assert page.locator("h1").inner_text() == "ACME · acme"
    assert page.locator("[data-testid=card-inbox]").count() == 1
    assert page.locator("nav.sidenav a", has_text="Settings").count() == 1  # admin in acme
    page.screenshot(path=str(screenshot_dir / "login-overview.png"), full_page=True)
    page.select_option("#tenant-switch", "globex")
    page.wait_for_url("**/t/globex/")
    assert page.locator("nav.sidenav a", has_text="Settings").count() == 0  # agent in globex


def test_wrong_password_shows_error(page, member) -> None:
    login(page, "dana", "nope")
    assert "do not match" in page.locator("p.error").inner_text()
