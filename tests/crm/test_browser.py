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
    row.locator("a", has_text="VIP pro").click()
    # Issue 20 item 9: the members are named with their identities.
    member = page.locator("[data-testid=segment-members] tbody tr").first
    name, identities, _ = member.locator("td").all_inner_texts()
    assert name and name != "(no name)" and identities.split()[0] in ("whatsapp", "telegram", "email")


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


def test_contacts_total_pages_merge_report_and_a_version_checked_edit(page, tenant_id: str, screenshot_dir) -> None:
    """Issue 20 item 9: the list had no total and no way back; an import did not say which rows merged into
    which contact; the contact page could not edit name, identities or attributes."""
    get_user_model().objects.create_user("crm-admin", password="crm-password-1")
    tenancy.tenant_create(tenant_id, name="CRM Shop", default_region="CO")
    tenancy.membership_set(tenant_id, username="crm-admin", role="admin")
    job = services.contact_import_start(tenant_id, filename="contacts.csv", data=FIXTURE.read_bytes())
    services.contact_import_run(tenant_id, job.id)
    login(page, "crm-admin", "crm-password-1")

    page.goto(f"/t/{tenant_id}/crm/contacts/import/{job.id}/")
    merges = page.locator("[data-testid=import-merges] tbody tr")
    assert merges.count() == 1
    row, into = merges.first.locator("td").all_inner_texts()
    assert row.isdigit() and into and into != "(no name)"
    page.screenshot(path=str(screenshot_dir / "crm-import-merges.png"), full_page=True)
    merges.first.locator("a").click()
    assert page.locator("h1").inner_text().startswith(into)

    page.goto(f"/t/{tenant_id}/crm/contacts/")
    total = selectors.contact_count(tenant_id)
    assert page.get_by_test_id("contact-total").inner_text() == f"{total} contacts"
    assert page.get_by_test_id("prev-page").count() == 0
    first = page.locator("[data-testid=contact-table] tbody tr").first.inner_text()
    page.get_by_test_id("next-page").click()
    assert "page 2" in page.get_by_test_id("contact-pager").inner_text()
    assert page.locator("[data-testid=contact-table] tbody tr").first.inner_text() != first
    page.get_by_test_id("next-page").click()
    assert "page 3" in page.get_by_test_id("contact-pager").inner_text()
    page.get_by_test_id("prev-page").click()
    page.get_by_test_id("prev-page").click()
    assert "page 1" in page.get_by_test_id("contact-pager").inner_text()
    assert page.locator("[data-testid=contact-table] tbody tr").first.inner_text() == first
    page.screenshot(path=str(screenshot_dir / "crm-contacts-pager.png"), full_page=True)

    contact = services.contact_create(
        tenant_id, identities=[{"channel": "whatsapp", "address": "+573009990001"}], name="Lucía", source="test"
    )
    page.goto(f"/t/{tenant_id}/crm/contacts/{contact.id}/")
    page.fill("#e-name", "Lucía Pérez")
    page.fill("#e-identities", "whatsapp +57 300 999 0001\ntelegram 7000123")
    page.fill("#e-attributes", 'plan = "gold"\nvisits = 3')
    # Meanwhile a colleague (or the API) changes the contact: the form's version is stale now.
    services.contact_update(tenant_id, contact.id, expected_version=contact.version, attributes={"city": "Cali"})
    page.get_by_test_id("save-contact").click()
    refusal = page.get_by_test_id("form-error").inner_text()
    assert "Someone changed this contact since you opened it" in refusal and "nothing was saved" in refusal
    stored = selectors.contact_get(tenant_id, contact.id)
    assert stored.name == "Lucía" and stored.attributes == {"city": "Cali"}  # nothing of the stale edit
    assert page.input_value("#e-name") == "Lucía Pérez"  # what was typed is kept
    page.screenshot(path=str(screenshot_dir / "crm-contact-stale-edit.png"), full_page=True)
    page.fill("#e-attributes", 'plan = "gold"\nvisits = 3\ncity = Cali')
    page.get_by_test_id("save-contact").click()  # the refused page's form carries the version it showed
    page.wait_for_selector("text=Contact saved.")
    saved = selectors.contact_get(tenant_id, contact.id)
    assert saved.name == "Lucía Pérez" and saved.attributes == {"city": "Cali", "plan": "gold", "visits": 3}
    assert sorted((i.channel, i.address) for i in saved.identities) == [
        ("telegram", "7000123"),
        ("whatsapp", "+573009990001"),
    ]

    page.fill("#e-name", "Lucía\u202eevil")
    page.fill("#e-identities", "whatsapp notaphone\nfax 123")
    page.fill("#e-attributes", "this is not a line")
    page.get_by_test_id("save-contact").click()
    shown = page.get_by_test_id("field-error").all_inner_texts()  # every mistake at once, each under its field
    assert len(shown) == 3 and shown[0].startswith("Contains U+202E RIGHT-TO-LEFT OVERRIDE"), shown
    assert shown[1].startswith("Line 1, address: not a phone number.") and "Line 2, channel:" in shown[1]
    assert shown[2].startswith("Line 1: write the name, '=', then the value")
    assert page.input_value("#e-identities") == "whatsapp notaphone\nfax 123"  # what was typed is kept
    assert selectors.contact_get(tenant_id, contact.id).version == saved.version  # nothing half written
    page.screenshot(path=str(screenshot_dir / "crm-contact-edit-error.png"), full_page=True)
