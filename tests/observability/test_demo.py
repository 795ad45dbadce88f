"""The observability demo loader against a live server (the real push endpoint)."""

from __future__ import annotations

import pytest

from botmesh_admin.demo import DemoContext, fixtures_dir
from botmesh_admin.kv import DurableKv
from botmesh_admin.observability import demo, selectors
from botmesh_admin.tenancy import services as tenancy


@pytest.mark.django_db(transaction=True)
def test_demo_pushes_two_replicas_of_tienda_bot(live_server, fresh_kv: DurableKv, tenant_id: str) -> None:
    tenancy.tenant_create(tenant_id, name="Tienda")
    _, token = tenancy.token_create(tenant_id, name="demo", role="admin")
    ctx = DemoContext(base_url=live_server.url, tokens={tenant_id: token}, fixtures=fixtures_dir())
    summary = demo.load(ctx, tenant=tenant_id)
    assert summary == "observability: 24 metric snapshots of tienda-bot from 2 replicas"
    latest = selectors.bot_metrics_latest(tenant_id, bot="tienda-bot")
    assert [s.replica for s in latest] == sorted(demo.REPLICAS)
    series = selectors.bot_metrics_series(tenant_id, bot="tienda-bot")
    points = series["replicas"][demo.REPLICAS[0]]
    assert len(points) == 12 and points[-1]["t"] - points[0]["t"] == 11 * demo.STEP_MS
    assert all(p["messages_in_per_min"] > 0 for p in points[1:])
