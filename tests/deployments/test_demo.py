"""The deployments demo loader, through the real API of a live server."""

from __future__ import annotations

import pytest

from botmesh_admin.demo import DemoContext, ensure_accounts, fixtures_dir
from botmesh_admin.kv.memory import MemoryKv
from botmesh_admin.kv.runtime import use_kv
from deployments import demo, selectors

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_publishes_gates_and_activates_and_is_rerunnable(live_server) -> None:
    with use_kv(MemoryKv()):
        ctx = DemoContext(base_url=live_server.url, tokens=ensure_accounts(), fixtures=fixtures_dir())
        assert demo.load(ctx) == "deployments: 5 versions of tienda-bot (5 new), gates run, 1.2.0 active"
        assert demo.load(ctx) == "deployments: 5 versions of tienda-bot (0 new), gates run, 1.2.0 active"
        versions = {v.version: v for v in selectors.version_list("tienda", "tienda-bot")}
        assert [v.seq for v in versions.values()] == [5, 4, 3, 2, 1]
        assert all(versions[v].gates_passed for v in ("1.0.0", "1.1.0", "1.1.1", "1.2.0"))
        rc = versions["2.0.0-rc.1"]
        assert [g.status for g in rc.gates] == ["succeeded", "inconclusive", "pending"]
        assert selectors.deployment_active("tienda", "tienda-bot").version == "1.2.0"
