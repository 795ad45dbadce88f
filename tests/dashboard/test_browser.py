"""The replicas and jobs pages in a real headless Chromium: live refresh and editing."""

from __future__ import annotations

import pytest

from botmesh_admin.coordination.memory import MemoryCoordinator
from tests.conftest import login

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("members", "isolated"),
]


def test_replicas_page_refreshes_itself(page, hub, web, screenshot_dir) -> None:  # type: ignore[no-untyped-def]
    """A replica that starts after the page loaded appears without a reload (htmx polling)."""
    login(page, "alice", "alice-password-1")
    page.goto("/t/tienda/replicas/")
    assert page.locator('[data-replica="web-1"]').count() == 1
    assert page.locator("nav.sidenav a", has_text="Replicas").count() == 1
    late = MemoryCoordinator(hub, "worker-late", lease_ms=5000, role="worker")
    late.try_lead("scheduler")
    late._beat()
    page.locator('[data-replica="worker-late"]').wait_for(timeout=8000)
    page.locator('[data-lead="scheduler"]').wait_for(timeout=8000)
    page.screenshot(path=str(screenshot_dir / "dashboard-replicas.png"), full_page=True)
    late.close()


def test_a_superuser_changes_a_schedule_in_the_form(page, web, screenshot_dir) -> None:  # type: ignore[no-untyped-def]
    login(page, "root", "root-password-1")
    page.goto("/t/tienda/jobs/")
    page.locator("#edit-kv\\.sweep summary").click()
    form = page.locator("#edit-kv\\.sweep form")
    form.locator('input[name="every_s"]').fill("120")
    form.locator('select[name="catch_up"]').select_option("skip")
    form.locator("button[type=submit]").click()
    page.wait_for_url("**/t/tienda/jobs/")
    assert "Job kv.sweep saved." in page.locator("ul.messages").inner_text()
    row = page.locator('tr[data-job="kv.sweep"]')
    assert "every 2 min" in row.inner_text() and "skip" in row.inner_text()
    page.screenshot(path=str(screenshot_dir / "dashboard-jobs.png"), full_page=True)


def test_a_refused_crontab_keeps_what_was_typed_next_to_its_field(page, web) -> None:  # type: ignore[no-untyped-def]
    """Issue 20 item 6: the schedule typed is still in the form, the error under the crontab input."""
    login(page, "root", "root-password-1")
    page.goto("/t/tienda/jobs/")
    page.locator("#edit-kv\\.sweep summary").click()
    form = page.locator("#edit-kv\\.sweep form")
    form.locator('select[name="kind"]').select_option("crontab")
    form.locator('input[name="crontab"]').fill("0 25 * * *")
    form.locator('select[name="catch_up"]').select_option("skip")
    form.locator("button[type=submit]").click()
    page.wait_for_selector('#edit-kv\\.sweep input[name="crontab"][aria-invalid=true]')
    form = page.locator("#edit-kv\\.sweep form")  # the page again, the form open
    assert form.locator('input[name="crontab"]').input_value() == "0 25 * * *"
    assert form.locator('select[name="kind"]').input_value() == "crontab"
    assert form.locator('select[name="catch_up"]').input_value() == "skip"
    error = page.locator("#kv\\.sweep-crontab-error")
    assert error.inner_text().startswith("Not a valid crontab")
    assert "schedule.crontab" not in page.inner_text("main") and "422" not in page.inner_text("main")


def test_bot_replicas_refresh_with_a_handover_and_the_admin_processes_below(  # type: ignore[no-untyped-def]
    page, bots, screenshot_dir
) -> None:
    """Issue 19 item 3: a bot's leader changes after the page loaded; the page shows it without a reload."""
    from botmesh_admin.observability import services as metrics

    replicas = [bots.replica("tienda", "tienda-bot", f"tienda-bot-{i}", lease_ms=3000) for i in (1, 2, 3)]
    assert replicas[0].try_lead("provider:wa-main") is not None and replicas[2].try_lead("scheduler") is not None
    assert replicas[1].acquire_turn("whatsapp:573001112233", 0) is not None
    for replica in replicas:
        replica._beat()
        metrics.bot_metrics_push(
            "tienda", bot="tienda-bot", replica=replica.replica_id, snapshot={"messages": {"in": 1}}
        )
    login(page, "bob", "bob-password-1")
    page.goto("/t/tienda/replicas/")
    bot = page.locator('[data-bot="tienda-bot"]')
    assert bot.locator("[data-bot-replica]").count() == 3
    assert "tienda-bot-1" in bot.locator('[data-bot-lead="provider:wa-main"]').inner_text()
    page.evaluate("window.loaded_once = true")  # survives only if the page is never reloaded
    replicas[0].step_down("provider:wa-main", reason="transport closed for 30000 ms")
    assert replicas[1].try_lead("provider:wa-main") is not None
    page.locator('[data-bot="tienda-bot"] [data-event="handover"]').wait_for(timeout=8000)
    assert "tienda-bot-2" in bot.locator('[data-bot-lead="provider:wa-main"]').inner_text()
    assert "transport closed for 30000 ms" in bot.locator('[data-event="step-down"]').inner_text()
    handover = bot.locator('[data-event="handover"]').inner_text()
    assert "previous holder released the lease (stepped down or stopped)" in handover
    assert "leads provider:wa-main" in bot.locator('[data-bot-replica="tienda-bot-2"]').inner_text()
    assert page.evaluate("window.loaded_once") is True
    admin = page.locator('[data-testid="admin-processes"]')
    assert admin.locator('[data-replica="web-1"]').count() == 1
    assert admin.bounding_box()["y"] > bot.bounding_box()["y"]  # type: ignore[index]
    assert "573001112233" not in page.content()
    page.screenshot(path=str(screenshot_dir / "dashboard-bot-replicas.png"), full_page=True)
