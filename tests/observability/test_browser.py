"""The metrics and traces pages in a real headless Chromium: charts per replica, htmx filters, span tree."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from botmesh_admin.kv import DurableKv
from botmesh_admin.kv.validation import now_ms
from botmesh_admin.observability import services
from botmesh_admin.observability.demo import REPLICAS, snapshot
from botmesh_admin.tenancy import services as tenancy
from tests.conftest import login

from .test_store_contract import span as span_dict
from .test_store_contract import tid

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def member(fresh_kv: DurableKv, tenant_id: str) -> str:
    get_user_model().objects.create_user("sre", password="sre-password-1")
    tenancy.tenant_create(tenant_id, name="Tienda")
    tenancy.membership_set(tenant_id, username="sre", role="agent")
    return tenant_id


def test_metrics_page_draws_one_line_per_replica(page, member: str, screenshot_dir) -> None:
    now = now_ms()
    for index, replica in enumerate(REPLICAS):
        for step in range(8):
            services.bot_metrics_push(
                member,
                bot="tienda-bot",
                replica=replica,
                snapshot=snapshot(step, index),
                received_at_ms=now - (7 - step) * 60_000,
            )
    login(page, "sre", "sre-password-1")
    page.goto(f"/t/{member}/metrics/")
    assert page.locator("nav.sidenav a", has_text="Metrics").count() == 1
    page.wait_for_function("window.observabilityChartsReady === true")
    lines = page.evaluate(
        "Array.from(document.querySelectorAll('canvas[data-series]')).map(c => c.chart.data.datasets.length)"
    )
    assert lines == [2] * 6
    points = page.evaluate(
        "document.querySelector('canvas[data-series=messages_in]').chart.data.datasets[0].data.length"
    )
    assert points == 8
    assert page.locator("[data-testid=replica-table] tr[data-replica]").count() == 2
    page.screenshot(path=str(screenshot_dir / "observability-metrics.png"), full_page=True)


def test_traces_filter_by_kind_with_htmx_and_open_the_span_tree(page, member: str, screenshot_dir) -> None:
    t = now_ms() - 1000.0
    services.trace_record(
        member,
        [
            span_dict(tid(1), "a" * 16, None, "POST webhooks/whatsapp", t, 40.0),
            span_dict(tid(1), "b" * 16, "a" * 16, "message.receive", t + 5, 5.0, **{"botmesh.conversation_id": "c-1"}),
            span_dict(tid(1), "c" * 16, "b" * 16, "message.send", t + 12, 25.0),
        ],
    )
    services.trace_record(
        member, [span_dict(tid(2), "a" * 16, None, "GET api/whoami", t + 100, 2.0, **{"botmesh.kind": "http"})]
    )
    login(page, "sre", "sre-password-1")
    page.goto(f"/t/{member}/traces/")
    assert page.locator(f"tr[data-trace='{tid(1)}']").count() == 1  # (the login's own page views are
    assert page.locator(f"tr[data-trace='{tid(2)}']").count() == 1  # traced too)
    page.select_option("select[name=kind]", "message")
    page.wait_for_function("document.querySelectorAll('tr[data-trace]').length === 1")
    assert "kind=message" in page.url  # the filter is in the URL (hx-push-url), so it can be shared
    page.click(f"tr[data-trace='{tid(1)}'] a")
    page.wait_for_selector("[data-testid=span-tree]")
    depths = page.eval_on_selector_all("tr[data-span]", "rows => rows.map(r => r.dataset.depth)")
    assert depths == ["0", "1", "2"]
    page.screenshot(path=str(screenshot_dir / "observability-trace.png"), full_page=True)


def test_metrics_charts_share_one_range_and_tick_at_round_times_of_the_tenants_zone(page, member: str) -> None:
    """Issue 20 item 7: every chart spans the window chosen; ticks fall on whole hours of the zone (+05:30 here)."""
    tenancy.tenant_time_zone_set(member, time_zone="Asia/Kolkata")
    now = now_ms()
    for index, replica in enumerate(REPLICAS):
        for step in range(4):  # the replicas pushed at different moments: their own ranges would differ
            services.bot_metrics_push(
                member,
                bot="tienda-bot",
                replica=replica,
                snapshot=snapshot(step, index),
                received_at_ms=now - (3 - step) * 600_000 - index * 1_500_000,
            )
    login(page, "sre", "sre-password-1")
    page.goto(f"/t/{member}/metrics/?window=6h")
    page.wait_for_function("window.observabilityChartsReady === true")
    axes = page.evaluate(
        "Array.from(document.querySelectorAll('canvas[data-series]')).map(c => {"
        " const x = c.chart.scales.x; return {min: x.min, max: x.max, ticks: x.ticks.map(t => t.value),"
        " labels: x.ticks.map(t => t.label), title: x.options.title.text}; })"
    )
    assert len(axes) == 6
    assert len({(a["min"], a["max"]) for a in axes}) == 1  # one range for all
    first = axes[0]
    assert first["max"] - first["min"] == 6 * 3_600_000 and abs(first["max"] - now) < 60_000
    assert 3 <= len(first["ticks"]) <= 8 and all(a["ticks"] == first["ticks"] for a in axes)
    hour = 3_600_000
    assert all(t % hour == hour // 2 for t in first["ticks"])  # whole hours in +05:30 are :30 in UTC
    assert all(label.endswith(":00") for label in first["labels"]) and first["title"] == "Asia/Kolkata"
