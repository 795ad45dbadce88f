"""The hub demo loader, through the real API of a live server."""

from __future__ import annotations

import pytest

from botmesh_admin.demo import DemoContext, ensure_accounts, fixtures_dir
from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.runtime import use_kv
from hub import demo, selectors

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_installs_the_fixture_plugins_and_is_rerunnable(live_server) -> None:
    with use_kv(MemoryKv()):
        ctx = DemoContext(base_url=live_server.url, tokens=ensure_accounts(), fixtures=fixtures_dir())
        summary = demo.load(ctx)
        assert summary.startswith("hub: 2 plugins") and "contacts:write" in summary
        assert demo.load(ctx) == summary
        plugins = {p.plugin_id: p for p in selectors.plugin_list("tienda")}
        assert plugins["x.y"].enabled
        assert plugins["acme.order-status"].manifest.version == "1.5.0"
        assert plugins["acme.order-status"].pending_permissions == ("contacts:write",)
