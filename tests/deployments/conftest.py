"""Fixtures of the deployments tests: the DeploymentStore over memory and every Kv backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from botmesh_admin.clock import FakeClock, use_clock
from botmesh_admin.demo import fixtures_dir
from deployments import services
from deployments.stores import use_store
from deployments.stores.base import DeploymentStore
from deployments.stores.kv import KvDeploymentStore
from deployments.stores.memory import MemoryDeploymentStore
from tests.stores import store_fixture
from tests.tenants import World, bearer, world

__all__ = ["World", "bearer", "world"]  # re-exported: pytest finds the fixture here, the tests import World from here

GATES = ("unit-tests", "conversation-replay", "manual-approval")


deployment_store = store_fixture("deployment_store", memory=MemoryDeploymentStore, kv=KvDeploymentStore)


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """The kernel clock fixed at 2023-11-14 (``use_clock``); move it with ``advance``."""
    with use_clock(FakeClock()) as fake:
        yield fake


@pytest.fixture
def registry(deployment_store: DeploymentStore, clock: FakeClock) -> Iterator[DeploymentStore]:
    """``deployment_store`` as the deployments store (``use_store``) on the fake ``clock``, keeping every version."""
    with use_store(deployment_store):
        yield deployment_store


@pytest.fixture(scope="session")
def versions() -> list[dict[str, Any]]:
    """The five fixture versions of tienda-bot, oldest first (the last a pre-release)."""
    folder = fixtures_dir() / "deployments"
    return [json.loads((folder / f"version_{i}.json").read_text()) for i in range(1, 6)]


def pass_gates(tenant: str, version: str, result: str = "succeeded") -> None:
    """Run every gate of ``version`` to ``result``."""
    for gate in GATES:
        run = services.gate_run_start(tenant, "tienda-bot", version, gate, actor="ci")
        services.gate_run_finish(tenant, "tienda-bot", version, gate, run_id=run.run_id, result=result, actor="ci")
