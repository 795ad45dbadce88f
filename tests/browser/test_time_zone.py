"""Times in the tenant's zone, one format, the zone shown (issue 20 item 7), in a real headless Chromium."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from botmesh_admin.tenancy import services as tenancy
from botmesh_admin.tenancy.models import Tenant
from crm import services as crm
from tests.conftest import login
from tests.inbox.test_browser import shop  # noqa: F401  (the fixture: a tenant with the demo's chats and journal)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOWN_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) -05$")


def _times_read_in_bogota(page) -> int:  # type: ignore[no-untyped-def]
    """Check every time on the page: the UTC instant (``datetime``) shown 5 hours earlier, ``-05``; return the count."""
    times = page.eval_on_selector_all(
        "main time[datetime]", "els => els.map(e => [e.getAttribute('datetime'), e.textContent, e.title])"
    )
    for instant, text, title in times:
        utc = dt.datetime.strptime(instant, "%Y-%m-%dT%H:%M:%SZ")
        shown = SHOWN_RE.match(text)
        assert shown, f"{text!r} is not the one format with the zone"
        assert dt.datetime.strptime(shown.group(1), "%Y-%m-%d %H:%M:%S") == utc - dt.timedelta(hours=5)
        assert title == "America/Bogota"
    assert page.inner_text("[data-testid=time-zone]") == "America/Bogota"  # the zone, in the top bar
    return len(times)


def test_a_tenant_in_bogota_sees_every_time_five_hours_before_utc(page, shop, screenshot_dir) -> None:  # noqa: F811
    tenant, _fake = shop
    tenancy.tenant_time_zone_set(tenant, time_zone="America/Bogota")
    tenancy.membership_set(tenant, username="mateo", role="admin")
    contact = crm.contact_create(tenant, name="Zona Horaria", identities=[{"channel": "telegram", "address": "42"}])
    tenancy.token_create(tenant, name="ci", created_by="mateo")
    login(page, "mateo", "mateo-password-1")
    page.goto(f"/t/{tenant}/inbox/")
    page.locator(".inbox-row", has_text="Ana García").first.click()
    page.wait_for_selector(".inbox-threadhead h2:has-text('Ana García')")
    counts = {"inbox": _times_read_in_bogota(page)}
    page.screenshot(path=str(screenshot_dir / "time-zone-inbox.png"))
    for name, path in (
        ("journal", "journal/"),
        ("contact", f"crm/contacts/{contact.id}/"),
        ("contacts", "crm/contacts/"),
        ("settings", "settings/tokens/"),
    ):
        page.goto(f"/t/{tenant}/{path}")
        counts[name] = _times_read_in_bogota(page)
    assert all(counts.values()), counts  # every page showed at least one time
    assert page.locator("#time-zone option:checked").inner_text() == "America/Bogota"


def test_the_first_admin_gives_the_tenant_their_browser_zone(chromium, live_server, shop) -> None:  # noqa: F811
    tenant, _fake = shop
    tenancy.membership_set(tenant, username="mateo", role="admin")
    for username, role in (("sofia", "agent"), ("mateo", "admin")):
        context = chromium.new_context(base_url=live_server.url, timezone_id="America/Bogota")
        try:
            page = context.new_page()
            login(page, username, f"{username}-password-1")
            page.wait_for_url(f"**/t/{tenant}/")
            if role == "agent":  # an agent's browser chooses nothing
                page.goto(f"/t/{tenant}/inbox/")
                assert page.inner_text("[data-testid=time-zone]") == "UTC"
                page.wait_for_timeout(500)
                assert Tenant.objects.get(id=tenant).time_zone == ""
            else:  # the first admin's does, and the page reloads in it
                page.wait_for_selector("[data-testid=time-zone]:text-is('America/Bogota')")
                assert Tenant.objects.get(id=tenant).time_zone == "America/Bogota"
        finally:
            context.close()
