"""The CRM pages in a real headless Chromium: import with live progress, search, detail, segments."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.demo import fixtures_dir
from botmesh_admin.tenancy import services as tenancy
from crm import selectors, services
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FIXTURE = fixtures_dir() / "crm" / "contacts.csv"


def test_marketer_imports_searches_and_builds_a_segment(page, tenant_id: str, screenshot_dir) -> None:
    get_user_model().objects.create_user("crm-admin", password="crm-password-1")
    tenancy.tenant_create(tenant_id, name="CRM Shop")
    tenancy.membership_set(tenant_id, username="crm-admin", role="admin")
    login(page, "crm-admin", "crm-password-1")
    page.goto(f"/t/{tenant_id}/")
    page.click("nav.sidenav >> text=Contacts")
    page.click("text=Import CSV")
    page.set_input_files("#crm-file", str(FIXTURE))
    page.click("button:has-text('Upload and import')")
    page.wait_for_url(re.compile(rf".*/t/{tenant_id}/crm/contacts/import/imp_[0-9a-f]+/$"))
    assert page.locator("[data-testid=import-status]").inner_text() == "queued"
    # No worker runs in this test: run the queued job here, as a Celery worker would,
    # and watch the page pick up the result by htmx polling (no reload).
    job_id = page.url.rstrip("/").rsplit("/", 1)[1]
    services.contact_import_run(tenant_id, job_id)
    page.wait_for_selector("[data-testid=import-progress][data-status=done]", timeout=10000)
    assert "201 created · 1 merged into existing contacts · 1 bad row" in page.inner_text(
        "[data-testid=import-summary]"
    )
    assert page.locator("[data-testid=import-errors] tbody tr").count() == 3
    page.screenshot(path=str(screenshot_dir / "crm-import-report.png"), full_page=True)

    page.click("nav.sidenav >> text=Contacts")
    page.fill("input[name=q]", "ana garcía")
    page.wait_for_function("document.querySelectorAll('[data-testid=contact-table] tbody tr').length === 1")
    page.click("[data-testid=contact-table] >> text=Ana García")
    assert page.locator("[data-testid=consent-whatsapp]").inner_text() == "granted"
    assert page.get_attribute("[data-testid=conversations-link]", "href").endswith(
        "/inbox/?contact=" + page.url.rstrip("/").rsplit("/", 1)[1]
    )
    page.select_option("select[name=channel]", "whatsapp")
    page.select_option("select[name=status]", "denied")
    page.fill("input[name=evidence]", "asked by phone to stop")
    page.click("button:has-text('Record')")
    page.wait_for_selector("text=Consent recorded.")
    assert page.locator("[data-testid=consent-whatsapp]").inner_text() == "denied"
    assert "asked by phone to stop" in page.inner_text("[data-testid=consent-history]")
    page.screenshot(path=str(screenshot_dir / "crm-contact.png"), full_page=True)

    page.click("nav.sidenav >> text=Segments")
    page.fill("input[name=name]", "VIP pro")
    page.fill("input[name=tags_all]", "vip")
    page.fill("textarea[name=attributes]", "plan = pro")
    expected = selectors.segment_count(tenant_id, {"tags_all": ["vip"], "attributes": {"plan": "pro"}})
    page.wait_for_selector(f"[data-testid=preview-count]:text-is('{expected}')")
    page.click("button:has-text('Save segment')")
    page.wait_for_selector("text=Segment 'VIP pro' saved.")
    row = page.locator("[data-testid=segment-table] tr", has_text="VIP pro")
    assert row.locator("[data-testid=segment-count]").inner_text() == str(expected)
    page.screenshot(path=str(screenshot_dir / "crm-segments.png"), full_page=True)


def test_a_refused_segment_rule_keeps_the_form_with_the_error_next_to_the_rule(page, tenant_id: str) -> None:
    """Issue 20 item 6: the marketer's rules are still there; the error is under the attributes box."""
    get_user_model().objects.create_user("seg-admin", password="seg-password-1")
    tenancy.tenant_create(tenant_id, name="CRM Shop")
    tenancy.membership_set(tenant_id, username="seg-admin", role="admin")
    login(page, "seg-admin", "seg-password-1")
    page.goto(f"/t/{tenant_id}/crm/segments/")
    page.fill("input[name=name]", "VIP pro")
    page.fill("input[name=tags_all]", "vip, gold")
    page.fill("textarea[name=attributes]", "plan = pro\ncity Bogotá")
    page.click("button:has-text('Save segment')")
    page.wait_for_selector("textarea[name=attributes][aria-invalid=true]")
    assert page.input_value("input[name=name]") == "VIP pro"
    assert page.input_value("input[name=tags_all]") == "vip, gold"
    assert page.input_value("textarea[name=attributes]") == "plan = pro\ncity Bogotá"
    error = page.locator("#segment-attributes-error")
    assert error.inner_text() == "Line 2: write name = value."
    assert page.locator(".field-error").count() == 1
    assert "segment.rules" not in page.inner_text("main") and "validation_error" not in page.inner_text("main")
    assert selectors.segment_list(tenant_id) == []
