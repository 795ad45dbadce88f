"""Where login lands (issue 20, item 11): the tenant used last, kept across logins; a first login
lands on the first tenant with data; every page shows the favicon."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.tenancy import services as tenancy
from inbox import services as inbox
from tests.backends import unique_id
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def two_tenants():
    """``empty`` (joined first, nothing in it) and ``busy`` (a conversation), and their agent."""
    empty, busy = unique_id("vacio"), unique_id("lleno")
    tenancy.tenant_create(empty, name="Vacío")
    tenancy.tenant_create(busy, name="Lleno")
    get_user_model().objects.create_user("lucia", password="lucia-password-1")
    tenancy.membership_set(empty, username="lucia", role="agent")
    tenancy.membership_set(busy, username="lucia", role="agent")
    inbox.message_project(
        busy,
        {
            "id": "m1",
            "channel": "telegram",
            "chatId": "telegram:700000001",
            "senderId": "telegram:700000001",
            "direction": "in",
            "type": "text",
            "body": "hola",
            "timestamp": 1_764_489_600_000,
        },
    )
    return empty, busy


def logout(page) -> None:
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/login/**")


def test_login_lands_on_the_tenant_used_last_across_logins(page, two_tenants, screenshot_dir) -> None:
    empty, busy = two_tenants
    login(page, "lucia", "lucia-password-1")
    page.wait_for_url(f"**/t/{busy}/")  # a first login: the first tenant with data, not the empty one
    page.select_option("#tenant-switch", empty)
    page.wait_for_url(f"**/t/{empty}/")
    page.goto(f"/t/{empty}/inbox/")  # any page of the tenant counts as using it
    logout(page)
    login(page, "lucia", "lucia-password-1")
    page.wait_for_url(f"**/t/{empty}/")  # a new session remembers the tenant used last
    page.select_option("#tenant-switch", busy)
    page.wait_for_url(f"**/t/{busy}/")
    logout(page)
    login(page, "lucia", "lucia-password-1")
    page.wait_for_url(f"**/t/{busy}/")
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon and icon.endswith("favicon.ico")
    assert page.request.get(icon).status == 200 and page.request.get("/favicon.ico").status == 200
    page.screenshot(path=str(screenshot_dir / "landing-last-tenant.png"))
