"""The deployments pages in a real headless Chromium: timeline, roll back with confirmation."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.tenancy import services as tenancy
from deployments import selectors, services
from tests.conftest import login

from .conftest import pass_gates

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_admin_rolls_back_after_confirming(page, tenant_id: str, versions, screenshot_dir) -> None:
    get_user_model().objects.create_user("ops-admin", password="ops-password-1")
    tenancy.tenant_create(tenant_id, name="Ops Shop")
    tenancy.membership_set(tenant_id, username="ops-admin", role="admin")
    for v in versions:
        services.version_publish(tenant_id, spec=v, actor="token:ci")
    for v in ("1.1.0", "1.2.0"):
        pass_gates(tenant_id, v)
    services.deployment_activate(tenant_id, "tienda-bot", "1.2.0", actor="token:ci")

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
    assert selectors.deployment_active(tenant_id, "tienda-bot").version == "1.1.0"


def test_admin_approves_the_gates_that_wait_for_a_person_then_activates(
    page, tenant_id: str, versions, screenshot_dir
) -> None:
    """Issue 20 item 4: only the API could decide a manual-approval gate; the page had no way to."""
    from django.test import Client

    users = get_user_model()
    users.objects.create_user("ops-admin", password="ops-password-1")
    users.objects.create_user("ops-agent", password="ops-password-2")
    tenancy.tenant_create(tenant_id, name="Ops Shop")
    tenancy.membership_set(tenant_id, username="ops-admin", role="admin")
    tenancy.membership_set(tenant_id, username="ops-agent", role="agent")
    rc = versions[-1]["version"]
    services.version_publish(tenant_id, spec=versions[-1], actor="token:ci")
    for gate, result in (("unit-tests", "succeeded"), ("conversation-replay", "inconclusive")):
        run = services.gate_run_start(tenant_id, "tienda-bot", rc, gate, actor="token:ci")
        services.gate_run_finish(tenant_id, "tienda-bot", rc, gate, run_id=run.run_id, result=result, actor="ci")

    agent = Client()
    agent.force_login(users.objects.get(username="ops-agent"))
    url = f"/t/{tenant_id}/deployments/tienda-bot/"
    assert 'data-testid="approve"' not in agent.get(url).content.decode()
    refused = agent.post(f"{url}versions/{rc}/gates/manual-approval/decision", {"decision": "approve", "reason": "x"})
    assert refused.status_code == 403
    assert selectors.version_get(tenant_id, "tienda-bot", rc).gate("manual-approval").status == "pending"

    login(page, "ops-admin", "ops-password-1")
    page.goto(url)
    assert page.get_by_test_id("activate").count() == 0  # not every gate has passed
    replay = page.get_by_test_id("decision-conversation-replay")
    assert "was inconclusive" in replay.inner_text()
    page.screenshot(path=str(screenshot_dir / "deployments-gate-decision.png"), full_page=True)
    replay.get_by_test_id("approve").click()  # no reason: the browser asks for one, nothing is sent
    assert selectors.version_get(tenant_id, "tienda-bot", rc).gate("conversation-replay").status == "inconclusive"
    replay.get_by_test_id("reason").fill("replay flaked on a timeout; checked by hand")
    replay.get_by_test_id("approve").click()
    page.wait_for_selector(f"text=Gate conversation-replay of {rc} approved.")
    manual = page.get_by_test_id("decision-manual-approval")
    manual.get_by_test_id("reason").fill("QA signed off")
    manual.get_by_test_id("approve").click()
    page.wait_for_selector(f"text=Gate manual-approval of {rc} approved.")
    assert page.locator(f"tr[data-version='{rc}'] [data-testid=gate-status]").inner_text() == "passed"
    assert "approved by user:ops-admin: QA signed off" in page.locator("table.deployments-audit").inner_text()
    page.click("[data-testid=activate]")
    page.click("[data-testid=confirm]")
    page.wait_for_selector(f"text=tienda-bot {rc} is now active.")
    assert selectors.deployment_active(tenant_id, "tienda-bot").version == rc
    page.screenshot(path=str(screenshot_dir / "deployments-gate-approved.png"), full_page=True)
